"""Co-located mode: `SharedMemoryVectorEnv`, a shared-memory env worker pool that is a gymnasium VectorEnv.

This module is light (no gymnasium import); the implementation lives in `cloud._shm_pool` and is imported
on first use, so ``import cloud`` stays fast (tests/test_import_weight.py).

What a step returns, per env, in each autoreset mode (the same as `gymnasium.vector.AsyncVectorEnv`):

- ``NEXT_STEP`` (gymnasium's default): the step that ends an episode returns its last observation with
  ``terminated``/``truncated`` set; the env's *next* step ignores its action, resets the env and returns the
  first observation with reward 0 and both flags False. A truncated episode bootstraps from the observation
  returned with ``truncated=True``.
- ``SAME_STEP``: the step that ends an episode resets the env at once and returns the new episode's first
  observation; ``info["final_obs"][i]`` (with mask ``info["_final_obs"]``) holds the real last observation
  and ``info["final_info"]`` the last step's info, so truncated episodes bootstrap from ``final_obs``.

Fault isolation. When a worker process crashes, hangs past ``step_timeout_s``, or (with
``on_env_error="restart"``) one of its envs raises, the pool kills it, starts a fresh one with new envs
(unseeded) and counts ``worker_restarts`` and ``dropped_episodes`` (one per env of the worker) in
`PoolCounters`. Each env of that worker answers its next step, once, with the dropped episode:

- reward 0.0, ``terminated=False``, ``truncated=True`` and ``info["worker_restarted"]=True``;
- ``NEXT_STEP``: the observation is the last one the old worker wrote for that env (the episode's last
  known state); the following step resets the env as after any truncation;
- ``SAME_STEP``: the observation is the new episode's first one; ``info["final_obs"]`` is the last known one.

A step in flight when the worker failed is re-run for that worker only (the actions are still in shared
memory), so the call returns normally. With ``on_worker_failure="raise"`` the pool restarts the worker
and raises `WorkerFailedError` instead; with ``on_env_error="raise"`` (the default, like AsyncVectorEnv)
an env exception restarts its worker and raises `EnvWorkerError` with the env index and the worker's
traceback (that step's results are lost; the restarted envs report truncated on their next step).

Where it differs from AsyncVectorEnv: spaces must be Box, Discrete, MultiDiscrete or MultiBinary (one
fixed-shape array each); ``autoreset_mode=DISABLED`` and ``render`` are not supported; an env's exception
arrives as `EnvWorkerError` (env index, worker traceback) rather than re-raised as its own type. With
``vector_env_fns`` worker ``w`` is reset with ``seeds[w * K]`` (vector envs take one seed), ``call``/
``get_attr`` return one result per worker, and ``reset_mask`` is refused.

Inference placement: by default the learner chooses the actions (`step` with a batch from the parent,
which is what PPO needs for log-probs and values); ``worker_policy`` + `act_step` runs a per-worker copy of
the policy instead. benchmarks/colocated_throughput.py measures both (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from cloud._envs import VECTOR_ENV_MODES
from device import ConfigError

if TYPE_CHECKING:
    import numpy as np


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


def _impl() -> Any:
    from cloud import _shm_pool

    return _shm_pool.SharedMemoryVectorEnv


# --- hack: a lazy class ------------------------------------------------------------------------------------
# The pool must subclass gymnasium's VectorEnv, but `import cloud` must not import gymnasium
# (tests/test_import_weight.py). This stand-in builds the real class (cloud._shm_pool.SharedMemoryVectorEnv)
# on first use: calling it returns an instance of the real class, and isinstance/issubclass/attribute
# lookups are forwarded to it.
class _LazyPoolType(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _impl())

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _impl())

    def __getattr__(cls, name: str) -> Any:
        return getattr(_impl(), name)


class SharedMemoryVectorEnv(metaclass=_LazyPoolType):
    """A `gymnasium.vector.VectorEnv` whose envs step in worker processes, exchanging data in shared memory.

    A drop-in for ``AsyncVectorEnv(env_fns, shared_memory=True)``: same reset/step/close semantics, batched
    spaces, ``reset(seed=int|list, options={"reset_mask": ...})``, autoreset modes NEXT_STEP and SAME_STEP (see
    the module docstring of `cloud._colocated`), info conventions, `call`/`get_attr`/`set_attr`, plus
    `step_async`/`step_wait(timeout)` and `reset_async`/`reset_wait(timeout)`. Observations and actions must
    be Box, Discrete, MultiDiscrete or MultiBinary.

    Unlike AsyncVectorEnv there is no pipe message per step: observations, actions, rewards, flags and final
    observations live in one 64-byte-aligned shared-memory segment, and workers and parent signal each other
    through shared counters and semaphores with a spin-then-block wait (spinning only where a core is spare;
    see `ColocatedConfig`). Each worker steps several envs
    (``len(env_fns) / num_workers``), or one numpy-vectorised env (``vector_env_fns``).

    Double buffering: the envs form two halves (`half_indices(0)`, `half_indices(1)`). A learner can run the
    policy on one half while the workers step the other::

        a0 = policy(obs[pool.half_indices(0)]); pool.step_half_async(0, a0)
        a1 = policy(obs[pool.half_indices(1)]); pool.step_half_async(1, a1)
        while training:
            obs0, r0, te0, tr0, info0 = pool.step_half_wait(0)   # half 1 is still stepping
            pool.step_half_async(0, policy(obs0))
            obs1, r1, te1, tr1, info1 = pool.step_half_wait(1)
            pool.step_half_async(1, policy(obs1))

    With two or more envs per worker each worker's envs are split between the halves; with one env per
    worker, or vector envs, whole workers alternate (worker w is in half w % 2).

    Args:
        env_fns: One factory per env (split contiguously over the workers). Exclusive with `vector_env_fns`.
        vector_env_fns: One factory per worker, each returning a gymnasium VectorEnv (e.g. ``gymnasium.make_vec(
            id, num_envs=K, vectorization_mode="vector_entry_point")``); its autoreset mode must match.
        config: `ColocatedConfig` (workers, spin times, timeouts, fault policy).
        autoreset_mode: ``"NextStep"`` (default) or ``"SameStep"`` (or the AutoresetMode members).
        copy: Return copies of the observations from `step`/`reset` (True) or a view of shared memory.
        worker_policy: Optional factory, run in each worker, of a function obs[k, ...] -> actions[k, ...]; enables
            `act_step`, where the workers choose actions themselves (per-worker inference).

    Attributes:
        counters: `PoolCounters` of restarts, crashes, timeouts, env errors and dropped episodes.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _impl()(*args, **kwargs)

    @staticmethod
    def make(
        env_id: str,
        *,
        num_workers: int,
        envs_per_worker: int,
        vectorized: bool = False,
        config: ColocatedConfig | None = None,
        autoreset_mode: str = "NextStep",
        copy: bool = True,
        env_kwargs: dict[str, Any] | None = None,
        worker_policy: Callable[[], Callable[[np.ndarray], np.ndarray]] | None = None,
    ) -> Any:
        """Build a pool of ``num_workers x envs_per_worker`` envs of a registered gymnasium id.

        Args:
            env_id: A gymnasium id, e.g. ``"CartPole-v1"``.
            num_workers: Worker processes.
            envs_per_worker: Envs each worker steps.
            vectorized: Give each worker one ``gymnasium.make_vec(env_id, num_envs=envs_per_worker,
                vectorization_mode="vector_entry_point")`` instead of `envs_per_worker` single envs.
            config: Pool options; its ``num_workers`` is replaced by `num_workers`.
            autoreset_mode: ``"NextStep"`` or ``"SameStep"``.
            copy: See the class.
            env_kwargs: Keyword arguments for ``gymnasium.make`` / ``make_vec``.
            worker_policy: See the class.
        """
        import dataclasses

        import gymnasium as gym

        base = config or ColocatedConfig()
        cfg = dataclasses.replace(base, num_workers=num_workers)
        kwargs = env_kwargs or {}
        if vectorized:
            vec_fn = functools.partial(
                gym.make_vec, env_id, num_envs=envs_per_worker, vectorization_mode="vector_entry_point", **kwargs
            )
            return _impl()(
                vector_env_fns=[vec_fn] * num_workers,
                config=cfg,
                autoreset_mode=autoreset_mode,
                copy=copy,
                worker_policy=worker_policy,
            )
        env_fn = functools.partial(gym.make, env_id, **kwargs)
        return _impl()(
            [env_fn] * (num_workers * envs_per_worker),
            config=cfg,
            autoreset_mode=autoreset_mode,
            copy=copy,
            worker_policy=worker_policy,
        )


def build_colocated_vector_env(env_id: str, *, num_envs: int, seed: int, config: ColocatedConfig | None = None) -> Any:
    """`cloud._envs.make_vector_env`'s ``mode="colocated"`` builder: a SAME_STEP pool, reset with `seed`.

    The envs are split over as many workers as there are CPUs (the largest divisor of `num_envs` not above
    ``os.cpu_count()``), unless ``config.num_workers`` says otherwise; env ``i`` is reset with ``seed + i``.
    """
    import dataclasses

    import gymnasium as gym

    cfg = config or ColocatedConfig()
    if cfg.num_workers is None:
        cpus = os.cpu_count() or 1
        workers = max(w for w in range(1, min(cpus, num_envs) + 1) if num_envs % w == 0)
        cfg = dataclasses.replace(cfg, num_workers=workers)
    pool = _impl()(
        [functools.partial(gym.make, env_id)] * num_envs, config=cfg, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    try:
        pool.reset(seed=seed)
    except BaseException:
        pool.close()
        raise
    return pool


# Registering a builder is a dict insertion: `make_vector_env(..., mode="colocated")` works once cloud is imported.
VECTOR_ENV_MODES["colocated"] = build_colocated_vector_env
