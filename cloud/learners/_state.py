"""`clone_state`: a snapshot of a learner's state tree that later optimiser steps cannot change."""

from __future__ import annotations

from typing import Any


def clone_state(value: Any) -> Any:
    """A copy of a state dict tree whose tensors are detached clones (containers copied, scalars shared)."""
    if hasattr(value, "detach") and hasattr(value, "clone"):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: clone_state(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(clone_state(v) for v in value)
    return value
