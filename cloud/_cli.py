"""Cloud-tier commands: demo, train, export, and switch / status / runs for running jobs.

Nothing heavy is imported here: each command imports torch, gymnasium or onnx when it runs. Every command is a
check and a run (`device.command`): the check validates every flag, their combinations, the env and the run dir
(a resumed checkpoint is loaded and restored into a learner) before anything is trained, written or started.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from cloud.rollout._edge import EdgeSourceConfig


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the cloud tier's commands to the root parser."""
    import dataclasses

    from cloud._demo import DemoConfig
    from cloud.hybrid import HybridConfig
    from cloud.learners._ppo_config import PPOConfig
    from cloud.learners._sac import SACConfig
    from cloud.rollout._edge import EdgeSourceConfig
    from cloud.runs._stop import ROLLING_EVERY_S
    from cloud.switching._modes import SwitchingConfig
    from cloud.switching._switcher import SwitchRules
    from device import add_config_arguments
    from device._config import add_option, command
    from device._kinds import PRIVATE_KEY, SEED
    from device._options import (
        Choice,
        EnvId,
        InputFolder,
        Integer,
        Name,
        Number,
        OutputFile,
        OutputFolder,
        Seconds,
        Switch,
    )
    from functions._envservice import TLS_GROUP_TITLE
    from functions._secure import ServiceTLS

    demo = sub.add_parser(
        "demo",
        help="run the whole strata story on one machine with embedded defaults",
        description="Run strata end to end on embedded defaults and write a report folder: PPO on CartPole-v1 "
        "co-located, switched live to serverless functions (local runtime) and back by the rules; a signed edge "
        "bundle and a distilled device bundle; three edge agents and two devices on the embedded MQTT broker; "
        "a fleet table; a fresh policy trained from the experience of three edge agents alone (the edge mode); "
        "learning-curve and throughput plots and a markdown summary.",
    )
    add_config_arguments(demo, DemoConfig)
    command(demo, check=_demo_check, run=_demo)

    train = sub.add_parser(
        "train",
        help="train a policy on a gymnasium env into a run dir",
        description="Train PPO on any registered gymnasium env with a Box observation space and a Discrete "
        "or Box action space. Writes RUN_DIR/checkpoints/{version:09d}.pt (atomically) and "
        "RUN_DIR/metrics.jsonl; --resume continues the newest checkpoint's version lineage. A fresh run starts from "
        "the env's tuned preset (cloud/presets/ppo.toml, sac.toml) when there is one and says so; --preset none "
        "uses the plain defaults. Every flag, the env and the run dir are checked before training starts.",
    )
    add_option(train, "--env", EnvId(), required=True, help="gymnasium env id, e.g. CartPole-v1")
    add_option(train, "--algo", Choice(values=("ppo", "sac")), default="ppo",
               help="learning algorithm: ppo (Discrete or Box actions) or sac (Box actions; replay; one mode, so "
               "switching flags are refused)")
    add_option(train, "--total-steps", Integer(min=1, max=10**12),
               help="env-step budget of the whole run (a resumed run stops at the same total; default: the "
               "preset's budget, required without one)")
    add_option(train, "--preset", Choice(values=("auto", "none")), default="auto",
               help="auto: start from the env's tuned preset in cloud/presets/ALGO.toml when there is one "
               "(hyperparameters, budget, solved threshold; flags given override single values); none: "
               "PPOConfig/SACConfig defaults")
    add_option(train, "--run-dir", OutputFolder(what="run folder", parents=True), required=True,
               help="folder for checkpoints and metrics (created with its parents)")
    add_option(train, "--seed", SEED, default=0, help="random seed")
    add_option(train, "--resume", Switch(), default=False,
               help="continue from the newest checkpoint in --run-dir (its hyperparameters, unless flags below "
               "override them)")
    add_option(train, "--target-return", Number(), metavar="R",
               help="stop early once the mean return of the last 20 episodes reaches R (PPO; default: the "
               "preset's solved threshold)")
    add_option(train, "--confirm-episodes", Integer(min=0, max=100_000),
               help="with --target-return, stop only once the deterministic policy also averages R over N "
               "fresh episodes (0: trust the training episodes alone; default: 20; PPO only)")
    add_option(train, "--checkpoint-every", Integer(min=1, max=10**9), default=100, metavar="UPDATES",
               help="also checkpoint every this many updates (SAC: commits of --log-every env steps); every stop "
               "writes one")
    add_option(train, "--rolling-checkpoint-s", Seconds(max=86400.0), default=ROLLING_EVERY_S,
               help="seconds between two rolling checkpoints, what a kill -9 resumes from (0: every update, so a "
               "kill -9 loses at most one update; N: the newest update at most every N s, so a kill -9 loses "
               "about N s of training)")
    add_config_arguments(train.add_argument_group("PPO hyperparameters (PPOConfig)"), PPOConfig)
    add_config_arguments(train.add_argument_group(
        "SAC hyperparameters (SACConfig, --algo sac; the PPO flags SAC shares, such as --gamma, --hidden-sizes and "
        "--use-sde, take SACConfig's defaults with --algo sac)"), SACConfig,
                         skip={f.name for f in dataclasses.fields(PPOConfig)})
    add_config_arguments(train.add_argument_group(
        "execution modes and live switching (SwitchingConfig): e.g. --modes colocated decoupled functions"),
        SwitchingConfig, skip={"tls"})
    add_config_arguments(train.add_argument_group(
        TLS_GROUP_TITLE + ": for --env-services off this host and the hybrid units' parameter server"), ServiceTLS)
    add_config_arguments(train.add_argument_group(
        "the edge mode (EdgeSourceConfig, --modes ... edge): the fleet's experience over MQTT trains the policy; "
        "edge agents run with --experience-steps N and --trust RUN_DIR/keys/strata-signing.pub"), EdgeSourceConfig)
    add_config_arguments(train.add_argument_group("automatic switching rules (SwitchRules)"), SwitchRules)
    add_config_arguments(train.add_argument_group(
        "hybrid units (HybridConfig, --modes hybrid [UNIT_MODES...]): learner replicas in step through "
        "torch.distributed; also runs under torchrun"), HybridConfig)
    command(train, check=_train_check, run=_train)

    run_dir = InputFolder(what="run folder", content="run-dir")
    switch = sub.add_parser(
        "switch", help="switch a running training job between co-located and decoupled execution",
        description="Ask the training job in RUN to move to another mode at its next update boundary; "
        "returns once the switch is complete and prints the pause.")
    add_option(switch, "run", run_dir, metavar="RUN", help="run dir of a job started with `strata train`")
    add_option(switch, "--to", Name(), required=True, metavar="MODE",
               help="target mode, one of the job's --modes (colocated, decoupled, fragments, functions, sync)")
    add_option(switch, "--timeout", Seconds(max=86400.0, positive=True), default=300.0,
               help="give up after this many seconds")
    command(switch, check=_control_check, run=_switch)

    status = sub.add_parser(
        "status", help="show a running job's mode, step rate, return, policy version and last switch",
        description="Ask the training job in RUN for its status over its loopback control endpoint.")
    add_option(status, "run", run_dir, metavar="RUN", help="run dir of a job started with `strata train`")
    add_option(status, "--json", Switch(), default=False, help="print the raw status as JSON")
    command(status, check=_control_check, run=_status)

    runs = sub.add_parser("runs", help="list training runs and whether they are running",
                          description="List the run dirs under ROOT with their state, step, version, return and mode.")
    add_option(runs, "--root", InputFolder(what="folder of run dirs"), default=Path("runs"), metavar="ROOT",
               help="folder holding run dirs")
    add_option(runs, "--json", Switch(), default=False, help="print JSON lines instead of a table")
    command(runs, check=_runs_check, run=_runs)

    export = sub.add_parser(
        "export",
        help="export a trained run as a signed ONNX policy bundle",
        description="Export a run's newest (or --version) checkpoint to ONNX with normalisation and action "
        "post-processing inside the graph, check it (onnx.checker; torch vs onnxruntime at batch 1 and 3) "
        "and write a signed policy bundle.",
    )
    add_option(export, "--run", run_dir, required=True, metavar="DIR", help="run dir written by `strata train`")
    add_option(export, "--out", OutputFile(what="bundle file"), required=True, help="bundle file to write (.bundle)")
    add_option(export, "--key", PRIVATE_KEY, metavar="KEYFILE",
               help="Ed25519 private key (PEM) to sign with; default: DIR/keys/strata-signing.key, generated on "
               "first use")
    add_option(export, "--tier", Choice(values=("edge", "device", "any")), default="any",
               help="tier the bundle targets; device distils a micro policy")
    add_option(export, "--version", Integer(min=0, max=10**12), metavar="V",
               help="policy version (checkpoint) to export (default: the newest)")
    add_option(export, "--policy", Name(), metavar="NAME", help="bundle policy name (default: from the env id)")
    add_option(export, "--ttl-s", Seconds(max=100 * 365 * 86400.0, positive=True),
               help="seconds until the bundle expires (default: never)")
    add_option(export, "--weights", Choice(values=("fp32", "fp16", "int8")),
               help="with --tier device: weight storage of the distilled micro policy (default: fp32)")
    add_option(export, "--distill-steps", Integer(min=1, max=10_000_000), metavar="N",
               help="with --tier device: env steps labelled by the teacher per DAgger iteration (default: 2000)")
    command(export, check=_export_check, run=_export)


