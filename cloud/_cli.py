"""Cloud-tier commands: demo (and, as they land, train, export, switch, status, runs, publish)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the cloud tier's commands to the root parser."""
    demo = sub.add_parser(
        "demo",
        help="run the whole strata story on one machine with embedded defaults",
        description="Run strata end to end on embedded defaults and write a report folder.",
    )
    demo.add_argument("--out", default="demo-report", help="report folder to write (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    demo.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from cloud._demo import DemoConfig, run_demo

    return run_demo(DemoConfig(out=args.out, seed=args.seed))
