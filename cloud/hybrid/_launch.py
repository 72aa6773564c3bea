"""Starting the units: under torchrun every process is one unit; otherwise torch's elastic launcher starts them.

The local launcher is `torch.distributed.launcher.api.elastic_launch`, the API torchrun itself runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from pathlib import Path
from typing import Any

from cloud._errors import HybridError
from cloud.hybrid._config import DEFAULT_UNITS, UnitSpec, under_torchrun
from cloud.hybrid._unit import HybridResult, run_unit
from cloud.runs._run import RunSpec, open_run
from cloud.runs._stop import StopSignal
from device import ConfigError

UNIT_MODES = ("colocated", "sync", "decoupled")
"""Rollout modes a unit can use (the fragment modes export a bundle per version, which units do not do yet)."""


def check_spec(spec: UnitSpec) -> None:
    """Refuse, with one line naming the fix, what every unit would refuse: do it once, before starting them."""
    from cloud.rollout._envs import probe_spaces

    modes = spec.switching.modes or ("colocated",)
    unknown = [m for m in modes if m not in UNIT_MODES]
    if unknown:
        raise ConfigError(f"train --modes hybrid: units cannot use modes {unknown}; choose from {list(UNIT_MODES)} "
                          "(e.g. --modes hybrid colocated decoupled)")
    workers = spec.hybrid.workers_per_unit
    if workers is not None and workers > spec.config.num_envs:
        raise ConfigError(f"train --modes hybrid: --workers-per-unit {workers} is more than --num-envs "
                          f"{spec.config.num_envs} (per unit); every worker needs an env")
    probe_spaces(spec.env_id)
    if under_torchrun() and spec.hybrid.max_restarts:
        raise ConfigError(f"train --modes hybrid: --max-restarts {spec.hybrid.max_restarts} applies when strata starts "
                          "the units; under torchrun pass torchrun's own --max-restarts")
    if not under_torchrun():  # the units check again (a torchrun restart resumes); here it fails before any starts
        open_run(RunSpec(algo="ppo", env_id=spec.env_id, run_dir=Path(spec.run_dir), total_steps=spec.total_steps,
                         resume=spec.resume), trim=False)


def train_hybrid(spec: UnitSpec) -> HybridResult:
    """Train with hybrid units; return rank 0's result.

    Under torchrun (``torchrun ... strata train --modes hybrid ...``) this process is one unit and the call
    returns its own result once the group is done. Otherwise it starts ``spec.hybrid.units`` units on this
    host (c10d rendezvous on 127.0.0.1) and restarts the whole group up to ``spec.hybrid.max_restarts`` times
    after a unit fails, every restart resuming from the last checkpoint.

    Raises:
        ConfigError: A bad spec (checked here before any unit starts).
        HybridError: A unit failed and no restart was left (the message names the unit and its error).
    """
    spec = spec.replace(switching=_unit_switching(spec))
    check_spec(spec)
    if under_torchrun():
        return run_unit(spec)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    units = spec.hybrid.units or DEFAULT_UNITS
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=units, run_id=f"strata-{uuid.uuid4().hex[:12]}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=spec.hybrid.max_restarts,
                          monitor_interval=0.1, start_method="spawn", signals_to_handle="SIGQUIT")
    # The elastic agent would turn SIGTERM/SIGINT/SIGHUP into its own shutdown: SIGTERM to the units, then 30 s of
    # waiting for units that have returned but wait for the agent to read their results, then SIGKILL. This
    # process handles them instead (`_Forward`): each unit stops at the same update boundary and returns, the
    # agent collects the results as on any finish, and the caller gets a `StopSignal` (exit 128 + N).
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    forward = _Forward().install()
    # A failed unit is one HybridError line below (and rank 0's stop line); torch's own logging of it, with the
    # launcher's traceback, is noise.
    quiet = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        outputs: dict[int, Any] = elastic_launch(launch, run_unit)(spec.replace(hybrid=_fixed_units(spec, units)))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        message = str(failure.message).strip().splitlines()
        detail = message[0] if message else f"exit code {failure.exitcode}"
        raise HybridError(f"train --modes hybrid: unit {rank} failed: {detail}") from None
    except SignalException as exc:
        # A second signal, or SIGQUIT: the agent shut the units down at once; rank 0 wrote what it could.
        raise StopSignal(int(exc.sigval)) from None
    finally:
        os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)  # the launcher leaves it set for the units
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)
    result: HybridResult = outputs[0]
    if forward.signum is not None:  # the units stopped at an update boundary; rank 0 printed the stop line
        raise StopSignal(forward.signum)
    return result


class _Forward:
    """The launcher's SIGTERM/SIGINT/SIGHUP: passed on to the units, which stop at their next update boundary.

    A signal sent to the whole process group (Ctrl-C, `timeout`, systemd) reaches the units as well; a unit counts
    the two deliveries as one (`cloud.hybrid._unit`). A second signal here stops the launcher at once.
    """

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> _Forward:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise StopSignal(signum)
        self.signum = signum
        for pid in _unit_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM if signum == signal.SIGHUP else signum)


def _unit_processes() -> list[int]:
    """This process's children that the launcher spawned as units (not multiprocessing's resource tracker)."""
    found = []
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2:].split()[1] == me and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def _unit_switching(spec: UnitSpec) -> Any:
    import dataclasses

    return dataclasses.replace(spec.switching, modes=spec.switching.modes or ("colocated",))


def _fixed_units(spec: UnitSpec, units: int) -> Any:
    import dataclasses

    return dataclasses.replace(spec.hybrid, units=units)