# ------------------------------------------------------------------------------------------------ demo


def _demo_check(args: argparse.Namespace) -> Any:
    """The demo's settings, its dependencies and its report folder, before the first training step."""
    from cloud._demo import DemoConfig
    from device import ConfigError, config_from_args, require

    given = [name for name in ("broker", "edge_nodes", "devices") if getattr(args, name) is not None]
    if args.fleet is False and given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"demo: {flags} set up the fleet stage, which --no-fleet leaves out; drop them or --no-fleet")
    config = config_from_args(DemoConfig, args)
    require("gymnasium", extra="cloud", purpose="the demo's simulators")
    require("torch", extra="cloud", purpose="the demo's learner")
    previous = Path(config.out) / "run"
    if previous.exists() and not (previous / "metrics.jsonl").exists() and not (previous / "checkpoints").is_dir():
        raise ConfigError(f"demo: {str(previous)!r} exists and is not a previous demo's run, which the demo "
                          "replaces; choose another --out")
    if config.functions == "aws":
        from infra.aws import check_environment

        check_environment()
    return config


def _demo(args: argparse.Namespace, config: Any) -> int:
    from cloud._demo import run_demo
    from cloud.runs._stop import StopSignal

    try:
        return run_demo(config)
    except StopSignal as stop:  # SIGTERM during a training stage: it has stopped its run and said so
        print(f"strata demo: stopped by {stop.name}", file=sys.stderr)
        return stop.exit_status


