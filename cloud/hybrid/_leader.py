"""Rank 0's duties: the control endpoint, the parameter server and the status of every unit.

Only the leader (rank 0) talks to the rest of strata. `strata switch` reaches its `SwitchGate`, which holds
the request until the next update boundary; the unit loop broadcasts it, and every unit switches there.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from cloud.switching._control import SwitchRefused
from cloud.switching._switcher import Switcher, SwitchEvent
from device import write_atomic
from functions._secure import PLAINTEXT, ServiceTLS

PARAM_SERVER_FILE = "paramserver.json"
"""Written by rank 0 into the run dir: ``{"address": "HOST:PORT", "policy": NAME}`` of its parameter server."""


class SwitchGate:
    """What the control endpoint sees as the switcher on rank 0: requests wait here for the next boundary.

    It answers the questions `cloud.switching._modes.JobControl` asks a `Switcher` (mode, modes, active, history),
    from rank 0's own switcher, and refuses the same requests a switcher refuses.
    """

    def __init__(self, switcher: Switcher) -> None:
        self._switcher = switcher
        self._lock = threading.Lock()
        self._pending: tuple[str, str, Future[SwitchEvent]] | None = None
        self.total_workers = switcher.active.workers()

    @property
    def mode(self) -> str:
        """The units' current rollout mode."""
        return self._switcher.mode

    @property
    def modes(self) -> list[str]:
        """Every configured rollout mode."""
        return self._switcher.modes

    @property
    def active(self) -> SwitchGate:
        """Stands for the units' active sources: its `workers` counts every unit's."""
        return self

    def workers(self) -> int:
        """Env workers of every unit's active source, as of the last update."""
        return self.total_workers

    @property
    def history(self) -> list[SwitchEvent]:
        """Switches so far."""
        return self._switcher.history

    def request(self, to: str, *, reason: str = "manual") -> Future[SwitchEvent]:
        """Queue a switch of every unit to `to`; the future completes once rank 0 has switched."""
        with self._lock:
            if to not in self._switcher.modes:
                raise SwitchRefused(f"mode {to!r} is not configured for this run; choose one of {self.modes}")
            if self._pending is not None:
                raise SwitchRefused(f"a switch to {self._pending[0]!r} is already in progress; wait for it to finish")
            if to == self._switcher.mode:
                raise SwitchRefused(f"the run is already in mode {to!r}; nothing to do")
            future: Future[SwitchEvent] = Future()
            self._pending = (to, reason, future)
            return future

    def take(self) -> tuple[str, str, Future[SwitchEvent]] | None:
        """The queued request, if any (the boundary broadcasts it)."""
        with self._lock:
            pending, self._pending = self._pending, None
            return pending

    def cancel(self) -> None:
        """Fail a queued request: the run is ending."""
        pending = self.take()
        if pending is not None:
            pending[2].set_exception(SwitchRefused("the run ended before the switch"))


class Leader:
    """Rank 0's services for one run: parameter server, control endpoint, unit status."""

    def __init__(self, *, switcher: Switcher, env_id: str, run_dir: Path, policy: str, control: bool,
                 param_host: str, param_port: int, tls: ServiceTLS = PLAINTEXT,
                 health_port: int | None = None) -> None:
        from cloud.params._server import ParameterServer, ParamServerConfig
        from cloud.switching._modes import JobControl

        self.run_dir = Path(run_dir)
        self.policy = policy
        self.gate = SwitchGate(switcher)
        self.server = ParameterServer(ParamServerConfig(host=param_host, port=param_port, tls=tls,
                                                        health_port=health_port)).start()
        self.published = 0
        write_atomic(self.run_dir / PARAM_SERVER_FILE,
                     json.dumps({"address": self.server.address, "policy": policy}), durable=False)
        self.control: JobControl | None = None
        if control:
            self.control = JobControl(self.gate, env_id=env_id, run_dir=self.run_dir).start()  # type: ignore[arg-type]

    def publish(self, version: int, agent: Any, normalizer: Any) -> None:
        """Push policy `version` (weights and normaliser statistics) to the parameter server."""
        weights = {name: t.detach().numpy() for name, t in agent.state_dict().items()}
        weights["normalizer.mean"] = np.asarray(normalizer.mean, dtype=np.float64)
        weights["normalizer.var"] = np.asarray(normalizer.var, dtype=np.float64)
        self.server.push(self.policy, weights, version=version)
        self.published += 1

    def update(self, **values: Any) -> None:
        """Refresh the status the control endpoint serves."""
        if self.control is not None:
            self.gate.total_workers = sum(int(unit["workers"]) for unit in values.get("units", ()))
            self.control.update(param_server=self.server.address, **values)

    def close(self) -> None:
        """Stop serving; fail a switch still queued."""
        self.gate.cancel()
        if self.control is not None:
            self.control.stop()
            self.control = None
        self.server.stop()
        (self.run_dir / PARAM_SERVER_FILE).unlink(missing_ok=True)
