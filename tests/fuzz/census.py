"""Census of one checkout: every option of every command with its hostile values, each run to its end.

Unlike the harness in `make test` (tests/fuzz/test_cli_fuzz.py), which runs the validation of long commands only,
the census runs every case as a user would (a forked child per case, killed past its time limit), so it can
measure a checkout that has no validate-only path and no declarations, such as the main before issue 33. Options
without a declaration get a kind inferred from their argparse action and name.

    cd CHECKOUT && PYTHONPATH=$PWD python /path/to/tests/fuzz/census.py --out census.jsonl

It prints one JSON line per case to --out and a table of tracebacks by family at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent))
import _commands
import _fixtures
import _values

_LEAN_NUMBERS = {"-1", "0", "99999", "9" * 30, "nan", "inf", "1e309", "1.5"}
LATE_S = 5.0
"""A refusal after this many seconds is late: the value was knowable before any work."""

TIMEOUTS = {"demo": 60.0, "train": 20.0, "functions serve": 6.0, "envs serve": 6.0, "infra apply": 10.0,
            "infra template": 10.0}
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1", "PIP_NO_INDEX": "1"}


# ------------------------------------------------------------------------------------------------ the parser


def leaves(parser: argparse.ArgumentParser,
           path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command, parser)`` of every leaf command."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
        return
    for name, child in subs[0].choices.items():
        yield from leaves(child, (*path, name))


_OUTPUT_NAMES = {"out", "kits", "run_dir", "state_dir", "prefix", "cache_dir", "decisions_out", "package"}
_INPUT_FOLDERS = {"run", "kit", "root", "source_dir"}


def describe(action: argparse.Action) -> dict[str, Any]:
    """The action's declaration, or (on a checkout without declarations) a kind inferred from it."""
    option = getattr(action, "strata_option", None)
    if option is not None:
        return dict(option.kind.describe())
    dest = action.dest
    type_name = getattr(action.type, "__name__", "") if action.type else ""
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return {"kind": "Switch"}
    if action.choices:
        return {"kind": "Choice", "values": [str(c) for c in action.choices]}
    if "port" in dest and type_name == "int":
        return {"kind": "Integer", "min": 0, "max": 65535, "unit": "port"}
    if type_name == "int":
        return {"kind": "Integer"}
    if type_name in ("finite_float", "float"):
        return {"kind": "Number"}
    if type_name == "seconds":
        return {"kind": "Number", "min": 0, "unit": "seconds"}
    if any(word in dest for word in ("broker", "endpoint", "url")):
        return {"kind": "Url", "schemes": ["http"] if "endpoint" in dest else ["mqtt", "mqtts"]}
    if dest in ("host", "bind", "param_server_host"):
        return {"kind": "Host"}
    if dest in ("env",):
        return {"kind": "EnvId"}
    if dest in _INPUT_FOLDERS:
        return {"kind": "InputFolder"}
    if dest in _OUTPUT_NAMES or dest.endswith("_dir"):
        kind = "OutputFile" if dest in ("decisions_out", "package") or (dest == "out" and type_name != "Path") \
            else "OutputFolder"
        return {"kind": kind}
    if type_name == "Path" or dest.endswith(("_file", "file")) or dest in ("trust", "config", "key", "state", "kit",
                                                                              "bundle", "run"):
        return {"kind": "InputFile"}
    if dest in ("fleet", "node", "node_id", "device_id", "edge_node", "policy", "stage", "name", "nodes", "devices",
                "cloud_user", "edge_nodes"):
        return {"kind": "Name"}
    return {"kind": "Text"}


# ------------------------------------------------------------------------------------------------ cases


@dataclass
class Case:
    command: str
    option: str
    family: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    """Sandbox-relative files to write before the run (a damaged checkpoint, a TOML config)."""
    copy_run: bool = False
    copy_cache: bool = False
    shown: str = ""