# ------------------------------------------------------------------------------------------------ train


@dataclass(frozen=True)
class TrainPlan:
    """What `strata train` was checked to run."""

    learner: Literal["ppo", "sac", "hybrid"]
    config: Any
    """`PPOConfig` or `SACConfig`."""
    switching: Any = None
    rules: Any = None
    unit: Any = None
    """The hybrid `UnitSpec`."""
    edge: Any = None
    """The edge mode's `EdgeSourceConfig`, when the run uses it."""
    finished_at: int | None = None
    """SAC: `--resume` of a run that reached its --total-steps and exported its policy, at this many env steps."""


def _train_check(args: argparse.Namespace) -> TrainPlan:
    """Everything `strata train` can refuse, before anything is trained or written (the run dir is only read)."""
    from cloud.hybrid._cli import check_hybrid_from_args, refuse_hybrid_flags
    from cloud.runs._presets import apply_preset

    _refuse_flags_of_the_other_algo(args)  # what was typed, before a preset fills in its values
    apply_preset(args)
    if args.confirm_episodes is None and args.algo == "ppo":  # None only tells SAC that it was not given
        args.confirm_episodes = 20
    if args.modes and args.modes[0] == "hybrid":
        return TrainPlan(learner="hybrid", config=None, unit=check_hybrid_from_args(args))
    refuse_hybrid_flags(args)
    if args.algo == "sac":
        return _check_sac(args)
    return _check_ppo(args)


