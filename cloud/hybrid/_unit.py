"""One hybrid unit: a PPO learner replica and its own rollout sources, in step with the other units.

The loop is `cloud._train.train`'s, with three collectives added (see the state machine in `cloud.hybrid`):
the gradient all-reduce inside every minibatch step (`cloud._ppo.ppo_update`'s ``reduce_gradients``), one
all-gather of each unit's update summary (steps, episodes, normaliser moments, figures for status), and one
broadcast of rank 0's decision (stop, switch).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from cloud._checkpoint import latest_checkpoint
from cloud._control import SWITCHES_FILE
from cloud._errors import HybridError
from cloud._stop import Checkpointer, resume_state
from cloud._switcher import SwitchEvent
from cloud.hybrid._config import UnitSpec
from device import ConfigError, require, space_to_json

RETURN_WINDOW = 20
"""Episodes in the moving mean that decides "solved" (as in `cloud._train`), over all units' episodes."""

CONFIRM_EVERY = 5
"""Updates between two confirmation evaluations of the deterministic policy (as in `cloud._train`)."""

STOP_NONE, STOP_SOLVED, STOP_SIGNAL = 0, 1, 2


@dataclass(frozen=True)
class HybridResult:
    """What a hybrid run did, as rank 0 saw it (every unit returns one; rank 0's is the run's)."""

    run_dir: Path
    env_id: str
    units: int
    policy_version: int
    global_step: int
    """Env steps of all units together, over the whole lineage."""
    wall_s: float
    checkpoint: Path | None
    mean_return: float
    solved_at_step: int | None
    solved_at_s: float | None
    greedy_return: float | None
    digests: list[str]
    """Every unit's digest of its final policy (weights and normaliser), in rank order: all equal."""
    normalizer_count: float
    """Observations the (merged) normaliser has seen."""
    unit_steps: list[int]
    """Env steps each unit collected in this call, in rank order."""
    accounting: dict[str, Any] = field(default_factory=dict)
    """Transitions produced and consumed, duplicates and gaps: ``total`` and ``per_unit``."""
    switches: tuple[SwitchEvent, ...] = ()
    stopped_by: str | None = None
    """The signal that stopped the run early, else None."""
    published: int = 0
    """Versions rank 0 pushed to the parameter server."""
    timings: dict[str, float] = field(default_factory=dict)
    """This unit's seconds collecting, updating and in gradient all-reduces, its update count, and the CPU
    seconds of its learner process (``cpu_s``) and of its env workers (``workers_cpu_s``)."""
    unit_status: list[dict[str, Any]] = field(default_factory=list)
    """Every unit's last status (rank, node, local rank, pid, steps, steps/s, workers, mode), in rank order."""