def option_cases(command: str, parser: argparse.ArgumentParser, places: _values.Places) -> Iterator[Case]:
    base = _commands.fill(_commands.BASELINES.get(command, []), places)
    env = AWS_ENV if command.startswith("infra") else {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.nargs == 0:
            continue
        desc = describe(action)
        if desc["kind"] == "Switch":
            continue
        values = _values.hostile(desc, places)
        if desc["kind"] in ("Integer", "Number", "Many"):
            values = [v for v in values if v[1] in _LEAN_NUMBERS or v[0] not in ("numbers", "endpoints")
                      or not re.fullmatch(r"[-+0-9.e ]*|nan|inf|-inf|0x10|\u0661|1_0", v[1])
                      or v[1] in {str(desc.get("min")), str(desc.get("max"))}]
        if command == "demo":
            values = [v for v in values if v[1] in ("-1", "0", "99999", "garbage://x", "nan", "x" * _values.BIG)
                      or (v[0] == "paths" and "proc" in v[1])]
        for family, value in values:
            if action.option_strings:
                argv = [*base, f"{action.option_strings[-1]}={value}"]
                if action.required or any(w == action.option_strings[-1] for w in base):
                    argv = _replace(base, action.option_strings[-1], value)
            else:
                argv = _positional(base, parser, action, value)
            name = action.option_strings[-1] if action.option_strings else action.dest.upper()
            yield Case(command, name, family, [*command.split(), *argv], env=dict(env), shown=value[:60])


def _replace(base: list[str], flag: str, value: str) -> list[str]:
    out, skip = [], False
    for i, word in enumerate(base):
        if skip:
            skip = False
            continue
        if word == flag:
            skip = i + 1 < len(base)
            continue
        out.append(word)
    return [*out, f"{flag}={value}"]


def _positional(base: list[str], parser: argparse.ArgumentParser, action: argparse.Action, value: str) -> list[str]:
    positionals = [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
    index = positionals.index(action)
    words = list(base)
    words[index] = value  # baselines put positionals first
    if value.startswith("-"):
        return [*words[:index], *words[index + 1:], "--", value]
    return words


def config_cases(places: _values.Places) -> Iterator[Case]:
    """Hostile TOML keys and STRATA_EDGE_*/STRATA_DEVICE_* variables for `edge config check`/`run` and devices."""
    from device._config_file import ConfigLayout  # noqa: F401  (present before and after issue 33)

    layouts = []
    from edge._provision import EDGE_LAYOUT

    layouts.append(("edge", EDGE_LAYOUT, places.fixture("edge-config")))
    try:
        from device._cli import _device_layout

        layouts.append(("device", _device_layout(), places.fixture("device-config")))
    except ImportError:
        pass
    toml_values = ["-1", "0", "nan", "inf", "-inf", "1e308", "9223372036854775807", '""', f'"{"x" * _values.BIG}"',
                   "true", "[]", "{}", '"/dev/zero"', '"/proc/self"', '"../.."', '"garbage://x"', "[1, 2]", '"\\u0000"']
    for tier, layout, config in layouts:
        assert config is not None
        base_text = config.read_text()
        commands = ["edge config check", "edge run"] if tier == "edge" else ["device config show", "device run"]
        for group, names in layout.groups.items():
            for name in names:
                for value in toml_values:
                    text = _set_toml(base_text, group, name, value)
                    for command in commands:
                        argv = [*command.split(), "--config", "case.toml"]
                        if command == "device run":
                            argv += ["--env", "CartPole-v1", "--steps", "3"]
                        yield Case(command, f"toml {group}.{name}", _toml_family(name, value), argv,
                                   files={"case.toml": text.encode()}, shown=value[:60])
                var = layout.env_prefix + name.upper()
                for family, value in [*_values.hostile({"kind": "Text"}, places)[:1], *ENV_VALUES]:
                    for command in commands:
                        argv = [*command.split(), "--config", str(config)]
                        if command == "device run":
                            argv += ["--env", "CartPole-v1", "--steps", "3"]
                        yield Case(command, f"env {var}", family, argv, env={var: value}, shown=value[:60])


ENV_VALUES = [("numbers", "nan"), ("numbers", "inf"), ("numbers", "-1"), ("numbers", "1e999"), ("paths", "/dev/zero"),
              ("paths", "/proc/self"), ("endpoints", "garbage://x"), ("text", "")]


def _toml_family(name: str, value: str) -> str:
    if len(value) > 1000:
        return "echoes"
    if value.strip('"') in ("/dev/zero", "/proc/self", "../.."):
        return "paths"
    if "garbage" in value:
        return "endpoints"
    return "numbers" if value[0] in "-0123456789ni" else "text"


def _set_toml(text: str, group: str, key: str, value: str) -> str:
    lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
    out: list[str] = []
    placed = False
    for line in lines:
        out.append(line)
        if line.strip() == f"[{group}]":
            out.append(f"{key} = {value}")
            placed = True
    if not placed:
        out += [f"[{group}]", f"{key} = {value}"]
    return "\n".join(out) + "\n"


def written_cases(places: _values.Places) -> Iterator[Case]:
    """Damaged files strata wrote itself: checkpoints, metrics, the switch log, the edge cache, kits, state."""
    run = places.fixture("run-dir")
    assert run is not None
    checkpoint = next((run / "checkpoints").glob("*.pt"))
    good = checkpoint.read_bytes()
    ckpt_variants: dict[str, bytes] = {"empty": b"", "truncated": good[: len(good) // 2], "garbage": b"\x00" * 64,
                                       "text": b"not a checkpoint\n"}
    ckpt_variants.update(_torch_variants(checkpoint))
    rel = f"run/checkpoints/{checkpoint.name}"
    for name, data in ckpt_variants.items():
        for argv in (["export", "--run", "run", "--out", "out.bundle"],
                     ["train", "--env", "CartPole-v1", "--run-dir", "run", "--total-steps", "512", "--resume",
                      "--env-mode", "sync"],
                     ["export", "--run", "run", "--out", "out.bundle", "--tier", "device", "--distill-steps", "64"]):
            yield Case(argv[0], f"checkpoint {name}", "files we wrote", argv, files={rel: data}, copy_run=True,
                       shown=name)
    metrics = (run / "metrics.jsonl").read_text().splitlines()
    first = json.loads(metrics[0])
    metric_variants = {
        "policy_version null": {**first, "policy_version": None},
        "policy_version text": {**first, "policy_version": "x"},
        "global_step null": {**first, "global_step": None},
        "global_step huge": {**first, "global_step": 10**30},
        "list": [1, 2],
    }
    for name, record in metric_variants.items():
        data = (json.dumps(record) + "\n" + "\n".join(metrics[1:]) + "\n").encode()
        for argv in (["train", "--env", "CartPole-v1", "--run-dir", "run", "--total-steps", "512", "--resume",
                      "--env-mode", "sync"], ["runs", "--root", "."]):
            yield Case(argv[0], f"metrics {name}", "files we wrote", argv, files={"run/metrics.jsonl": data},
                       copy_run=True, shown=name)
    for name, data in {"torn line": b'{"global_step": 12', "binary": b"\xff\xfe\x00"}.items():
        yield Case("train", f"metrics {name}", "files we wrote",
                   ["train", "--env", "CartPole-v1", "--run-dir", "run", "--total-steps", "512", "--resume",
                    "--env-mode", "sync"], files={"run/metrics.jsonl": data}, copy_run=True, shown=name)
        yield Case("runs", f"switches {name}", "files we wrote", ["runs", "--root", "."],
                   files={"run/switches.jsonl": data}, copy_run=True, shown=name)
    for name, data in {"pointer garbage": ("pointer.json", b"{]"), "pointer list": ("pointer.json", b"[1]"),
                       "verifier garbage": ("verifier.json", b'{"format": 1, "highest_accepted": 5}'),
                       "slot garbage": ("slots/a.bundle", b"\x00" * 100)}.items():
        target, payload = data
        for command in (["edge", "config", "check"], ["edge", "run"]):
            yield Case(" ".join(command), f"cache {name}", "files we wrote",
                       [*command, "--fleet", "fleet", "--node-id", "node-1", "--cache-dir", "cache", "--trust",
                        str(places.fixture("public-key")), "--steps", "3"],
                       files={f"cache/{target}": payload}, copy_cache=True, shown=name)
    for name, payload in {"state garbage": b"{]", "state list": b"[]", "state bad versions": b'{"format": 1, '
                          b'"highest_accepted": {"cartpole": "x"}}'}.items():
        yield Case("bundle verify", name, "files we wrote",
                   ["bundle", "verify", str(places.fixture("bundle")), "--trust", str(places.fixture("public-key")),
                    "--state", "state.json"], files={"state.json": payload}, shown=name)
    kit = places.fixture("kit")
    assert kit is not None
    for name, payload in {"kit toml garbage": b"[identity\n", "kit toml values": b'[identity]\nfleet = 5\n',
                          "kit huge": b"#" * 3_000_000}.items():
        yield Case("edge install", name, "files we wrote",
                   ["edge", "install", "--kit", "kit", "--prefix", "stage", "--dry-run"],
                   files={"kit/edge.toml": payload, "kit/signer.pub": (kit / "signer.pub").read_bytes()}, shown=name)
    for name, payload in {"infra state garbage": b"{]", "infra state wrong": b'{"schema": 1, "resources": 5}'}.items():
        yield Case("infra plan", name, "files we wrote", ["infra", "plan", "--stage", "dev", "--region", "us-east-1"],
                   env=dict(AWS_ENV), files={".strata/infra/dev.json": payload}, shown=name)


def _torch_variants(checkpoint: Path) -> dict[str, bytes]:
    import io

    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    out: dict[str, bytes] = {}

    def saved(value: Any) -> bytes:
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()

    out["no config"] = saved({k: v for k, v in state.items() if k != "config"})
    out["config list"] = saved({**state, "config": [1, 2]})
    out["config bad value"] = saved({**state, "config": {**state["config"], "num_envs": -3}})
    out["version text"] = saved({**state, "version": "x"})
    out["no agent"] = saved({k: v for k, v in state.items() if "agent" not in k})
    out["not a dict"] = saved([1, 2, 3])
    out["agent wrong shapes"] = saved({**state, **{k: {n: t[..., :1] if hasattr(t, "shape") and t.ndim else t
                                                       for n, t in v.items()}
                                                   for k, v in state.items() if "agent" in k and isinstance(v, dict)}})
    return out


# ------------------------------------------------------------------------------------------------ running


@dataclass
class Outcome:
    rc: int | None
    seconds: float
    stderr: str
    created: list[str]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def run_case(case: Case, places: _values.Places, scratch: Path, timeout: float) -> Outcome:
    from cloud.cli import main

    sandbox = places.root
    if sandbox.exists():
        shutil.rmtree(sandbox)
    sandbox.mkdir()
    tmp = scratch / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if case.copy_run:
        run = places.fixture("run-dir")
        assert run is not None
        shutil.copytree(run, sandbox / "run")
    if case.copy_cache:
        cache = places.fixture("edge-cache")
        assert cache is not None
        shutil.copytree(cache, sandbox / "cache")
    for rel, data in case.files.items():
        (sandbox / rel).parent.mkdir(parents=True, exist_ok=True)
        (sandbox / rel).write_bytes(data)
    places.prepare()
    before = _tree(sandbox) | {f"@fixtures/{p}" for p in _tree(places.fixtures_root or sandbox)}
    err_path = scratch / "stderr"
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the case
        os.setpgid(0, 0)
        rc = 1
        try:
            os.chdir(sandbox)
            for name in list(os.environ):
                if name.startswith(("STRATA_", "AWS_")):
                    del os.environ[name]
            os.environ.update(case.env)
            os.environ["TMPDIR"] = str(tmp)
            tempfile.tempdir = str(tmp)
            out = os.open(os.devnull, os.O_WRONLY)
            err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            try:
                rc = main(case.argv)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                traceback.print_exc()
                rc = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(rc if isinstance(rc, int) else 1)
    rc: int | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() - started > timeout:
            break
        time.sleep(0.02)
    seconds = time.monotonic() - started
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    if rc is None:
        os.waitpid(pid, 0)
    time.sleep(0.05)
    after = _tree(sandbox) | {f"@fixtures/{p}" for p in _tree(places.fixtures_root or sandbox)}
    created = sorted(after - before) + [f"@tmp/{p}" for p in sorted(_tree(tmp))]
    stderr = err_path.read_text(errors="replace") if err_path.exists() else ""
    return Outcome(rc=rc, seconds=seconds, stderr=stderr, created=created)


def classify(case: Case, outcome: Outcome) -> dict[str, Any]:
    lines = [ln for ln in outcome.stderr.splitlines() if ln.strip()]
    record: dict[str, Any] = {"command": case.command, "option": case.option, "family": case.family,
                              "value": case.shown, "rc": outcome.rc, "seconds": round(outcome.seconds, 2),
                              "last": (lines[-1] if lines else "")[:160]}
    if "Traceback (most recent call last)" in outcome.stderr:
        record["traceback"] = (lines[-1] if lines else "?")[:200]
    elif outcome.rc is None:
        record["ran_on"] = True
    elif outcome.rc == 2 and outcome.seconds > LATE_S:
        record["late"] = True
    if outcome.rc not in (0, 2, None) and "traceback" not in record:
        record["other_exit"] = (lines[-1] if lines else "")[:200]
    if lines and max(len(ln) for ln in lines) > 1000:
        record["echo_chars"] = max(len(ln) for ln in lines)
    if outcome.rc == 2 and len(lines) > 1:
        record["error_lines"] = len(lines)
    if outcome.rc == 2 and outcome.created:
        record["left_behind"] = outcome.created[:5]
    return record


def sample(cases: list[Case], per_option: int) -> list[Case]:
    """At most `per_option` cases of each (command, option), one of each family first, drawn with a fixed seed."""
    import random

    rng = random.Random(33)
    groups: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for case in cases:
        groups[(case.command, case.option)].append(case)
    kept: list[Case] = []
    for group in groups.values():
        rng.shuffle(group)
        by_family = {c.family: c for c in reversed(group)}
        first = list(by_family.values())
        rest = [c for c in group if c not in first]
        kept += (first + rest)[:per_option]
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default="", help="comma-separated commands to run (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated commands to leave out")
    parser.add_argument("--groups", default="options,config,written")
    parser.add_argument("--per-option", type=int, default=0,
                        help="run at most N cases per (command, option), drawn with a fixed seed (0: all)")
    args = parser.parse_args()
    import gymnasium  # noqa: F401  (warm the forked children)
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401

    from cloud.cli import build_parser

    scratch = Path(tempfile.mkdtemp(prefix="census-"))
    fixtures_root = scratch / "fixtures"
    fixtures = _fixtures.build(fixtures_root)
    places = _values.Places(root=scratch / "case", fixtures=fixtures, fixtures_root=fixtures_root)
    only = {c for c in args.only.split(",") if c}
    skip = {c for c in args.skip.split(",") if c}
    cases: list[Case] = []
    groups = set(args.groups.split(","))
    if "options" in groups:
        for command, sub in leaves(build_parser()):
            if (only and command not in only) or command in skip:
                continue
            cases += list(option_cases(command, sub, places))
    if "config" in groups:
        cases += [c for c in config_cases(places) if (not only or c.command in only) and c.command not in skip]
    if "written" in groups:
        cases += [c for c in written_cases(places) if (not only or c.command in only) and c.command not in skip]
    if args.per_option:
        cases = sample(cases, args.per_option)
    print(f"census: {len(cases)} cases", file=sys.stderr, flush=True)
    found: Counter[str] = Counter()
    distinct: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    with args.out.open("w") as out:
        for i, case in enumerate(cases):
            outcome = run_case(case, places, scratch, TIMEOUTS.get(case.command, 8.0))
            record = classify(case, outcome)
            out.write(json.dumps(record) + "\n")
            out.flush()
            if "traceback" in record:
                family = "echoes" if case.family == "echoes" else case.family
                found[family] += 1
                exc = record["traceback"].split(":")[0]
                distinct[family].add((case.command, case.option.split(" ")[0] if " " in case.option else case.option,
                                      exc))
            if i % 50 == 0:
                print(f"census: {i}/{len(cases)} {dict(found)}", file=sys.stderr, flush=True)
    print(json.dumps({"cases": len(cases), "traceback_cases": dict(found),
                      "distinct_tracebacks": {k: len(v) for k, v in distinct.items()}}))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