def _spec(args: argparse.Namespace, algo: str, *, caller: str = "train") -> Any:
    from cloud.runs._run import RunSpec, resume_command

    return RunSpec(algo=algo, env_id=args.env, run_dir=Path(args.run_dir), seed=args.seed,
                   total_steps=args.total_steps, resume=args.resume, checkpoint_every=args.checkpoint_every,
                   rolling_checkpoint_s=args.rolling_checkpoint_s, resume_command=resume_command(args), caller=caller)


def _check_ppo(args: argparse.Namespace) -> TrainPlan:
    from cloud.learners._ppo_config import PPOConfig
    from cloud.rollout._envs import probe_spaces
    from cloud.runs._checkpoint import latest_checkpoint, reading, resumed_config
    from cloud.runs._run import open_run
    from cloud.runs._train import TargetCheck
    from cloud.switching._modes import check_modes, switching_from_args
    from cloud.switching._switcher import SwitchRules
    from device import ConfigError, config_from_args

    switching = switching_from_args(args)
    if (switching.tls.enabled or switching.tls.tls_token_file) and not switching.env_services:
        raise ConfigError("train: --tls-* secure connections to --env-services (and the hybrid units' parameter "
                          "server); this run has neither: add --env-services HOST:PORT,... or drop them")
    config = PPOConfig.from_flags(args, base=resumed_config(PPOConfig, args.run_dir) if args.resume else None)
    rules = config_from_args(SwitchRules, args)
    spec = _spec(args, "ppo")
    TargetCheck(args.target_return, args.confirm_episodes)
    check_modes(config, switching, rules=rules)
    edge = _edge_config(args)
    state = open_run(spec, trim=False)  # fresh: the dir holds no run; resume: its checkpoint and logs read back
    obs_space, action_space = probe_spaces(args.env, config.pipeline)
    if state is not None:
        from cloud.learners._ppo import PPOLearner

        with reading(latest_checkpoint(spec.run_dir)):
            PPOLearner(obs_space, action_space, config, state)
    return TrainPlan(learner="ppo", config=config, switching=switching, rules=rules, edge=edge)


def _check_sac(args: argparse.Namespace) -> TrainPlan:
    import dataclasses

    from cloud.learners._sac import SACConfig, check_sac_action_space
    from cloud.rollout._envs import probe_spaces
    from cloud.runs._checkpoint import latest_checkpoint, reading
    from cloud.runs._run import open_run
    from device import config_from_args

    config = config_from_args(SACConfig, args)
    spec = _spec(args, "sac", caller="train_sac")
    state = open_run(spec, also_taken=("policy.onnx",), trim=False)
    finished_at = None
    if state is not None:  # the checkpoint's hyperparameters, unless flags override them
        given = {f.name for f in dataclasses.fields(SACConfig) if getattr(args, f.name, None) is not None}
        with reading(latest_checkpoint(spec.run_dir)):
            config = dataclasses.replace(SACConfig.from_dict(state["config"]), **{k: getattr(config, k) for k in given})
            if int(state["version"]) >= args.total_steps and (spec.run_dir / "policy.onnx").exists():
                finished_at = int(state["version"])
    check_sac_action_space(args.env, probe_spaces(args.env, config.pipeline)[1])
    return TrainPlan(learner="sac", config=config, edge=_edge_config(args), finished_at=finished_at)


