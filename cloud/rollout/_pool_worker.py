"""A pool worker process: its start-up spec, the envs it steps (`EnvRunner`) and its command loop (`worker_main`).

Per step command (slot = half 0, half 1 or all of the worker's envs) the worker reads the actions (from shared
memory, from its own policy copy, or from the pipe when they cannot be written to shared memory unchanged),
steps its envs of the slot and writes the results where the pool's carrier says (`cloud._pool_carriers`):

- ``array`` (fixed-shape Box/Discrete/MultiDiscrete/MultiBinary, the hot path): observations, rewards, flags and
  final observations into the pool's segment; infos and error records, only when there are any, encoded without
  pickle (`cloud.rollout._infocodec`) into the worker's info buffer.
- ``shm`` (Tuple, Dict, Text, OneOf of fixed size): observations through gymnasium's shared-memory utilities;
  infos and final observations pickled over the pipe, as AsyncVectorEnv carries them.
- ``pipe`` (dynamic and custom spaces, or ``shared_memory=False``): observations, infos and final observations
  pickled over the pipe.

Then it marks the slot done (counter + semaphore). Control commands (reset, call, set_attr, close) arrive
over the pipe and answer over it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Semaphore
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import write_to_shared_memory

from cloud.rollout._infocodec import encode_info
from cloud.rollout._pool_spin import Spinner
from cloud.rollout._shm import ShmArena, ShmLayout, attach
from functions._lifetime import GRACE_S, pid_alive, watch_parent

log = logging.getLogger(__name__)

HALF0, HALF1, ALL = 0, 1, 2
SLOTS = 3
OK, ERROR = 0, 1
# Where a step command's actions are (cmd_kind): shared memory, the worker's policy, or the pipe.
ACT_SHM, ACT_POLICY, ACT_PIPE = 0, 1, 2
EnvFn = Callable[[], gym.Env]
VectorEnvFn = Callable[[], VectorEnv]
# One env's step outcome for the parent: (env index, info, final info or None); `finals` maps env index to a
# final observation that does not sit in the shared final_obs array.
Record = tuple[int, dict[str, Any], dict[str, Any] | None]


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """Everything one worker process needs to start (the factories are cloudpickled, as AsyncVectorEnv does)."""

    index: int
    base: int
    num_envs: int
    env_fns: Sequence[EnvFn] | None
    vector_fn: VectorEnvFn | None
    slot_envs: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    autoreset_mode: str
    carrier: str
    spin_s: float
    info_bytes: int
    fresh: bool
    start_done: tuple[int, int, int]
    start_ctrl: int
    parent_pid: int
    policy_fn: Callable[[], Callable[[np.ndarray], np.ndarray]] | None
    observation_mode: str
    single_observation_space: gym.Space[Any]
    single_action_space: gym.Space[Any]


def error_record(env_index: int, exc: BaseException) -> tuple[int, str, str, str, str]:
    """What the parent needs to re-raise an env's exception: index, summary, traceback, type module and name."""
    kind = type(exc)
    return env_index, f"{kind.__name__}: {exc}", traceback.format_exc(), kind.__module__, kind.__qualname__


