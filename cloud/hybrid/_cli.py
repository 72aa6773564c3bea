"""`strata train --modes hybrid ...`: the train command's hybrid branch (flags in, one summary out)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal

from device import ConfigError


def refuse_hybrid_flags(args: argparse.Namespace) -> None:
    """A hybrid flag without ``--modes hybrid`` would be ignored: refuse it instead."""
    from cloud.hybrid._config import HybridConfig

    given = [f.name for f in dataclasses.fields(HybridConfig) if getattr(args, f.name, None) is not None]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"train: {flags} only apply to hybrid units; add --modes hybrid (e.g. --modes hybrid "
                          "colocated) or drop them")
    if "hybrid" in (args.modes or ()):
        raise ConfigError(f"train: --modes {' '.join(args.modes)}: hybrid must come first, followed by the units' "
                          "rollout modes (e.g. --modes hybrid colocated decoupled)")


def train_hybrid_from_args(args: argparse.Namespace) -> int:
    """Run ``strata train --modes hybrid [UNIT_MODES...]``; print rank 0's summary."""
    from cloud.hybrid._config import HybridConfig, UnitSpec
    from cloud.hybrid._launch import train_hybrid
    from cloud.learners._ppo_config import PPOConfig
    from cloud.runs._checkpoint import resumed_config
    from cloud.runs._metrics import METRICS_FILE
    from cloud.runs._run import resume_command
    from cloud.runs._stop import StopSignal
    from cloud.switching._modes import switching_from_args
    from cloud.switching._switcher import SwitchRules
    from device import config_from_args

    if args.algo != "ppo":
        raise ConfigError(f"train: --modes hybrid trains PPO units; --algo {args.algo} is not supported there")
    rules = [f.name for f in dataclasses.fields(SwitchRules) if getattr(args, f.name, None) is not None]
    if rules:
        raise ConfigError(f"train --modes hybrid: automatic switching rules ({', '.join(rules)}) are not supported "
                          "for hybrid units; switch them with `strata switch RUN --to MODE`")
    config = PPOConfig.from_flags(args, base=resumed_config(PPOConfig, args.run_dir) if args.resume else None)
    unit_modes = tuple(args.modes[1:])
    if "hybrid" in unit_modes:
        raise ConfigError("train: --modes names hybrid twice; list it once, first")
    switching = switching_from_args(args, modes=unit_modes)
    spec = UnitSpec(env_id=args.env, total_steps=args.total_steps, run_dir=args.run_dir, seed=args.seed,
                    config=config, switching=switching, hybrid=config_from_args(HybridConfig, args),
                    resume=args.resume, target_return=args.target_return, confirm_episodes=args.confirm_episodes,
                    checkpoint_every=args.checkpoint_every, rolling_checkpoint_s=args.rolling_checkpoint_s,
                    resume_command=resume_command(args))
    try:
        result = train_hybrid(spec)
    except StopSignal as stop:
        return stop.exit_status  # rank 0 printed the stop line: where the checkpoint is, the command that resumes
    if result.stopped_by is not None and result.stopped_by.startswith("SIG"):  # a signal to a unit (torchrun)
        return 128 + int(getattr(signal, result.stopped_by))
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    solved = ("" if result.solved_at_step is None
              else f", reached {args.target_return} at step {result.solved_at_step:,}")
    print(f"strata train: {args.env}: {result.units} hybrid units, policy version {result.policy_version}, "
          f"{result.global_step:,} env steps ({', '.join(f'{s:,}' for s in result.unit_steps)} per unit), mean return "
          f"(last 20 episodes) {result.mean_return:.1f}{solved}, {result.wall_s:.1f} s")
    same = "identical" if len(set(result.digests)) == 1 else "DIFFERENT"
    print(f"strata train: policy digests of the units: {same} ({', '.join(result.digests)}); normaliser merged over "
          f"{result.normalizer_count:,.0f} observations")
    for unit in result.unit_status:
        print(f"strata train: unit {unit['rank']} on node {unit['node']} (local rank {unit['local_rank']}): "
              f"{unit['steps']:,} env steps, {unit['env_steps_per_s']:,.0f} steps/s, {unit['workers']} workers, "
              f"mode {unit['mode']}")
    for event in result.switches:
        print(f"strata train: every unit switched {event.from_mode} -> {event.to_mode} at step {event.at_step:,} "
              f"({event.trigger}: {event.reason}); pause {event.pause_s * 1000:.0f} ms")
    total = result.accounting.get("total")
    if total and result.switches:
        print(f"strata train: transitions produced {total['produced']:,}, consumed {total['consumed']:,}, duplicates "
              f"{total['duplicates']}, gaps {total['gaps']} (all units)")
    print(f"strata train: checkpoint {result.checkpoint}; metrics {args.run_dir / METRICS_FILE}")
    return 0
