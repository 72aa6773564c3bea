"""Co-located mode: `SharedMemoryVectorEnv`, a shared-memory env worker pool that is a gymnasium VectorEnv.

This module is light (no gymnasium import); the implementation lives in `cloud.rollout._shm_pool` and is imported
on first use, so ``import cloud`` stays fast (tests/test_import_weight.py).

What a step returns, per env, in each autoreset mode (the same as `gymnasium.vector.AsyncVectorEnv`):

- ``NEXT_STEP`` (gymnasium's default): the step that ends an episode returns its last observation with
  ``terminated``/``truncated`` set; the env's *next* step ignores its action, resets the env and returns the
  first observation with reward 0 and both flags False. A truncated episode bootstraps from the observation
  returned with ``truncated=True``.
- ``SAME_STEP``: the step that ends an episode resets the env at once and returns the new episode's first
  observation; ``info["final_obs"][i]`` (with mask ``info["_final_obs"]``) holds the real last observation
  and ``info["final_info"]`` the last step's info, so truncated episodes bootstrap from ``final_obs``.
- ``DISABLED``: envs are never reset by a step; the caller resets the ended ones with
  ``reset(options={"reset_mask": ended})``.

Fault isolation. When a worker process crashes, hangs past ``step_timeout_s``, or (with
``on_env_error="restart"``) one of its envs raises, the pool kills it, starts a fresh one with new envs
(unseeded) and counts ``worker_restarts`` and ``dropped_episodes`` (one per env of the worker) in
`PoolCounters`. Each env of that worker answers its next step, once, with the dropped episode:

- reward 0.0, ``terminated=False``, ``truncated=True`` and ``info["worker_restarted"]=True``;
- ``NEXT_STEP``: the observation is the last one the old worker wrote for that env (the episode's last
  known state); the following step resets the env as after any truncation;
- ``SAME_STEP``: the observation is the new episode's first one; ``info["final_obs"]`` is the last known one.
- ``DISABLED``: as NEXT_STEP, without the reset (the caller resets the env).

With spaces other than the fixed-shape four (below) the last observation is not kept across a restart: the
env is reset and its first observation is returned (and is ``final_obs`` in SAME_STEP).

A step in flight when the worker failed is re-run for that worker only (the actions are still in shared
memory), so the call returns normally. With ``on_worker_failure="raise"`` the pool restarts the worker
and raises `WorkerFailedError` instead; with ``on_env_error="raise"`` (the default, like AsyncVectorEnv)
an env exception restarts its worker and is re-raised as the env's own exception type (an `EnvWorkerError`
subclass that also carries the env index and the worker's traceback). A ``timeout`` passed to a ``*_wait``
call that expires restarts the workers that did not answer and raises `WorkerTimeoutError`, a
``multiprocessing.TimeoutError`` as AsyncVectorEnv raises.

Drop-in for AsyncVectorEnv: the constructor takes AsyncVectorEnv's arguments in its order (``env_fns,
shared_memory, copy, context, daemon, worker, observation_mode, autoreset_mode, max_concurrency``) and
gymnasium's own ``tests/vector`` passes with the pool swapped in (`scripts/gymnasium_conformance.sh`). What
differs: a custom ``worker`` function is refused (ValueError); a worker process steps several envs; the pool
restarts a crashed or hung worker instead of leaving it dead; an env that raised is rebuilt with its worker
(AsyncVectorEnv shuts that env's process down). Spaces: Box, Discrete, MultiDiscrete and MultiBinary go
through the shared-memory fast path; Tuple, Dict, Text and OneOf through gymnasium's shared-memory utilities
(``gymnasium.vector.utils``); Graph, Sequence and custom spaces need ``shared_memory=False`` and travel over the
pipe, as with AsyncVectorEnv. With ``vector_env_fns`` worker ``w`` is reset with ``seeds[w * K]`` (vector envs
take one seed), ``call``/``get_attr`` return one result per worker, and ``reset_mask`` is refused.

Inference placement: by default the learner chooses the actions (`step` with a batch from the parent,
which is what PPO needs for log-probs and values); ``worker_policy`` + `act_step` runs a per-worker copy of
the policy instead. benchmarks/colocated_throughput.py measures both (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cloud.rollout._envs import VECTOR_ENV_MODES
from cloud.rollout._pool_config import ColocatedConfig, PoolCounters, spin_times_us
from device import ObsPipeline, env_maker

__all__ = ["ColocatedConfig", "PoolCounters", "SharedMemoryVectorEnv", "build_colocated_vector_env", "spin_times_us"]

if TYPE_CHECKING:
    import numpy as np


def _impl() -> Any:
    from cloud.rollout import _shm_pool

    return _shm_pool.SharedMemoryVectorEnv


# --- hack: a lazy class ------------------------------------------------------------------------------------
# The pool must subclass gymnasium's VectorEnv, but `import cloud` must not import gymnasium
# (tests/test_import_weight.py). This stand-in builds the real class (cloud.rollout._shm_pool.SharedMemoryVectorEnv)
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

    A drop-in for ``gymnasium.vector.AsyncVectorEnv``, with its constructor arguments: same reset/step/close
    semantics, batched spaces, ``reset(seed=int|list, options={"reset_mask": ...})``, autoreset modes
    NEXT_STEP, SAME_STEP and DISABLED (see the module docstring of `cloud.rollout._colocated`), info conventions,
    `call`/`get_attr`/`set_attr`/`render`, `step_async`/`step_wait(timeout)`, `reset_async`/`reset_wait(timeout)`
    and gymnasium's error types. Fixed-shape Box, Discrete, MultiDiscrete and MultiBinary spaces take the fast
    path described here; the module docstring says how other spaces travel.

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
        env_fns: One factory per env (split contiguously and as evenly as possible over the workers; cloudpickled,
            so lambdas work with every start method). Exclusive with `vector_env_fns`.
        shared_memory: False carries observations over the pipe (any space), as AsyncVectorEnv does.
        copy: Return copies of the observations from `step`/`reset` (True) or a view of shared memory.
        context: multiprocessing start method (fork, forkserver, spawn); or set ``ColocatedConfig.context``.
        daemon: Start the workers as daemon processes (AsyncVectorEnv's meaning).
        worker: AsyncVectorEnv's custom worker function: not supported, anything but None is refused.
        observation_mode: ``"same"``, ``"different"`` or (batched space, single space), as AsyncVectorEnv.
        autoreset_mode: ``"NextStep"`` (default), ``"SameStep"`` or ``"Disabled"`` (or the AutoresetMode members).
        max_concurrency: At most this many envs in ``reset``/``step`` at once over all workers (None: no limit).
        vector_env_fns: One factory per worker, each returning a gymnasium VectorEnv (e.g. ``gymnasium.make_vec(
            id, num_envs=K, vectorization_mode="vector_entry_point")``); its autoreset mode must match.
        config: `ColocatedConfig` (workers, spin times, timeouts, fault policy).
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


def build_colocated_vector_env(env_id: str, *, num_envs: int, seed: int, config: ColocatedConfig | None = None,
                               pipeline: ObsPipeline | None = None) -> Any:
    """`cloud.rollout._envs.make_vector_env`'s ``mode="colocated"`` builder: a SAME_STEP pool, reset with `seed`.

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
    # The workers make their envs through the run's observation pipeline: a lossy codec's round trip runs in
    # them, in parallel, and the frames land once in the pool's 64-byte-aligned shared memory.
    pool = _impl()(
        [env_maker(env_id, pipeline)] * num_envs, config=cfg, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    try:
        pool.reset(seed=seed)
    except BaseException:
        pool.close()
        raise
    return pool


# Registering a builder is a dict insertion: `make_vector_env(..., mode="colocated")` works once cloud is imported.
VECTOR_ENV_MODES["colocated"] = build_colocated_vector_env
