"""Switching: the switcher that moves a live run between rollout modes, and the control endpoint that drives it.

The switcher's state machine, its rules, the wiring of modes into sources, and `strata switch`, `status`, `runs`.
"""

from cloud.switching._control import ControlClient, ControlError, RunStatus, SwitchRefused, list_runs
from cloud.switching._modes import JobControl, SwitchingConfig
from cloud.switching._switcher import Switcher, SwitchError, SwitchEvent, SwitchRules

__all__ = [
    "ControlClient",
    "ControlError",
    "JobControl",
    "RunStatus",
    "SwitchError",
    "SwitchEvent",
    "SwitchRefused",
    "SwitchRules",
    "Switcher",
    "SwitchingConfig",
    "list_runs",
]
