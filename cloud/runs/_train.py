"""`train`: runs PPO on a gymnasium env id into a run dir (checkpoints, metrics), fresh or resumed.

One iteration reads like the method; each step is a method of `PPORun`, testable alone:

    collect          the switcher's active source runs policy version v for one rollout
    update           one PPO update on it; the normaliser folds in the batch; the version becomes v + 1
    observe          the episodes that ended join the moving mean of returns
    switch           the switcher's boundary: a requested or rule-driven switch happens here, and is logged
    commit           the completed update becomes what any stop keeps (before it is logged, with signals held
                     over both: a version in metrics.jsonl is at most one update past the checkpoint a SIGKILL
                     resumes from, and every checkpointed version has its metrics line)
    publish          metrics.jsonl, the progress display and the control endpoint's status
    decide_to_stop   the target return reached (the moving mean's crossing, or a confirmation of the greedy
                     policy); the budget is the loop's condition

The run dir holds ``checkpoints/{version:09d}.pt`` (see `cloud.runs._checkpoint`) and ``metrics.jsonl``
(see `cloud.runs._metrics`). The policy version is the number of completed PPO updates; a resumed run
loads the newest checkpoint and continues the same lineage (version, env-step count, optimiser,
normaliser and recent returns). Env state cannot be checkpointed: a resumed run starts fresh
episodes, seeded from the seed and the version so it does not replay the first run's streams.

Every way the run stops (Ctrl-C, SIGTERM, a source failure, a learner error) leaves a checkpoint at
the last completed update and one line saying how to resume (`cloud.runs._run.RunSession`); ``--resume``
continues from the same global step and policy version, and drops the metrics lines past it.

Experience comes from a `cloud.switching.Switcher` over the run's modes (`cloud.switching._modes`): one
mode (``PPOConfig.env_mode``) by default, or several between which the run switches live, by rule
or by `strata switch`. Completed switches are appended to ``switches.jsonl``; while the run is
going, its control endpoint is advertised in ``control.json`` (see `cloud.switching._control`).
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cloud.learners._ppo_config import PPOConfig
from cloud.rollout._collector import Episode
from cloud.rollout._edge import EdgeLedger, EdgeSourceConfig
from cloud.rollout._envs import make_vector_env, probe_spaces
from cloud.runs._checkpoint import latest_checkpoint, reading
from cloud.runs._progress import Progress
from cloud.runs._run import RunSession, RunSpec, open_run
from cloud.runs._stop import ROLLING_EVERY_S, signals_held
from cloud.switching._modes import (
    BUNDLE_MODES,
    EDGE_MODE,
    EdgeWiring,
    JobControl,
    PolicyPublisher,
    SwitchingConfig,
    build_switcher,
    check_exploration,
)
from cloud.switching._switcher import SwitchEvent, SwitchRules
from device import ConfigError, ObsPipeline, RolloutBatch, require, space_to_json

RETURN_WINDOW = 20
"""Episodes in the moving mean that decides "solved" (CartPole-v1's 475 threshold is over such a mean)."""

CONFIRM_EVERY = 5
"""Updates between two confirmation evaluations of the deterministic policy (see `TargetCheck`)."""


@dataclass(frozen=True)
class TrainResult:
    """What a call of `train` did."""

    run_dir: Path
    env_id: str
    policy_version: int
    """Completed updates, over the whole lineage (including resumed-from runs)."""
    global_step: int
    """Env steps, over the whole lineage."""
    wall_s: float
    """Seconds this call spent (not counting earlier runs of a resumed lineage)."""
    checkpoint: Path
    episodes: list[Episode]
    """Episodes that ended during this call."""
    mean_return: float
    """Mean return of the last `RETURN_WINDOW` episodes (NaN before any episode ended)."""
    solved_at_step: int | None
    """Env step at which the moving mean first reached the target return in this call, else None. Without a
    confirmation (``confirm_episodes=0``) it is the step at which the episode that took the mean over the target
    ended, as a per-step callback would see it; with one, the update at which the confirmation passed."""
    solved_at_s: float | None
    """Seconds into this call at which the run knew (the end of that rollout's update), else None."""
    cpu_s: float = 0.0
    """CPU seconds this process spent in this call (all threads; the envs too when they run in-process)."""
    solved_at_cpu_s: float | None = None
    """CPU seconds into this call at which the target was reached, else None (what a benchmark compares)."""
    greedy_return: float | None = None
    """Mean return of the deterministic policy in the last confirmation evaluation, if one ran."""
    switches: tuple[SwitchEvent, ...] = ()
    """Switches between modes during this call."""
    accounting: dict[str, int] | None = None
    """Transitions ``produced`` by the sources and ``consumed``, ``duplicates`` and ``gaps`` seen by the learner."""


def _print(line: str) -> None:
    print(line, flush=True)


def window_mean(recent: Iterable[float]) -> tuple[float, int]:
    """The mean of the last `RETURN_WINDOW` returns (NaN when there are none) and how many there are."""
    window = list(recent)[-RETURN_WINDOW:]
    return (float(np.mean(window)) if window else float("nan")), len(window)


class TargetCheck:
    """When a run has reached its target return (shared by the single learner and hybrid units).

    Without a confirmation (``confirm_episodes=0``) the moving mean of the last `RETURN_WINDOW` returns reaching
    `target` is enough; with one, the deterministic policy must also average `target` over `confirm_episodes`
    fresh episodes, evaluated at most every `CONFIRM_EVERY` updates.
    """

    def __init__(self, target: float | None, confirm_episodes: int) -> None:
        if confirm_episodes < 0:
            raise ConfigError(f"train: confirm_episodes must be >= 0, got {confirm_episodes}")
        self.target, self.confirm_episodes = target, confirm_episodes
        self.last_confirm = -CONFIRM_EVERY
        self.greedy_return: float | None = None
        """Mean return of the deterministic policy in the last confirmation, if one ran."""

    def crossing(self, earlier: Iterable[float], new: list[Episode]) -> Episode | None:
        """Without a confirmation: the first of the `new` episodes with which the moving mean reached the target.

        The window includes the `earlier` returns, so the crossing can be the first new episode.
        """
        if self.target is None or self.confirm_episodes:
            return None
        window: collections.deque[float] = collections.deque(earlier, maxlen=RETURN_WINDOW)
        for episode in new:
            window.append(episode.episodic_return)
            if len(window) == RETURN_WINDOW and sum(window) / RETURN_WINDOW >= self.target:
                return episode
        return None

    def reached(self, mean_return: float, window: int) -> bool:
        """Whether a full window's mean is at the target (a confirmation, if any, is still to come)."""
        return self.target is not None and window >= RETURN_WINDOW and mean_return >= self.target

    def confirmation_due(self, mean_return: float, window: int, version: int) -> bool:
        """Whether a confirmation should run at `version` (the mean is there and none ran lately)."""
        return (self.confirm_episodes > 0 and self.reached(mean_return, window)
                and version - self.last_confirm >= CONFIRM_EVERY)

    def decision(self, *, stop: bool, step: int, mean_return: float) -> tuple[str, dict[str, float]]:
        """The one log line and the metrics of a decision at the target: stop, or keep training past it."""
        assert self.target is not None
        values = {"decision/stop": float(stop)}
        if self.confirm_episodes == 0:
            return (f"target return {self.target:g} reached at step {step:,}: mean of the last {RETURN_WINDOW} "
                    f"episodes {mean_return:.1f}; stopping"), values
        assert self.greedy_return is not None
        values["charts/greedy_return"] = self.greedy_return
        greedy = (f"the deterministic policy averaged {self.greedy_return:.1f} over {self.confirm_episodes} fresh "
                  f"episodes (training mean {mean_return:.1f})")
        if stop:
            return f"target return {self.target:g} confirmed at step {step:,}: {greedy}; stopping", values
        return (f"training mean reached the target return {self.target:g} at step {step:,}, but {greedy}: below the "
                f"target, training goes on (next check in {CONFIRM_EVERY} updates)"), values

    def confirm(self, version: int, evaluate: Callable[[int], float]) -> bool:
        """Run a confirmation at `version`: ``evaluate(episodes)`` is the greedy mean return; did it pass?"""
        assert self.target is not None
        self.last_confirm = version
        self.greedy_return = evaluate(self.confirm_episodes)
        return self.greedy_return >= self.target


def train(
    *,
    env_id: str,
    total_steps: int,
    run_dir: Path,
    seed: int = 0,
    config: PPOConfig | None = None,
    resume: bool = False,
    target_return: float | None = None,
    confirm_episodes: int = 0,
    checkpoint_every: int = 100,
    rolling_checkpoint_s: float = ROLLING_EVERY_S,
    progress: bool | None = None,
    log: Callable[[str], None] = _print,
    switching: SwitchingConfig | None = None,
    rules: SwitchRules | None = None,
    resume_command: str | None = None,
    edge: EdgeSourceConfig | None = None,
) -> TrainResult:
    """Train PPO on `env_id` until `total_steps` env steps (over the lineage) or `target_return` is reached.

    Args:
        env_id: A registered gymnasium env id with a Box observation and a Discrete or Box action space.
        total_steps: Env-step budget of the whole lineage; a resumed run stops at the same total.
        run_dir: Where checkpoints and metrics go.
        seed: Seeds torch, the envs and minibatch shuffling.
        config: Hyperparameters; with `resume`, None means "the checkpoint's".
        resume: Continue from the newest checkpoint in `run_dir` (it must exist).
        target_return: Stop early once the mean of the last 20 training episodes reaches this.
        confirm_episodes: With `target_return`, stop only when, in addition, the deterministic policy
            (argmax / clipped mean, what the exporter puts in the graph) averages `target_return`
            over this many fresh episodes (0: no confirmation). A confirmation runs at most every
            `CONFIRM_EVERY` updates; its env steps are not counted in the budget.
        checkpoint_every: Also checkpoint every this many updates (the last update always is).
        rolling_checkpoint_s: Write the newest update in the background at most this often (0: every update);
            what a SIGKILL resumes from.
        progress: Show a rich progress bar (None: only when stdout is a terminal; otherwise print
            a progress line every few seconds).
        log: Where progress lines and notices go.
        switching: The modes the run may use (default: only ``config.env_mode``) and the control endpoint.
        rules: Automatic switching rules (default: none; manual switches only).
        resume_command: The command the stop line tells the user to run (default: the basic
            ``strata train ... --resume``).
        edge: The ``edge`` mode's broker, fleet and staleness handling (needed when `switching` names it).

    Raises:
        ConfigError: Bad arguments, an env with unsupported spaces, a fresh run into a dir that
            already has checkpoints, or a resume without one.
    """
    spec = RunSpec(algo="ppo", env_id=env_id, run_dir=Path(run_dir), seed=seed, total_steps=total_steps,
                   resume=resume, checkpoint_every=checkpoint_every, rolling_checkpoint_s=rolling_checkpoint_s,
                   resume_command=resume_command)
    target = TargetCheck(target_return, confirm_episodes)
    state = open_run(spec)
    config = config or (PPOConfig.from_dict(state["config"]) if state else PPOConfig())
    with RunSession(spec, start_version=int(state["version"]) if state else 0, log=log) as session:
        run = PPORun(spec, session, config=config, state=state, target=target, log=log,
                     switching=switching or SwitchingConfig(control=False), rules=rules or SwitchRules(), edge=edge)
        try:
            with Progress(total_steps, run.global_step, log=log, env_id=env_id,
                          enabled=sys.stdout.isatty() if progress is None else progress) as display:
                while run.global_step < total_steps and run.solved_at_step is None:
                    batch, episodes = run.collect()
                    values = run.update(batch)
                    values |= run.observe(episodes)
                    values |= run.switch()
                    with signals_held():  # a stop between the two would keep an update metrics.jsonl never saw
                        run.commit()
                        run.publish(values, display)
                    run.decide_to_stop()
        except BaseException:
            if run.switcher.history:  # a stopped run that switched still accounts for its transitions
                log(f"strata train: {accounting_line(run.accounting())} (the interrupted rollout is not consumed)")
            raise
        return run.result(session.finish())


def accounting_line(accounting: dict[str, int]) -> str:
    """``transitions produced P, consumed C, duplicates D, gaps G``: what the learner did with its sources' output."""
    return (f"transitions produced {accounting['produced']:,}, consumed {accounting['consumed']:,}, duplicates "
            f"{accounting['duplicates']}, gaps {accounting['gaps']}")


class PPORun:
    """One PPO run's state between updates, and the steps of an iteration (see the module docstring).

    Building it builds the run: the learner (restored from `state`), the switcher over the run's modes, the
    policy publisher fragment modes need, and the control endpoint; then `RunSession.begin` creates the run dir.
    """

    def __init__(self, spec: RunSpec, session: RunSession, *, config: PPOConfig, state: dict[str, Any] | None,
                 target: TargetCheck, switching: SwitchingConfig, rules: SwitchRules,
                 log: Callable[[str], None], edge: EdgeSourceConfig | None = None) -> None:
        torch = require("torch", extra="cloud", purpose="the PPO learner")
        from cloud.learners._ppo import PPOLearner

        self.spec, self.session, self.config, self.target, self.log = spec, session, config, target, log
        self.version = int(state["version"]) if state else 0
        self.global_step = int(state["global_step"]) if state else 0
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(spec.seed + 7919 * self.version)
        self.generator = np.random.default_rng([spec.seed, self.version])
        check_exploration(config, switching.modes)
        obs_space, action_space = probe_spaces(spec.env_id, config.pipeline)
        with reading(latest_checkpoint(spec.run_dir) if state else None):
            self.learner = PPOLearner(obs_space, action_space, config, state)
        self.spaces = {"observation_space": space_to_json(obs_space), "action_space": space_to_json(action_space)}
        self.edge_ledger: EdgeLedger | None = None
        """What the edge mode has learned from (record ids go into every checkpoint), when the run has that mode."""
        if EDGE_MODE in switching.modes:
            self.edge_ledger = EdgeLedger((state or {}).get("edge"), resumed_version=self.version)
        self.switcher = self._build_switcher(switching, rules, edge)
        session.on_close(self.switcher.close)
        control = JobControl(self.switcher, env_id=spec.env_id, run_dir=spec.run_dir) if switching.control else None
        session.begin(mode=self.switcher.mode, step=self.global_step, version=self.version, control=control)
        self.num_updates = config.num_updates(spec.total_steps)
        self.episodes: list[Episode] = []
        self.mean_return = float("nan")
        self.solved_at_step: int | None = None
        self.solved_at_s: float | None = None
        self.solved_at_cpu_s: float | None = None
        self._crossed: Episode | None = None
        self._recorded = 0  # switcher.history entries already in switches.jsonl
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self.start_step = self.global_step

    def _build_switcher(self, switching: SwitchingConfig, rules: SwitchRules,
                        edge: EdgeSourceConfig | None) -> Any:
        spec, learner = self.spec, self.learner
        publisher = None
        wiring = None
        if self.edge_ledger is not None:
            if edge is None:
                raise ConfigError("train: mode edge needs --edge-broker mqtt://HOST:PORT and --edge-fleet NAME")
            edge.check_ready()
            wiring = EdgeWiring(config=edge, observation_space=self.spaces["observation_space"],
                                action_space=self.spaces["action_space"], ledger=self.edge_ledger,
                                checkpointed=lambda: _newest_version(spec.run_dir))
        if any(m in BUNDLE_MODES for m in switching.modes):
            producer = None
            if edge is not None and self.edge_ledger is not None:
                from edge._experience import ExperienceRequest

                producer = ExperienceRequest(actions=edge.edge_actions, steps=self.config.num_steps,
                                             noise_std=edge.edge_noise_std).to_producer()
            publisher = PolicyPublisher(spec.run_dir, agent=learner.agent, normalizer=learner.normalizer,
                                        obs_space=self.spaces["observation_space"],
                                        action_space=self.spaces["action_space"],
                                        policy=(edge.edge_policy if edge is not None and edge.edge_policy
                                                else spec.env_id.split("-")[0].split("/")[-1].lower()),
                                        producer=producer, pipeline=self.config.pipeline)
        env_seed = spec.seed if self.version == 0 else spec.seed + 104729 * self.version
        return build_switcher(env_id=spec.env_id, config=self.config, switching=switching, rules=rules,
                              run_dir=spec.run_dir, seed=env_seed, agent=learner.agent,
                              normalizer=learner.normalizer, publisher=publisher, log=self.log,
                              first_version=self.version, edge=wiring)

    @property
    def elapsed(self) -> float:
        """Seconds since the run started (this call)."""
        return time.perf_counter() - self.started

    def collect(self) -> tuple[RolloutBatch, list[Episode]]:
        """Run the current policy version for one rollout in the active mode."""
        batch, episodes = self.switcher.collect(policy_version=self.version, global_step=self.global_step)
        self.global_step += batch.size
        return batch, episodes

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """One PPO update on `batch`; the normaliser then folds it in and the version advances."""
        learner = self.learner
        learner.anneal(self.version, self.num_updates)
        values = learner.update(learner.reward_scaler.fit_scale(batch), generator=self.generator)
        self.version += 1
        learner.normalizer.update(batch.obs)
        return values

    def observe(self, episodes: list[Episode]) -> dict[str, float]:
        """Fold the episodes that ended into the moving mean of returns; their figures for the metrics."""
        recent = self.learner.recent
        self._crossed = self.target.crossing(recent, episodes)
        self.episodes += episodes
        recent.extend(e.episodic_return for e in episodes)
        self.mean_return, _ = window_mean(recent)
        values = {"charts/mean_return_20": self.mean_return, "charts/learning_rate": self.learner.learning_rate,
                  "perf/env_steps_per_s": (self.global_step - self.start_step) / max(self.elapsed, 1e-9)}
        if episodes:
            values["charts/episodic_return"] = float(np.mean([e.episodic_return for e in episodes]))
            values["charts/episodic_length"] = float(np.mean([e.episodic_length for e in episodes]))
        return values

    def switch(self) -> dict[str, float]:
        """The switcher's update boundary; log the switches (failovers during collect, then one here)."""
        self.switcher.at_boundary(step=self.global_step, version=self.version, update=self.version,
                                  mean_return=self.mean_return)
        values: dict[str, float] = {}
        for event in self.switcher.history[self._recorded:]:
            values["switch/pause_s"] = event.pause_s
            self.session.record_switch(event.to_dict())
        self._recorded = len(self.switcher.history)
        return values

    def publish(self, values: dict[str, float], display: Progress) -> None:
        """The update's figures to metrics.jsonl, the progress display and the control endpoint."""
        steps_per_s = values["perf/env_steps_per_s"]
        if self.edge_ledger is not None:
            values |= edge_metrics(self.edge_ledger, self.version)
        self.session.log(global_step=self.global_step, policy_version=self.version, values=values)
        display.update(self.global_step, self.mean_return, steps_per_s, mode=self.switcher.mode)
        edge = {} if self.edge_ledger is None else {"edge": self.edge_ledger.status(policy_version=self.version)}
        self.session.status(state="training", step=self.global_step, policy_version=self.version,
                            mean_return=None if np.isnan(self.mean_return) else self.mean_return,
                            env_steps_per_s=steps_per_s, **edge)

    def decide_to_stop(self) -> None:
        """Set `solved_at_step` when the target is reached: the crossing, or a passed confirmation."""
        if self._crossed is not None:
            self._solved(self._crossed.global_step)
            self._decided(stop=True, step=self._crossed.global_step)
            return
        _, window = window_mean(self.learner.recent)
        if not self.target.confirmation_due(self.mean_return, window, self.version):
            return
        passed = self.target.confirm(self.version, lambda episodes: evaluate_greedy(
            self.learner.agent, self.learner.normalizer, self.spec.env_id, episodes=episodes,
            seed=self.spec.seed + 1_000_003 + self.version, pipeline=self.config.pipeline))
        if passed:
            self._solved(self.global_step)
        self._decided(stop=passed, step=self.global_step)

    def _decided(self, *, stop: bool, step: int) -> None:
        """A decision at the target: one line in the log, one record in metrics.jsonl."""
        line, values = self.target.decision(stop=stop, step=step, mean_return=self.mean_return)
        self.log(f"train: {line}")
        self.session.log(global_step=self.global_step, policy_version=self.version, values=values)

    def _solved(self, step: int) -> None:
        self.solved_at_step, self.solved_at_s = step, self.elapsed
        self.solved_at_cpu_s = time.process_time() - self.cpu_started

    def commit(self) -> None:
        """The update is complete: its state becomes what any stop checkpoints."""
        edge = {} if self.edge_ledger is None else {"edge": self.edge_ledger.state_dict()}
        self.session.commit({"algo": "ppo", "env_id": self.spec.env_id, "seed": self.spec.seed,
                             "version": self.version, "global_step": self.global_step,
                             "config": self.config.to_dict(), **self.spaces, **self.learner.state_dict(), **edge})

    def result(self, checkpoint: Path | None) -> TrainResult:
        """What the run did (a resumed run already at its budget reports its newest checkpoint)."""
        assert checkpoint is not None
        return TrainResult(run_dir=self.spec.run_dir, env_id=self.spec.env_id, policy_version=self.version,
                           global_step=self.global_step, wall_s=self.elapsed,
                           cpu_s=time.process_time() - self.cpu_started, checkpoint=checkpoint,
                           episodes=self.episodes, mean_return=window_mean(self.learner.recent)[0],
                           solved_at_step=self.solved_at_step, solved_at_s=self.solved_at_s,
                           solved_at_cpu_s=self.solved_at_cpu_s, greedy_return=self.target.greedy_return,
                           switches=tuple(self.switcher.history),
                           accounting=self.accounting())

    def accounting(self) -> dict[str, int]:
        """Transitions ``produced`` by the sources; ``consumed``, ``duplicates`` and ``gaps`` seen by the learner."""
        return {"produced": self.switcher.produced(), **self.switcher.accounting.check()}


def _newest_version(run_dir: Path) -> int:
    """Version of the newest checkpoint on disk, -1 when there is none."""
    newest = latest_checkpoint(run_dir)
    return int(newest.stem) if newest is not None else -1


def edge_metrics(ledger: EdgeLedger, version: int) -> dict[str, float]:
    """The edge mode's figures for metrics.jsonl (namespaced ``edge/``)."""
    status = ledger.status(policy_version=version)
    values = {f"edge/{k}": float(status[k]) for k in ("records", "transitions", "duplicates_wire",
                                                       "duplicates_learner", "refused_stale", "pending")}
    if status["staleness_mean"] is not None:
        values["edge/staleness_mean"] = float(status["staleness_mean"])
    return values


def evaluate_greedy(agent: Any, normalizer: Any, env_id: str, *, episodes: int, seed: int, mode: str = "sync",
                    pipeline: ObsPipeline | None = None) -> float:
    """Mean return of `agent`'s deterministic policy over `episodes` episodes, one per env of a vector env.

    Runs in-process (``mode="sync"`` by default) whatever source feeds the learner: a confirmation
    is a short check, not worth starting workers for.
    """
    import torch

    gym = require("gymnasium", extra="cloud", purpose="evaluation environments")
    envs = make_vector_env(env_id, num_envs=episodes, seed=seed, mode=mode, pipeline=pipeline)
    space = envs.single_action_space
    bounds = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
    try:
        obs, _ = envs.reset(seed=seed)
        returns = np.zeros(episodes)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            with torch.inference_mode():
                action = agent.greedy_action(torch.from_numpy(normalizer(obs))).numpy()
            if bounds is not None:
                action = np.clip(action, *bounds)
            obs, reward, terminated, truncated, _ = envs.step(action)
            returns += np.where(running, reward, 0.0)
            running &= ~np.logical_or(terminated, truncated)
    finally:
        envs.close()
    return float(returns.mean())
