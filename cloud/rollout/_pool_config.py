"""The shared-memory pool's contract: its config, its counters and the spin-time rule (no gymnasium import).

`cloud.rollout._colocated` (the light public face) and the pool's implementation modules both import from here, so
neither imports the other at module level.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from device import ConfigError


@dataclass(frozen=True, kw_only=True)
class ColocatedConfig:
    """How the shared-memory worker pool runs its workers."""

    # Processes
    num_workers: int | None = None
    """Worker processes; None means one per CPU (at most one per env). Envs are split evenly between them."""
    context: str | None = None
    """multiprocessing start method (fork, forkserver, spawn); None uses the platform default."""

    # Waiting
    worker_spin_us: float | None = None
    """How long a worker polls (yielding the CPU) for its next command before it blocks, in microseconds;
    None: 100 if the host has a core to spare for it (cpu_count >= num_workers + 2), else 0 (block at once)."""
    parent_spin_us: float | None = None
    """How long the parent polls for a worker's results before it blocks, in microseconds; None: 50 if the host
    has a core to spare (cpu_count >= num_workers + 2), else 0."""

    # Faults
    step_timeout_s: float = 60.0
    """A worker that does not finish a step or call within this many seconds counts as hung and is restarted."""
    start_timeout_s: float = 120.0
    """How long a (re)started worker may take to build its envs."""
    close_timeout_s: float = 5.0
    """How long close() waits for workers to exit before killing them."""
    on_env_error: Literal["raise", "restart"] = "raise"
    """An exception inside an env: raise EnvWorkerError (worker restarted), or restart the worker and go on."""
    on_worker_failure: Literal["restart", "raise"] = "restart"
    """A crashed or hung worker: restart it and go on, or restart it and raise WorkerFailedError."""

    # Buffers
    info_bytes: int = 1 << 16
    """Shared-memory bytes per worker and slot for the (encoded) infos of one step; only non-empty infos use it."""

    def __post_init__(self) -> None:
        if self.num_workers is not None and self.num_workers < 1:
            raise ConfigError(f"ColocatedConfig.num_workers must be >= 1 or None, got {self.num_workers}")
        if self.on_env_error not in ("raise", "restart"):
            raise ConfigError(f"ColocatedConfig.on_env_error must be 'raise' or 'restart', got {self.on_env_error!r}")
        if self.on_worker_failure not in ("restart", "raise"):
            raise ConfigError(
                f"ColocatedConfig.on_worker_failure must be 'restart' or 'raise', got {self.on_worker_failure!r}"
            )
        for name in ("worker_spin_us", "parent_spin_us"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(f"ColocatedConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("step_timeout_s", "start_timeout_s", "close_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ColocatedConfig.{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.info_bytes < 1024:
            raise ConfigError(f"ColocatedConfig.info_bytes must be >= 1024, got {self.info_bytes}")


@dataclass(kw_only=True)
class PoolCounters:
    """What the pool's fault isolation has done so far (read `pool.counters`)."""

    worker_restarts: int = 0
    """Workers replaced for any reason."""
    worker_crashes: int = 0
    """Workers found dead while stepping."""
    worker_timeouts: int = 0
    """Workers that did not finish a step within step_timeout_s."""
    env_errors: int = 0
    """Steps in which an env raised."""
    dropped_episodes: int = 0
    """Episodes cut short by a restart (one per env of each restarted worker)."""


def spin_times_us(config: ColocatedConfig, num_workers: int) -> tuple[float, float]:
    """The (worker, parent) spin times in microseconds that `config` asks for on this host.

    Spinning only pays when the spinner has a core of its own: on the 2-core host with 2 workers and the
    parent, blocking at once measured 32k vs 18k steps/s (2x1 CartPole) and 95k vs 83k (2x32) under load.
    """
    spare = (os.cpu_count() or 1) >= num_workers + 2
    worker = config.worker_spin_us if config.worker_spin_us is not None else (100.0 if spare else 0.0)
    parent = config.parent_spin_us if config.parent_spin_us is not None else (50.0 if spare else 0.0)
    return worker, parent