class EnvRunner:
    """A worker's envs and the shared arrays it writes; one `step(slot)` per command."""

    def __init__(
        self, spec: WorkerSpec, arrays: dict[str, np.ndarray], pipe: Connection, gym_shm: Any, limit: Semaphore | None
    ) -> None:
        self.spec = spec
        self.mode = AutoresetMode(spec.autoreset_mode)
        self.carrier = spec.carrier
        self.pipe, self.gym_shm, self.limit = pipe, gym_shm, limit
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
        self.in_array = self.carrier == "array"
        self.final_dtype, self.final_shape = self.final_obs.dtype, self.final_obs.shape[1:]
        self._stash: dict[int, Any] = {}  # actions sent over the pipe for a slot not being stepped yet

    def check_spaces(self) -> tuple[bool, bool]:
        """Do this worker's envs have the pool's spaces? (observation, action), as AsyncVectorEnv checks."""
        spec = self.spec
        pairs: list[tuple[gym.Space[Any], gym.Space[Any]]] = (
            [(self.vec.single_observation_space, self.vec.single_action_space)]
            if self.vec is not None
            else [(env.observation_space, env.action_space) for env in self.envs]
        )
        same_obs = all(
            obs == spec.single_observation_space
            if spec.observation_mode == "same"
            else is_space_dtype_shape_equiv(spec.single_observation_space, obs)
            for obs, _ in pairs
        )
        return same_obs, all(act == spec.single_action_space for _, act in pairs)

    # -- the hot path ---------------------------------------------------------------------------------------

    def step(self, slot: int) -> Any:
        """Step the envs of `slot`; write results (or the error records of every env that raised).

        Returns what must go over the pipe after the slot is marked done (``shm``/``pipe`` carriers), else None.
        """
        local = self.spec.slot_envs[slot]
        kind = int(self.cmd_kind[slot])
        errors: list[tuple[int, str, str, str, str]] = []
        out: Any = None
        try:
            actions = self._pipe_actions(slot) if kind == ACT_PIPE else None
            if kind == ACT_POLICY and self.policy is not None:
                self._act(local)
            finals: list[tuple[int, Any]]
            if self.vec is not None:
                records, finals, obs = self._step_vector(local), [], None
            else:
                records, finals, obs = self._step_envs(local, actions, errors)
            if errors:
                raise _EnvsFailed
            if self.carrier == "array":
                self._write_blob(slot, (records, finals) if records or finals else None)
            else:
                out = (slot, records, finals, obs)
                self.info_len[slot] = 0
            self.status[slot] = OK
        except _EnvsFailed:
            self._write_blob(slot, errors)
            self.status[slot] = ERROR
        except Exception as exc:
            self._write_blob(slot, [error_record(self.current_env, exc)])
            self.status[slot] = ERROR
        return out

    def _pipe_actions(self, slot: int) -> list[Any]:
        while slot not in self._stash:
            tag, got, actions = self.pipe.recv()
            assert tag == "act", tag
            self._stash[got] = actions
        return list(self._stash.pop(slot))

    def _act(self, local: tuple[int, ...]) -> None:
        assert self.policy is not None
        idx = np.asarray(local, dtype=np.intp) + self.spec.base
        self.actions[idx] = self.policy(self.obs[idx])

    def _step_envs(
        self, local: tuple[int, ...], pipe_actions: list[Any] | None, errors: list[tuple[int, str, str, str, str]]
    ) -> tuple[list[Record], list[tuple[int, Any]], list[Any] | None]:
        # Results go to Python lists and are written to shared memory in one slice assignment per array:
        # per-element numpy writes cost more than the CartPole step itself.
        if not local:
            return [], [], None
        base, mode = self.spec.base, self.mode
        same_step, next_step = mode == AutoresetMode.SAME_STEP, mode == AutoresetMode.NEXT_STEP
        lo = base + local[0]
        sl = slice(lo, lo + len(local))
        actions: Any = pipe_actions if pipe_actions is not None else self.actions[sl].copy()
        autoreset, pending, limit = self.autoreset, self.pending_trunc, self.limit
        in_array, final_dtype, final_shape = self.in_array, self.final_dtype, self.final_shape
        records: list[Record] = []
        finals: list[tuple[int, Any]] = []
        obs_list: list[Any] = []
        rew_list: list[Any] = []
        term_list: list[Any] = []
        trunc_list: list[Any] = []
        ended: list[int] = []
        for i, j in enumerate(local):
            g = base + j
            self.current_env = g
            env = self.envs[j]
            if pending[j]:
                obs_list.append(self._dropped(j, g, records, finals))
                rew_list.append(0.0)
                term_list.append(False)
                trunc_list.append(True)
                if same_step:
                    ended.append(g)
                continue
            reward: Any
            if limit is not None:
                limit.acquire()
            try:
                if next_step and autoreset[j]:
                    obs, info = env.reset()
                    reward, term, trunc = 0.0, False, False
                else:
                    obs, reward, term, trunc, info = env.step(actions[i])
                if same_step and (term or trunc):
                    # The final observation rides in the shared array when it is exactly an array of its
                    # dtype and shape; anything else (a Python int from a Discrete env, a composite value)
                    # travels as itself, so the caller sees what the env returned.
                    if in_array and type(obs) is np.ndarray and obs.dtype == final_dtype and obs.shape == final_shape:
                        self.final_obs[g] = obs
                    else:
                        finals.append((g, obs))
                    final_info = info
                    obs, info = env.reset()
                    ended.append(g)
                    if info or final_info:
                        records.append((g, info, final_info))
                elif info:
                    records.append((g, info, None))
            except Exception as exc:
                errors.append(error_record(g, exc))
                obs, reward, term, trunc = None, 0.0, False, False
            finally:
                if limit is not None:
                    limit.release()
            obs_list.append(obs)
            rew_list.append(reward)
            term_list.append(term)
            trunc_list.append(trunc)
            autoreset[j] = term or trunc
        if errors:
            return records, finals, None
        if in_array:
            self.obs[sl] = obs_list
        else:
            self._write_obs(sl, obs_list)
        self.rewards[sl] = rew_list
        self.terminated[sl] = term_list
        self.truncated[sl] = trunc_list
        if same_step:
            has_final = self.has_final
            has_final[sl] = False
            if ended:
                has_final[ended] = True
        return records, finals, (None if in_array or self.carrier == "shm" else obs_list)

    def _write_obs(self, sl: slice, obs_list: list[Any]) -> None:
        if self.carrier == "shm":
            space = self.spec.single_observation_space
            for g, obs in zip(range(sl.start, sl.stop), obs_list, strict=True):
                write_to_shared_memory(space, g, obs, self.gym_shm)

    def _dropped(self, j: int, g: int, records: list[Record], finals: list[tuple[int, Any]]) -> Any:
        """The first step of env `j` after a restart: the dropped episode, truncated (see cloud.rollout._colocated)."""
        self.pending_trunc[j] = False
        if self.carrier != "array":
            # The old worker's last observation of a composite or dynamic space is not kept: start anew.
            obs, info = self.envs[j].reset()
            if self.mode == AutoresetMode.SAME_STEP:
                finals.append((g, obs))
                records.append((g, {**info, "worker_restarted": True}, {}))
            else:
                records.append((g, {**info, "worker_restarted": True}, None))
            return obs
        if self.mode == AutoresetMode.SAME_STEP:
            self.final_obs[g] = self.obs[g]
            obs, info = self.envs[j].reset()
            records.append((g, {**info, "worker_restarted": True}, {}))
            return obs
        if self.mode == AutoresetMode.NEXT_STEP:
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
            if name in ("reset", "step", "close", "_setattr", "_check_spaces"):
                raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` directly instead.")
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
            return [("vec", base, info)] if info else [], None
        records = []
        errors: list[tuple[int, str, str, str, str]] = []
        new_obs: dict[int, Any] = {}
        for j, env in enumerate(self.envs):
            if mask is not None and not mask[j]:
                continue
            self.current_env = base + j
            if self.limit is not None:
                self.limit.acquire()
            try:
                obs, info = env.reset(seed=seeds[j], options=options)
            except Exception as exc:
                errors.append(error_record(base + j, exc))
                continue
            finally:
                if self.limit is not None:
                    self.limit.release()
            self.autoreset[j] = False
            self.pending_trunc[j] = False
            new_obs[base + j] = obs
            if info:
                records.append((base + j, info, None))
        if errors:
            raise _EnvsFailed(errors)
        if self.carrier == "array":
            for g, obs in new_obs.items():
                self.obs[g] = obs
            return records, None
        if self.carrier == "shm":
            for g, obs in new_obs.items():
                write_to_shared_memory(self.spec.single_observation_space, g, obs, self.gym_shm)
            return records, None
        return records, new_obs

    def close(self) -> None:
        """Close every env, ignoring their errors (the worker is going away)."""
        closing: list[Any] = [*self.envs, *([self.vec] if self.vec is not None else [])]
        for env in closing:
            try:
                env.close()
            except Exception:
                log.debug("env close failed in worker %d", self.spec.index, exc_info=True)


class _EnvsFailed(Exception):
    """Internal: one or more envs raised; their error records are in `args[0]` (or collected by the caller)."""


def quiet_on_group_signals(parent_pid: int) -> Callable[[], None]:
    """A worker ignores the signals a process group gets while its parent lives; returns what runs once it is gone.

    Ctrl-C and SIGTERM/SIGHUP reach the whole process group (a terminal, `timeout`, systemd, ``kill -- -PGID``):
    while the parent lives it alone reports and closes its workers (a forked worker would otherwise run the parent's
    handler and print a `StopSignal` traceback). The returned function is `watch_parent`'s action when the parent
    is gone: the worker then leaves its loop quietly (SIGTERM), or is killed after a grace period.
    """
    gone = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def handler(signum: int, frame: Any) -> None:
        if gone.is_set() or not pid_alive(parent_pid):
            raise KeyboardInterrupt  # the serve loop returns on it; nothing is printed

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)

    def parent_gone() -> None:
        gone.set()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    return parent_gone


def worker_main(
    spec: WorkerSpec,
    layout: ShmLayout,
    inherited: ShmArena | None,
    pipe: Connection,
    cmd_sem: Semaphore,
    done_sems: tuple[Semaphore, Semaphore, Semaphore],
    gym_shm: Any,
    limit: Semaphore | None,
) -> None:
    """Entry point of a worker process: build envs, then serve step commands and control messages."""
    parent_gone = quiet_on_group_signals(spec.parent_pid)
    # Also when the parent is killed with SIGKILL while we compute (functions._lifetime).
    watch_parent(spec.parent_pid, on_death=parent_gone)
    arrays = attach(layout, inherited)
    try:
        runner = EnvRunner(spec, arrays, pipe, gym_shm, limit)
        spaces_ok = runner.check_spaces()
    except Exception as exc:
        pipe.send(("error", [error_record(spec.base, exc)]))
        return
    pipe.send(("ok", spaces_ok))
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
                if not pid_alive(spec.parent_pid):
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
                except _EnvsFailed as failed:
                    pipe.send(("error", failed.args[0]))
                except Exception as exc:
                    pipe.send(("error", [error_record(runner.current_env, exc)]))
                continue
            for slot in (HALF0, HALF1, ALL):
                if cmd_seq[slot] != last[slot]:
                    last[slot] += 1
                    out = runner.step(slot)
                    done_seq[slot] = last[slot]
                    done_sems[slot].release()
                    if out is not None:
                        # After the done mark, so a large message never blocks a parent waiting for that mark.
                        pipe.send(("out", *out))
                    break
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
