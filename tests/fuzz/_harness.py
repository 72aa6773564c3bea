"""The fuzz harness's machinery: the real parser walked, argv generated from the declarations, one case run in-process.

`commands()` walks ``cloud.cli.build_parser()`` and lists every leaf command with the declaration of each of its
options (`device._config.option_of`). `argv_strategy` draws a command line from them: the command's base line
(`tests.fuzz._commands`) with one to three options given a hostile, generated or valid value of their kind.
`run_case` runs it through ``cloud.cli.main`` in this process, in the case's sandbox as working folder, with the
temp folder moved into the sandbox, and `check_outcome` asserts what every command owes a user:

    exit 0 or 2; no traceback; a refusal is exactly one line ``strata CMD: error: ...`` of bounded length;
    nothing created outside the output paths the argv names (nothing at all on a refusal or a check).

Commands whose run is cheap and bounded run for real (`FULL`); the others run their check only
(``main(argv, check_only=True)``), which is the very validation their run starts with.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.fuzz import _commands, _values

FULL = frozenset({"keys generate", "bundle inspect", "bundle verify", "device config show", "device config check",
                  "device export-c", "edge config show", "edge config check", "broker config", "runs", "status",
                  "switch"})
"""Commands the harness runs to their end: bounded, local, and writing only under the paths they are given.

Every other command trains, serves, connects, deploys or installs; the harness runs its check (the same
function its run calls first) and asserts that the check alone writes nothing.
"""

MAX_ERROR_LINE = 1200
"""An error line longer than this is an echo (values are cut to 80 characters each)."""
CHECK_SECONDS = 30.0
"""A check that takes longer is a late refusal in the making (they take well under a second; the bound is for a
loaded machine)."""
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1", "PIP_NO_INDEX": "1"}


def quick(examples: int) -> settings:
    """The default run's budget: `examples` fixed examples per test (derandomized, so `make test` repeats itself).

    ``STRATA_FUZZ_EXAMPLES=N`` draws N fresh random examples per test instead (a longer local hunt).
    """
    chosen = os.environ.get("STRATA_FUZZ_EXAMPLES")
    return settings(max_examples=int(chosen or examples), deadline=None, derandomize=chosen is None, database=None,
                    suppress_health_check=list(HealthCheck))


def long(examples: int) -> settings:
    """The ``-m slow`` budget: `examples` fresh random examples per test."""
    return settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@dataclass(frozen=True)
class Opt:
    """One option of one command, as the harness sees it."""

    dest: str
    flags: tuple[str, ...]
    desc: dict[str, Any]
    """The kind's declaration (`device._options.Kind.describe`)."""
    takes: str
    switch: bool
    boolean_optional: bool
    output: bool
    """An output path: what the command may create is under its value."""


@dataclass(frozen=True)
class Command:
    """A leaf command and its options."""

    name: str
    options: tuple[Opt, ...]
    undeclared: tuple[str, ...]
    """Options without a declaration (the harness test fails on any)."""


def commands() -> list[Command]:
    """Every leaf command of the real parser with its declared options."""
    from cloud.cli import build_parser
    from device._config import option_of

    found: list[Command] = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs:
            for name, child in subs[0].choices.items():
                walk(child, (*path, name))
            return
        options, undeclared = [], []
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            option = option_of(action)
            if option is None:
                undeclared.append(action.dest)
                continue
            desc = option.kind.describe()
            options.append(Opt(dest=action.dest, flags=tuple(action.option_strings), desc=desc, takes=option.takes,
                               switch=desc["kind"] == "Switch",
                               boolean_optional=isinstance(action, argparse.BooleanOptionalAction),
                               output=desc["kind"] in ("OutputFile", "OutputFolder") or (
                                   desc["kind"] == "Many" and desc["item"]["kind"] in ("OutputFile", "OutputFolder"))))
        found.append(Command(" ".join(path), tuple(options), tuple(undeclared)))

    walk(build_parser(), ())
    return found


# ------------------------------------------------------------------------------------------------ values


_SURROGATES = st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF)
_TEXT = st.text(alphabet=st.one_of(st.characters(blacklist_characters="\x00"), _SURROGATES), max_size=40)


def _generated(desc: dict[str, Any]) -> st.SearchStrategy[str]:
    """Values of the kind's own shape drawn by hypothesis, around and beyond its bounds."""
    kind = desc["kind"]
    if kind == "Many":
        return _generated(desc["item"])
    if kind == "Integer":
        near = [b for b in (desc.get("min"), desc.get("max")) if b is not None]
        around = [st.integers(min_value=b - 3, max_value=b + 3) for b in near]
        return st.one_of(st.integers(), *around).map(str)
    if kind == "Number":
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers().map(str),
                         st.floats(min_value=-10, max_value=10).map(lambda x: f"{x:.3g}"))
    return _TEXT


