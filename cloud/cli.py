"""The `strata` command line: one parser; each tier registers its own commands from its own package.

Building the parser imports no heavy library: every command imports what it needs when it runs,
so `strata edge run` works with only the ``[edge]`` extra installed, and a missing extra prints an
install hint and exits 2 instead of a traceback.

Every command is two functions (`device.command`): its check, which validates everything the command can know
before it starts any work (the declared options are already checked by the parser), and its run, which gets
what the check returned. `main` calls the check, then the run; ``main(argv, check_only=True)`` stops after the
check, which is what ``strata edge config check`` is for the edge agent, and what the fuzz harness drives for
commands that would train or serve. A refusal is one line, ``strata COMMAND: error: ...``, exit 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from device import StrataError, shown

MAX_ERROR_CHARS = 1000
"""An error line is cut here: values in it are cut to 80 characters each, this bounds their number."""


def _one_line(message: str) -> str:
    """`message` on one line, every word of it cut to 100 characters, the whole to `MAX_ERROR_CHARS`.

    Values are quoted cut to 80 characters where the message is made (`device.shown`); this is the net for a
    word that was not (argparse's own messages, an exception's text).
    """
    text = " ".join(message.split())
    text = re.sub(r"\S{101,}", lambda m: m.group(0)[:97] + "...", text)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


class _Parser(argparse.ArgumentParser):
    """argparse with each error on one line, what is wrong and where the help is, instead of the usage dump.

    Every sub-parser is built from this class too (``add_subparsers`` makes them of the parent's type).
    """

    def error(self, message: str) -> NoReturn:
        # argparse says "argument --port: '70000': must be ..."; strata says "--port '70000': must be ...".
        message = re.sub(r"^argument ([^:]+): (?=')", r"\1 ", message)
        message = re.sub(r"^argument ([^:]+): ", r"\1: ", message)
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see `{self.prog} --help`)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        """Refuse leftovers here, so `strata train --bogus` points at `strata train --help`, not the root's.

        argparse hands a sub-command's unknown arguments up to the root parser, which would name itself; the
        innermost parser sees them first. Nothing in strata parses only the arguments it knows.
        """
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            listed = " ".join(shown(e) if len(e) > 80 else e for e in extras[:3])
            more = f" and {len(extras) - 3} more" if len(extras) > 3 else ""
            self.error(f"unrecognized arguments: {listed}{more}")
        return parsed, extras


def _name_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> None:
    """Give every leaf command its full name (``edge run``) for its error lines."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        parser.set_defaults(command_name=" ".join(path))
        return
    for name, child in subs[0].choices.items():
        _name_commands(child, (*path, name))


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
    _name_commands(parser)
    return parser


def main(argv: Sequence[str] | None = None, *, check_only: bool = False) -> int:
    """Run the CLI; return the process exit status.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).
        check_only: Stop after the command's check: every option and combination validated, nothing started,
            written or read beyond what validation reads (the fuzz harness's path for long commands).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed, e.g. for the command that resumes a run
    name = f"strata {args.command_name}"
    try:
        checked = args.check(args)
        if check_only:
            return 0
        from functions._lifetime import watch_parent

        watch_parent()  # a service started by `strata train` (STRATA_PARENT_PID) stops when the trainer is gone
        return int(args.func(args, checked) or 0)
    except StrataError as exc:
        print(f"{name}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`strata infra plan | head`): stop quietly, as other Unix tools do. Point
        # stdout at /dev/null so the interpreter's final flush does not fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:
        # The machine refused (disk full, a folder that vanished, a permission): one line naming the file. Every
        # path option is checked before any work, so this is the environment changing under a command, not a bad
        # value; exit 1 tells it apart from a refusal (2).
        where = f" {shown(str(exc.filename))}" if exc.filename else ""
        print(f"{name}: error: {exc.strerror or type(exc).__name__}{where}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