def _train(args: argparse.Namespace, plan: TrainPlan) -> int:
    from cloud.hybrid._cli import train_hybrid
    from cloud.runs._metrics import METRICS_FILE
    from cloud.runs._run import resume_command
    from cloud.runs._stop import StopSignal
    from cloud.runs._train import accounting_line, train

    if plan.learner == "hybrid":
        return train_hybrid(args, plan.unit)
    if plan.learner == "sac":
        return _train_sac(args, plan)
    try:
        result = train(env_id=args.env, total_steps=args.total_steps, run_dir=args.run_dir, seed=args.seed,
                       config=plan.config, resume=args.resume, target_return=args.target_return,
                       confirm_episodes=args.confirm_episodes, checkpoint_every=args.checkpoint_every,
                       rolling_checkpoint_s=args.rolling_checkpoint_s, switching=plan.switching, rules=plan.rules,
                       resume_command=resume_command(args), edge=plan.edge)
    except StopSignal as stop:
        return stop.exit_status  # the stop line said where the checkpoint is
    solved = ("" if result.solved_at_step is None
              else f", reached {args.target_return} at step {result.solved_at_step:,}")
    print(f"strata train: {args.env}: policy version {result.policy_version}, {result.global_step:,} env steps, "
          f"mean return (last 20 episodes) {result.mean_return:.1f}{solved}, {result.wall_s:.1f} s")
    for event in result.switches:
        print(f"strata train: switched {event.from_mode} -> {event.to_mode} at step {event.at_step:,} "
              f"({event.trigger}: {event.reason}); pause {event.pause_s * 1000:.0f} ms")
    if result.accounting and result.switches:
        print(f"strata train: {accounting_line(result.accounting)}")
    print(f"strata train: checkpoint {result.checkpoint}; metrics {args.run_dir / METRICS_FILE}")
    return 0


def _edge_config(args: argparse.Namespace) -> EdgeSourceConfig | None:
    """The edge mode's config when ``--modes`` names it; edge flags without that mode would do nothing: an error."""
    import dataclasses

    from cloud.rollout._edge import EdgeSourceConfig
    from device import ConfigError, config_from_args

    sac = args.algo == "sac"
    if ("edge" in (args.modes or ())) if not sac else args.env_mode == "edge":
        config = config_from_args(EdgeSourceConfig, args)
        config.check_ready()
        return config
    given = sorted(f.name for f in dataclasses.fields(EdgeSourceConfig) if getattr(args, f.name, None) is not None)
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        where = "--env-mode edge (SAC)" if sac else "edge in --modes"
        raise ConfigError(f"train: {flags} configure the edge mode, which this run does not use; give {where} or "
                          "drop them")
    return None


def _refuse_flags_of_the_other_algo(args: argparse.Namespace) -> None:
    """A flag the chosen learner does not use is an error, never silently ignored."""
    import dataclasses

    from cloud.learners._ppo_config import PPOConfig
    from cloud.learners._sac import SACConfig
    from cloud.switching._modes import SwitchingConfig
    from cloud.switching._switcher import SwitchRules
    from device import ConfigError
    from functions._secure import ServiceTLS

    ppo = {f.name for f in dataclasses.fields(PPOConfig)}
    sac = {f.name for f in dataclasses.fields(SACConfig)}
    if args.algo == "sac":
        unused = (ppo - sac) | {f.name for f in dataclasses.fields(SwitchingConfig) if f.name != "control"}
        unused |= {f.name for f in dataclasses.fields(ServiceTLS)}
        unused |= {f.name for f in dataclasses.fields(SwitchRules)} | {"target_return", "confirm_episodes"}
        why = ("SAC runs in one mode (--env-mode) without live switching or an early stop; drop them or use "
               "--algo ppo")
    else:
        unused = sac - ppo
        why = "they are SAC hyperparameters; drop them or pass --algo sac"
    given = sorted(name for name in unused if getattr(args, name, None) is not None)
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"train: --algo {args.algo} does not use {flags}: {why}")


