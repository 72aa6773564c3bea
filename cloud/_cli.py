"""Cloud-tier commands: demo, train, export, and switch / status / runs for running jobs.

Nothing heavy is imported here: each command imports torch, gymnasium or onnx when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

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
    from device import add_config_arguments, finite_float, seconds
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
    demo.set_defaults(func=_demo)

    train = sub.add_parser(
        "train",
        help="train a policy on a gymnasium env into a run dir",
        description="Train PPO on any registered gymnasium env with a Box observation space and a Discrete "
        "or Box action space. Writes RUN_DIR/checkpoints/{version:09d}.pt (atomically) and "
        "RUN_DIR/metrics.jsonl; --resume continues the newest checkpoint's version lineage. A fresh run starts from "
        "the env's tuned preset (cloud/presets/ppo.toml, sac.toml) when there is one and says so; --preset none "
        "uses the plain defaults.",
    )
    train.add_argument("--env", required=True, metavar="ID", help="gymnasium env id, e.g. CartPole-v1")
    train.add_argument("--algo", default="ppo", choices=["ppo", "sac"],
                       help="learning algorithm: ppo (Discrete or Box actions) or sac (Box actions; replay; "
                       "one mode, so switching flags are refused) (default: %(default)s)")
    train.add_argument("--total-steps", type=int, default=None, metavar="N",
                       help="env-step budget of the whole run (a resumed run stops at the same total; default: the "
                       "preset's budget, required without one)")
    train.add_argument("--preset", default="auto", choices=["auto", "none"],
                       help="auto: start from the env's tuned preset in cloud/presets/ALGO.toml when there is one "
                       "(hyperparameters, budget, solved threshold; flags given override single values); none: "
                       "PPOConfig/SACConfig defaults (default: %(default)s)")
    train.add_argument("--run-dir", required=True, type=Path, metavar="DIR", help="folder for checkpoints and metrics")
    train.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    train.add_argument("--resume", action="store_true",
                       help="continue from the newest checkpoint in --run-dir (its hyperparameters, unless "
                       "flags below override them)")
    train.add_argument("--target-return", type=finite_float, default=None, metavar="R",
                       help="stop early once the mean return of the last 20 episodes reaches R (PPO; default: the "
                       "preset's solved threshold)")
    train.add_argument("--confirm-episodes", type=int, default=None, metavar="N",
                       help="with --target-return, stop only once the deterministic policy also averages R over N "
                       "fresh episodes (0: trust the training episodes alone; default: 20; PPO only)")
    train.add_argument("--checkpoint-every", type=int, default=100, metavar="UPDATES",
                       help="also checkpoint every this many updates (SAC: commits of --log-every env steps; "
                       "default: %(default)s); every stop writes one")
    train.add_argument("--rolling-checkpoint-s", type=seconds, default=ROLLING_EVERY_S, metavar="SECONDS",
                       help="seconds between two rolling checkpoints, what a kill -9 resumes from (default: "
                       "%(default)s, every update: a kill -9 loses at most one update; N: the newest update at most "
                       "every N s, so a kill -9 loses about N s of training)")
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
    train.set_defaults(func=_train)

    switch = sub.add_parser(
        "switch", help="switch a running training job between co-located and decoupled execution",
        description="Ask the training job in RUN to move to another mode at its next update boundary; "
        "returns once the switch is complete and prints the pause.")
    switch.add_argument("run", type=Path, metavar="RUN", help="run dir of a job started with `strata train`")
    switch.add_argument("--to", required=True, metavar="MODE",
                        help="target mode, one of the job's --modes (colocated, decoupled, fragments, functions, sync)")
    switch.add_argument("--timeout", type=seconds, default=300.0, metavar="S",
                        help="give up after this many seconds (default: %(default)s)")
    switch.set_defaults(func=_switch)

    status = sub.add_parser(
        "status", help="show a running job's mode, step rate, return, policy version and last switch",
        description="Ask the training job in RUN for its status over its loopback control endpoint.")
    status.add_argument("run", type=Path, metavar="RUN", help="run dir of a job started with `strata train`")
    status.add_argument("--json", action="store_true", help="print the raw status as JSON")
    status.set_defaults(func=_status)

    runs = sub.add_parser("runs", help="list training runs and whether they are running",
                          description="List the run dirs under ROOT with their state, step, version, return and mode.")
    runs.add_argument("--root", type=Path, default=Path("runs"), metavar="ROOT",
                      help="folder holding run dirs (default: %(default)s)")
    runs.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    runs.set_defaults(func=_runs)

    export = sub.add_parser(
        "export",
        help="export a trained run as a signed ONNX policy bundle",
        description="Export a run's newest (or --version) checkpoint to ONNX with normalisation and action "
        "post-processing inside the graph, check it (onnx.checker; torch vs onnxruntime at batch 1 and 3) "
        "and write a signed policy bundle.",
    )
    export.add_argument("--run", required=True, type=Path, metavar="DIR", help="run dir written by `strata train`")
    export.add_argument("--out", required=True, type=Path, metavar="FILE", help="bundle file to write (.bundle)")
    export.add_argument("--key", type=Path, default=None, metavar="KEYFILE",
                        help="Ed25519 private key (PEM) to sign with; default: DIR/keys/strata-signing.key, "
                        "generated on first use")
    export.add_argument("--tier", default="any", choices=["edge", "device", "any"],
                        help="tier the bundle targets (default: %(default)s); device distils a micro policy")
    export.add_argument("--version", type=int, default=None, metavar="V",
                        help="policy version (checkpoint) to export (default: the newest)")
    export.add_argument("--policy", default=None, metavar="NAME", help="bundle policy name (default: from the env id)")
    export.add_argument("--ttl-s", type=seconds, default=None, metavar="SECONDS",
                        help="seconds until the bundle expires (default: never)")
    export.add_argument("--weights", default="fp32", choices=["fp32", "fp16", "int8"],
                        help="with --tier device: weight storage of the distilled micro policy (default: %(default)s)")
    export.add_argument("--distill-steps", type=int, default=2000, metavar="N",
                        help="with --tier device: env steps labelled by the teacher per DAgger iteration "
                        "(default: %(default)s)")
    export.set_defaults(func=_export)


def _demo(args: argparse.Namespace) -> int:
    from cloud._demo import DemoConfig, run_demo
    from cloud.runs._stop import StopSignal
    from device import config_from_args

    config = config_from_args(DemoConfig, args)
    try:
        return run_demo(config)
    except StopSignal as stop:  # SIGTERM during a training stage: it has stopped its run and said so
        print(f"strata demo: stopped by {stop.name}", file=sys.stderr)
        return stop.exit_status


def _train(args: argparse.Namespace) -> int:
    from cloud.hybrid._cli import refuse_hybrid_flags, train_hybrid_from_args
    from cloud.learners._ppo_config import PPOConfig
    from cloud.runs._checkpoint import resumed_config
    from cloud.runs._metrics import METRICS_FILE
    from cloud.runs._presets import apply_preset
    from cloud.runs._run import resume_command
    from cloud.runs._stop import StopSignal
    from cloud.runs._train import accounting_line, train
    from cloud.switching._modes import switching_from_args
    from cloud.switching._switcher import SwitchRules
    from device import ConfigError, config_from_args

    _refuse_flags_of_the_other_algo(args)  # what was typed, before a preset fills in its values
    apply_preset(args)
    if args.confirm_episodes is None and args.algo == "ppo":  # None only tells SAC that it was not given
        args.confirm_episodes = 20
    if args.modes and args.modes[0] == "hybrid":
        return train_hybrid_from_args(args)
    refuse_hybrid_flags(args)
    if args.algo == "sac":
        return _train_sac(args)
    switching = switching_from_args(args)
    if (switching.tls.enabled or switching.tls.tls_token_file) and not switching.env_services:
        raise ConfigError("train: --tls-* secure connections to --env-services (and the hybrid units' parameter "
                          "server); this run has neither: add --env-services HOST:PORT,... or drop them")
    config = PPOConfig.from_flags(args, base=resumed_config(PPOConfig, args.run_dir) if args.resume else None)
    edge = _edge_config(args)
    try:
        result = train(env_id=args.env, total_steps=args.total_steps, run_dir=args.run_dir, seed=args.seed,
                       config=config, resume=args.resume, target_return=args.target_return,
                       confirm_episodes=args.confirm_episodes, checkpoint_every=args.checkpoint_every,
                       rolling_checkpoint_s=args.rolling_checkpoint_s,
                       switching=switching, rules=config_from_args(SwitchRules, args),
                       resume_command=resume_command(args), edge=edge)
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


def _train_sac(args: argparse.Namespace) -> int:
    import dataclasses

    from cloud.learners._sac import SACConfig
    from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint
    from cloud.runs._run import resume_command
    from cloud.runs._sac_run import train_sac
    from cloud.runs._stop import StopSignal
    from device import config_from_args

    config = config_from_args(SACConfig, args)
    edge = _edge_config(args)
    newest = latest_checkpoint(args.run_dir) if args.resume else None
    if newest is not None:  # the checkpoint's hyperparameters, unless flags override them
        state = load_checkpoint(newest)
        if (state.get("algo") == "sac" and state.get("env_id") == args.env and int(state["version"]) >= args.total_steps
                and (args.run_dir / "policy.onnx").exists()):
            # Finished: its policy is exported and evaluated; a rerun would repeat that and log it twice.
            print(f"strata train: run dir {args.run_dir} holds a finished SAC run ({int(state['version']):,} env "
                  f"steps; policy {args.run_dir / 'policy.onnx'}); nothing to do; pass a --total-steps above "
                  f"{int(state['version']):,} to train it further")
            return 0
        if state.get("algo") == "sac":  # else train_sac refuses with the reason
            given = {f.name for f in dataclasses.fields(SACConfig) if getattr(args, f.name, None) is not None}
            config = dataclasses.replace(SACConfig.from_dict(state["config"]),
                                         **{k: getattr(config, k) for k in given})
    try:
        result = train_sac(config, env_id=args.env, run_dir=args.run_dir, seed=args.seed,
                           total_steps=args.total_steps, resume=args.resume, checkpoint_every=args.checkpoint_every,
                           rolling_checkpoint_s=args.rolling_checkpoint_s,
                           control=args.control is not False, resume_command=resume_command(args), edge=edge)
    except StopSignal as stop:
        return stop.exit_status
    print(f"strata train: {args.env}: SAC, {result.global_step:,} env steps, exported policy's mean evaluation "
          f"return {result.mean_eval_return:.1f}; checkpoint {latest_checkpoint(args.run_dir)}; outputs in "
          f"{args.run_dir}")
    return 0


def _switch(args: argparse.Namespace) -> int:
    from cloud.switching._control import ControlClient

    result = ControlClient.for_run(args.run).switch(args.to, timeout=args.timeout)
    print(f"strata switch: {result['from_mode']} -> {result['to_mode']} at step {result['at_step']:,} "
          f"(policy version {result['at_version']}); pause {result['pause_s'] * 1000:.0f} ms")
    return 0


def _status(args: argparse.Namespace) -> int:
    import json

    from cloud.switching._control import ControlClient

    status = ControlClient.for_run(args.run).status()
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


def _runs(args: argparse.Namespace) -> int:
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


def _export(args: argparse.Namespace) -> int:
    from cloud.runs._checkpoint import latest_checkpoint
    from cloud.runs._export import export_run, write_bundle
    from device import ConfigError, generate_keypair, load_signing_key

    if latest_checkpoint(args.run) is None:  # before any key is generated into a dir that is not a run
        raise ConfigError(f"--run {str(args.run)!r} has no checkpoints; train one first with "
                          "`strata train --run-dir DIR ...`")
    key_path: Path = args.key
    if key_path is None:
        key_dir = args.run / "keys"
        key_path = key_dir / "strata-signing.key"
        if not key_path.exists():
            generate_keypair(key_dir)
            print(f"strata export: generated signing key {key_path} (public key {key_dir / 'strata-signing.pub'}: "
                  "give it to consumers as --trust)")
        else:
            print(f"strata export: signing with the run's key {key_path}")
    if args.tier == "device":
        from cloud.runs._export import export_micro

        return export_micro(args, load_signing_key(key_path))
    result = export_run(args.run, signing_key=load_signing_key(key_path), version=args.version, policy=args.policy,
                        target_tier=args.tier, ttl_s=args.ttl_s)
    write_bundle(args.out, result.bundle)
    m = result.bundle.manifest
    diff = ", ".join(f"{k} {v:.1e}" for k, v in result.max_abs_diff.items())
    print(f"strata export: wrote {args.out}: policy {m.policy!r} version {m.version} (parent {m.parent_version}), "
          f"tier {m.target_tier}, model {len(result.bundle.model):,} B sha256 {m.model_sha256[:12]}, "
          f"key {result.bundle.key_id}; torch vs onnxruntime max |diff|: {diff}")
    return 0
