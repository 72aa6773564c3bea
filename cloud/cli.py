"""The `strata` command line: one parser; each tier registers its own commands from its own package.

Building the parser imports no heavy library: every command imports what it needs when it runs,
so `strata edge run` works with only the ``[edge]`` extra installed, and a missing extra prints an
install hint and exits 2 instead of a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from device import StrataError


class _Parser(argparse.ArgumentParser):
    """argparse with each error on one line, what is wrong and where the help is, instead of the usage dump.

    Every sub-parser is built from this class too (``add_subparsers`` makes them of the parent's type).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        """Refuse leftovers here, so `strata train --bogus` points at `strata train --help`, not the root's.

        argparse hands a sub-command's unknown arguments up to the root parser, which would name itself; the
        innermost parser sees them first. Nothing in strata parses only the arguments it knows.
        """
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    """Return the full `strata` parser with every tier's commands registered."""
    from cloud import _cli as cloud_cli
    from device import _cli as device_cli
    from edge import _cli as edge_cli
    from functions import _cli as functions_cli
    from infra import _cli as infra_cli

    parser = _Parser(
        prog="strata",
        description="Train RL policies in the cloud, run them at the edge. "
        "Start with `strata demo`; every command has --help.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for tier in (cloud_cli, device_cli, edge_cli, functions_cli, infra_cli):
        tier.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed, e.g. for the command that resumes a run
    from functions._lifetime import watch_parent

    watch_parent()  # a service started by `strata train` (STRATA_PARENT_PID) stops when the trainer is gone
    try:
        return int(args.func(args) or 0)
    except StrataError as exc:
        print(f"strata {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"strata {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`strata infra plan | head`): stop quietly, as other Unix tools do. Point
        # stdout at /dev/null so the interpreter's final flush does not fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
