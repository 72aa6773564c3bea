"""Lazy imports of optional dependencies, failing with an install hint instead of a traceback."""

from __future__ import annotations

import importlib
from types import ModuleType

from device._errors import MissingDependencyError


def require(module: str, *, extra: str, purpose: str = "") -> ModuleType:
    """Import `module`, or raise `MissingDependencyError` naming the extra that provides it.

    Args:
        module: Dotted module name, e.g. ``"onnxruntime"``.
        extra: The strata extra that installs it, e.g. ``"edge"``.
        purpose: What the caller needs it for, shown in the message.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f" for {purpose}" if purpose else ""
        raise MissingDependencyError(
            f"{module!r} is needed{why} but is not installed; install it with: pip install 'strata[{extra}]'"
        ) from exc
