"""Write docs/cli.md, the CLI reference, from the `strata` parser itself (`--check` verifies it is current)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cloud.cli import build_parser

OUT = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


Command = tuple[tuple[str, ...], argparse.ArgumentParser]


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[Command]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _walk(child, (*path, name))
    return found


def render() -> str:
    """Return the CLI reference as markdown."""
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal width; pin it so the file is stable
    parts = ["# strata CLI reference", "",
             "Generated from the parser by `scripts/gen_cli_docs.py`; do not edit by hand.", ""]
    for path, parser in _walk(build_parser(), ()):
        if not path:
            continue
        parser.prog = "strata " + " ".join(path)
        parts += [f"## `strata {' '.join(path)}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def main() -> int:
    """Write (or with --check, verify) docs/cli.md."""
    text = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            print("docs/cli.md is out of date: run .venv/bin/python scripts/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
