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


def make_env(env_id: str, *, command: str, extra: str) -> object:
    """``gymnasium.make(env_id)``, every refusal one line naming `command`: not registered, or a missing package.

    Raises:
        MissingDependencyError: gymnasium, or a package the env needs (Box2D, MuJoCo), is not installed.
        ConfigError: `env_id` is not a registered env, or gymnasium refuses to make it.
    """
    from device._errors import ConfigError
    from device._names import shown

    gym = require("gymnasium", extra=extra, purpose=f"the env of `{command}`")
    try:
        return gym.make(env_id)
    except gym.error.DependencyNotInstalled as exc:
        raise MissingDependencyError(f"{command}: env {shown(env_id)} needs a package that is not installed: "
                                     f"{shown(str(exc), 160)}") from None
    except ImportError as exc:  # an env whose module imports an optional package at make time
        raise MissingDependencyError(f"{command}: env {shown(env_id)} needs a package that is not installed: "
                                     f"{shown(str(exc), 160)}") from None
    except gym.error.Error as exc:
        raise ConfigError(f"{command}: --env {shown(env_id)} cannot be made: {shown(str(exc), 160)}; pass a "
                          "registered gymnasium env id such as CartPole-v1") from None
