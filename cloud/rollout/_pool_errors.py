"""The pool's errors as gymnasium's error types, so ``except gymnasium.error.X`` works as with AsyncVectorEnv.

Each class is a `cloud._errors` class (the tree is drawn there) and the gymnasium error it stands for. An env's
own exception is re-raised as `EnvWorkerError` combined with the env's exception type (`remote_error`), so
``except ValueError`` catches a ValueError raised inside a worker while the env index and the worker's traceback
stay on the exception.
"""

from __future__ import annotations

import builtins
import sys
from typing import Any

from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError

from cloud._errors import EnvWorkerError, PoolStateError


class PoolClosedError(PoolStateError, ClosedEnvironmentError):
    """The pool was used after `close()`."""


class NoPendingCallError(PoolStateError, NoAsyncCallError):
    """A ``*_wait`` call with no matching ``*_async`` call in flight."""

    def __init__(self, message: str, name: str) -> None:
        Exception.__init__(self, message)
        self.name = name


class PendingCallError(PoolStateError, AlreadyPendingCallError):
    """A call while another one is still in flight."""

    def __init__(self, message: str, name: str) -> None:
        Exception.__init__(self, message)
        self.name = name


_COMBINED: dict[type[BaseException], type[EnvWorkerError]] = {}


def _env_exception_type(module: str, qualname: str) -> type[Exception] | None:
    """The env exception's class, looked up among modules this process has already imported (never imports)."""
    owner: Any = builtins if module == "builtins" else sys.modules.get(module)
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    if isinstance(owner, type) and issubclass(owner, Exception) and not issubclass(owner, EnvWorkerError):
        return owner
    return None


def remote_error(
    message: str, *, env_index: int, worker_index: int, remote_traceback: str, type_module: str, type_name: str
) -> EnvWorkerError:
    """An `EnvWorkerError` that is also an instance of the env's exception type where that type can be combined."""
    exc_type = _env_exception_type(type_module, type_name)
    if exc_type is not None:
        combined = _COMBINED.get(exc_type)
        if combined is None:
            try:
                combined = type(exc_type.__name__, (EnvWorkerError, exc_type), {"__module__": __name__})
            except TypeError:  # e.g. two built-in bases with different memory layouts (OSError subclasses)
                combined = EnvWorkerError
            _COMBINED[exc_type] = combined
        try:
            return combined(message, env_index=env_index, worker_index=worker_index, remote_traceback=remote_traceback)
        except Exception:  # an exception type whose constructor needs other arguments
            pass
    return EnvWorkerError(message, env_index=env_index, worker_index=worker_index, remote_traceback=remote_traceback)
