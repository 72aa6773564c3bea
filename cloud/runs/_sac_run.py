"""`train_sac`: runs `cloud.learners.SACTrainer` into a run dir through the run machinery PPO uses.

Pipeline: open the run (fresh, or the newest checkpoint) -> `RunSession` (signals, checkpoints, metrics, switch
log, a control endpoint that reports status and refuses switches) -> the trainer steps and learns, and every
`SACConfig.log_every` env steps is a commit (policy version = env steps), logged and reported -> at the budget the
deterministic policy is exported as a verified ONNX graph (and, with a key, a signed bundle) and evaluated.

A checkpoint holds the actor, the twin critics and their targets, the three optimisers, the temperature, the step
counters, the sampler's state and the replay's contents, so ``--resume`` continues the same run. Env state is not
checkpointed: a resumed run starts a fresh episode (and, with gSDE, a fresh exploration matrix).

With ``env_mode="edge"`` the env source is the fleet (`cloud.rollout._edge.EdgeFeed`): at every commit the
deterministic actor goes out as a signed bundle (bundle version 1 + commits) asking for Gaussian exploration
noise and records of a divisor of ``log_every`` steps; the learner takes whole records up to its next commit, puts
every transition into the replay with its acting version, and keeps the ids of the records it learned from in
every checkpoint, so each enters the replay exactly once (a resumed run learns again from what its checkpoint
lost).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cloud.learners._sac import SACConfig, SACTrainer
from cloud.replay._tables import ReplayStats
from cloud.rollout._edge import EdgeFeed, EdgeLedger, EdgeSourceConfig
from cloud.rollout._envs import episode_returns
from cloud.runs._export import default_policy_name
from cloud.runs._run import RunSession, RunSpec, open_run
from cloud.runs._stop import ROLLING_EVERY_S
from cloud.switching._control import RunStatus
from device import Bundle, ConfigError, SigningKey, require, write_atomic


@dataclass(frozen=True)
class SACResult:
    """What `train_sac` did and produced."""

    run_dir: Path
    global_step: int
    wall_s: float
    eval_returns: list[float]
    """Returns of the exported ONNX policy over `SACConfig.eval_episodes` episodes."""
    train_returns: list[float]
    """Returns of the training episodes (stochastic policy and the random warm-up)."""
    model: bytes
    """The exported ONNX graph."""
    bundle: Bundle | None
    """The signed bundle, when a signing key was given."""
    replay: ReplayStats

    @property
    def mean_eval_return(self) -> float:
        """Mean return of the exported policy."""
        return float(np.mean(self.eval_returns)) if self.eval_returns else math.nan


def evaluate_onnx_policy(model: bytes, *, env_id: str, episodes: int, seed: int) -> list[float]:
    """Returns of `episodes` episodes of the ONNX policy `model` (input "obs", output "action") in onnxruntime."""
    gym = require("gymnasium", extra="cloud", purpose="evaluating policies")
    ort = require("onnxruntime", extra="cloud", purpose="evaluating policies")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    env = gym.make(env_id)
    try:
        return episode_returns(env, lambda obs: session.run(["action"], {"obs": obs[None]})[0][0], episodes=episodes,
                               seed=seed)
    finally:
        env.close()


def train_sac(config: SACConfig | None, *, env_id: str, run_dir: Path, seed: int, total_steps: int,
              signing_key: SigningKey | None = None, policy: str | None = None,
              log: Callable[[str], None] = print, resume: bool = False, checkpoint_every: int = 100,
              rolling_checkpoint_s: float = ROLLING_EVERY_S,
              control: bool = False, resume_command: str | None = None,
              edge: EdgeSourceConfig | None = None) -> SACResult:
    """Train SAC until `total_steps` env steps (over the run), export the deterministic policy and evaluate it.

    Writes ``RUN_DIR/checkpoints/{step:09d}.pt`` (see the module docstring), ``RUN_DIR/metrics.jsonl``
    (CleanRL-style names), ``RUN_DIR/policy.onnx`` and, with a `signing_key`,
    ``RUN_DIR/bundles/{step:09d}.bundle``; every file goes through a temp file and a rename.

    Args:
        config: Hyperparameters (including the replay deployment); with `resume`, None means the checkpoint's.
        env_id: Gymnasium env id with Box observations and bounded Box actions.
        run_dir: Output folder (created).
        seed: Seeds torch, the env, the replay sampler and the evaluation episodes.
        total_steps: Env-step budget of the whole run; a resumed run stops at the same total.
        signing_key: Signs the exported bundle; None exports the ONNX graph only.
        policy: Bundle policy name; None derives it from `env_id`.
        log: Where progress lines go.
        resume: Continue from the newest checkpoint in `run_dir` (it must exist).
        checkpoint_every: Keep a checkpoint every this many commits (of `SACConfig.log_every` steps each).
        rolling_checkpoint_s: Write the newest commit in the background at most this often (0: every commit).
        control: Serve the control endpoint (`strata status`, `strata runs`; SAC has one mode, so
            `strata switch` is refused).
        resume_command: The command the stop line tells the user to run.
        edge: The fleet and broker of ``env_mode="edge"`` (needed then, refused otherwise).

    Raises:
        ConfigError: Bad arguments, a fresh run into a dir that already holds a run (checkpoints or a
            policy.onnx: never overwritten), or a resume without a SAC checkpoint.
    """
    spec = RunSpec(algo="sac", env_id=env_id, run_dir=Path(run_dir), seed=seed, total_steps=total_steps,
                   resume=resume, checkpoint_every=checkpoint_every, rolling_checkpoint_s=rolling_checkpoint_s,
                   resume_command=resume_command, caller="train_sac")
    state = open_run(spec, also_taken=("policy.onnx",))
    config = config or (SACConfig.from_dict(state["config"]) if state else SACConfig())
    if (config.env_mode == "edge") != (edge is not None):
        raise ConfigError("train: SAC learns from the fleet with --env-mode edge and --edge-broker, --edge-fleet; "
                          "give both or neither")
    if edge is not None:
        edge.check_ready()
    started = time.perf_counter()
    start_version = int(state["version"]) if state else 0
    trainer = SACTrainer(config, env_id=env_id, seed=seed + 7919 * start_version, total_steps=total_steps)
    status = RunStatus(spec.run_dir, refusal=f"a SAC run has one mode ({config.env_mode}); live switching is for "
                       "PPO runs", env_id=env_id, algo="sac", mode=config.env_mode, modes=[config.env_mode],
                       workers=1, last_switch=None, switches=0) if control else None
    ledger = EdgeLedger((state or {}).get("edge"), resumed_version=start_version) if edge is not None else None
    with RunSession(spec, start_version=start_version, keep_every=checkpoint_every * config.log_every, log=log,
                    tensorboard=False) as session:
        session.on_close(trainer.close)
        if state is not None:
            trainer.load_state_dict(state, seed=seed)
        session.begin(mode=config.env_mode, step=trainer.global_step, version=trainer.global_step, control=status)

        def logged(step: int, values: dict[str, float]) -> None:
            _log(session, trainer, step, values, log=log, ledger=ledger)

        if edge is not None and ledger is not None:
            take = _fleet(edge, trainer, ledger, session=session, policy=policy or default_policy_name(env_id),
                          log=log)
            trainer.run_fed(total_steps, take=take, on_log=logged)  # commits at log_every only: none splits a record
        else:
            trainer.run(total_steps, on_step=lambda step: _step(session, trainer, step), on_log=logged)
        if session.checkpointer.version != trainer.global_step:  # the budget is not a multiple of log_every
            session.commit(_state(session, trainer, ledger))
        session.finish()
        model, bundle = _export(trainer, run_dir=spec.run_dir, signing_key=signing_key,
                                policy=policy or default_policy_name(env_id))
        eval_returns = evaluate_onnx_policy(model, env_id=env_id, episodes=config.eval_episodes, seed=seed + 10_000)
        session.log(global_step=trainer.global_step, policy_version=trainer.global_step,
                    values={"eval/mean_return": float(np.mean(eval_returns)) if eval_returns else math.nan})
        return SACResult(run_dir=spec.run_dir, global_step=trainer.global_step, wall_s=time.perf_counter() - started,
                         eval_returns=eval_returns, train_returns=list(trainer.train_returns), model=model,
                         bundle=bundle, replay=trainer.replay.stats())


def record_steps(log_every: int, *, limit: int = 256) -> int:
    """Steps per fleet record for SAC: the largest divisor of `log_every` up to `limit` (commits split no record)."""
    return max(d for d in range(1, min(limit, log_every) + 1) if log_every % d == 0)


def _fleet(edge: EdgeSourceConfig, trainer: SACTrainer, ledger: EdgeLedger, *, session: RunSession, policy: str,
           log: Callable[[str], None]) -> Callable[[int], list[Any]]:
    """Start the fleet feed; return ``take(budget)``, which also publishes the actor at every new commit."""
    from cloud.runs._checkpoint import latest_checkpoint
    from device import generate_keypair, load_signing_key
    from edge._experience import ExperienceRequest

    run_dir = session.spec.run_dir
    keys = run_dir / "keys"
    if not (keys / "strata-signing.key").exists():
        generate_keypair(keys)
    signing_key = load_signing_key(keys / "strata-signing.key")
    log_every = trainer.config.log_every
    steps = record_steps(log_every)
    request = ExperienceRequest(actions=edge.edge_actions, steps=steps, noise_std=edge.edge_noise_std)

    def newest() -> int:
        path = latest_checkpoint(run_dir)
        return int(path.stem) if path is not None else -1

    feed = EdgeFeed(edge, run_dir=run_dir, observation_space=trainer.observation_space,
                    action_space=trainer.action_space, steps=steps, ledger=ledger, checkpointed=newest, log=log)
    session.on_close(feed.close)
    feed.start()
    published = [0]

    def take(budget: int) -> list[Any]:
        version = 1 + trainer.global_step // log_every  # the commits so far: a new bundle at each
        if version - published[0] >= edge.edge_publish_every or not published[0]:
            model = trainer.export_onnx()
            feed.publish(version, trainer.build_bundle(model, signing_key=signing_key, policy=policy, version=version,
                                                       producer=request.to_producer()).to_bytes())
            published[0] = version
        return feed.take(current=version, global_step=trainer.global_step, budget=budget)

    return take


def _state(session: RunSession, trainer: SACTrainer, ledger: EdgeLedger | None = None) -> dict[str, Any]:
    """The checkpoint of the trainer's present state (policy version = env steps)."""
    spec = session.spec
    edge = {} if ledger is None else {"edge": ledger.state_dict()}
    return {"algo": "sac", "env_id": spec.env_id, "seed": spec.seed, "version": trainer.global_step,
            "config": trainer.config.to_dict(), "observation_space": trainer.observation_space,
            "action_space": trainer.action_space, **trainer.state_dict(), **edge}


