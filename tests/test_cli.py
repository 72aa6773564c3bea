"""The CLI as a whole: every command has useful --help, bad flags and missing extras fail clearly."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from cloud.cli import build_parser
from tests._cli import run_strata


def leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix]
    found: list[tuple[str, ...]] = []
    for name, child in subs[0].choices.items():
        found += leaf_commands(child, (*prefix, name))
    return found


COMMANDS = leaf_commands(build_parser())


def test_there_are_commands() -> None:
    assert ("demo",) in COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command: tuple[str, ...]) -> None:
    result = run_strata(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: strata " + " ".join(command) in result.stdout
    # Useful help: the command describes itself and documents every option it takes.
    assert len(result.stdout.splitlines()) >= 3


@pytest.mark.parametrize("command", [("demo",), ("functions", "serve")], ids=lambda c: " ".join(("strata", *c)))
def test_unknown_flag_is_one_line_naming_the_flag_and_the_commands_help(command: tuple[str, ...]) -> None:
    result = run_strata(*command, "--no-such-flag")
    assert result.returncode == 2
    prog = " ".join(("strata", *command))
    [line] = result.stderr.strip().splitlines()
    assert line == f"{prog}: error: unrecognized arguments: --no-such-flag (see `{prog} --help`)"


def test_missing_extra_prints_install_hint_not_traceback() -> None:
    # Make gymnasium unimportable, as on a machine without the extra, then run the demo.
    code = ("import sys; sys.modules['gymnasium'] = None; from cloud.cli import main; "
            "sys.exit(main(['demo', '--out', sys.argv[1]]))")
    result = subprocess.run([sys.executable, "-c", code, "unused-out"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "pip install 'strata[cloud]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_cli_reference_is_current() -> None:
    result = subprocess.run([sys.executable, "scripts/gen_cli_docs.py", "--check"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("args", "flag", "value", "expected"), [
    (("train", "--env", "CartPole-v1"), "--target-return", "nan", "must be a finite number"),
    (("train", "--env", "CartPole-v1"), "--rolling-checkpoint-s", "-1",
     "must be a finite number of seconds from 0 to 86400"),
    (("switch", "run", "--to", "colocated"), "--timeout", "nan",
     "must be a finite number of seconds above 0 and at most 86400"),
    (("export", "--run", "run", "--out", "x.bundle"), "--ttl-s", "inf", "must be a finite number of seconds above 0"),
    (("functions", "serve"), "--throttle-rate", "nan", "must be a finite number from 0 to 1"),
    (("functions", "serve"), "--cold-start-delay", "inf", "must be a finite number of seconds from 0 to 900"),
    (("functions", "serve"), "--idle-timeout", "-5", "must be a finite number of seconds above 0"),
    (("envs", "serve"), "--duration", "nan", "must be a finite number of seconds from 0 to"),
])
def test_number_flags_refuse_nan_infinities_and_out_of_range_values(
        args: tuple[str, ...], flag: str, value: str, expected: str, tmp_path: Path) -> None:
    """Python's float() takes "nan" and "inf": these flags would have waited forever or compared false."""
    (tmp_path / "run").mkdir()
    result = run_strata(*args, f"{flag}={value}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()  # one line: no usage dump
    assert f"error: {flag} '{value}': {expected}" in line and line.endswith("--help`)"), line
