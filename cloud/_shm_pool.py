"""The shared-memory env worker pool behind `cloud.SharedMemoryVectorEnv` (imports gymnasium; loaded lazily).

Pipeline of one step, per worker process (W workers, K envs each, N = W*K):

    parent: write actions into shm ─> bump cmd_seq[w, slot] ─> post cmd_sem[w]
    worker: spin-then-block (Spinner) on cmd_sem[w] ─> step its envs of `slot` ─> write obs/reward/flags (and
            encoded infos only if an env returned a non-empty info) ─> done_seq[w, slot] = seq ─> post done_sem[w][slot]
    parent: spin-then-block on done_sem[w][slot] (slicing the block to check liveness and the timeout)

A slot is half 0, half 1 or all envs: the halves let the learner run the policy on one half while the
workers step the other (`step_half_async` / `step_half_wait`). Semaphores are counters shared by the two
processes: an uncontended post or try-acquire is an atomic instruction in user space (no system call, no
message); a blocked waiter costs one futex wake. Control (reset, call, get_attr, set_attr, close, the
restart handshake) goes over a pipe per worker and is never on the step path.

Worker states (parent side, `WorkerState`): STARTING -> READY -> (STEPPING <-> READY) -> CLOSED, with FAILED
-> STARTING when a worker crashes, hangs past `step_timeout_s`, or (with ``on_env_error="restart"``) an env
raises. A restarted worker builds fresh envs; each of its envs answers its next step with the dropped
episode's truncation (see `SharedMemoryVectorEnv` for exactly what is returned).
"""

from __future__ import annotations

import enum
import logging
import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Semaphore
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from cloud._colocated import ColocatedConfig, PoolCounters, spin_times_us
from cloud._errors import EnvWorkerError, PoolStateError, UnsupportedSpaceError, WorkerFailedError
from cloud._infocodec import decode_info, encode_info
from cloud._shm import ShmArena, ShmLayout, attach

log = logging.getLogger(__name__)

HALF0, HALF1, ALL = 0, 1, 2
SLOTS = 3
_OK, _ERROR = 0, 1
EnvFn = Callable[[], gym.Env]
VectorEnvFn = Callable[[], VectorEnv]
StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class WorkerState(enum.Enum):
    """Where one worker process is in its life, as the parent sees it."""

    STARTING = "starting"
    READY = "ready"
    STEPPING = "stepping"
    FAILED = "failed"
    CLOSED = "closed"


class Spinner:
    """Spin-then-block waits on a semaphore whose poster first bumps a shared counter, with adaptive spinning.

    `wait` polls `ready` (the counter; ~0.1 us a poll, against several times that for a try-acquire) for up to
    `spin_s`, yielding the CPU between polls, then blocks on the semaphore. The poster always writes its
    counter and then posts, so once `ready` is seen the post is a few instructions away and taking it does
    not sleep. Measured on the 2-core host: spinning without yielding lets three processes steal each other's
    time slices (1 ms of it drops 2x1 CartPole from ~40k to ~1k steps/s); yielding keeps ~46k on a quiet
    machine, but on a loaded one a yield hands the core to another process for a whole time slice, and a
    plain futex block (woken with the scheduler's wake-up preference) is faster. So the spinner stops
    spinning after `misses` waits in a row that outlast the spin, for the next `pause` waits, then tries again.
    """

    def __init__(self, spin_s: float, *, misses: int = 4, pause: int = 256) -> None:
        self.spin_s = spin_s
        self._limit, self._pause = misses, pause
        self._misses = 0
        self._skip = 0

    def wait(self, sem: Semaphore, ready: Callable[[], bool], block_s: float) -> bool:
        """Take one post of `sem`; False if nothing was posted within `block_s` after the spin."""
        if ready() or self.spin_s <= 0:
            return sem.acquire(True, block_s)
        if self._skip:
            self._skip -= 1
            return sem.acquire(True, block_s)
        deadline = time.perf_counter() + self.spin_s
        while True:
            os.sched_yield()
            seen = ready()
            if time.perf_counter() > deadline:
                break  # seen or not, this wait outlasted the spin (a yield can cost a whole time slice)
            if seen:
                self._misses = 0
                return sem.acquire(True, block_s)
        self._misses += 1
        if self._misses >= self._limit:
            self._misses, self._skip = 0, self._pause
        return sem.acquire(True, block_s)


def _reached(row: np.ndarray, slot: int, target: int) -> Callable[[], bool]:
    """A `ready` test for `Spinner.wait`: has the worker's done counter for `slot` reached `target`?"""
    return lambda: bool(row[slot] >= target)


