"""The parent side of `cloud.SharedMemoryVectorEnv` (imports gymnasium; loaded lazily): a gymnasium VectorEnv.

Pipeline of one step, W workers with K_w envs each (the envs split as evenly as the worker count allows):

    parent: write actions into shm ─> bump cmd_seq[w, slot] ─> post cmd_sem[w]
    worker: spin-then-block (`cloud.rollout._pool_spin.Spinner`) on cmd_sem[w] ─> step its envs of `slot` ─> write
            obs/reward/flags (and encoded infos only if an env returned a non-empty info) ─> done_seq[w, slot]
            = seq ─> post done_sem[w][slot]   (the worker side lives in `cloud.rollout._pool_worker`)
    parent: spin-then-block on done_sem[w][slot] (slicing the block to check liveness and the timeout)

A slot is half 0, half 1 or all envs: the halves let the learner run the policy on one half while the
workers step the other (`step_half_async` / `step_half_wait`). Control (reset, call, get_attr, set_attr, close,
the restart handshake) goes over a pipe per worker and is never on the step path. Fixed-shape Box, Discrete,
MultiDiscrete and MultiBinary spaces use the path above; other spaces and ``shared_memory=False`` use the
slower carriers described in `cloud.rollout._pool_worker`.

Call states (gymnasium's errors): a ``*_wait`` without its ``*_async`` raises `NoPendingCallError`
(NoAsyncCallError), a call while another is in flight `PendingCallError` (AlreadyPendingCallError), any call
after `close` `PoolClosedError` (ClosedEnvironmentError), an expired ``timeout`` `WorkerTimeoutError`
(multiprocessing.TimeoutError).

Worker states (parent side, `WorkerState`): STARTING -> READY -> (STEPPING <-> READY) -> CLOSED, with FAILED
-> STARTING when a worker crashes, hangs past `step_timeout_s`, or (with ``on_env_error="restart"``) an env
raises. A restarted worker builds fresh envs; each of its envs answers its next step with the dropped
episode's truncation (see `cloud.rollout._colocated` for exactly what is returned).
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import logging
import multiprocessing as mp
import multiprocessing.util  # its exit hook is registered first, so ours (below) runs before it
import os
import time
import weakref
from collections.abc import Callable, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Semaphore
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.error import CustomSpaceError
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import (
    batch_differing_spaces,
    batch_space,
    concatenate,
    create_empty_array,
    create_shared_memory,
    iterate,
    read_from_shared_memory,
)

from cloud._errors import PoolStateError, WorkerFailedError, WorkerTimeoutError
from cloud.rollout._infocodec import decode_info
from cloud.rollout._pool_config import ColocatedConfig, PoolCounters, spin_times_us
from cloud.rollout._pool_errors import NoPendingCallError, PendingCallError, PoolClosedError, remote_error
from cloud.rollout._pool_spin import Spinner, reached
from cloud.rollout._pool_worker import (
    ACT_PIPE,
    ACT_POLICY,
    ACT_SHM,
    ALL,
    ERROR,
    HALF0,
    HALF1,
    SLOTS,
    EnvFn,
    VectorEnvFn,
    WorkerSpec,
    worker_main,
)
from cloud.rollout._shm import ShmArena

log = logging.getLogger(__name__)
# gymnasium's wrapper that cloudpickles what it holds (typed for env factories only; the pool wraps its specs too).
_Cloudpickled: Any = gym.vector.utils.CloudpickleWrapper

StepResult = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
_FIXED = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


class WorkerState(enum.Enum):
    """Where one worker process is in its life, as the parent sees it."""

    STARTING = "starting"
    READY = "ready"
    STEPPING = "stepping"
    FAILED = "failed"
    CLOSED = "closed"


def _array_layout(space: gym.Space[Any] | None, n: int) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Shape and dtype of `n` batched values of a fixed-shape `space` (a 1-byte placeholder for other carriers)."""
    if space is None:
        return (n, 1), np.dtype(np.uint8)
    return (n, *tuple(space.shape or ())), np.dtype(batch_space(space, n).dtype)


def _split(num_envs: int, num_workers: int) -> list[int]:
    """Envs per worker: as even as possible, the first workers taking one more when it does not divide."""
    q, r = divmod(num_envs, num_workers)
    return [q + (1 if w < r else 0) for w in range(num_workers)]


@dataclass
class _Worker:
    """The parent's record of one worker process."""

    index: int
    base: int
    num_envs: int
    slot_envs: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    process: Any = None
    pipe: Connection | None = None
    cmd_sem: Semaphore | None = None
    done_sems: tuple[Semaphore, Semaphore, Semaphore] | None = None
    state: WorkerState = WorkerState.STARTING
    pipe_actions: dict[int, list[Any]] = field(default_factory=dict)
    """Actions of an in-flight command that went over the pipe, by slot (re-sent if the worker is restarted)."""
    outs: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    """Step results that arrived over the pipe for a slot not being collected yet."""


def _refuse_arguments(*, env_fns: Sequence[EnvFn] | None, vector_env_fns: Sequence[VectorEnvFn] | None,
                      worker: Callable[..., None] | None, max_concurrency: int | None, context: str | None,
                      config: ColocatedConfig) -> None:
    """The constructor's argument checks, before anything is built (AsyncVectorEnv's messages where it has them)."""
    if worker is not None:
        raise ValueError(
            "SharedMemoryVectorEnv: a custom `worker` function is not supported (the pool's workers speak "
            "shared memory, not AsyncVectorEnv's pipe protocol); use gymnasium.vector.AsyncVectorEnv for it"
        )
    if (env_fns is None) == (vector_env_fns is None):
        raise ValueError(
            "SharedMemoryVectorEnv: pass exactly one of env_fns (one factory per env) or vector_env_fns "
            "(one factory per worker, each returning a gymnasium VectorEnv)"
        )
    if max_concurrency is not None:
        if not isinstance(max_concurrency, int | np.integer):
            raise ValueError(f"`max_concurrency` must be an integer or None, got {type(max_concurrency)}.")
        if max_concurrency < 1:
            raise ValueError(f"`max_concurrency` must be a positive or None, got {max_concurrency}.")
    if context is not None and config.context is not None and context != config.context:
        raise ValueError(
            f"SharedMemoryVectorEnv: context={context!r} but ColocatedConfig(context={config.context!r}); "
            "give the start method once"
        )