def _train_sac(args: argparse.Namespace, plan: TrainPlan) -> int:
    from cloud.runs._checkpoint import latest_checkpoint
    from cloud.runs._run import resume_command
    from cloud.runs._sac_run import train_sac
    from cloud.runs._stop import StopSignal

    if plan.finished_at is not None:  # its policy is exported and evaluated; a rerun would repeat that
        print(f"strata train: run dir {args.run_dir} holds a finished SAC run ({plan.finished_at:,} env steps; "
              f"policy {args.run_dir / 'policy.onnx'}); nothing to do; pass a --total-steps above "
              f"{plan.finished_at:,} to train it further")
        return 0
    try:
        result = train_sac(plan.config, env_id=args.env, run_dir=args.run_dir, seed=args.seed,
                           total_steps=args.total_steps, resume=args.resume, checkpoint_every=args.checkpoint_every,
                           rolling_checkpoint_s=args.rolling_checkpoint_s,
                           control=args.control is not False, resume_command=resume_command(args), edge=plan.edge)
    except StopSignal as stop:
        return stop.exit_status
    print(f"strata train: {args.env}: SAC, {result.global_step:,} env steps, exported policy's mean evaluation "
          f"return {result.mean_eval_return:.1f}; checkpoint {latest_checkpoint(args.run_dir)}; outputs in "
          f"{args.run_dir}")
    return 0


# ------------------------------------------------------------------------------------------------ running jobs


def _control_check(args: argparse.Namespace) -> Any:
    """The job's control endpoint (file and token) reads back; nothing is sent yet."""
    from cloud.switching._control import ControlClient

    return ControlClient.for_run(args.run)


def _switch(args: argparse.Namespace, client: Any) -> int:
    result = client.switch(args.to, timeout=args.timeout)
    print(f"strata switch: {result['from_mode']} -> {result['to_mode']} at step {result['at_step']:,} "
          f"(policy version {result['at_version']}); pause {result['pause_s'] * 1000:.0f} ms")
    return 0


def _status(args: argparse.Namespace, client: Any) -> int:
    import json

    status = client.status()
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    last = status.get("last_switch")
    rows = [("run", status.get("run_dir")), ("env", status.get("env_id")), ("state", status.get("state")),
            ("mode", f"{status.get('mode')} (modes: {', '.join(status.get('modes', []))})"),
            ("env steps", f"{status.get('step', 0):,}"), ("steps/s", f"{status.get('env_steps_per_s', 0):,.0f}"),
            ("mean return (20)", status.get("mean_return")), ("policy version", status.get("policy_version")),
            ("active workers", status.get("workers")),
            *[(f"unit {u['rank']}", f"node {u['node']} pid {u['pid']}: {u['steps']:,} steps, "
               f"{u['env_steps_per_s']:,.0f} steps/s, {u['workers']} workers, {u['mode']}")
              for u in status.get("units", [])],
            ("last switch", "none" if not last else f"{last['from_mode']} -> {last['to_mode']} at step "
             f"{last['at_step']:,} ({last['trigger']}: {last['reason']}), pause {last['pause_s'] * 1000:.0f} ms")]
    edge = status.get("edge")
    if isinstance(edge, dict):
        rows += [("edge records", f"{edge.get('records', 0):,} learned from ({edge.get('transitions', 0):,} "
                  f"transitions); {edge.get('records_received', 0):,} received, {edge.get('pending', 0):,} pending"),
                 ("edge duplicates", f"{edge.get('duplicates_wire', 0):,} on the wire (stored once), "
                  f"{edge.get('duplicates_learner', 0):,} dropped by the learner"),
                 ("edge refused", f"{edge.get('refused_stale', 0):,} stale, {edge.get('refused', 0):,} malformed, "
                  f"{edge.get('refused_ingest', 0):,} at ingest; staleness mean {edge.get('staleness_mean')} max "
                  f"{edge.get('staleness_max')} versions"),
                 ("edge ingesters", f"{edge.get('ingesters', 0)} running, {edge.get('ingester_restarts', 0)} "
                  "restarts")]
        for node, n in sorted((edge.get("nodes") or {}).items()):
            rows.append((f"node {node}"[:17], f"{n.get('records', 0):,} records, v{n.get('version')}, lag "
                         f"{n.get('lag_versions')} versions / {n.get('lag_s')} s"))
    for name, value in rows:
        print(f"{name:>17}  {value}")
    return 0