def _array_layout(space: gym.Space[Any], n: int, what: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Shape and dtype of `n` batched values of `space`, or raise for spaces without a fixed numpy layout."""
    if not isinstance(space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary):
        raise UnsupportedSpaceError(
            f"SharedMemoryVectorEnv: the {what} space {space} has no fixed-shape numpy layout; use Box, Discrete, "
            "MultiDiscrete or MultiBinary (flatten Dict/Tuple spaces with gymnasium.wrappers.FlattenObservation), "
            "or gymnasium.vector.AsyncVectorEnv for this env"
        )
    batched = batch_space(space, n)
    return (n, *tuple(space.shape or ())), np.dtype(batched.dtype)


@dataclass(frozen=True, kw_only=True)
class _WorkerSpec:
    """Everything one worker process needs to start (picklable when the env factories are)."""

    index: int
    base: int
    num_envs: int
    env_fns: Sequence[EnvFn] | None
    vector_fn: VectorEnvFn | None
    slot_envs: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    autoreset_mode: str
    spin_s: float
    info_bytes: int
    fresh: bool
    start_done: tuple[int, int, int]
    start_ctrl: int
    parent_pid: int
    policy_fn: Callable[[], Callable[[np.ndarray], np.ndarray]] | None


class _EnvRunner:
    """A worker's envs and the shared arrays it writes; one `step(slot)` per command."""

    def __init__(self, spec: _WorkerSpec, arrays: dict[str, np.ndarray]) -> None:
        self.spec = spec
        self.mode = AutoresetMode(spec.autoreset_mode)
        w = spec.index
        self.obs, self.final_obs, self.actions = arrays["obs"], arrays["final_obs"], arrays["actions"]
        self.rewards, self.terminated, self.truncated = arrays["rewards"], arrays["terminated"], arrays["truncated"]
        self.has_final = arrays["has_final"]
        self.info_len, self.info_buf, self.status = arrays["info_len"][w], arrays["info_buf"][w], arrays["status"][w]
        self.cmd_kind = arrays["cmd_kind"][w]
        self.envs: list[gym.Env] = [fn() for fn in spec.env_fns] if spec.env_fns is not None else []
        self.vec: VectorEnv | None = spec.vector_fn() if spec.vector_fn is not None else None
        k = spec.num_envs
        # NEXT_STEP: this env's previous step ended an episode, so its next step is a reset.
        self.autoreset = [False] * k
        # After a restart: the next step of this env reports the dropped episode as truncated.
        self.pending_trunc = [spec.fresh] * k
        self.policy = spec.policy_fn() if spec.policy_fn is not None else None
        self.current_env = -1

    # -- the hot path ---------------------------------------------------------------------------------------

    def step(self, slot: int) -> None:
        """Step the envs of `slot`; write results and infos to shared memory (an env exception as an error record)."""
        local = self.spec.slot_envs[slot]
        try:
            if self.cmd_kind[slot] == 1 and self.policy is not None:
                self._act(local)
            records = self._step_vector(local) if self.vec is not None else self._step_envs(local)
            self._write_blob(slot, records)
            self.status[slot] = _OK
        except Exception as exc:
            env_index = self.current_env
            self._write_blob(slot, (env_index, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            self.status[slot] = _ERROR

    def _act(self, local: tuple[int, ...]) -> None:
        assert self.policy is not None
        idx = np.asarray(local, dtype=np.intp) + self.spec.base
        self.actions[idx] = self.policy(self.obs[idx])

    def _step_envs(self, local: tuple[int, ...]) -> Any:
        # Results go to Python lists and are written to shared memory in one slice assignment per array:
        # per-element numpy writes cost more than the CartPole step itself.
        if not local:
            return []
        base, same_step = self.spec.base, self.mode == AutoresetMode.SAME_STEP
        lo = base + local[0]
        sl = slice(lo, lo + len(local))
        actions = self.actions[sl].copy()
        autoreset, pending = self.autoreset, self.pending_trunc
        records: list[tuple[int, dict[str, Any], dict[str, Any] | None]] = []
        obs_list: list[Any] = []
        rew_list: list[Any] = []
        term_list: list[Any] = []
        trunc_list: list[Any] = []
        finals: list[int] = []
        for i, j in enumerate(local):
            g = base + j
            self.current_env = g
            env = self.envs[j]
            if pending[j]:
                obs_list.append(self._dropped(j, g, records))
                rew_list.append(0.0)
                term_list.append(False)
                trunc_list.append(True)
                if same_step:
                    finals.append(g)
                continue
            reward: Any
            if not same_step and autoreset[j]:
                obs, info = env.reset()
                reward, term, trunc = 0.0, False, False
            else:
                obs, reward, term, trunc, info = env.step(actions[i])
            if same_step and (term or trunc):
                self.final_obs[g] = obs
                final_info = info
                obs, info = env.reset()
                finals.append(g)
                if info or final_info:
                    records.append((g, info, final_info))
            elif info:
                records.append((g, info, None))
            obs_list.append(obs)
            rew_list.append(reward)
            term_list.append(term)
            trunc_list.append(trunc)
            autoreset[j] = term or trunc
        self.obs[sl] = obs_list
        self.rewards[sl] = rew_list
        self.terminated[sl] = term_list
        self.truncated[sl] = trunc_list
        if same_step:
            has_final = self.has_final
            has_final[sl] = False
            if finals:
                has_final[finals] = True
        return records

    def _dropped(self, j: int, g: int, records: list[tuple[int, dict[str, Any], dict[str, Any] | None]]) -> Any:
        """The first step of env `j` after a restart: the dropped episode, truncated (see cloud._colocated)."""
        self.pending_trunc[j] = False
        if self.mode == AutoresetMode.SAME_STEP:
            self.final_obs[g] = self.obs[g]
            obs, info = self.envs[j].reset()
            records.append((g, {**info, "worker_restarted": True}, {}))
            return obs
        self.autoreset[j] = True
        records.append((g, {"worker_restarted": True}, None))
        return self.obs[g].copy()

    def _step_vector(self, local: tuple[int, ...]) -> Any:
        assert self.vec is not None
        base, k = self.spec.base, self.spec.num_envs
        if not local:
            return []
        sl = slice(base, base + k)
        self.current_env = base
        if any(self.pending_trunc):
            self.pending_trunc = [False] * k
            self.rewards[sl], self.terminated[sl], self.truncated[sl] = 0.0, False, True
            if self.mode == AutoresetMode.SAME_STEP:
                self.final_obs[sl] = self.obs[sl]
                self.obs[sl], info = self.vec.reset()
                self.has_final[sl] = True
                return [(base + j, {"worker_restarted": True}, {}) for j in range(k)]
            self.autoreset = [True] * k
            self.has_final[sl] = False
            return [(base + j, {"worker_restarted": True}, None) for j in range(k)]
        if all(self.autoreset):
            # The inner vector env was never reset (fresh after a restart in NEXT_STEP mode).
            self.autoreset = [False] * k
            obs, info = self.vec.reset()
            reward, term, trunc = 0.0, False, False
        else:
            obs, reward, term, trunc, info = self.vec.step(self.actions[sl])
        self.obs[sl], self.rewards[sl], self.terminated[sl], self.truncated[sl] = obs, reward, term, trunc
        self.has_final[sl] = False
        return [("vec", base, info)] if info else []

    def _write_blob(self, slot: int, payload: Any) -> None:
        if not payload:
            self.info_len[slot] = 0
            return
        data = encode_info(payload)
        if len(data) > self.spec.info_bytes:
            raise ValueError(
                f"SharedMemoryVectorEnv worker {self.spec.index}: the infos of one step encode to {len(data)} bytes, "
                f"more than ColocatedConfig(info_bytes={self.spec.info_bytes}); raise info_bytes"
            )
        self.info_buf[slot, : len(data)] = np.frombuffer(data, dtype=np.uint8)
        self.info_len[slot] = len(data)

    # -- control (over the pipe) ----------------------------------------------------------------------------

    def control(self, msg: tuple[Any, ...]) -> Any:
        """Run one control command and return its picklable result."""
        kind = msg[0]
        if kind == "reset":
            return self._reset(msg[1], msg[2], msg[3])
        if kind == "call":
            _, name, args, kwargs = msg
            targets: list[Any] = [self.vec] if self.vec is not None else self.envs
            out = []
            for i, env in enumerate(targets):
                self.current_env = self.spec.base + i
                attr = env.get_wrapper_attr(name) if isinstance(env, gym.Env) else getattr(env, name)
                out.append(attr(*args, **kwargs) if callable(attr) else attr)
            return out
        if kind == "set_attr":
            _, name, values = msg
            targets = [self.vec] if self.vec is not None else self.envs
            for i, (env, value) in enumerate(zip(targets, values, strict=True)):
                self.current_env = self.spec.base + i
                if isinstance(env, gym.Env):
                    env.set_wrapper_attr(name, value)
                else:
                    setattr(env, name, value)
            return None
        raise ValueError(f"unknown control command {kind!r}")

    def _reset(self, seeds: list[int | None], options: dict[str, Any] | None, mask: list[bool] | None) -> Any:
        base = self.spec.base
        if self.vec is not None:
            self.current_env = base
            obs, info = self.vec.reset(seed=seeds[0], options=options)
            sl = slice(base, base + self.spec.num_envs)
            self.obs[sl] = obs
            self.autoreset = [False] * self.spec.num_envs
            self.pending_trunc = [False] * self.spec.num_envs
            return [("vec", base, info)] if info else []
        records = []
        for j, env in enumerate(self.envs):
            if mask is not None and not mask[j]:
                continue
            self.current_env = base + j
            obs, info = env.reset(seed=seeds[j], options=options)
            self.obs[base + j] = obs
            self.autoreset[j] = False
            self.pending_trunc[j] = False
            if info:
                records.append((base + j, info, None))
        return records

    def close(self) -> None:
        """Close every env, ignoring their errors (the worker is going away)."""
        closing: list[Any] = [*self.envs, *([self.vec] if self.vec is not None else [])]
        for env in closing:
            try:
                env.close()
            except Exception:
                log.debug("env close failed in worker %d", self.spec.index, exc_info=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _worker_main(
    spec: _WorkerSpec,
    layout: ShmLayout,
    inherited: ShmArena | None,
    pipe: Connection,
    cmd_sem: Semaphore,
    done_sems: tuple[Semaphore, Semaphore, Semaphore],
) -> None:
    """Entry point of a worker process: build envs, then serve step commands and control messages."""
    # SIGINT goes to the whole process group on Ctrl-C; the parent decides when its workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    arrays = attach(layout, inherited)
    try:
        runner = _EnvRunner(spec, arrays)
    except Exception as exc:
        pipe.send(("error", (spec.base, f"{type(exc).__name__}: {exc}", traceback.format_exc())))
        return
    pipe.send(("ok", None))
    w = spec.index
    cmd_seq, done_seq, ctrl_seq = arrays["cmd_seq"][w], arrays["done_seq"][w], arrays["ctrl_seq"]
    last = list(spec.start_done)
    last_ctrl = spec.start_ctrl
    spinner = Spinner(spec.spin_s)
    row = cmd_seq

    def ready() -> bool:
        return bool(ctrl_seq[w] != last_ctrl or row[0] != last[0] or row[1] != last[1] or row[2] != last[2])

    try:
        while True:
            if not spinner.wait(cmd_sem, ready, 1.0):
                if not _alive(spec.parent_pid):
                    return  # the parent is gone: nothing will read our results
                continue
            if ctrl_seq[w] != last_ctrl:
                last_ctrl = int(ctrl_seq[w])
                msg = pipe.recv()
                if msg[0] == "close":
                    runner.close()
                    pipe.send(("ok", None))
                    return
                try:
                    pipe.send(("ok", runner.control(msg)))
                except Exception as exc:
                    pipe.send(("error", (runner.current_env, f"{type(exc).__name__}: {exc}", traceback.format_exc())))
                continue
            for slot in (HALF0, HALF1, ALL):
                if cmd_seq[slot] != last[slot]:
                    last[slot] += 1
                    runner.step(slot)
                    done_seq[slot] = last[slot]
                    done_sems[slot].release()
                    break
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return


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


class SharedMemoryVectorEnv(VectorEnv):
    """See `cloud._colocated.SharedMemoryVectorEnv` for the documentation of this class."""

    def __init__(
        self,
        env_fns: Sequence[EnvFn] | None = None,
        *,
        vector_env_fns: Sequence[VectorEnvFn] | None = None,
        config: ColocatedConfig | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        worker_policy: Callable[[], Callable[[np.ndarray], np.ndarray]] | None = None,
    ) -> None:
        self.config = config = config or ColocatedConfig()
        if (env_fns is None) == (vector_env_fns is None):
            raise ValueError(
                "SharedMemoryVectorEnv: pass exactly one of env_fns (one factory per env) or vector_env_fns "
                "(one factory per worker, each returning a gymnasium VectorEnv)"
            )
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        if self.autoreset_mode == AutoresetMode.DISABLED:
            raise ValueError(
                "SharedMemoryVectorEnv: autoreset_mode=DISABLED is not supported; "
                "use NEXT_STEP (the default) or SAME_STEP"
            )
        self.copy = copy
        self._same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        self.counters = PoolCounters()
        self._worker_policy = worker_policy
        self._closed_workers = False
        self._ctx: Any = mp.get_context(config.context)
        self._in_flight: dict[int, float] = {}
        self._pending_control: list[int] | None = None

        # Read spaces from one throwaway env in the parent, as AsyncVectorEnv does.
        if env_fns is not None:
            if not env_fns:
                raise ValueError("SharedMemoryVectorEnv: env_fns is empty; pass at least one env factory")
            num_workers = config.num_workers or min(len(env_fns), os.cpu_count() or 1)
            if len(env_fns) % num_workers:
                raise ValueError(
                    f"SharedMemoryVectorEnv: len(env_fns)={len(env_fns)} is not a multiple of "
                    f"num_workers={num_workers}; give every worker the same number of envs"
                )
            per_worker = len(env_fns) // num_workers
            dummy = env_fns[0]()
            self.single_observation_space = dummy.observation_space
            self.single_action_space = dummy.action_space
            self.metadata = dict(dummy.metadata)
            self.render_mode = dummy.render_mode
            self.spec = dummy.spec
            dummy.close()
            groups: list[tuple[Sequence[EnvFn] | None, VectorEnvFn | None]] = [
                (list(env_fns[w * per_worker : (w + 1) * per_worker]), None) for w in range(num_workers)
            ]
        else:
            assert vector_env_fns is not None
            if not vector_env_fns:
                raise ValueError("SharedMemoryVectorEnv: vector_env_fns is empty; pass one factory per worker")
            num_workers = len(vector_env_fns)
            dummy_vec = vector_env_fns[0]()
            per_worker = dummy_vec.num_envs
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
            groups = [(None, fn) for fn in vector_env_fns]
        self.num_envs = n = num_workers * per_worker
        self._worker_spin_us, parent_spin_us = spin_times_us(config, num_workers)
        self._spinner = Spinner(parent_spin_us * 1e-6)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        obs_shape, obs_dtype = _array_layout(self.single_observation_space, n, "observation")
        act_shape, act_dtype = _array_layout(self.single_action_space, n, "action")

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
        # Each worker's blob region is written per slot: give each slot its own view.
        self._vectorised = vector_env_fns is not None

        # Halves: split each worker's envs in two; with one env per worker (or a vector env per worker, which
        # steps all its envs at once) whole workers alternate between the halves instead.
        self._workers: list[_Worker] = []
        self._groups = groups
        half_of_env = np.zeros(n, dtype=np.int64)
        for w in range(num_workers):
            base = w * per_worker
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
        self._half_indices = (np.flatnonzero(half_of_env == 0), np.flatnonzero(half_of_env == 1))
        self._slot_indices = (*self._half_indices, np.arange(n))
        self._positions = []
        for idx in self._slot_indices:
            pos = np.full(n, -1, dtype=np.int64)
            pos[idx] = np.arange(len(idx))
            self._positions.append(pos)
        self._slot_workers = tuple(
            tuple(wk for wk in self._workers if wk.slot_envs[s]) for s in range(SLOTS)
        )
        try:
            for wk in self._workers:
                self._start_worker(wk, fresh=False)
            for wk in self._workers:
                self._await_ready(wk)
        except BaseException:
            self.close(terminate=True)
            raise

    # -- worker lifecycle -----------------------------------------------------------------------------------

    def _start_worker(self, wk: _Worker, *, fresh: bool) -> None:
        env_fns, vector_fn = self._groups[wk.index]
        spec = _WorkerSpec(
            index=wk.index,
            base=wk.base,
            num_envs=wk.num_envs,
            env_fns=env_fns,
            vector_fn=vector_fn,
            slot_envs=wk.slot_envs,
            autoreset_mode=self.autoreset_mode.value,
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
        )
        parent_pipe, child_pipe = self._ctx.Pipe()
        wk.cmd_sem = self._ctx.Semaphore(0)
        wk.done_sems = (self._ctx.Semaphore(0), self._ctx.Semaphore(0), self._ctx.Semaphore(0))
        inherited = self._arena if self._ctx.get_start_method() == "fork" else None
        wk.process = self._ctx.Process(
            target=_worker_main,
            name=f"strata-colocated-{wk.index}",
            args=(spec, self._arena.layout, inherited, child_pipe, wk.cmd_sem, wk.done_sems),
            daemon=True,
        )
        wk.process.start()
        child_pipe.close()
        wk.pipe = parent_pipe
        wk.state = WorkerState.STARTING

    def _await_ready(self, wk: _Worker) -> None:
        status, payload = self._recv(wk, self.config.start_timeout_s, "start")
        if status != "ok":
            self._raise_env_error(wk, payload, "creating its envs")
        wk.state = WorkerState.READY

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

    def _raise_env_error(self, wk: _Worker, payload: Any, during: str) -> None:
        env_index, summary, tb = payload
        raise EnvWorkerError(
            f"SharedMemoryVectorEnv: env {env_index} (worker {wk.index}) raised while {during}: {summary}\n"
            f"--- worker traceback ---\n{tb}",
            env_index=int(env_index),
            worker_index=wk.index,
            remote_traceback=tb,
        )

    def _kill(self, wk: _Worker) -> None:
        if wk.process is not None and wk.process.exitcode is None:
            wk.process.kill()
        if wk.process is not None:
            wk.process.join(5)
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
        assert wk.cmd_sem is not None
        for _ in range(int((self._cmd_seq[w] - self._done_seq[w]).sum())):
            wk.cmd_sem.release()

    # -- stepping -------------------------------------------------------------------------------------------

    def _assert_open(self, what: str) -> None:
        if self.closed or self._closed_workers:
            raise PoolStateError(f"SharedMemoryVectorEnv.{what}: the pool is closed; create a new one")

    def _issue(self, slot: int, actions: Any, kind: int, what: str) -> None:
        self._assert_open(what)
        if self._pending_control is not None:
            raise PoolStateError(f"SharedMemoryVectorEnv.{what}: a control call is pending; wait for it first")
        busy = [s for s in self._in_flight if slot == ALL or s in (slot, ALL)]
        if busy:
            raise PoolStateError(
                f"SharedMemoryVectorEnv.{what}: slot {('half 0', 'half 1', 'all envs')[busy[0]]} is already "
                f"stepping; call the matching *_wait first"
            )
        idx = self._slot_indices[slot]
        if kind == 0:
            if slot == ALL:
                acts = np.asarray(actions)
                if acts.shape != self._actions.shape:
                    raise ValueError(
                        f"SharedMemoryVectorEnv.{what}: actions must have shape {self._actions.shape} "
                        f"(action_space.shape) but got {acts.shape}"
                    )
                self._actions[...] = acts
            else:
                acts = np.asarray(actions)
                if len(acts) != len(idx):
                    raise ValueError(
                        f"SharedMemoryVectorEnv.{what}: expected {len(idx)} actions for half {slot} "
                        f"(indices half_indices({slot})) but got {len(acts)}"
                    )
                self._actions[idx] = acts
        self._in_flight[slot] = time.monotonic()
        for wk in self._slot_workers[slot]:
            self._cmd_kind[wk.index, slot] = kind
            self._cmd_seq[wk.index, slot] += 1
            wk.state = WorkerState.STEPPING
            assert wk.cmd_sem is not None
            wk.cmd_sem.release()

    def _collect(self, slot: int, timeout: float | None, what: str) -> StepResult:
        if slot not in self._in_flight:
            raise PoolStateError(
                f"SharedMemoryVectorEnv.{what}: nothing is stepping in this slot; call the matching *_async first"
            )
        started = self._in_flight[slot]
        limit = self.config.step_timeout_s if timeout is None else timeout
        spinner = self._spinner
        errors: list[tuple[_Worker, Any]] = []
        failure: WorkerFailedError | None = None
        n = len(self._slot_indices[slot])
        infos: dict[str, Any] = {}
        blobs: list[Any] = []
        for wk in self._slot_workers[slot]:
            w = wk.index
            done_row, target = self._done_seq[w], int(self._cmd_seq[w, slot])
            while done_row[slot] < target:
                assert wk.done_sems is not None
                if spinner.wait(wk.done_sems[slot], _reached(done_row, slot, target), 0.05):
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
                if self.config.on_worker_failure == "raise":
                    self._restart(wk, reason, abandon=slot)
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
            if failure is not None and failure.worker_index == w:
                continue
            length = int(self._info_len[w, slot])
            # Infos and error records are decoded without pickle (cloud._infocodec), like everything else here.
            if self._status[w, slot] == _ERROR:
                errors.append((wk, decode_info(self._info_buf[w, slot, :length].tobytes())))
            elif length:
                blobs.append(decode_info(self._info_buf[w, slot, :length].tobytes()))
        del self._in_flight[slot]
        if failure is not None:
            raise failure
        if errors:
            self._handle_env_errors(errors, slot, timeout, what)
            return self._collect_after_restart(slot, timeout, what)
        return self._assemble(slot, n, blobs, infos)

    def _handle_env_errors(
        self, errors: list[tuple[_Worker, Any]], slot: int, timeout: float | None, what: str
    ) -> None:
        self.counters.env_errors += len(errors)
        raise_it = self.config.on_env_error == "raise"
        for wk, _payload in errors:
            self._restart(wk, "an env raised", abandon=slot)
        if raise_it:
            wk, payload = errors[0]
            self._raise_env_error(wk, payload, f"stepping ({what})")

    def _collect_after_restart(self, slot: int, timeout: float | None, what: str) -> StepResult:
        # on_env_error="restart": only the restarted workers get the command again (same actions in shm); their
        # envs answer it with the dropped episodes' truncation. The other workers are not stepped twice: their
        # results are still in shared memory and are simply read again.
        self._in_flight[slot] = time.monotonic()
        for wk in self._slot_workers[slot]:
            if self._status[wk.index, slot] == _ERROR:
                self._cmd_seq[wk.index, slot] += 1
                assert wk.cmd_sem is not None
                wk.cmd_sem.release()
        return self._collect(slot, timeout, what)

    def _assemble(self, slot: int, n: int, blobs: list[Any], infos: dict[str, Any]) -> StepResult:
        idx = self._slot_indices[slot]
        full = slot == ALL
        per_env: dict[int, dict[str, Any]] = {}
        finals: dict[int, dict[str, Any] | None] = {}
        for blob in blobs:
            for rec in blob:
                if rec[0] == "vec":
                    self._unbatch(rec[1], rec[2], per_env)
                else:
                    g, info, final_info = rec
                    per_env[g] = info
                    finals[g] = final_info
        # has_final is only ever set in SAME_STEP mode (the worker writes it for every env it steps).
        has_final = self._has_final if full else self._has_final[idx]
        if self._same_step and has_final.any():
            for pos in np.flatnonzero(has_final):
                g = int(pos) if full else int(idx[pos])
                per_env[g] = {
                    "final_info": finals.get(g) or {},
                    "final_obs": self._final_obs[g].copy(),
                    **per_env.get(g, {}),
                }
        positions = self._positions[slot]
        for g in sorted(per_env):
            if per_env[g]:
                infos = add_info(infos, per_env[g], int(positions[g]), n)
        if full:
            obs = self._obs.copy() if self.copy else self._obs
            return obs, self._rewards.copy(), self._terminated.copy(), self._truncated.copy(), infos
        return self._obs[idx], self._rewards[idx], self._terminated[idx], self._truncated[idx], infos

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
        """Send a batch of actions (shape ``action_space.shape``) to all envs; collect with `step_wait`."""
        self._issue(ALL, actions, 0, "step_async")

    def step_wait(self, timeout: float | None = None) -> StepResult:
        """Wait for the step of all envs; ``timeout`` overrides `ColocatedConfig.step_timeout_s` for this call."""
        return self._collect(ALL, timeout, "step_wait")

    def step(self, actions: Any) -> StepResult:
        """Step every env with `actions`; same returns as `gymnasium.vector.AsyncVectorEnv.step`."""
        self._issue(ALL, actions, 0, "step")
        return self._collect(ALL, None, "step")

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the current workers (they change when a worker is restarted)."""
        return tuple(int(wk.process.pid) for wk in self._workers)

    @property
    def shm_name(self) -> str:
        """Name of the pool's shared-memory segment (``/dev/shm/<name>`` while the pool is open)."""
        return self._arena.name

    def half_indices(self, half: int) -> np.ndarray:
        """The env indices (into the full batch) that make up `half` (0 or 1), in the order halves use."""
        return self._half_indices[self._check_half(half)]

    def _check_half(self, half: int) -> int:
        if half not in (HALF0, HALF1):
            raise ValueError(f"SharedMemoryVectorEnv: half must be 0 or 1, got {half!r}")
        return half

    def step_half_async(self, half: int, actions: Any) -> None:
        """Send actions for the envs of `half` (``len(half_indices(half))`` of them); collect with `step_half_wait`."""
        self._issue(self._check_half(half), actions, 0, "step_half_async")

    def step_half_wait(self, half: int, timeout: float | None = None) -> StepResult:
        """Wait for `half`'s step; the returned arrays (copies) are indexed like `half_indices(half)`."""
        return self._collect(self._check_half(half), timeout, "step_half_wait")

    def observations(self, half: int | None = None) -> np.ndarray:
        """The latest observations of all envs (a view) or of one half (a copy)."""
        return self._obs if half is None else self._obs[self.half_indices(half)]

    def act_step(self, timeout: float | None = None) -> tuple[np.ndarray, StepResult]:
        """Workers pick actions with their own policy copy (`worker_policy`), then step; returns (actions, step)."""
        if self._worker_policy is None:
            raise PoolStateError(
                "SharedMemoryVectorEnv.act_step: no worker_policy was given; pass worker_policy=<factory> or use step()"
            )
        self._issue(ALL, None, 1, "act_step")
        result = self._collect(ALL, timeout, "act_step")
        return self._actions.copy(), result

    # -- control --------------------------------------------------------------------------------------------

    def _control_async(self, messages: Sequence[tuple[Any, ...] | None], what: str) -> None:
        self._assert_open(what)
        if self._in_flight or self._pending_control is not None:
            raise PoolStateError(
                f"SharedMemoryVectorEnv.{what}: a step or another call is in flight; finish it with its *_wait first"
            )
        sent = []
        for wk, msg in zip(self._workers, messages, strict=True):
            if msg is None:
                continue
            assert wk.pipe is not None and wk.cmd_sem is not None
            wk.pipe.send(msg)
            self._ctrl_seq[wk.index] += 1
            wk.cmd_sem.release()
            sent.append(wk.index)
        self._pending_control = sent

    def _control_wait(self, timeout: float | None, what: str) -> list[tuple[_Worker, Any]]:
        if self._pending_control is None:
            raise PoolStateError(f"SharedMemoryVectorEnv.{what}: no call is pending; call the matching *_async first")
        sent, self._pending_control = self._pending_control, None
        limit = self.config.step_timeout_s if timeout is None else timeout
        results: list[tuple[_Worker, Any]] = []
        crash: WorkerFailedError | None = None
        env_failure: tuple[_Worker, Any] | None = None
        for w in sent:
            wk = self._workers[w]
            try:
                status, payload = self._recv(wk, limit, what)
            except WorkerFailedError as exc:
                self._restart(wk, str(exc), abandon=None)
                crash = crash or exc
                continue
            if status != "ok":
                env_failure = env_failure or (wk, payload)
                continue
            results.append((wk, payload))
        if crash is not None:
            raise crash
        if env_failure is not None:
            self._raise_env_error(env_failure[0], env_failure[1], what.replace("_wait", ""))
        return results

    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Start resetting the envs; see `reset`."""
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
        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = np.asarray(options.pop("reset_mask"))
            if mask.shape != (n,) or mask.dtype != np.bool_ or not mask.any():
                raise ValueError(
                    f"`options['reset_mask']` must be a bool array of shape ({n},) with at least one True value, "
                    f"got {mask!r}"
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
        self._control_async(messages, "reset_async")

    def reset_wait(self, timeout: float | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Wait for `reset_async` and return (observations, infos)."""
        results = self._control_wait(timeout, "reset_wait")
        per_env: dict[int, dict[str, Any]] = {}
        for _wk, records in results:
            for rec in records:
                if rec[0] == "vec":
                    self._unbatch(rec[1], rec[2], per_env)
                else:
                    per_env[rec[0]] = rec[1]
        infos: dict[str, Any] = {}
        for g in sorted(per_env):
            infos = add_info(infos, per_env[g], g, self.num_envs)
        return (self._obs.copy() if self.copy else self._obs), infos

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset envs: an int ``seed`` gives env i seed+i, a list one seed per env; options["reset_mask"] picks envs."""
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Start calling method (or reading attribute) `name` on every env; see `call`."""
        self._control_async([("call", name, args, kwargs)] * len(self._workers), "call_async")

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for `call_async`; one result per env (per worker with vector_env_fns)."""
        return tuple(r for _wk, results in self._control_wait(timeout, "call_wait") for r in results)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call `name(*args, **kwargs)` on every env (or read it if it is not callable); one result per env."""
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute `name` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute `name` on every env: one value for all, or a list/tuple with one value per env."""
        targets = len(self._workers) if self._vectorised else self.num_envs
        if not isinstance(values, list | tuple):
            values = [values] * targets
        if len(values) != targets:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {targets} environments."
            )
        messages: list[tuple[Any, ...] | None] = []
        for wk in self._workers:
            part = values[wk.index : wk.index + 1] if self._vectorised else values[wk.base : wk.base + wk.num_envs]
            messages.append(("set_attr", name, list(part)))
        self._control_async(messages, "set_attr")
        self._control_wait(None, "set_attr")

    def close_extras(self, timeout: float | None = None, terminate: bool = False, **kwargs: Any) -> None:
        """Stop the workers (politely unless `terminate`) and unlink the shared memory."""
        if self._closed_workers:
            return
        self._closed_workers = True
        deadline = time.monotonic() + (self.config.close_timeout_s if timeout is None else timeout)
        workers = getattr(self, "_workers", [])
        if not terminate and not self._in_flight:
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
                if wk.process is not None:
                    wk.process.join(max(0.0, deadline - time.monotonic()))
        for wk in workers:
            self._kill(wk)
            wk.state = WorkerState.CLOSED
        self._arena.close()

    def __del__(self) -> None:
        # The shared memory has its own finalizer; this makes sure no worker outlives a pool left unclosed.
        if not getattr(self, "closed", True) and hasattr(self, "_arena"):
            self.close(terminate=True)


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
