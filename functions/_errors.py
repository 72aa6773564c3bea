"""The functions tier's exceptions: everything it raises on purpose derives from `FunctionsError`.

    StrataError (device)
     └── FunctionsError
          ├── EventError (also ValueError)   a function event failed validation (names the field and the fix)
          ├── SimulationError                 the env could not be made or stepped as the event asked
          ├── NoEnvCodecError                 an env layer has no env-state codec, so its episodes cannot be carried
          └── RuntimeConfigError (ValueError) a bad `strata functions serve` setting (function spec, fault rate)

Messages name the call, the bad value and the fix.
"""

from __future__ import annotations

from device import StrataError


class FunctionsError(StrataError):
    """Base class of the functions tier's errors."""


class EventError(FunctionsError, ValueError):
    """A function event is malformed; `field` names the offending field and `fix` says what to send."""

    def __init__(self, field: str, message: str, fix: str) -> None:
        super().__init__(f"event field {field!r}: {message}; {fix}")
        self.field = field
        self.reason = message
        self.fix = fix


class SimulationError(FunctionsError):
    """The environment named by the event could not be created or stepped."""


class NoEnvCodecError(FunctionsError):
    """An env (one of its wrapper layers) has no env-state codec; register one with `register_env_codec`."""


class RuntimeConfigError(FunctionsError, ValueError):
    """A local function runtime setting is invalid."""