def _runs_check(args: argparse.Namespace) -> None:
    from device import ConfigError

    if args.root == Path("runs") and not args.root.exists():
        return  # the default root: no runs yet is an answer, not an error
    if not args.root.is_dir():
        raise ConfigError(f"--root {str(args.root)!r} is not a folder; pass the folder that holds run dirs")


def _runs(args: argparse.Namespace, checked: None) -> int:
    import json

    from cloud.switching._control import list_runs

    runs = list_runs(args.root)
    if args.json:
        for run in runs:
            print(json.dumps(run))
        return 0
    if not runs:
        print(f"strata runs: no run dirs under {str(args.root)!r} (start one with `strata train --run-dir "
              f"{args.root}/NAME ...`)")
        return 0
    print(f"{'run':<40} {'state':<8} {'step':>10} {'version':>8} {'return':>8}  mode")
    for r in runs:
        ret = "-" if r["mean_return"] is None else f"{r['mean_return']:.1f}"
        step = "-" if r["step"] is None else f"{r['step']:,}"
        print(f"{r['run']:<40} {r['state']:<8} {step:>10} {r['version'] or '-':>8} {ret:>8}  {r['mode'] or '-'}")
    return 0


# ------------------------------------------------------------------------------------------------ export


def _export_check(args: argparse.Namespace) -> Any:
    """The checkpoint loads and its policy rebuilds; the key reads; the device flags fit the tier."""
    from cloud.runs._checkpoint import latest_checkpoint
    from cloud.runs._export import check_export
    from device import ConfigError, load_signing_key, shown

    device_only = [flag for flag, value in (("--weights", args.weights), ("--distill-steps", args.distill_steps))
                   if value is not None]
    if device_only and args.tier != "device":
        raise ConfigError(f"export: {', '.join(device_only)} set how a micro policy is distilled and do nothing "
                          f"with --tier {args.tier}; add --tier device or drop them")
    if args.version is None and latest_checkpoint(args.run) is None:
        raise ConfigError(f"--run {shown(str(args.run))} has no checkpoints; train one first with "
                          "`strata train --run-dir DIR ...`")
    state = check_export(args.run, args.version, device=args.tier == "device")
    key = load_signing_key(args.key) if args.key is not None else None
    return state, key


def _export(args: argparse.Namespace, checked: Any) -> int:
    from cloud.runs._export import export_run, write_bundle
    from device import generate_keypair, load_signing_key

    _, key = checked
    if key is None:
        key_dir = args.run / "keys"
        key_path = key_dir / "strata-signing.key"
        if not key_path.exists():
            generate_keypair(key_dir)
            print(f"strata export: generated signing key {key_path} (public key {key_dir / 'strata-signing.pub'}: "
                  "give it to consumers as --trust)")
        else:
            print(f"strata export: signing with the run's key {key_path}")
        key = load_signing_key(key_path)
    if args.tier == "device":
        from cloud.runs._export import export_micro

        return export_micro(args, key)
    result = export_run(args.run, signing_key=key, version=args.version, policy=args.policy,
                        target_tier=args.tier, ttl_s=args.ttl_s)
    write_bundle(args.out, result.bundle)
    m = result.bundle.manifest
    diff = ", ".join(f"{k} {v:.1e}" for k, v in result.max_abs_diff.items())
    print(f"strata export: wrote {args.out}: policy {m.policy!r} version {m.version} (parent {m.parent_version}), "
          f"tier {m.target_tier}, model {len(result.bundle.model):,} B sha256 {m.model_sha256[:12]}, "
          f"key {result.bundle.key_id}; torch vs onnxruntime max |diff|: {diff}")
    return 0