def value_strategy(opt: Opt, places: _values.Places, *, hostile: bool) -> st.SearchStrategy[str]:
    """A hostile or generated value for `opt` (paths are the sandbox's, so the list is per sandbox); without
    `hostile`, its valid value where it has one."""
    good = _values.valid(opt.desc, places)
    if not hostile and good is not None:
        return st.just(good)
    values = [value for _, value in _values.hostile(opt.desc, places) if "\x00" not in value]
    return st.one_of(st.sampled_from(values), _generated(opt.desc))


def _set(argv: list[str], opt: Opt, values: Sequence[str], *, on: bool = True) -> list[str]:
    """`argv` with `opt` given `values` (replacing it where the base line gives it)."""
    out: list[str] = []
    skip = 0
    for word in argv:
        if skip:
            skip -= 1
            continue
        if opt.flags and word in opt.flags:
            skip = 0 if opt.switch else 1
            continue
        out.append(word)
    if opt.switch:
        if opt.boolean_optional:
            flag = opt.flags[0] if on else "--no-" + opt.flags[0][2:]
            return [*out, flag]
        return [*out, opt.flags[0]] if on else out
    flag = opt.flags[0] if opt.flags else None
    if flag is None:
        return out  # positionals are placed by `with_positionals`
    if opt.takes == "words":
        return [*out, flag, *values] if all(not v.startswith("-") for v in values) else [
            *out, *(f"{flag}={v}" for v in values[-1:])]
    if opt.takes == "repeat":
        return [*out, *(f"{flag}={v}" for v in values)]
    return [*out, f"{flag}={values[0]}"]


@st.composite
def argv_strategy(draw: st.DrawFn, command: Command, places: _values.Places) -> list[str]:
    """A command line for `command`: its base line with one to three options given drawn values."""
    base = _commands.fill(_commands.BASELINES.get(command.name, []), places)
    positional_opts = [o for o in command.options if not o.flags]
    flags = list(base)
    positionals: list[str] = []
    # base lines put the positionals first
    for _ in positional_opts:
        if flags and not flags[0].startswith("-"):
            positionals.append(flags.pop(0))
    # One option gets a hostile value; up to two more get valid ones (or switch on/off), so the command's deeper
    # checks run too, not only the parser's.
    chosen = draw(st.lists(st.sampled_from(command.options), min_size=1, max_size=3, unique_by=lambda o: o.dest))
    for position, opt in enumerate(chosen):
        if opt.switch:
            flags = _set(flags, opt, [], on=draw(st.booleans()))
            continue
        count = draw(st.integers(min_value=1, max_value=3)) if opt.takes in ("words", "repeat") else 1
        values = [draw(value_strategy(opt, places, hostile=position == 0)) for _ in range(count)]
        if not opt.flags:
            index = positional_opts.index(opt)
            while len(positionals) <= index:
                positionals.append("x")
            positionals[index] = values[0]
        else:
            flags = _set(flags, opt, values)
    words = command.name.split()
    if any(p.startswith("-") for p in positionals):
        return [*words, *flags, "--", *positionals]
    return [*words, *positionals, *flags]


def outputs_of(command: Command, argv: list[str]) -> list[Path]:
    """The output paths `argv` names (values of output options, as given); where a full run may create things."""
    found: list[Path] = []
    flags = {f: o for o in command.options if o.output for f in o.flags}
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name in flags:
            if eq:
                found.append(Path(value))
            elif i + 1 < len(argv):
                found.append(Path(argv[i + 1]))
    return found


# ------------------------------------------------------------------------------------------------ running


def _warm_up() -> None:
    """Let the libraries write what they write once per process into the real temp folder, before any sandbox.

    onnxruntime writes ``$TMPDIR/.ses`` when first imported; torch's first optimizer step makes
    ``$TMPDIR/torchinductor_$USER``. Neither is strata's doing; with this, anything a case leaves in its temp
    folder is.
    """
    import onnxruntime  # noqa: F401
    import torch

    layer = torch.nn.Linear(1, 1)
    optimizer = torch.optim.Adam(layer.parameters())
    layer(torch.ones(1, 1)).sum().backward()
    optimizer.step()


_warm_up()


@dataclass
class Outcome:
    """What one run of ``cloud.cli.main`` did."""

    code: int
    stdout: str
    stderr: str
    escaped: str | None
    """The traceback of an exception that left `main`, if any."""
    seconds: float
    created: list[str]


