"""The edge tier's exceptions; every one derives from `EdgeError` (itself a `device.StrataError`).

    EdgeError
     ├── EdgeConfigError (also ValueError)   a caller mistake: bad broker URL, topic, flag or size
     ├── PayloadError (also ValueError)      an incoming MQTT payload is malformed; names topic and problem
     ├── CacheError                          the policy cache on disk cannot be used (no valid policy)
     └── PublishError                        the broker did not acknowledge a publish in time

Link conditions (broker unreachable, queue full) are not exceptions: `edge._mqtt` reports them as states.
Messages name the call, the bad value and the fix.
"""

from __future__ import annotations

from device import StrataError


class EdgeError(StrataError):
    """Base class of every error the edge tier raises on purpose."""


class EdgeConfigError(EdgeError, ValueError):
    """A caller passed a bad value: broker URL, topic segment, payload size, flag."""


class PayloadError(EdgeError, ValueError):
    """An incoming payload does not follow the contract of its topic (see `edge._topics`)."""

    def __init__(self, topic: str, problem: str) -> None:
        super().__init__(f"payload on {topic!r} refused: {problem}")
        self.topic = topic
        self.problem = problem


class CacheError(EdgeError):
    """The on-disk policy cache holds no usable policy, or cannot be written."""


class PublishError(EdgeError):
    """A publish was not acknowledged by the broker within its deadline."""
