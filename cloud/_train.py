"""`train`: runs PPO on a gymnasium env id into a run dir (checkpoints, metrics), fresh or resumed.

The run dir holds ``checkpoints/{version:09d}.pt`` (see `cloud._checkpoint`) and ``metrics.jsonl``
(see `cloud._metrics`). The policy version is the number of completed PPO updates; a resumed run
loads the newest checkpoint and continues the same lineage (version, env-step count, optimiser,
normaliser and recent returns). Env state cannot be checkpointed: a resumed run starts fresh
episodes, seeded from the seed and the version so it does not replay the first run's streams.

Every way the run stops (Ctrl-C, SIGTERM, a source failure, a learner error) leaves a checkpoint at
the last completed update and one line saying how to resume (`cloud._stop`); ``--resume`` continues
from the same global step and policy version, and drops the metrics lines past it.

Experience comes from a `cloud._switcher.Switcher` over the run's modes (`cloud._switching`): one
mode (``PPOConfig.env_mode``) by default, or several between which the run switches live, by rule
or by `strata switch`. Completed switches are appended to ``switches.jsonl``; while the run is
going, its control endpoint is advertised in ``control.json`` (see `cloud._control`).
"""

from __future__ import annotations

import collections
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cloud._checkpoint import latest_checkpoint
from cloud._control import SWITCHES_FILE
from cloud._envs import make_vector_env, probe_spaces
from cloud._metrics import MetricsWriter
from cloud._ppo import Episode, PPOConfig, ppo_update
from cloud._stop import ROLLING_EVERY_S, Checkpointer, clone_state, resume_state, stop_signals
from cloud._switcher import SwitchEvent, SwitchRules
from cloud._switching import (
    FRAGMENT_MODES,
    JobControl,
    PolicyPublisher,
    SwitchingConfig,
    build_switcher,
    check_exploration,
)
from device import ConfigError, require, space_to_json

RETURN_WINDOW = 20
"""Episodes in the moving mean that decides "solved" (CartPole-v1's 475 threshold is over such a mean)."""