def _step(session: RunSession, trainer: SACTrainer, step: int) -> None:
    """After every update: the status moves; every ``commit_every`` steps, a commit (`_log` commits its own)."""
    session.status(state="training", step=step, policy_version=step)
    config = trainer.config
    if step % config.commit_every == 0 and step % config.log_every:
        session.commit(_state(session, trainer))


def _log(session: RunSession, trainer: SACTrainer, step: int, values: dict[str, float], *,
         log: Callable[[str], None], ledger: EdgeLedger | None = None) -> None:
    """Every ``log_every`` env steps: metrics and status figures, then the commit, then a progress line.

    The commit comes after the line: a stop between the two keeps the previous commit, and the resume drops the line.
    """
    window = trainer.train_returns[-20:]
    values["charts/mean_return_20"] = float(np.mean(window)) if window else math.nan
    edge: dict[str, Any] = {}
    if ledger is not None:
        edge = {"edge": ledger.status(policy_version=step // trainer.config.log_every)}
    session.log(global_step=step, policy_version=step, values=values)
    session.status(state="training", step=step, policy_version=step,
                   mean_return=None if not window else values["charts/mean_return_20"],
                   env_steps_per_s=values["perf/env_steps_per_s"], **edge)
    session.commit(_state(session, trainer, ledger))
    log(f"sac {session.spec.env_id} step {step}/{session.spec.total_steps} return "
        f"{values['charts/episodic_return']:.1f} {values['perf/env_steps_per_s']:.0f} steps/s")


def _export(trainer: SACTrainer, *, run_dir: Path, signing_key: SigningKey | None,
            policy: str) -> tuple[bytes, Bundle | None]:
    """Export the deterministic policy to ``policy.onnx`` and, with a key, a signed bundle under ``bundles/``."""
    model = trainer.export_onnx()
    write_atomic(run_dir / "policy.onnx", model)
    if signing_key is None:
        return model, None
    bundle = trainer.build_bundle(model, signing_key=signing_key, policy=policy, version=max(trainer.global_step, 1))
    write_atomic(run_dir / "bundles" / f"{bundle.manifest.version:09d}.bundle", bundle.to_bytes())
    return model, bundle