_LIVE_POOLS: weakref.WeakSet[SharedMemoryVectorEnv] = weakref.WeakSet()


@atexit.register  # registered after multiprocessing's own exit hook, so it runs before it (atexit is LIFO)
def _close_live_pools() -> None:
    """At interpreter exit, stop the workers of every pool left open (an uncaught KeyboardInterrupt, say).

    A worker ignores SIGTERM while its parent lives (`_pool_worker.quiet_on_group_signals`), so multiprocessing's
    own exit hook, which terminates and then joins daemonic children, would wait for them for ever.
    """
    for pool in list(_LIVE_POOLS):
        with contextlib.suppress(Exception):
            pool.close(terminate=True)


class SharedMemoryVectorEnv(VectorEnv):
    """See `cloud.rollout._colocated.SharedMemoryVectorEnv` for the documentation of this class."""

    def __init__(
        self,
        env_fns: Sequence[EnvFn] | None = None,
        shared_memory: bool = True,
        copy: bool = True,
        context: str | None = None,
        daemon: bool = True,
        worker: Callable[..., None] | None = None,
        observation_mode: str | tuple[gym.Space[Any], gym.Space[Any]] = "same",
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        max_concurrency: int | None = None,
        *,
        vector_env_fns: Sequence[VectorEnvFn] | None = None,
        config: ColocatedConfig | None = None,
        worker_policy: Callable[[], Callable[[np.ndarray], np.ndarray]] | None = None,
    ) -> None:
        self.config = config = config or ColocatedConfig()
        # Set first: __del__ and close() run even when the checks below raise.
        self._closed_workers = False
        self._workers: list[_Worker] = []
        self._in_flight: dict[int, float] = {}
        self._pending_control: tuple[str, list[int]] | None = None
        _LIVE_POOLS.add(self)
        _refuse_arguments(env_fns=env_fns, vector_env_fns=vector_env_fns, worker=worker,
                          max_concurrency=max_concurrency, context=context, config=config)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.shared_memory, self.copy, self.daemon = shared_memory, copy, daemon
        self.context = context or config.context
        self.max_concurrency = max_concurrency
        self.observation_mode = observation_mode
        self._same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        self.counters = PoolCounters()
        self._worker_policy = worker_policy
        self._ctx: Any = mp.get_context(self.context)
        self._vectorised = vector_env_fns is not None
        if env_fns is not None:
            sizes, groups = self._spaces_from_envs(env_fns, observation_mode)
        else:
            assert vector_env_fns is not None
            sizes, groups = self._spaces_from_vector_envs(vector_env_fns, observation_mode)
        self.num_envs = sum(sizes)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._allocate(num_workers=len(sizes))
        self._assign_halves(sizes, groups)
        self._start_workers(observation_mode)

    def _spaces_from_envs(self, env_fns: Sequence[EnvFn], observation_mode: Any
                          ) -> tuple[list[int], list[tuple[Sequence[EnvFn] | None, VectorEnvFn | None]]]:
        """Read the spaces from one throwaway env in the parent, as AsyncVectorEnv does; split the envs on workers."""
        if not env_fns:
            raise ValueError("SharedMemoryVectorEnv: env_fns is empty; pass at least one env factory")
        num_workers = self.config.num_workers or min(len(env_fns), os.cpu_count() or 1)
        if num_workers > len(env_fns):
            raise ValueError(
                f"SharedMemoryVectorEnv: num_workers={num_workers} is more than len(env_fns)={len(env_fns)}; "
                "give every worker at least one env"
            )
        sizes = _split(len(env_fns), num_workers)
        dummy = env_fns[0]()
        self.metadata = dict(dummy.metadata)
        self.render_mode = dummy.render_mode
        self.spec = dummy.spec
        self.single_action_space = dummy.action_space
        n = len(env_fns)
        if isinstance(observation_mode, tuple) and len(observation_mode) == 2:
            if not all(isinstance(s, gym.Space) for s in observation_mode):
                raise TypeError(
                    f"Expected both elements of observation_mode to be Spaces, got {type(observation_mode[0])} "
                    f"and {type(observation_mode[1])}"
                )
            self.observation_space, self.single_observation_space = observation_mode
        elif observation_mode == "same":
            self.single_observation_space = dummy.observation_space
            self.observation_space = batch_space(self.single_observation_space, n)
        elif observation_mode == "different":
            env_spaces = []
            for fn in env_fns:
                made = fn()
                env_spaces.append(made.observation_space)
                made.close()
            self.single_observation_space = env_spaces[0]
            self.observation_space = batch_differing_spaces(env_spaces)
        else:
            dummy.close()
            raise ValueError(
                "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch "
                f"observation space, actual got {observation_mode}"
            )
        dummy.close()
        groups: list[tuple[Sequence[EnvFn] | None, VectorEnvFn | None]] = []
        start = 0
        for size in sizes:
            groups.append(([_Cloudpickled(fn) for fn in env_fns[start : start + size]], None))
            start += size
        return sizes, groups

    def _spaces_from_vector_envs(self, vector_env_fns: Sequence[VectorEnvFn], observation_mode: Any
                                 ) -> tuple[list[int], list[tuple[Sequence[EnvFn] | None, VectorEnvFn | None]]]:
        """Read the spaces from one throwaway vector env; each worker runs one vector env."""
        if not vector_env_fns:
            raise ValueError("SharedMemoryVectorEnv: vector_env_fns is empty; pass one factory per worker")
        if observation_mode != "same":
            raise ValueError("SharedMemoryVectorEnv: observation_mode must be 'same' with vector_env_fns")
        num_workers = len(vector_env_fns)
        dummy_vec = vector_env_fns[0]()
        sizes = [dummy_vec.num_envs] * num_workers
        self.single_observation_space = dummy_vec.single_observation_space
        self.single_action_space = dummy_vec.single_action_space
        self.metadata = dict(dummy_vec.metadata)
        self.render_mode = dummy_vec.render_mode
        self.spec = dummy_vec.spec
        inner_mode = dummy_vec.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        dummy_vec.close()
        if AutoresetMode(inner_mode) != self.autoreset_mode:
            raise ValueError(
                f"SharedMemoryVectorEnv: the vector envs in the workers autoreset with {inner_mode}, but "
                f"autoreset_mode={self.autoreset_mode}; pass autoreset_mode={AutoresetMode(inner_mode).value!r}"
            )
        self.observation_space = batch_space(self.single_observation_space, sum(sizes))
        return sizes, [(None, _Cloudpickled(fn)) for fn in vector_env_fns]

    def _allocate(self, *, num_workers: int) -> None:
        """Pick how observations travel and lay out the shared-memory arena every worker attaches to."""
        n, config = self.num_envs, self.config
        self._carrier = self._pick_carrier()
        self._act_fixed = isinstance(self.single_action_space, _FIXED)
        if (self._vectorised or self._worker_policy is not None) and (self._carrier != "array" or not self._act_fixed):
            raise ValueError(
                "SharedMemoryVectorEnv: vector_env_fns and worker_policy need fixed-shape Box, Discrete, "
                "MultiDiscrete or MultiBinary spaces and shared_memory=True"
            )
        self._worker_spin_us, parent_spin_us = spin_times_us(config, num_workers)
        self._spinner = Spinner(parent_spin_us * 1e-6)
        obs_shape, obs_dtype = _array_layout(self.single_observation_space if self._carrier == "array" else None, n)
        act_shape, act_dtype = _array_layout(self.single_action_space if self._act_fixed else None, n)

        self._gym_shm: Any = None
        if self._carrier == "shm":
            try:
                self._gym_shm = create_shared_memory(self.single_observation_space, n=n, ctx=cast(Any, self._ctx))
            except CustomSpaceError as exc:
                raise ValueError(
                    "Using `SharedMemoryVectorEnv(..., shared_memory=True)` caused an error (a custom space has no "
                    "shared-memory layout); pass shared_memory=False for it"
                ) from exc
        self._obs_items: list[Any] = [None] * n
        self._pipe_obs: Any = (
            create_empty_array(self.single_observation_space, n=n, fn=np.zeros) if self._carrier == "pipe" else None
        )
        self._limit = (self._ctx.BoundedSemaphore(self.max_concurrency) if self.max_concurrency is not None
                       else None)

        self._arena = ShmArena.create(
            {
                "obs": (obs_shape, obs_dtype),
                "final_obs": (obs_shape, obs_dtype),
                "actions": (act_shape, act_dtype),
                "rewards": ((n,), np.float64),
                "terminated": ((n,), np.bool_),
                "truncated": ((n,), np.bool_),
                "has_final": ((n,), np.bool_),
                "cmd_seq": ((num_workers, SLOTS), np.int64),
                "done_seq": ((num_workers, SLOTS), np.int64),
                "cmd_kind": ((num_workers, SLOTS), np.int64),
                "status": ((num_workers, SLOTS), np.int64),
                "ctrl_seq": ((num_workers,), np.int64),
                "info_len": ((num_workers, SLOTS), np.int64),
                "info_buf": ((num_workers, SLOTS, config.info_bytes), np.uint8),
            }
        )
        a = self._arena.arrays
        self._obs, self._final_obs, self._actions = a["obs"], a["final_obs"], a["actions"]
        self._rewards, self._terminated, self._truncated = a["rewards"], a["terminated"], a["truncated"]
        self._has_final, self._cmd_seq, self._done_seq = a["has_final"], a["cmd_seq"], a["done_seq"]
        self._cmd_kind, self._status, self._ctrl_seq = a["cmd_kind"], a["status"], a["ctrl_seq"]
        self._info_len, self._info_buf = a["info_len"], a["info_buf"]

    def _assign_halves(self, sizes: list[int],
                       groups: list[tuple[Sequence[EnvFn] | None, VectorEnvFn | None]]) -> None:
        """Split each worker's envs in two halves, the pipelined slots.

        With one env per worker (or a vector env per worker, which steps all its envs at once) whole workers
        alternate between the halves instead.
        """
        n = self.num_envs
        self._groups = groups
        half_of_env = np.zeros(n, dtype=np.int64)
        base = 0
        for w, per_worker in enumerate(sizes):
            if per_worker >= 2 and not self._vectorised:
                h0 = tuple(range(per_worker // 2))
                h1 = tuple(range(per_worker // 2, per_worker))
            elif w % 2 == 0:
                h0, h1 = tuple(range(per_worker)), ()
            else:
                h0, h1 = (), tuple(range(per_worker))
            half_of_env[[base + j for j in h1]] = 1
            self._workers.append(
                _Worker(index=w, base=base, num_envs=per_worker, slot_envs=(h0, h1, tuple(range(per_worker))))
            )
            base += per_worker
        self._half_indices = (np.flatnonzero(half_of_env == 0), np.flatnonzero(half_of_env == 1))
        self._slot_indices = (*self._half_indices, np.arange(n))
        self._slot_action_spaces = tuple(batch_space(self.single_action_space, len(i)) for i in self._slot_indices)
        self._slot_act_shapes = tuple((len(i), *self._actions.shape[1:]) for i in self._slot_indices)
        self._positions = []
        for idx in self._slot_indices:
            pos = np.full(n, -1, dtype=np.int64)
            pos[idx] = np.arange(len(idx))
            self._positions.append(pos)
        self._slot_workers = tuple(tuple(wk for wk in self._workers if wk.slot_envs[s]) for s in range(SLOTS))

    def _start_workers(self, observation_mode: Any) -> None:
        """Start every worker and wait until each has built its envs and checked their spaces against ours."""
        try:
            for wk in self._workers:
                self._start_worker(wk, fresh=False)
            checks = [self._await_ready(wk) for wk in self._workers]
        except BaseException:
            self.close(terminate=True)
            raise
        if not all(obs_ok for obs_ok, _ in checks) or not all(act_ok for _, act_ok in checks):
            self.close(terminate=True)
            if not all(obs_ok for obs_ok, _ in checks):
                raise RuntimeError(
                    "SharedMemoryVectorEnv(..., observation_mode='same') however some of the sub-environments "
                    "observation spaces are not equivalent. If this is intentional, use "
                    "`observation_mode='different'` instead."
                    if observation_mode == "same"
                    else f"SharedMemoryVectorEnv(..., observation_mode={observation_mode!r}): the sub-environments' "
                    "observation spaces do not share a common shape and dtype."
                )
            raise RuntimeError(
                f"Some environments have an action space different from `{self.single_action_space}`. "
                "In order to batch actions, the action spaces from all environments must be equal."
            )

    def _pick_carrier(self) -> str:
        """How observations travel: 'array' (the fast path), 'shm' (gymnasium's shared memory) or 'pipe'."""
        if not self.shared_memory:
            return "pipe"
        return "array" if isinstance(self.single_observation_space, _FIXED) else "shm"

    # -- worker lifecycle -----------------------------------------------------------------------------------

    def _start_worker(self, wk: _Worker, *, fresh: bool) -> None:
        env_fns, vector_fn = self._groups[wk.index]
        spec = WorkerSpec(
            index=wk.index,
            base=wk.base,
            num_envs=wk.num_envs,
            env_fns=env_fns,
            vector_fn=vector_fn,
            slot_envs=wk.slot_envs,
            autoreset_mode=self.autoreset_mode.value,
            carrier=self._carrier,
            spin_s=self._worker_spin_us * 1e-6,
            info_bytes=self.config.info_bytes,
            fresh=fresh,
            start_done=(
                int(self._done_seq[wk.index, 0]),
                int(self._done_seq[wk.index, 1]),
                int(self._done_seq[wk.index, 2]),
            ),
            start_ctrl=int(self._ctrl_seq[wk.index]),
            parent_pid=os.getpid(),
            policy_fn=self._worker_policy,
            observation_mode="same" if self.observation_mode == "same" else "different",
            single_observation_space=self.single_observation_space,
            single_action_space=self.single_action_space,
        )
        parent_pipe, child_pipe = self._ctx.Pipe()
        wk.cmd_sem = self._ctx.Semaphore(0)
        wk.done_sems = (self._ctx.Semaphore(0), self._ctx.Semaphore(0), self._ctx.Semaphore(0))
        wk.outs = {}
        inherited = self._arena if self._ctx.get_start_method() == "fork" else None
        process = self._ctx.Process(
            target=_start,
            name=f"strata-colocated-{wk.index}",
            # The spec holds the env factories: cloudpickle them (as AsyncVectorEnv does) so lambdas and
            # closures survive the spawn and forkserver start methods.
            args=(
                _Cloudpickled(spec),
                self._arena.layout,
                inherited,
                child_pipe,
                wk.cmd_sem,
                wk.done_sems,
                self._gym_shm,
                self._limit,
            ),
            daemon=self.daemon,
        )
        wk.process = process
        try:
            process.start()
        finally:
            child_pipe.close()
        wk.pipe = parent_pipe
        wk.state = WorkerState.STARTING

    def _await_ready(self, wk: _Worker) -> tuple[bool, bool]:
        status, payload = self._recv(wk, self.config.start_timeout_s, "start")
        if status != "ok":
            self._raise_env_errors(wk, payload, "creating its envs")
        wk.state = WorkerState.READY
        obs_ok, act_ok = payload
        return bool(obs_ok), bool(act_ok)

    def _recv(self, wk: _Worker, timeout_s: float, what: str) -> tuple[str, Any]:
        assert wk.pipe is not None
        deadline = time.monotonic() + timeout_s
        while not wk.pipe.poll(0.05):
            if wk.process.exitcode is not None and not wk.pipe.poll(0):
                raise WorkerFailedError(
                    f"SharedMemoryVectorEnv.{what}: worker {wk.index} (envs {wk.base}..{wk.base + wk.num_envs - 1}) "
                    f"exited with code {wk.process.exitcode}",
                    worker_index=wk.index,
                )
            if time.monotonic() > deadline:
                raise WorkerFailedError(
                    f"SharedMemoryVectorEnv.{what}: worker {wk.index} did not answer within {timeout_s} s; "
                    "raise ColocatedConfig.start_timeout_s/step_timeout_s if its envs are slow",
                    worker_index=wk.index,
                )
        try:
            msg: tuple[str, Any] = wk.pipe.recv()
        except EOFError as exc:
            raise WorkerFailedError(
                f"SharedMemoryVectorEnv.{what}: worker {wk.index} closed its pipe", worker_index=wk.index
            ) from exc
        return msg

    def _raise_env_errors(self, wk: _Worker, records: list[Any], during: str) -> None:
        """Log every env error as AsyncVectorEnv does, then raise the last one as the env's own exception type."""
        for env_index, _summary, tb, *_ in records:
            gym.logger.error(f"Received the following error from Worker-{env_index} - Shutting it down")
            gym.logger.error(f"{tb}")
        gym.logger.error("Raising the last exception back to the main process.")
        env_index, summary, tb, type_module, type_name = records[-1]
        raise remote_error(
            f"SharedMemoryVectorEnv: env {env_index} (worker {wk.index}) raised while {during}: {summary}\n"
            f"--- worker traceback ---\n{tb}",
            env_index=int(env_index),
            worker_index=wk.index,
            remote_traceback=tb,
            type_module=type_module,
            type_name=type_name,
        )

    def _kill(self, wk: _Worker) -> None:
        process = wk.process
        if process is not None and process.pid is not None:  # a process whose start failed has no pid
            if process.exitcode is None:
                process.kill()
            process.join(5)
        if wk.pipe is not None:
            wk.pipe.close()
            wk.pipe = None

    def _restart(self, wk: _Worker, reason: str, *, abandon: int | None) -> None:
        """Replace a failed worker by a fresh one; its envs report their dropped episodes on their next step.

        A step command of slot `abandon` that the old worker did not finish is dropped (marked done, no result);
        every other unfinished command is handed to the new worker, whose envs answer it with the truncation.
        """
        log.warning("SharedMemoryVectorEnv: restarting worker %d (%s)", wk.index, reason)
        wk.state = WorkerState.FAILED
        self._kill(wk)
        self.counters.worker_restarts += 1
        self.counters.dropped_episodes += wk.num_envs
        w = wk.index
        if abandon is not None:
            self._done_seq[w, abandon] = self._cmd_seq[w, abandon]
        self._start_worker(wk, fresh=True)
        self._await_ready(wk)
        assert wk.cmd_sem is not None and wk.pipe is not None
        for slot in range(SLOTS):
            if self._cmd_seq[w, slot] > self._done_seq[w, slot]:
                if self._cmd_kind[w, slot] == ACT_PIPE:
                    wk.pipe.send(("act", slot, wk.pipe_actions[slot]))
                wk.cmd_sem.release()

    # -- stepping -------------------------------------------------------------------------------------------

    def _assert_open(self) -> None:
        if self.closed or self._closed_workers:
            raise PoolClosedError(f"Trying to operate on `{type(self).__name__}`, after a call to `close()`.")

    def _assert_idle(self, what: str) -> None:
        """Refuse a control call while a step or another call is in flight (AlreadyPendingCallError)."""
        pending = "step" if self._in_flight else self._pending_control[0] if self._pending_control else None
        if pending is not None:
            raise PendingCallError(
                f"Calling `{what}` while waiting for a pending call to `{pending}` to complete.", pending
            )

    def _issue(self, slot: int, actions: Any, kind: int, what: str) -> None:
        self._assert_open()
        if self._pending_control is not None:
            pending = self._pending_control[0]
            raise PendingCallError(
                f"Calling `{what}` while waiting for a pending call to `{pending}` to complete.", pending
            )
        busy = [s for s in self._in_flight if slot == ALL or s in (slot, ALL)]
        if busy:
            raise PendingCallError(
                f"Calling `{what}` while waiting for a pending call to `step` to complete "
                f"({('half 0', 'half 1', 'all envs')[busy[0]]} is stepping; call the matching *_wait first).",
                "step",
            )
        idx = self._slot_indices[slot]
        per_env: list[Any] | None = None
        if kind == ACT_SHM:
            acts = np.asarray(actions) if self._act_fixed else None
            if acts is not None and acts.shape == self._slot_act_shapes[slot] and acts.dtype == self._actions.dtype:
                # The hot path: a batch of exactly the action array's shape and dtype.
                if slot == ALL:
                    self._actions[...] = acts
                else:
                    self._actions[idx] = acts
            else:
                per_env, kind = self._actions_off_the_fast_path(slot, actions, acts, what)
        self._in_flight[slot] = time.monotonic()
        positions = self._positions[slot]
        for wk in self._slot_workers[slot]:
            w = wk.index
            self._cmd_kind[w, slot] = kind
            if per_env is not None:
                part = [per_env[int(positions[wk.base + j])] for j in wk.slot_envs[slot]]
                wk.pipe_actions[slot] = part
                assert wk.pipe is not None
                wk.pipe.send(("act", slot, part))
            self._cmd_seq[w, slot] += 1
            wk.state = WorkerState.STEPPING
            assert wk.cmd_sem is not None
            wk.cmd_sem.release()

    def _actions_off_the_fast_path(
        self, slot: int, actions: Any, acts: np.ndarray | None, what: str
    ) -> tuple[list[Any] | None, int]:
        """Check actions that are not a batch of the action array's dtype and shape; write them or list them per env.

        Returns (per-env actions to send over the pipe, ACT_PIPE) or (None, ACT_SHM) when they were written.
        """
        idx = self._slot_indices[slot]
        if acts is None:  # a composite action space: AsyncVectorEnv's way, one element per env
            per_env = list(iterate(self._slot_action_spaces[slot], actions))
            if len(per_env) != len(idx):
                raise ValueError(f"SharedMemoryVectorEnv.{what}: expected {len(idx)} actions but got {len(per_env)}")
            return per_env, ACT_PIPE
        want = self._slot_act_shapes[slot]
        if acts.ndim == 0:
            raise TypeError(
                f"SharedMemoryVectorEnv.{what}: actions must be a batch of shape {want}, got the scalar {acts!r}"
            )
        if len(acts) != len(idx):
            raise ValueError(
                f"SharedMemoryVectorEnv.{what}: actions must have shape {want} "
                f"({'action_space.shape' if slot == ALL else f'half_indices({slot})'}) but got {acts.shape}"
            )
        if acts.shape == want and np.can_cast(acts.dtype, self._actions.dtype, "safe"):
            if slot == ALL:
                self._actions[...] = acts
            else:
                self._actions[idx] = acts
            return None, ACT_SHM
        # Writing these into the action array would change them (0.7 -> 0 for a Discrete space, a reshape for a
        # Box): hand each env its action unchanged, over the pipe, as AsyncVectorEnv does.
        return list(acts), ACT_PIPE

    def _recv_out(self, wk: _Worker, slot: int, what: str) -> tuple[Any, ...]:
        """The step result a ``shm``/``pipe`` carrier worker sent for `slot` (it is sent right after the done mark)."""
        while slot not in wk.outs:
            assert wk.pipe is not None
            try:
                msg = wk.pipe.recv()
            except EOFError as exc:
                raise WorkerFailedError(
                    f"SharedMemoryVectorEnv.{what}: worker {wk.index} closed its pipe", worker_index=wk.index
                ) from exc
            wk.outs[msg[1]] = msg
        return wk.outs.pop(slot)

    def _collect(self, slot: int, timeout: float | None, what: str) -> StepResult:
        if slot not in self._in_flight:
            self._assert_open()
            name = "step_async" if what in ("step_wait", "step") else what.replace("_wait", "_async")
            raise NoPendingCallError(f"Calling `{what}` without any prior call to `{name}`.", "step")
        started = self._in_flight[slot]
        limit = self.config.step_timeout_s if timeout is None else timeout
        spinner = self._spinner
        errors: list[tuple[_Worker, Any]] = []
        failure: WorkerFailedError | None = None
        failed: set[int] = set()  # workers restarted with this slot's command abandoned: no result to read
        n = len(self._slot_indices[slot])
        blobs: list[Any] = []
        outs: dict[int, tuple[Any, ...]] = {}
        for wk in self._slot_workers[slot]:
            w = wk.index
            done_row, target = self._done_seq[w], int(self._cmd_seq[w, slot])
            while done_row[slot] < target:
                assert wk.done_sems is not None
                if spinner.wait(wk.done_sems[slot], reached(done_row, slot, target), 0.05):
                    continue
                crashed = wk.process.exitcode is not None
                if not crashed and time.monotonic() - started < limit:
                    continue
                if crashed:
                    self.counters.worker_crashes += 1
                    reason = f"exited with code {wk.process.exitcode}"
                else:
                    self.counters.worker_timeouts += 1
                    reason = f"no answer within {limit} s"
                if timeout is not None and not crashed:
                    # The caller's own deadline: AsyncVectorEnv raises multiprocessing.TimeoutError.
                    self._restart(wk, reason, abandon=slot)
                    failed.add(w)
                    failure = failure or WorkerTimeoutError(
                        f"The call to `{what}` has timed out after {timeout} second(s): worker {w} (envs "
                        f"{wk.base}..{wk.base + wk.num_envs - 1}) was restarted and its envs report truncated on "
                        "their next step",
                        worker_index=w,
                    )
                    break
                if self.config.on_worker_failure == "raise":
                    self._restart(wk, reason, abandon=slot)
                    failed.add(w)
                    failure = failure or WorkerFailedError(
                        f"SharedMemoryVectorEnv.{what}: worker {w} (envs {wk.base}..{wk.base + wk.num_envs - 1}) "
                        f"{reason}; it was restarted and its envs report truncated on their next step",
                        worker_index=w,
                    )
                    break
                self._restart(wk, reason, abandon=None)
                started = time.monotonic()
                done_row, target = self._done_seq[w], int(self._cmd_seq[w, slot])
            wk.state = WorkerState.READY
            if w in failed:
                continue
            length = int(self._info_len[w, slot])
            # Infos and error records are decoded without pickle (cloud.rollout._infocodec), like everything else here.
            if self._status[w, slot] == ERROR:
                errors.append((wk, decode_info(self._info_buf[w, slot, :length].tobytes())))
                continue
            if length:
                blobs.append(decode_info(self._info_buf[w, slot, :length].tobytes()))
            if self._carrier != "array":
                outs[w] = self._recv_out(wk, slot, what)
        del self._in_flight[slot]
        if failure is not None:
            raise failure
        if errors:
            for w, out in outs.items():
                self._workers[w].outs[slot] = out  # read again after the restart, not stepped twice
            self._handle_env_errors(errors, slot, what)
            return self._collect_after_restart(slot, timeout, what)
        return self._assemble(slot, n, blobs, outs)

    def _handle_env_errors(self, errors: list[tuple[_Worker, Any]], slot: int, what: str) -> None:
        self.counters.env_errors += len(errors)
        for wk, _records in errors:
            self._restart(wk, "an env raised", abandon=slot)
        if self.config.on_env_error == "raise":
            records = [rec for _wk, recs in errors for rec in recs]
            self._raise_env_errors(errors[-1][0], records, f"stepping ({what})")

    def _collect_after_restart(self, slot: int, timeout: float | None, what: str) -> StepResult:
        # on_env_error="restart": only the restarted workers get the command again (same actions); their envs
        # answer it with the dropped episodes' truncation. The other workers are not stepped twice: their
        # results are still in shared memory (or kept from the pipe) and are simply read again.
        self._in_flight[slot] = time.monotonic()
        for wk in self._slot_workers[slot]:
            if self._status[wk.index, slot] == ERROR:
                assert wk.cmd_sem is not None and wk.pipe is not None
                if self._cmd_kind[wk.index, slot] == ACT_PIPE:
                    wk.pipe.send(("act", slot, wk.pipe_actions[slot]))
                self._cmd_seq[wk.index, slot] += 1
                wk.cmd_sem.release()
        return self._collect(slot, timeout, what)

    def _assemble(self, slot: int, n: int, blobs: list[Any], outs: dict[int, tuple[Any, ...]]) -> StepResult:
        idx = self._slot_indices[slot]
        full = slot == ALL
        per_env: dict[int, dict[str, Any]] = {}
        final_infos: dict[int, dict[str, Any] | None] = {}
        final_obs: dict[int, Any] = {}
        parts: list[Any] = blobs
        for w, (_tag, _slot, records, finals, obs) in outs.items():
            parts.append((records, finals))
            if obs is not None:
                wk = self._workers[w]
                for j, value in zip(wk.slot_envs[slot], obs, strict=True):
                    self._obs_items[wk.base + j] = value
        for records, finals in parts:
            for rec in records:
                if rec[0] == "vec":
                    self._unbatch(rec[1], rec[2], per_env)
                else:
                    g, info, final_info = rec
                    per_env[g] = info
                    final_infos[g] = final_info
            for g, value in finals:
                final_obs[g] = value
        # has_final is only ever set in SAME_STEP mode (the worker writes it for every env it steps).
        infos: dict[str, Any] = {}
        has_final = self._has_final if full else self._has_final[idx]
        if self._same_step and has_final.any():
            for pos in np.flatnonzero(has_final):
                g = int(pos) if full else int(idx[pos])
                per_env[g] = {
                    "final_info": final_infos.get(g) or {},
                    "final_obs": final_obs[g] if g in final_obs else self._final_obs[g].copy(),
                    **per_env.get(g, {}),
                }
        positions = self._positions[slot]
        for g in sorted(per_env):
            if per_env[g]:
                infos = add_info(infos, per_env[g], int(positions[g]), n)
        if full:
            obs = (self._obs.copy() if self.copy else self._obs) if self._carrier == "array" else self._batch_obs(ALL)
            return obs, self._rewards.copy(), self._terminated.copy(), self._truncated.copy(), infos
        return self._batch_obs(slot), self._rewards[idx], self._terminated[idx], self._truncated[idx], infos

    def _batch_obs(self, slot: int) -> Any:
        """The observations of `slot`'s envs as one batch (a copy unless copy=False and all envs)."""
        full = slot == ALL
        space = self.single_observation_space
        if self._carrier == "array":
            if full:
                return self._obs.copy() if self.copy else self._obs
            return self._obs[self._slot_indices[slot]]
        if self._carrier == "shm":
            batch = read_from_shared_memory(space, self._gym_shm, n=self.num_envs)
        else:
            batch = concatenate(space, self._obs_items, self._pipe_obs)
        if full:
            return deepcopy(batch) if self.copy else batch
        items = list(iterate(self.observation_space, batch))
        idx = self._slot_indices[slot]
        empty: Any = create_empty_array(space, n=len(idx), fn=np.zeros)
        return concatenate(space, [items[i] for i in idx], empty)

    def _unbatch(self, base: int, info: dict[str, Any], per_env: dict[int, dict[str, Any]]) -> None:
        """Split a worker's batched vector-env info into per-env dicts (inverse of `add_info`)."""

        def split(d: dict[str, Any]) -> dict[int, dict[str, Any]]:
            out: dict[int, dict[str, Any]] = {}
            for key, value in d.items():
                if key.startswith("_"):
                    continue
                mask = d.get(f"_{key}")
                if isinstance(value, dict):
                    for i, sub in split(value).items():
                        out.setdefault(i, {})[key] = sub
                    continue
                rows = [int(i) for i in np.flatnonzero(mask)] if mask is not None else list(range(len(value)))
                for i in rows:
                    out.setdefault(i, {})[key] = value[i]
            return out

        for i, env_info in split(info).items():
            per_env.setdefault(base + i, {}).update(env_info)

    # -- the VectorEnv API ----------------------------------------------------------------------------------

    def step_async(self, actions: Any) -> None:
        """Send a batch of actions (an element of ``action_space``) to all envs; collect with `step_wait`."""
        self._issue(ALL, actions, ACT_SHM, "step_async")

    def step_wait(self, timeout: float | None = None) -> StepResult:
        """Wait for the step of all envs; an expired ``timeout`` raises `WorkerTimeoutError` (a TimeoutError)."""
        return self._collect(ALL, timeout, "step_wait")

    def step(self, actions: Any) -> StepResult:
        """Step every env with `actions`; same returns as `gymnasium.vector.AsyncVectorEnv.step`."""
        self._issue(ALL, actions, ACT_SHM, "step")
        return self._collect(ALL, None, "step")

    @property
    def num_workers(self) -> int:
        """Worker processes of the pool (what `strata status` reports as its workers)."""
        return len(self._workers)

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the current workers (they change when a worker is restarted)."""
        return tuple(int(wk.process.pid) for wk in self._workers)

    @property
    def shm_name(self) -> str:
        """Name of the pool's shared-memory segment (``/dev/shm/<name>`` while the pool is open)."""
        return self._arena.name

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The np_random seed of every env (one per worker with vector_env_fns), as AsyncVectorEnv returns them."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """The numpy random generator of every env (copies from the workers)."""
        return self.get_attr("np_random")

    def render(self) -> tuple[Any, ...] | None:
        """The rendered frame of every env (``call("render")``), as AsyncVectorEnv does."""
        return self.call("render")

    def half_indices(self, half: int) -> np.ndarray:
        """The env indices (into the full batch) that make up `half` (0 or 1), in the order halves use."""
        return self._half_indices[self._check_half(half)]

    def _check_half(self, half: int) -> int:
        if half not in (HALF0, HALF1):
            raise ValueError(f"SharedMemoryVectorEnv: half must be 0 or 1, got {half!r}")
        return half

    def step_half_async(self, half: int, actions: Any) -> None:
        """Send actions for the envs of `half` (``len(half_indices(half))`` of them); collect with `step_half_wait`."""
        self._issue(self._check_half(half), actions, ACT_SHM, "step_half_async")

    def step_half_wait(self, half: int, timeout: float | None = None) -> StepResult:
        """Wait for `half`'s step; the returned arrays (copies) are indexed like `half_indices(half)`."""
        return self._collect(self._check_half(half), timeout, "step_half_wait")

    def observations(self, half: int | None = None) -> Any:
        """The latest observations of all envs (a view with fixed-shape spaces) or of one half (a copy)."""
        self._assert_open()
        if half is None:
            return self._obs if self._carrier == "array" else self._batch_obs(ALL)
        return self._batch_obs(self._check_half(half))

    def act_step(self, timeout: float | None = None) -> tuple[np.ndarray, StepResult]:
        """Workers pick actions with their own policy copy (`worker_policy`), then step; returns (actions, step)."""
        if self._worker_policy is None:
            raise PoolStateError(
                "SharedMemoryVectorEnv.act_step: no worker_policy was given; pass worker_policy=<factory> or use step()"
            )
        self._issue(ALL, None, ACT_POLICY, "act_step")
        result = self._collect(ALL, timeout, "act_step")
        return self._actions.copy(), result

    # -- control --------------------------------------------------------------------------------------------

    def _control_async(self, messages: Sequence[tuple[Any, ...] | None], kind: str) -> None:
        sent = []
        for wk, msg in zip(self._workers, messages, strict=True):
            if msg is None:
                continue
            assert wk.pipe is not None and wk.cmd_sem is not None
            wk.pipe.send(msg)
            self._ctrl_seq[wk.index] += 1
            wk.cmd_sem.release()
            sent.append(wk.index)
        self._pending_control = (kind, sent)

    def _control_wait(self, timeout: float | None, kind: str, what: str) -> list[tuple[_Worker, Any]]:
        self._assert_open()
        if self._pending_control is None or self._pending_control[0] != kind:
            raise NoPendingCallError(f"Calling `{what}` without any prior call to `{kind}_async`.", kind)
        sent = self._pending_control[1]
        self._pending_control = None
        limit = self.config.step_timeout_s if timeout is None else timeout
        results: list[tuple[_Worker, Any]] = []
        crash: WorkerFailedError | None = None
        env_failure: tuple[_Worker, list[Any]] | None = None
        deadline = time.monotonic() + limit
        for w in sent:
            wk = self._workers[w]
            try:
                status, payload = self._recv(wk, max(0.0, deadline - time.monotonic()), what)
            except WorkerFailedError as exc:
                self._restart(wk, str(exc), abandon=None)
                if timeout is not None and wk.process is not None and "did not answer" in str(exc):
                    exc = WorkerTimeoutError(
                        f"The call to `{what}` has timed out after {timeout} second(s): worker {w} was restarted",
                        worker_index=w,
                    )
                crash = crash or exc
                continue
            if status != "ok":
                if env_failure is None:
                    env_failure = (wk, list(payload))
                else:
                    env_failure[1].extend(payload)
                continue
            results.append((wk, payload))
        if crash is not None:
            raise crash
        if env_failure is not None:
            self._raise_env_errors(env_failure[0], env_failure[1], what.replace("_wait", ""))
        return results

    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Start resetting the envs; see `reset`."""
        self._assert_open()
        n = self.num_envs
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(n)]
        else:
            seeds = list(seed)
        if len(seeds) != n:
            raise ValueError(
                f"If seeds are passed as a list the length must match num_envs={n} but got length={len(seeds)}."
            )
        self._assert_idle("reset_async")
        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray):
                raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
            if mask.shape != (n,):
                raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
            if mask.dtype != np.bool_:
                raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
            if not mask.any():
                raise ValueError(
                    "`options['reset_mask']` must contain a boolean array with at least one True value, "
                    f"got reset_mask={mask}"
                )
            if self._vectorised:
                raise ValueError("SharedMemoryVectorEnv.reset: reset_mask is not supported with vector_env_fns")
        messages: list[tuple[Any, ...] | None] = []
        for wk in self._workers:
            sl = slice(wk.base, wk.base + wk.num_envs)
            local_mask = None if mask is None else [bool(m) for m in mask[sl]]
            if local_mask is not None and not any(local_mask):
                messages.append(None)
                continue
            messages.append(("reset", seeds[sl], options, local_mask))
        if mask is not None:
            self._terminated[mask], self._truncated[mask] = False, False
        else:
            self._terminated[:], self._truncated[:] = False, False
        self._control_async(messages, "reset")

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Wait for `reset_async` and return (observations, infos)."""
        results = self._control_wait(timeout, "reset", "reset_wait")
        per_env: dict[int, dict[str, Any]] = {}
        for _wk, (records, new_obs) in results:
            for rec in records:
                if rec[0] == "vec":
                    self._unbatch(rec[1], rec[2], per_env)
                else:
                    per_env[rec[0]] = rec[1]
            if new_obs:
                for g, value in new_obs.items():
                    self._obs_items[g] = value
        infos: dict[str, Any] = {}
        for g in sorted(per_env):
            infos = add_info(infos, per_env[g], g, self.num_envs)
        return self._batch_obs(ALL), infos

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset envs: an int ``seed`` gives env i seed+i, a list one seed per env; options["reset_mask"] picks envs."""
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Start calling method (or reading attribute) `name` on every env; see `call`."""
        self._assert_open()
        self._assert_idle("call_async")
        self._control_async([("call", name, args, kwargs)] * len(self._workers), "call")

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for `call_async`; one result per env (per worker with vector_env_fns)."""
        return tuple(r for _wk, results in self._control_wait(timeout, "call", "call_wait") for r in results)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call `name(*args, **kwargs)` on every env (or read it if it is not callable); one result per env."""
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute `name` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute `name` on every env: one value for all, or a list/tuple with one value per env."""
        self._assert_open()
        targets = len(self._workers) if self._vectorised else self.num_envs
        if not isinstance(values, list | tuple):
            values = [values] * targets
        if len(values) != targets:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {targets} environments."
            )
        self._assert_idle("set_attr")
        messages: list[tuple[Any, ...] | None] = []
        for wk in self._workers:
            part = values[wk.index : wk.index + 1] if self._vectorised else values[wk.base : wk.base + wk.num_envs]
            messages.append(("set_attr", name, list(part)))
        self._control_async(messages, "set_attr")
        self._control_wait(None, "set_attr", "set_attr")

    def close_extras(self, timeout: float | None = None, terminate: bool = False, **kwargs: Any) -> None:
        """Stop the workers (politely unless `terminate` or a call is in flight) and unlink the shared memory."""
        if self._closed_workers:
            return
        self._closed_workers = True
        pending = "step" if self._in_flight else self._pending_control[0] if self._pending_control else None
        if pending is not None:
            gym.logger.warn(f"Calling `close` while waiting for a pending call to `{pending}` to complete.")
            terminate = True  # its results would be thrown away: stop the workers at once
        self._in_flight.clear()
        self._pending_control = None
        deadline = time.monotonic() + (self.config.close_timeout_s if timeout is None else timeout)
        workers = self._workers
        if not terminate:
            for wk in workers:
                if wk.pipe is None or wk.process is None or wk.process.exitcode is not None:
                    continue
                try:
                    wk.pipe.send(("close",))
                    self._ctrl_seq[wk.index] += 1
                    assert wk.cmd_sem is not None
                    wk.cmd_sem.release()
                except (BrokenPipeError, OSError):
                    pass
            for wk in workers:
                if wk.process is not None and wk.process.pid is not None:
                    wk.process.join(max(0.0, deadline - time.monotonic()))
        for wk in workers:
            self._kill(wk)
            wk.state = WorkerState.CLOSED
        if hasattr(self, "_arena"):
            self._arena.close()

    def __del__(self) -> None:
        # The shared memory has its own finalizer; this makes sure no worker outlives a pool left unclosed. At
        # interpreter exit or in a garbage-collection cycle the pipes may already be finalized: nothing to report.
        if not getattr(self, "closed", True) and not getattr(self, "_closed_workers", True):
            with contextlib.suppress(OSError, ValueError):
                self.close(terminate=True)


def _start(
    spec: Any,
    layout: Any,
    inherited: ShmArena | None,
    pipe: Connection,
    cmd_sem: Semaphore,
    done_sems: tuple[Semaphore, Semaphore, Semaphore],
    gym_shm: Any,
    limit: Semaphore | None,
) -> None:
    """Process target: unwrap the cloudpickled spec and run the worker loop."""
    worker_main(spec.fn, layout, inherited, pipe, cmd_sem, done_sems, gym_shm, limit)


def add_info(vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int, num_envs: int) -> dict[str, Any]:
    """Merge one env's info into batched infos exactly as `gymnasium.vector.VectorEnv._add_info` does, for any size."""
    for key, value in env_info.items():
        if key == "final_obs":
            array = vector_infos["final_obs"] if "final_obs" in vector_infos else np.full(num_envs, None, dtype=object)
            array[env_num] = value
        elif isinstance(value, dict):
            array = add_info(vector_infos.get(key, {}), value, env_num, num_envs)
        else:
            if key not in vector_infos:
                if type(value) in (int, float, bool) or issubclass(type(value), np.number):
                    array = np.zeros(num_envs, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((num_envs, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(num_envs, None, dtype=object)
            else:
                array = vector_infos[key]
            array[env_num] = value
        mask = vector_infos.get(f"_{key}", np.zeros(num_envs, dtype=np.bool_))
        mask[env_num] = True
        vector_infos[key], vector_infos[f"_{key}"] = array, mask
    return vector_infos