CONFIRM_EVERY = 5
"""Updates between two confirmation evaluations of the deterministic policy (see `train`)."""


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

    Raises:
        ConfigError: Bad arguments, an env with unsupported spaces, a fresh run into a dir that
            already has checkpoints, or a resume without one.
    """
    torch = require("torch", extra="cloud", purpose="the PPO learner")
    gym = require("gymnasium", extra="cloud", purpose="training environments")
    from cloud._agent import build_learner, check_action_space

    run_dir = Path(run_dir)
    if total_steps < 1:
        raise ConfigError(f"train: total_steps must be >= 1, got {total_steps}")
    if checkpoint_every < 1 or confirm_episodes < 0:
        raise ConfigError(f"train: checkpoint_every must be >= 1 and confirm_episodes >= 0, got {checkpoint_every} "
                          f"and {confirm_episodes}")
    state: dict[str, Any] | None = None
    if resume:
        state = resume_state(run_dir, env_id=env_id, algo="ppo", caller="train")
        config = config or PPOConfig.from_dict(state["config"])
    elif latest_checkpoint(run_dir) is not None:
        raise ConfigError(f"train: run dir {str(run_dir)!r} already has checkpoints; pass --resume to continue "
                          "that run or choose another --run-dir")
    config = config or PPOConfig()
    version = int(state["version"]) if state else 0
    global_step = int(state["global_step"]) if state else 0

    torch.set_num_threads(config.torch_threads)
    torch.manual_seed(seed + 7919 * version)
    generator = np.random.default_rng([seed, version])
    env_seed = seed if version == 0 else seed + 104729 * version
    switching = switching or SwitchingConfig(control=False)
    check_exploration(config, switching.modes)
    obs_space, action_space = probe_spaces(env_id)
    check_action_space(config, action_space)
    switcher = None
    control: JobControl | None = None
    checkpointer = Checkpointer(run_dir, keep_every=checkpoint_every, start_version=version,
                                rolling_every_s=rolling_checkpoint_s)
    resume_command = resume_command or (f"strata train --env {env_id} --run-dir {run_dir} --total-steps "
                                        f"{total_steps} --resume")
    with stop_signals():
        try:
            assert isinstance(obs_space, gym.spaces.Box)  # check_spaces checked the spaces
            agent, optimizer, normalizer, reward_scaler, recent = build_learner(obs_space, action_space, config, state)
            spaces = {"observation_space": space_to_json(obs_space), "action_space": space_to_json(action_space)}
            publisher = None
            if any(m in FRAGMENT_MODES for m in switching.modes):
                publisher = PolicyPublisher(run_dir, agent=agent, normalizer=normalizer,
                                            obs_space=spaces["observation_space"], action_space=spaces["action_space"],
                                            policy=env_id.split("-")[0].lower())
            switcher = build_switcher(env_id=env_id, config=config, switching=switching, rules=rules or SwitchRules(),
                                      run_dir=run_dir, seed=env_seed, agent=agent, normalizer=normalizer,
                                      publisher=publisher, log=log, first_version=version)
            run_dir.mkdir(parents=True, exist_ok=True)
            _append_jsonl(run_dir / SWITCHES_FILE, {"from_mode": None, "to_mode": switcher.mode,
                                                    "reason": "initial mode", "trigger": "start",
                                                    "at_step": global_step, "at_version": version, "pause_s": 0.0})
            if switching.control:
                control = JobControl(switcher, env_id=env_id, run_dir=run_dir).start()

            def commit() -> None:
                """The update is complete: its state becomes what any stop checkpoints."""
                checkpointer.commit(clone_state({
                    "algo": "ppo", "env_id": env_id, "seed": seed, "version": version, "global_step": global_step,
                    "config": config.to_dict(), **spaces, "agent": agent.state_dict(),
                    "optimizer": optimizer.state_dict(), "normalizer": normalizer.state_dict(),
                    "reward_scaler": reward_scaler.state_dict(), "recent_returns": list(recent),
                }))

            num_updates = config.num_updates(total_steps)
            episodes: list[Episode] = []
            solved_at_step: int | None = None
            solved_at_s: float | None = None
            solved_at_cpu_s: float | None = None
            greedy_return: float | None = None
            last_confirm = -CONFIRM_EVERY
            started, cpu_started = time.perf_counter(), time.process_time()
            start_step = global_step
            recorded = 0  # switcher.history entries already in switches.jsonl
            display = _Progress(total_steps, start_step, enabled=sys.stdout.isatty() if progress is None else progress,
                                log=log, env_id=env_id)
            with MetricsWriter(run_dir) as metrics, display:
                while global_step < total_steps and solved_at_step is None:
                    if config.anneal_lr:
                        frac = max(0.0, 1.0 - version / num_updates)
                        optimizer.param_groups[0]["lr"] = frac * config.learning_rate
                    batch, new_episodes = switcher.collect(policy_version=version, global_step=global_step)
                    global_step += batch.size
                    values = ppo_update(agent, optimizer, normalizer, reward_scaler.fit_scale(batch), config,
                                        generator=generator)
                    version += 1
                    normalizer.update(batch.obs)

                    crossed = _first_crossing(recent, new_episodes, target_return) if confirm_episodes == 0 else None
                    episodes += new_episodes
                    recent.extend(e.episodic_return for e in new_episodes)
                    elapsed = time.perf_counter() - started
                    window = list(recent)[-RETURN_WINDOW:]
                    mean_return = float(np.mean(window)) if window else float("nan")
                    if new_episodes:
                        values["charts/episodic_return"] = float(np.mean([e.episodic_return for e in new_episodes]))
                        values["charts/episodic_length"] = float(np.mean([e.episodic_length for e in new_episodes]))
                    values["charts/mean_return_20"] = mean_return
                    values["charts/learning_rate"] = float(optimizer.param_groups[0]["lr"])
                    values["perf/env_steps_per_s"] = (global_step - start_step) / max(elapsed, 1e-9)
                    switcher.at_boundary(step=global_step, version=version, update=version, mean_return=mean_return)
                    for event in switcher.history[recorded:]:  # failovers during collect, then a switch here
                        values["switch/pause_s"] = event.pause_s
                        _append_jsonl(run_dir / SWITCHES_FILE, event.to_dict())
                    recorded = len(switcher.history)
                    metrics.log(global_step=global_step, policy_version=version, values=values)
                    display.update(global_step, mean_return, values["perf/env_steps_per_s"], mode=switcher.mode)
                    if control is not None:
                        control.update(state="training", step=global_step, policy_version=version,
                                       mean_return=None if np.isnan(mean_return) else mean_return,
                                       env_steps_per_s=values["perf/env_steps_per_s"])
                    if confirm_episodes == 0 and crossed is not None:
                        solved_at_step, solved_at_s = crossed.global_step, elapsed
                        solved_at_cpu_s = time.process_time() - cpu_started
                    elif (confirm_episodes > 0 and target_return is not None and len(window) >= RETURN_WINDOW
                          and mean_return >= target_return and version - last_confirm >= CONFIRM_EVERY):
                        last_confirm = version
                        greedy_return = evaluate_greedy(agent, normalizer, env_id, episodes=confirm_episodes,
                                                        seed=seed + 1_000_003 + version)
                        metrics.log(global_step=global_step, policy_version=version,
                                    values={"charts/greedy_return": greedy_return})
                        if greedy_return >= target_return:
                            solved_at_step, solved_at_s = global_step, time.perf_counter() - started
                            solved_at_cpu_s = time.process_time() - cpu_started
                    commit()
                last_path = checkpointer.final()
            accounting = {"produced": switcher.produced(), **switcher.accounting.check()}
            switches = tuple(switcher.history)
        except BaseException as exc:
            # The stop path: the last completed update is written first, before closing anything can hang or fail.
            log(checkpointer.stopped(exc, step=global_step, resume_command=resume_command))
            raise
        finally:
            checkpointer.close()
            if control is not None:
                control.stop()
            if switcher is not None:
                switcher.close()
    if last_path is None:  # a resumed run that was already at its budget: its checkpoint is the newest
        last_path = latest_checkpoint(run_dir)
    assert last_path is not None
    window = list(recent)[-RETURN_WINDOW:]
    return TrainResult(run_dir=run_dir, env_id=env_id, policy_version=version, global_step=global_step,
                       wall_s=time.perf_counter() - started, cpu_s=time.process_time() - cpu_started,
                       checkpoint=last_path, episodes=episodes,
                       mean_return=float(np.mean(window)) if window else float("nan"),
                       solved_at_step=solved_at_step, solved_at_s=solved_at_s, solved_at_cpu_s=solved_at_cpu_s,
                       greedy_return=greedy_return,
                       switches=switches, accounting=accounting)


def _first_crossing(earlier: Iterable[float], new: list[Episode], target: float | None) -> Episode | None:
    """The first of the `new` episodes with which the last `RETURN_WINDOW` returns' mean reached `target`, or None.

    The window includes the `earlier` returns, so the crossing can be the first new episode.
    """
    if target is None:
        return None
    window: collections.deque[float] = collections.deque(earlier, maxlen=RETURN_WINDOW)
    for episode in new:
        window.append(episode.episodic_return)
        if len(window) == RETURN_WINDOW and sum(window) / RETURN_WINDOW >= target:
            return episode
    return None


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def evaluate_greedy(agent: Any, normalizer: Any, env_id: str, *, episodes: int, seed: int, mode: str = "sync") -> float:
    """Mean return of `agent`'s deterministic policy over `episodes` episodes, one per env of a vector env.

    Runs in-process (``mode="sync"`` by default) whatever source feeds the learner: a confirmation
    is a short check, not worth starting workers for.
    """
    import torch

    gym = require("gymnasium", extra="cloud", purpose="evaluation environments")
    envs = make_vector_env(env_id, num_envs=episodes, seed=seed, mode=mode)
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


class _Progress:
    """A rich progress bar on a terminal; otherwise a plain progress line every few seconds."""

    def __init__(self, total: int, done: int, *, enabled: bool, log: Callable[[str], None], env_id: str,
                 every_s: float = 5.0) -> None:
        self.total, self.enabled, self.log, self.env_id, self.every_s = total, enabled, log, env_id, every_s
        self._last_print = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None
        self._done = done

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), TextColumn("[cyan]{task.fields[mode]}"),
                                 BarColumn(), MofNCompleteColumn(), TextColumn("return {task.fields[ret]:>7}"),
                                 TextColumn("{task.fields[sps]:>8} steps/s"), TimeElapsedColumn())
            self._bar.start()
            self._task = self._bar.add_task(f"PPO {self.env_id}", total=self.total, completed=self._done,
                                            ret="-", sps="-", mode="")
        return self

    def update(self, global_step: int, mean_return: float, steps_per_s: float, mode: str = "") -> None:
        """Show the env-step count, the 20-episode mean return, the throughput and the active mode."""
        ret = "-" if np.isnan(mean_return) else f"{mean_return:.1f}"
        if self._bar is not None:
            self._bar.update(self._task, completed=min(global_step, self.total), ret=ret, sps=f"{steps_per_s:,.0f}",
                             mode=mode)
        elif time.perf_counter() - self._last_print >= self.every_s:
            self._last_print = time.perf_counter()
            where = f" [{mode}]" if mode else ""
            self.log(f"train {self.env_id}{where}: step {global_step:,}/{self.total:,}  return(20) {ret}  "
                     f"{steps_per_s:,.0f} steps/s")

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

