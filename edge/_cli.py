"""Edge-tier commands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the edge tier's commands to the root parser."""
