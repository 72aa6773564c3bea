"""The cost of the rolling checkpoint (what a `kill -9` resumes from): training steps/s by how often it is written.

Same run, arms alternated, median of repeats:

    ppo every      PPO on CartPole-v1 (the default PPOConfig, co-located), the rolling checkpoint written after every
                   update (``--rolling-checkpoint-s 0``, the default: a SIGKILL loses at most one update)
    ppo 1s         written at most once a second (the default before issue 36; a SIGKILL lost up to 30 updates)
    ppo never      written once (the baseline: nothing but the first commit)
    sac N          SAC on Pendulum-v1 committing every N env steps (``--commit-every N``; 250 is the default), each
                   commit written as the rolling checkpoint (a SIGKILL loses at most N steps); the baseline is
                   N = 1000, the commits that come with the metrics lines (``--log-every 1000``) alone

The cost of an arm is its learner process's CPU per env step over the baseline's, minus 1 (the writer is a thread of
that process; CPU is what the write takes from training, and unlike wall time it holds on a shared, loaded machine);
steps/s (wall) is printed as well.

    .venv/bin/python benchmarks/rolling_checkpoint.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PPO_ARMS = {"every": 0.0, "1s": 1.0, "never": 1e9}
SAC_COMMIT_EVERY = (1000, 250, 100)


def run_ppo(rolling_s: float, *, steps: int, work: Path) -> tuple[float, float]:
    from cloud.learners._ppo_config import PPOConfig
    from cloud.runs._train import train

    result = train(env_id="CartPole-v1", total_steps=steps, run_dir=work, config=PPOConfig(), progress=False,
                   log=lambda line: None, rolling_checkpoint_s=rolling_s, checkpoint_every=100_000)
    return result.global_step / result.wall_s, result.cpu_s / result.global_step * 1e6


def run_sac(commit_every: int, *, steps: int, work: Path) -> tuple[float, float]:
    from cloud.learners._sac import SACConfig
    from cloud.runs._sac_run import train_sac

    config = SACConfig(log_every=1000, commit_every=commit_every, eval_episodes=1, learning_starts=256)
    started, cpu = time.perf_counter(), time.process_time()
    result = train_sac(config, env_id="Pendulum-v1", run_dir=work, seed=0, total_steps=steps,
                       log=lambda line: None, checkpoint_every=100_000)
    return result.global_step / (time.perf_counter() - started), (time.process_time() - cpu) / steps * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (a quarter of PPO's, under a third of SAC's)")
    args = parser.parse_args(argv)
    repeats = 3
    ppo_steps = 8_192 if args.quick else 32_768
    sac_steps = 600 if args.quick else 2_000
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            arms: list[tuple[str, Any]] = [(f"ppo {name}", lambda work, s=s: run_ppo(s, steps=ppo_steps, work=work))
                                           for name, s in PPO_ARMS.items()]
            arms += [(f"sac {n}", lambda work, n=n: run_sac(n, steps=sac_steps, work=work)) for n in SAC_COMMIT_EVERY]
            for key, arm in arms:
                rate, cpu_us = arm(Path(tmp) / f"{key}-{repeat}".replace(" ", "-"))
                rates.setdefault(key, []).append(rate)
                cpus.setdefault(key, []).append(cpu_us)
    median = {key: statistics.median(values) for key, values in rates.items()}
    cpu = {key: statistics.median(values) for key, values in cpus.items()}
    base = {"ppo": cpu["ppo never"], "sac": cpu[f"sac {max(SAC_COMMIT_EVERY)}"]}
    print(f"{'arm':<10} {'steps/s':>9} {'CPU us/step':>12} {'cost':>7}   CPU us/step of each repeat")
    cost: dict[str, float] = {}
    for key, value in cpu.items():
        cost[key] = value / base[key.split()[0]] - 1.0
        runs = " ".join(f"{v:,.0f}" for v in cpus[key])
        print(f"{key:<10} {median[key]:>9,.0f} {value:>12,.0f} {cost[key]:>7.1%}   {runs}")
    figures: dict[str, Any] = {
        "benchmark": "rolling_checkpoint", "quick": args.quick, "repeats": repeats, "ppo_steps": ppo_steps,
        "sac_steps": sac_steps, "steps_per_s": median, "cpu_us_per_step": cpu, "cost": cost,
        "ppo_every_update_cost": cost["ppo every"], "ppo_1s_cost": cost["ppo 1s"],
    }
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