def tree(root: Path) -> set[str]:
    """Every path under `root` (relative), symbolic links not followed."""
    out: set[str] = set()
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


class _Capture(io.TextIOWrapper):
    """A text stream over bytes, strict like a UTF-8 terminal's stdout (or backslash-escaping like stderr)."""

    def __init__(self, errors: str) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors=errors, write_through=True)

    def text(self) -> str:
        self.flush()
        buffer = self.buffer
        assert isinstance(buffer, io.BytesIO)
        return buffer.getvalue().decode("utf-8", errors="replace")


@contextlib.contextmanager
def sandbox(places: _values.Places, env: dict[str, str]) -> Iterator[Path]:
    """A fresh sandbox as working folder and temp folder, `env` set; everything restored afterwards."""
    if places.root.exists():
        shutil.rmtree(places.root)
    places.root.mkdir(parents=True)
    places.prepare()
    tmp = places.root.parent / (places.root.name + "-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    saved_env = {k: v for k, v in os.environ.items() if k.startswith(("STRATA_", "AWS_", "PIP_", "TMPDIR"))}
    saved_cwd, saved_tempdir = os.getcwd(), tempfile.tempdir
    for name in saved_env:
        del os.environ[name]
    os.environ.update(env)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    os.chdir(places.root)
    try:
        yield tmp
    finally:
        os.chdir(saved_cwd)
        tempfile.tempdir = saved_tempdir
        for name in [k for k in os.environ if k.startswith(("STRATA_", "AWS_", "PIP_", "TMPDIR"))]:
            del os.environ[name]
        os.environ.update(saved_env)


def run_case(argv: list[str], places: _values.Places, *, check_only: bool, env: dict[str, str] | None = None,
             files: dict[str, bytes] | None = None, setup: Callable[[], None] | None = None) -> Outcome:
    """Run ``strata ARGV`` in-process in a fresh sandbox; what it printed, exited and created.

    The sandbox holds `files` (relative path -> bytes) and whatever `setup` puts there (copies of fixtures).
    """
    from cloud.cli import main

    with sandbox(places, env or {}) as tmp:
        if setup is not None:
            setup()
        for rel, data in (files or {}).items():
            (places.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (places.root / rel).write_bytes(data)
        before = tree(places.root) | {f"@fixtures/{p}" for p in tree(places.fixtures_root or places.root)}
        out, err = _Capture("strict"), _Capture("backslashreplace")
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        escaped = None
        started = time.monotonic()
        try:
            code = main(argv, check_only=check_only)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            escaped = traceback.format_exc()
            code = 1
        finally:
            sys.stdout, sys.stderr = saved
        seconds = time.monotonic() - started
        after = tree(places.root) | {f"@fixtures/{p}" for p in tree(places.fixtures_root or places.root)}
        created = sorted(after - before) + [f"@tmp/{p}" for p in sorted(tree(tmp))]
        return Outcome(code=code, stdout=out.text(), stderr=err.text(), escaped=escaped, seconds=seconds,
                       created=created)


def check_outcome(command: Command, argv: list[str], outcome: Outcome, places: _values.Places, *,
                  check_only: bool) -> None:
    """Assert what every command owes a user (see the module docstring)."""
    shown = " ".join(a if len(a) < 100 else a[:60] + f"...({len(a)} chars)" for a in argv)
    assert outcome.escaped is None, f"strata {shown}\n{outcome.escaped}"
    assert "Traceback (most recent call last)" not in outcome.stderr, f"strata {shown}\n{outcome.stderr}"
    assert outcome.code in (0, 2), f"strata {shown}: exit {outcome.code}\n{outcome.stderr[-2000:]}"
    errors = [line for line in outcome.stderr.splitlines() if ": error: " in line]
    if outcome.code == 2:
        assert len(errors) == 1, f"strata {shown}: not one error line\n{outcome.stderr[-3000:]}"
        line = errors[0]
        assert line.startswith(f"strata {command.name}: error: "), f"strata {shown}: {line[:300]}"
        assert len(line) <= MAX_ERROR_LINE, f"strata {shown}: an error line of {len(line)} characters"
    if check_only:
        assert outcome.seconds < CHECK_SECONDS, f"strata {shown}: the check took {outcome.seconds:.1f} s"
    allowed = [] if (outcome.code != 0 or check_only) else outputs_of(command, argv)
    roots = [(places.root / p).absolute() for p in allowed]
    stray = [p for p in outcome.created if p.startswith("@") or not any(
        (places.root / p).absolute().is_relative_to(root) for root in roots)]
    assert not stray, f"strata {shown}: exit {outcome.code} left {stray[:5]} (outputs: {allowed})"