class _StopFlag:
    """SIGTERM / SIGINT ask the unit to stop at the next update boundary; a second one stops it at once."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> _StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _Summary:
    """The fixed layout of the float64 vector each unit contributes to the per-update all-gather."""

    HEAD = ("steps", "stop", "workers", "steps_per_s", "pid", "local_rank", "node_rank", "collect_s", "update_s",
            "allreduce_s", "obs_count", "episodes", "mode")

    def __init__(self, obs_dim: int, max_episodes: int) -> None:
        self.d, self.e = obs_dim, max_episodes
        self.h = len(self.HEAD)
        self.size = self.h + 2 * obs_dim + 2 * max_episodes

    def pack(self, head: dict[str, float], mean: np.ndarray, var: np.ndarray, returns: list[float],
             lengths: list[int]) -> np.ndarray:
        v = np.zeros(self.size, dtype=np.float64)
        v[:self.h] = [head[name] for name in self.HEAD]
        v[self.h:self.h + self.d] = mean
        v[self.h + self.d:self.h + 2 * self.d] = var
        n = min(len(returns), self.e)
        start = self.h + 2 * self.d
        v[start:start + n] = returns[:n]
        v[start + self.e:start + self.e + n] = lengths[:n]
        return v

    def head(self, row: np.ndarray) -> dict[str, float]:
        return {name: float(row[i]) for i, name in enumerate(self.HEAD)}

    def moments(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return row[self.h:self.h + self.d], row[self.h + self.d:self.h + 2 * self.d]

    def episodes(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = int(row[self.HEAD.index("episodes")])
        start = self.h + 2 * self.d
        return row[start:start + n], row[start + self.e:start + self.e + n]


def _print(line: str) -> None:
    print(line, flush=True)


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _resume_state(spec: UnitSpec) -> dict[str, Any] | None:
    """The checkpoint this unit starts from: with ``--resume``, or after torchrun restarted the group."""
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    path = latest_checkpoint(spec.run_dir)
    if spec.resume and path is None:
        raise ConfigError(f"train: --resume given but run dir {str(spec.run_dir)!r} has no checkpoint; "
                          "drop --resume to start a new run")
    if path is None:
        return None
    if not (spec.resume or restarted):
        raise ConfigError(f"train: run dir {str(spec.run_dir)!r} already has checkpoints; pass --resume to "
                          "continue that run or choose another --run-dir")
    leader = int(os.environ.get("RANK", "0")) == 0
    state = resume_state(Path(spec.run_dir), env_id=spec.env_id, algo="ppo", caller="train", trim=leader)
    if leader:
        version = int(state["version"])
        if restarted:
            print(f"strata train: the unit group was restarted (restart "
                  f"{os.environ['TORCHELASTIC_RESTART_COUNT']}): every unit resumes from {path} (policy version "
                  f"{version}, step {int(state['global_step']):,})", flush=True)
    return state


def run_unit(spec: UnitSpec) -> HybridResult:
    """Train as one unit of the group torchrun (or `cloud.hybrid.train_hybrid`) started; return what it saw."""
    torch = require("torch", extra="cloud", purpose="the PPO learner")
    gym = require("gymnasium", extra="cloud", purpose="training environments")
    from cloud._agent import build_learner
    from cloud._envs import probe_spaces
    from cloud._metrics import MetricsWriter
    from cloud._ppo import ppo_update
    from cloud._switcher import SwitchRules
    from cloud._switching import build_switcher
    from cloud._train import _Progress, evaluate_greedy
    from cloud.hybrid._leader import Leader
    from cloud.hybrid._sync import UnitGroup, state_digest

    rank = int(os.environ.get("RANK", "0"))
    log: Callable[[str], None] = _print if rank == 0 else (lambda line: None)
    config, run_dir = spec.config, Path(spec.run_dir)
    state = _resume_state(spec)
    version = int(state["version"]) if state else 0
    global_step = int(state["global_step"]) if state else 0
    seed = spec.seed

    torch.set_num_threads(config.torch_threads)
    torch.manual_seed(seed + 7919 * version)  # the same on every unit: identical initial weights
    obs_space, action_space = probe_spaces(spec.env_id)
    assert isinstance(obs_space, gym.spaces.Box)
    obs_dim = int(np.prod(obs_space.shape))
    agent, optimizer, normalizer, reward_scaler, recent = build_learner(obs_space, action_space, config, state)
    # From here on every unit draws its own actions and minibatches, and steps its own env streams.
    torch.manual_seed(seed + 7919 * version + 1_000_033 * (rank + 1))
    generator = np.random.default_rng([seed, version, rank])
    env_seed = seed + 104729 * version + 7_777_777 * rank
    spaces = {"observation_space": space_to_json(obs_space), "action_space": space_to_json(action_space)}

    stop = _StopFlag().install()
    switcher = group = leader = metrics = None
    checkpointer: Checkpointer | None = None
    last_path: Path | None = None
    try:
        # The pool forks its workers before the group opens its sockets, so no worker holds a copy of them.
        switcher = build_switcher(env_id=spec.env_id, config=config, switching=spec.switching, rules=SwitchRules(),
                                  run_dir=run_dir, seed=env_seed, agent=agent, normalizer=normalizer,
                                  publisher=None, log=log, first_version=version,
                                  colocated_workers=spec.hybrid.workers_per_unit)
        group = UnitGroup(timeout_s=spec.hybrid.collective_timeout_s)
        if spec.hybrid.units is not None and spec.hybrid.units != group.world:
            raise ConfigError(f"train --modes hybrid: --units {spec.hybrid.units} but the launcher started "
                              f"{group.world} units; drop --units under torchrun (its world size decides)")
        group.broadcast_module(agent)
        digests = group.gather_digests(state_digest(agent, normalizer))
        if len(set(digests)) > 1:
            raise HybridError(f"units start from different policies (digests {digests}); every unit must see the "
                              f"same run dir {str(run_dir)!r} (shared storage) to resume from its checkpoints")
        world = group.world
        modes = switcher.modes
        summary = _Summary(obs_dim, config.batch_size)
        num_updates = max(1, spec.total_steps // (world * config.batch_size))

        def snapshot_state() -> dict[str, Any]:
            return {"algo": "ppo", "env_id": spec.env_id, "seed": seed, "version": version,
                    "global_step": global_step, "config": config.to_dict(), **spaces,
                    "agent": {k: v.detach().clone() for k, v in agent.state_dict().items()},
                    "optimizer": copy.deepcopy(optimizer.state_dict()), "normalizer": normalizer.state_dict(),
                    "reward_scaler": reward_scaler.state_dict(), "recent_returns": list(recent),
                    "hybrid": {"units": world}}

        if group.is_leader:
            run_dir.mkdir(parents=True, exist_ok=True)
            # Rank 0 commits every completed update: kept every checkpoint_every updates, otherwise the newest is
            # written in the background as the rolling checkpoint (at most once per rolling_checkpoint_s); a stop
            # of any kind writes the last commit.
            checkpointer = Checkpointer(run_dir, keep_every=spec.checkpoint_every, start_version=version,
                                        rolling_every_s=spec.rolling_checkpoint_s)
            leader = Leader(switcher=switcher, env_id=spec.env_id, run_dir=run_dir,
                            policy=spec.env_id.split("-")[0].lower(), control=spec.switching.control,
                            param_host=spec.hybrid.param_server_host, param_port=spec.hybrid.param_server_port)
            metrics = MetricsWriter(run_dir)
            _append_jsonl(run_dir / SWITCHES_FILE, {"from_mode": None, "to_mode": switcher.mode,
                                                    "reason": f"initial mode of {world} hybrid units",
                                                    "trigger": "start", "at_step": global_step,
                                                    "at_version": version, "pause_s": 0.0})
            log(f"strata train: {world} hybrid units (gloo), {config.num_envs} envs each in mode {switcher.mode}; "
                f"parameter server {leader.server.address}")

        solved_at_step: int | None = None
        solved_at_s: float | None = None
        greedy_return: float | None = None
        last_confirm = -CONFIRM_EVERY
        stopped_by: str | None = None
        unit_steps = [0] * world
        units: list[dict[str, Any]] = []
        mean_return = float("nan")
        timings = {"collect_s": 0.0, "update_s": 0.0, "allreduce_s": 0.0, "updates": 0.0}
        started, cpu_started = time.perf_counter(), time.process_time()
        start_step = global_step
        display = _Progress(spec.total_steps, start_step, enabled=False if rank else
                            (os.isatty(1) if spec.progress is None else spec.progress), log=log, env_id=spec.env_id)
        with display:
            while global_step < spec.total_steps:
                if config.anneal_lr:
                    optimizer.param_groups[0]["lr"] = max(0.0, 1.0 - version / num_updates) * config.learning_rate
                t0 = time.perf_counter()
                batch, episodes = switcher.collect(policy_version=version, global_step=global_step)
                t1 = time.perf_counter()
                update_batch = batch
                if reward_scaler.enabled:  # every unit folds every unit's return moments, in rank order: one scale
                    returns = reward_scaler.discounted_returns(
                        batch.rewards, np.logical_or(batch.terminations, batch.truncations), batch.worker)
                    for row in group.all_gather(np.array([returns.mean(), returns.var(), returns.size])):
                        reward_scaler.stats.update_moments(row[0], row[1], row[2])
                    update_batch = dataclasses.replace(batch, rewards=reward_scaler.scale(batch.rewards))
                values = ppo_update(agent, optimizer, normalizer, update_batch, config, generator=generator,
                                    reduce_gradients=lambda: group.average_gradients(agent.parameters()))
                t2 = time.perf_counter()
                version += 1
                allreduce_s = group.take_allreduce_s()
                timings["collect_s"] += t1 - t0
                timings["update_s"] += t2 - t1
                timings["allreduce_s"] += allreduce_s
                timings["updates"] += 1

                flat_obs = batch.obs.reshape(-1, obs_dim).astype(np.float64)
                head = {"steps": batch.size, "stop": float(stop.signal is not None),
                        "workers": switcher.active.workers(), "pid": os.getpid(),
                        "steps_per_s": (unit_steps[rank] + batch.size) / max(t2 - started, 1e-9),
                        "local_rank": group.local_rank, "node_rank": group.node_rank, "collect_s": t1 - t0,
                        "update_s": t2 - t1, "allreduce_s": allreduce_s, "obs_count": flat_obs.shape[0],
                        "episodes": len(episodes), "mode": modes.index(switcher.mode)}
                table = group.all_gather(summary.pack(head, flat_obs.mean(axis=0), flat_obs.var(axis=0),
                                                      [e.episodic_return for e in episodes],
                                                      [e.episodic_length for e in episodes]))
                heads = [summary.head(row) for row in table]
                new_returns: list[float] = []
                new_lengths: list[float] = []
                for row, h in zip(table, heads, strict=True):  # rank order: the same result on every unit
                    normalizer.update_moments(*summary.moments(row), h["obs_count"])
                    returns, lengths = summary.episodes(row)
                    new_returns += returns.tolist()
                    new_lengths += lengths.tolist()
                for r, h in enumerate(heads):
                    unit_steps[r] += int(h["steps"])
                global_step += sum(int(h["steps"]) for h in heads)
                recent.extend(new_returns)
                window = list(recent)[-RETURN_WINDOW:]
                mean_return = float(np.mean(window)) if window else float("nan")
                if checkpointer is not None:
                    checkpointer.commit(snapshot_state())
                elapsed = time.perf_counter() - started

                # --- rank 0 decides; every unit acts on its decision at this boundary ---
                decision = np.array([STOP_NONE, -1], dtype=np.int64)
                pending = None
                if leader is not None:
                    if any(h["stop"] for h in heads):
                        decision[0] = STOP_SIGNAL
                    elif (spec.target_return is not None and len(window) >= RETURN_WINDOW
                          and mean_return >= spec.target_return):
                        if spec.confirm_episodes == 0:
                            decision[0] = STOP_SOLVED
                        elif version - last_confirm >= CONFIRM_EVERY:
                            last_confirm = version
                            greedy_return = evaluate_greedy(agent, normalizer, spec.env_id,
                                                            episodes=spec.confirm_episodes,
                                                            seed=seed + 1_000_003 + version)
                            if greedy_return >= spec.target_return:
                                decision[0] = STOP_SOLVED
                    pending = leader.gate.take() if decision[0] == STOP_NONE else None
                    if pending is not None:
                        decision[1] = modes.index(pending[0])
                decision = group.broadcast(decision)
                if decision[0] == STOP_SIGNAL:
                    stopped_by = stop.signal or "a signal to another unit"
                if decision[0] == STOP_SOLVED:
                    solved_at_step, solved_at_s = global_step, elapsed
                event = None
                if decision[1] >= 0:
                    to = modes[int(decision[1])]
                    reason = pending[1] if pending is not None else "switch broadcast by rank 0"
                    switcher.request(to, reason=reason)
                    event = switcher.at_boundary(step=global_step, version=version, update=version,
                                                 mean_return=mean_return)
                    if pending is not None and event is not None:
                        pending[2].set_result(event)

                units = [_unit_status(r, h, unit_steps[r], modes) for r, h in enumerate(heads)]
                if event is not None:  # every unit switched here: its status says so from now on
                    for unit in units:
                        unit["mode"] = switcher.mode
                if leader is not None and metrics is not None:
                    if new_returns:
                        values["charts/episodic_return"] = float(np.mean(new_returns))
                        values["charts/episodic_length"] = float(np.mean(new_lengths))
                    values["charts/mean_return_20"] = mean_return
                    values["charts/learning_rate"] = float(optimizer.param_groups[0]["lr"])
                    values["perf/env_steps_per_s"] = (global_step - start_step) / max(elapsed, 1e-9)
                    values["perf/collect_s"] = max(h["collect_s"] for h in heads)
                    values["perf/update_s"] = max(h["update_s"] for h in heads)
                    values["perf/allreduce_s"] = max(h["allreduce_s"] for h in heads)
                    if greedy_return is not None and last_confirm == version:
                        values["charts/greedy_return"] = greedy_return
                    if event is not None:
                        values["switch/pause_s"] = event.pause_s
                        _append_jsonl(run_dir / SWITCHES_FILE, event.to_dict())
                    metrics.log(global_step=global_step, policy_version=version, values=values)
                    leader.publish(version, agent, normalizer)
                    display.update(global_step, mean_return, values["perf/env_steps_per_s"], mode=switcher.mode)
                    leader.update(state="training", step=global_step, policy_version=version,
                                  mean_return=None if np.isnan(mean_return) else mean_return,
                                  env_steps_per_s=values["perf/env_steps_per_s"],
                                  units=units)
                if decision[0] != STOP_NONE:
                    break

        if checkpointer is not None:
            last_path = checkpointer.final()
        if stopped_by is not None:
            log(f"strata train: stopped by {stopped_by} at policy version {version}, step {global_step:,}; "
                f"checkpoint {last_path}; continue with the same command and --resume")
        final = group.gather_digests(state_digest(agent, normalizer))
        counts = switcher.accounting.check()
        produced = switcher.produced()
        switcher.close()  # its workers exit and are reaped: their CPU is in this process's children's usage
        timings["cpu_s"] = time.process_time() - cpu_started
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        timings["workers_cpu_s"] = usage.ru_utime + usage.ru_stime
        per_unit = group.all_gather(np.array([produced, counts["consumed"], counts["duplicates"],
                                              counts["gaps"]], dtype=np.float64))
        accounting = {"per_unit": [dict(zip(("produced", "consumed", "duplicates", "gaps"), map(int, row),
                                            strict=True)) for row in per_unit],
                      "total": dict(zip(("produced", "consumed", "duplicates", "gaps"),
                                        map(int, per_unit.sum(axis=0)), strict=True))}
        window = list(recent)[-RETURN_WINDOW:]
        return HybridResult(
            run_dir=run_dir, env_id=spec.env_id, units=world, policy_version=version, global_step=global_step,
            wall_s=time.perf_counter() - started, checkpoint=last_path,
            mean_return=float(np.mean(window)) if window else float("nan"), solved_at_step=solved_at_step,
            solved_at_s=solved_at_s, greedy_return=greedy_return, digests=final,
            normalizer_count=float(normalizer.count), unit_steps=unit_steps, accounting=accounting,
            switches=tuple(switcher.history), stopped_by=stopped_by,
            published=leader.published if leader is not None else 0, timings=timings, unit_status=units)
    except BaseException as exc:
        # A peer died, a collective timed out, or this unit failed: rank 0 keeps the last completed update.
        if checkpointer is not None:
            path = checkpointer.final() or latest_checkpoint(run_dir)
            committed = checkpointer.committed
            step = int(committed["global_step"]) if committed else int(state["global_step"]) if state else 0
            log(f"strata train: unit failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                f"; checkpoint {path} (policy version {checkpointer.version}, step {step:,}); "
                "continue with the same command and --resume")
        raise
    finally:
        stop.restore()
        if checkpointer is not None:
            checkpointer.close()
        if metrics is not None:
            metrics.close()
        if leader is not None:
            leader.close()
        if switcher is not None:
            switcher.close()
        if group is not None:
            group.close()


def _unit_status(rank: int, head: dict[str, float], steps: int, modes: list[str]) -> dict[str, Any]:
    return {"rank": rank, "node": int(head["node_rank"]), "local_rank": int(head["local_rank"]),
            "pid": int(head["pid"]), "steps": steps, "env_steps_per_s": head["steps_per_s"],
            "workers": int(head["workers"]), "mode": modes[int(head["mode"])]}
