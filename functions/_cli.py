"""Functions-tier commands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the functions tier's commands to the root parser."""
    from functions._envservice import register_cli as register_envs

    register_envs(sub)  # `strata envs serve` (the gRPC env service)
