"""One hybrid unit: a PPO learner replica and its own rollout sources, in step with the other units.

The loop is `cloud.runs._train.train`'s, with three collectives added (see the state machine in `cloud.hybrid`):
the gradient all-reduce inside every minibatch step (`cloud.learners._ppo.ppo_update`'s ``reduce_gradients``), one
all-gather of each unit's update summary (steps, episodes, normaliser moments, figures for status), and one
broadcast of rank 0's decision (stop, switch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import numpy as np

from cloud._errors import HybridError
from cloud.hybrid._config import UnitSpec
from cloud.learners._ppo import PPOLearner
from cloud.rollout._collector import Episode
from cloud.rollout._envs import probe_spaces
from cloud.runs._checkpoint import latest_checkpoint
from cloud.runs._progress import Progress
from cloud.runs._run import RunSession, RunSpec, open_run
from cloud.runs._stop import signals_held
from cloud.runs._train import TargetCheck, evaluate_greedy, window_mean
from cloud.switching._switcher import Switcher, SwitchEvent
from device import ConfigError, RolloutBatch, require, space_to_json
from functions._lifetime import watch_parent

if TYPE_CHECKING:
    from cloud.hybrid._leader import Leader

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


SAME_SIGNAL_S = 0.5
"""A second signal within this long of the first is the same stop delivered twice (to the process group and
passed on by strata's launcher), not a second request."""


class _StopFlag:
    """SIGTERM / SIGINT / SIGHUP ask the unit to stop at the next update boundary; a second one stops it at once."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._at = 0.0
        self._previous: dict[int, Any] = {}

    def install(self) -> _StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:
            if time.monotonic() - self._at < SAME_SIGNAL_S:
                return
            raise KeyboardInterrupt
        self.signal, self._at = signal.Signals(signum).name, time.monotonic()

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


def _resume_state(spec: UnitSpec, run: RunSpec) -> dict[str, Any] | None:
    """The checkpoint this unit starts from: with ``--resume``, or after torchrun restarted the group."""
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    leader = int(os.environ.get("RANK", "0")) == 0
    resuming = spec.resume or (restarted and latest_checkpoint(spec.run_dir) is not None)
    state = open_run(dataclasses.replace(run, resume=resuming), trim=leader)
    if state is not None and leader and restarted:
        print(f"strata train: the unit group was restarted (restart {os.environ['TORCHELASTIC_RESTART_COUNT']}): "
              f"every unit resumes from {latest_checkpoint(spec.run_dir)} (policy version {int(state['version'])}, "
              f"step {int(state['global_step']):,})", flush=True)
    return state


@contextlib.contextmanager
def peer_loss(rank: int) -> Iterator[None]:
    """A collective that fails because another unit is gone becomes one `HybridError` line (the CLI exits 2).

    Rank 0's stop line (the checkpoint of the last completed update) comes first; no torch or gloo traceback.
    """
    import torch.distributed as dist

    try:
        yield
    except RuntimeError as exc:
        text = str(exc).strip()
        if not isinstance(exc, dist.DistError) and "gloo" not in text.lower() and "by peer" not in text:
            raise
        first = text.splitlines()[0] if text else type(exc).__name__
        if first.startswith("[") and "] " in first:  # gloo's "[.../pair.cc:537] Read error ...: Connection reset ..."
            first = first.split("] ", 1)[1]
        first = first.split(". ", 1)[0][:160]
        raise HybridError(f"train --modes hybrid: unit {rank} lost a peer unit ({first}); the run stops; resume it "
                          "with the stop line's command once every unit can run") from None


def run_unit(spec: UnitSpec) -> HybridResult:
    """Train as one unit of the group torchrun (or `cloud.hybrid.train_hybrid`) started; return what it saw.

    The iteration is `cloud.runs._train.train`'s, with the collectives of the state machine in `cloud.hybrid`.
    """
    rank = int(os.environ.get("RANK", "0"))
    log: Callable[[str], None] = _print if rank == 0 else (lambda line: None)
    run = RunSpec(algo="ppo", env_id=spec.env_id, run_dir=Path(spec.run_dir), seed=spec.seed,
                  total_steps=spec.total_steps, resume=spec.resume, checkpoint_every=spec.checkpoint_every,
                  rolling_checkpoint_s=spec.rolling_checkpoint_s, resume_command=spec.resume_command)
    state = _resume_state(spec, run)
    stop = _StopFlag().install()
    # The launcher (strata's or torchrun) killed with SIGKILL: SIGTERM to this unit, so the group stops at one update
    # boundary with rank 0's checkpoint; a unit that cannot is killed after a grace period (functions._lifetime).
    watch_parent(os.getppid())
    try:
        # Rank 0 keeps the run's work (commits, metrics, the stop line); the others only train.
        with contextlib.ExitStack() as stack:
            session = None
            if rank == 0:
                session = stack.enter_context(RunSession(run, start_version=int(state["version"]) if state else 0,
                                                         log=log, signals=False))
            unit = Unit(spec, state, rank=rank, stop=stop, session=session, log=log)
            if session is not None:
                session.on_close(unit.close)  # after rank 0's stop line, which comes first
            else:
                stack.callback(unit.close)
            with unit.progress() as display, peer_loss(rank):
                while unit.global_step < spec.total_steps:
                    batch, episodes = unit.collect()
                    values = unit.update(batch)
                    values |= unit.merge(batch, episodes)
                    decision = unit.decide()
                    values |= unit.switch(decision)
                    with signals_held():  # as PPO's loop: every checkpointed version has its metrics line
                        unit.commit()
                        unit.publish(values, display)
                    if decision[0] != STOP_NONE:
                        break
            return unit.result()
    finally:
        stop.restore()


class Unit:
    """One unit's state between updates, and the steps of an iteration.

    The steps are collect, update, merge, decide, switch, commit and publish; building a unit builds its learner,
    sources and group and, on rank 0, the leader's services.
    """

    def __init__(self, spec: UnitSpec, state: dict[str, Any] | None, *, rank: int, stop: _StopFlag,
                 session: RunSession | None, log: Callable[[str], None]) -> None:
        torch = require("torch", extra="cloud", purpose="the PPO learner")
        from cloud.hybrid._sync import UnitGroup

        self.spec, self.rank, self.stop, self.session, self.log = spec, rank, stop, session, log
        self.config = config = spec.config
        self.version = int(state["version"]) if state else 0
        self.global_step = int(state["global_step"]) if state else 0
        self.target = TargetCheck(spec.target_return, spec.confirm_episodes)
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(spec.seed + 7919 * self.version)  # the same on every unit: identical initial weights
        obs_space, action_space = probe_spaces(spec.env_id)
        self.obs_dim = int(np.prod(obs_space.shape))
        self.learner = PPOLearner(obs_space, action_space, config, state)
        # From here on every unit draws its own actions and minibatches, and steps its own env streams.
        torch.manual_seed(spec.seed + 7919 * self.version + 1_000_033 * (rank + 1))
        self.generator = np.random.default_rng([spec.seed, self.version, rank])
        self.spaces = {"observation_space": space_to_json(obs_space), "action_space": space_to_json(action_space)}
        self.leader: Leader | None = None
        self.switcher = self._build_switcher()
        try:
            # The pool forks its workers before the group opens its sockets, so no worker holds a copy of them.
            self.group = UnitGroup(timeout_s=spec.hybrid.collective_timeout_s)
            self._join()
            self._setup(session)
        except BaseException:
            self.close()
            raise

    def _setup(self, session: RunSession | None) -> None:
        """The loop's state once the group has joined; rank 0 starts the leader's services."""
        config = self.config
        self.modes = self.switcher.modes
        self.summary = _Summary(self.obs_dim, config.batch_size)
        self.num_updates = max(1, self.spec.total_steps // (self.group.world * config.batch_size))
        self.unit_steps = [0] * self.group.world
        self.units: list[dict[str, Any]] = []
        self.mean_return = float("nan")
        self.solved_at_step: int | None = None
        self.solved_at_s: float | None = None
        self.stopped_by: str | None = None
        self.timings = {"collect_s": 0.0, "update_s": 0.0, "allreduce_s": 0.0, "updates": 0.0}
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self.start_step = self.global_step
        self._pending: tuple[str, str, Any] | None = None
        self._event: SwitchEvent | None = None
        if session is not None:
            self._lead(session)

    def _build_switcher(self) -> Switcher:
        from cloud.switching._modes import build_switcher
        from cloud.switching._switcher import SwitchRules

        spec = self.spec
        env_seed = spec.seed + 104729 * self.version + 7_777_777 * self.rank
        return build_switcher(env_id=spec.env_id, config=self.config, switching=spec.switching, rules=SwitchRules(),
                              run_dir=Path(spec.run_dir), seed=env_seed, agent=self.learner.agent,
                              normalizer=self.learner.normalizer, publisher=None, log=self.log,
                              first_version=self.version, colocated_workers=spec.hybrid.workers_per_unit)

    def _join(self) -> None:
        """Take rank 0's weights and check that every unit now holds the same policy."""
        from cloud.hybrid._sync import state_digest
        spec = self.spec
        if spec.hybrid.units is not None and spec.hybrid.units != self.group.world:
            raise ConfigError(f"train --modes hybrid: --units {spec.hybrid.units} but the launcher started "
                              f"{self.group.world} units; drop --units under torchrun (its world size decides)")
        self.group.broadcast_module(self.learner.agent)
        digests = self.group.gather_digests(state_digest(self.learner.agent, self.learner.normalizer))
        if len(set(digests)) > 1:
            raise HybridError(f"units start from different policies (digests {digests}); every unit must see the "
                              f"same run dir {str(spec.run_dir)!r} (shared storage) to resume from its checkpoints")

    def _lead(self, session: RunSession) -> None:
        """Rank 0: the parameter server, the control endpoint and the run's logs."""
        from cloud.hybrid._leader import Leader

        spec, world = self.spec, self.group.world
        self.leader = Leader(switcher=self.switcher, env_id=spec.env_id, run_dir=Path(spec.run_dir),
                             policy=spec.env_id.split("-")[0].lower(), control=spec.switching.control,
                             param_host=spec.hybrid.param_server_host, param_port=spec.hybrid.param_server_port,
                             tls=spec.switching.tls, health_port=spec.hybrid.param_server_health_port)
        session.begin(mode=self.switcher.mode, step=self.global_step, version=self.version,
                      reason=f"initial mode of {world} hybrid units")
        self.log(f"strata train: {world} hybrid units (gloo), {self.config.num_envs} envs each in mode "
                 f"{self.switcher.mode}; parameter server {self.leader.server.address}")

    def progress(self) -> Progress:
        """Rank 0's progress display (a bar on a terminal, else lines); silent on the other units."""
        enabled = False if self.rank else (os.isatty(1) if self.spec.progress is None else self.spec.progress)
        return Progress(self.spec.total_steps, self.start_step, enabled=enabled, log=self.log, env_id=self.spec.env_id)

    def collect(self) -> tuple[RolloutBatch, list[Episode]]:
        """This unit's own rollout with the current policy version."""
        t0 = time.perf_counter()
        batch, episodes = self.switcher.collect(policy_version=self.version, global_step=self.global_step)
        self._collect_s = time.perf_counter() - t0
        return batch, episodes

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """PPO on this unit's batch, gradients averaged over the group; every unit's rewards on one scale."""
        group, learner = self.group, self.learner
        t1 = time.perf_counter()
        learner.anneal(self.version, self.num_updates)
        update_batch = batch
        if learner.reward_scaler.enabled:  # every unit folds every unit's return moments, in rank order
            returns = learner.reward_scaler.discounted_returns(
                batch.rewards, np.logical_or(batch.terminations, batch.truncations), batch.worker)
            for row in group.all_gather(np.array([returns.mean(), returns.var(), returns.size])):
                learner.reward_scaler.stats.update_moments(row[0], row[1], row[2])
            update_batch = dataclasses.replace(batch, rewards=learner.reward_scaler.scale(batch.rewards))
        values = learner.update(update_batch, generator=self.generator,
                                reduce_gradients=lambda: group.average_gradients(learner.agent.parameters()))
        self._update_s = time.perf_counter() - t1
        self.version += 1
        self._allreduce_s = group.take_allreduce_s()
        for key, seconds in (("collect_s", self._collect_s), ("update_s", self._update_s),
                             ("allreduce_s", self._allreduce_s), ("updates", 1.0)):
            self.timings[key] += seconds
        return values

    def merge(self, batch: RolloutBatch, episodes: list[Episode]) -> dict[str, float]:
        """All-gather every unit's summary: steps, episodes, observation moments and status figures."""
        flat_obs = batch.obs.reshape(-1, self.obs_dim).astype(np.float64)
        head = {"steps": batch.size, "stop": float(self.stop.signal is not None),
                "workers": self.switcher.active.workers(), "pid": os.getpid(),
                "steps_per_s": (self.unit_steps[self.rank] + batch.size) / max(time.perf_counter() - self.started,
                                                                                1e-9),
                "local_rank": self.group.local_rank, "node_rank": self.group.node_rank,
                "collect_s": self._collect_s, "update_s": self._update_s, "allreduce_s": self._allreduce_s,
                "obs_count": flat_obs.shape[0], "episodes": len(episodes), "mode": self.modes.index(self.switcher.mode)}
        table = self.group.all_gather(self.summary.pack(head, flat_obs.mean(axis=0), flat_obs.var(axis=0),
                                                        [e.episodic_return for e in episodes],
                                                        [e.episodic_length for e in episodes]))
        self.heads = [self.summary.head(row) for row in table]
        new_returns: list[float] = []
        new_lengths: list[float] = []
        for row, h in zip(table, self.heads, strict=True):  # rank order: the same result on every unit
            self.learner.normalizer.update_moments(*self.summary.moments(row), h["obs_count"])
            returns, lengths = self.summary.episodes(row)
            new_returns += returns.tolist()
            new_lengths += lengths.tolist()
        for r, h in enumerate(self.heads):
            self.unit_steps[r] += int(h["steps"])
        self.global_step += sum(int(h["steps"]) for h in self.heads)
        self.learner.recent.extend(new_returns)
        self.mean_return, self._window = window_mean(self.learner.recent)
        values = {"charts/mean_return_20": self.mean_return, "charts/learning_rate": self.learner.learning_rate,
                  "perf/env_steps_per_s": (self.global_step - self.start_step) / max(self.elapsed, 1e-9),
                  "perf/collect_s": max(h["collect_s"] for h in self.heads),
                  "perf/update_s": max(h["update_s"] for h in self.heads),
                  "perf/allreduce_s": max(h["allreduce_s"] for h in self.heads)}
        if new_returns:
            values["charts/episodic_return"] = float(np.mean(new_returns))
            values["charts/episodic_length"] = float(np.mean(new_lengths))
        return values

    @property
    def elapsed(self) -> float:
        """Seconds since the unit started training (this call)."""
        return time.perf_counter() - self.started

    def decide(self) -> np.ndarray:
        """Rank 0 decides (stop for a signal, stop solved, or switch every unit); the group gets its decision."""
        decision = np.array([STOP_NONE, -1], dtype=np.int64)
        self._pending = None
        if self.leader is not None:
            if any(h["stop"] for h in self.heads):
                decision[0] = STOP_SIGNAL
            elif self._solved_here():
                decision[0] = STOP_SOLVED
            self._pending = self.leader.gate.take() if decision[0] == STOP_NONE else None
            if self._pending is not None:
                decision[1] = self.modes.index(self._pending[0])
        decision = self.group.broadcast(decision)
        self._decision_values: dict[str, float] = {}
        if decision[0] != STOP_SIGNAL and self.leader is not None and self.target.reached(
                self.mean_return, self._window) and (self.target.confirm_episodes == 0
                                                     or self.target.last_confirm == self.version):
            # A decision at the target (stop, or train past it): one line and one metrics record, as PPO's.
            line, self._decision_values = self.target.decision(stop=decision[0] == STOP_SOLVED,
                                                               step=self.global_step, mean_return=self.mean_return)
            self.log(f"train: {line}")
        if decision[0] == STOP_SIGNAL:
            self.stopped_by = self.stop.signal or "a signal to another unit"
        if decision[0] == STOP_SOLVED:
            self.solved_at_step, self.solved_at_s = self.global_step, self.elapsed
        return decision

    def _solved_here(self) -> bool:
        """Rank 0: the moving mean at the target, confirmed by the greedy policy when asked (`TargetCheck`)."""
        target = self.target
        if not target.reached(self.mean_return, self._window):
            return False
        if target.confirm_episodes == 0:
            return True
        if not target.confirmation_due(self.mean_return, self._window, self.version):
            return False
        return target.confirm(self.version, lambda episodes: evaluate_greedy(
            self.learner.agent, self.learner.normalizer, self.spec.env_id, episodes=episodes,
            seed=self.spec.seed + 1_000_003 + self.version))

    def switch(self, decision: np.ndarray) -> dict[str, float]:
        """Every unit switches its rollout mode at this boundary when rank 0 broadcast one."""
        self._event = None
        if decision[1] < 0:
            return {}
        to = self.modes[int(decision[1])]
        reason = self._pending[1] if self._pending is not None else "switch broadcast by rank 0"
        self.switcher.request(to, reason=reason)
        self._event = self.switcher.at_boundary(step=self.global_step, version=self.version, update=self.version,
                                                mean_return=self.mean_return)
        if self._pending is not None and self._event is not None:
            self._pending[2].set_result(self._event)
        if self._event is None:
            return {}
        if self.session is not None:
            self.session.record_switch(self._event.to_dict())
        return {"switch/pause_s": self._event.pause_s}

    def publish(self, values: dict[str, float], display: Progress) -> None:
        """Every unit's status; rank 0 logs metrics, publishes the version and serves status."""
        self.units = [_unit_status(r, h, self.unit_steps[r], self.modes) for r, h in enumerate(self.heads)]
        if self._event is not None:  # every unit switched here: its status says so from now on
            for unit in self.units:
                unit["mode"] = self.switcher.mode
        if self.leader is None or self.session is None:
            return
        values |= self._decision_values
        self.session.log(global_step=self.global_step, policy_version=self.version, values=values)
        self.leader.publish(self.version, self.learner.agent, self.learner.normalizer)
        display.update(self.global_step, self.mean_return, values["perf/env_steps_per_s"], mode=self.switcher.mode)
        self.leader.update(state="training", step=self.global_step, policy_version=self.version,
                           mean_return=None if np.isnan(self.mean_return) else self.mean_return,
                           env_steps_per_s=values["perf/env_steps_per_s"], units=self.units)

    def commit(self) -> None:
        """Rank 0: the completed update is what any stop keeps."""
        if self.session is not None:
            self.session.commit({"algo": "ppo", "env_id": self.spec.env_id, "seed": self.spec.seed,
                                 "version": self.version, "global_step": self.global_step,
                                 "config": self.config.to_dict(), **self.spaces, **self.learner.state_dict(),
                                 "hybrid": {"units": self.group.world}})

    def result(self) -> HybridResult:
        """Finish: rank 0's final checkpoint and stop line, every unit's digest and transition accounting."""
        from cloud.hybrid._sync import state_digest
        last_path = self.session.finish() if self.session is not None else None
        if self.stopped_by is not None and self.session is not None:
            self.log(f"strata train: stopped by {self.stopped_by} at step {self.global_step:,} (policy version "
                     f"{self.version}); checkpoint {last_path}; resume with: {self.session.spec.command}")
        final = self.group.gather_digests(state_digest(self.learner.agent, self.learner.normalizer))
        counts = self.switcher.accounting.check()
        produced = self.switcher.produced()
        self.switcher.close()  # its workers exit and are reaped: their CPU is in this process's children's usage
        self.timings["cpu_s"] = time.process_time() - self.cpu_started
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.timings["workers_cpu_s"] = usage.ru_utime + usage.ru_stime
        per_unit = self.group.all_gather(np.array([produced, counts["consumed"], counts["duplicates"],
                                                   counts["gaps"]], dtype=np.float64))
        names = ("produced", "consumed", "duplicates", "gaps")
        accounting = {"per_unit": [dict(zip(names, map(int, row), strict=True)) for row in per_unit],
                      "total": dict(zip(names, map(int, per_unit.sum(axis=0)), strict=True))}
        return HybridResult(
            run_dir=Path(self.spec.run_dir), env_id=self.spec.env_id, units=self.group.world,
            policy_version=self.version, global_step=self.global_step, wall_s=self.elapsed, checkpoint=last_path,
            mean_return=window_mean(self.learner.recent)[0], solved_at_step=self.solved_at_step,
            solved_at_s=self.solved_at_s, greedy_return=self.target.greedy_return, digests=final,
            normalizer_count=float(self.learner.normalizer.count), unit_steps=self.unit_steps,
            accounting=accounting, switches=tuple(self.switcher.history), stopped_by=self.stopped_by,
            published=self.leader.published if self.leader is not None else 0, timings=self.timings,
            unit_status=self.units)

    def close(self) -> None:
        """Stop the leader's services, the sources and the group (whatever was built)."""
        if self.leader is not None:
            self.leader.close()
        self.switcher.close()
        group = getattr(self, "group", None)  # absent when joining the group failed
        if group is not None:
            with contextlib.suppress(RuntimeError):  # a group that lost a unit may fail to tear down: it is left
                group.close()


def _unit_status(rank: int, head: dict[str, float], steps: int, modes: list[str]) -> dict[str, Any]:
    return {"rank": rank, "node": int(head["node_rank"]), "local_rank": int(head["local_rank"]),
            "pid": int(head["pid"]), "steps": steps, "env_steps_per_s": head["steps_per_s"],
            "workers": int(head["workers"]), "mode": modes[int(head["mode"])]}
