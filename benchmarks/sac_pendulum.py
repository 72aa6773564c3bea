"""SAC on Pendulum-v1: the exported ONNX policy's mean return over 20 episodes, for 3 seeds, vs a random policy.

Each seed trains `cloud.learners._sac.train_sac` with the default `SACConfig` (2x128 networks, prioritized
replay in shared memory) for ``--steps`` env steps, exports the deterministic policy and evaluates
the ONNX graph in onnxruntime on 20 fresh episodes. The goal: every seed >= -200 within 30k steps.
The baseline, measured in the same run on the same evaluation seeds, is a uniformly random policy.

Usage: ``python benchmarks/sac_pendulum.py [--quick] [--steps N] [--seeds 0 1 2]``; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from cloud.learners._sac import SACConfig
from cloud.runs._sac_run import train_sac

GOAL = -200.0


def random_policy_returns(episodes: int, seed: int) -> list[float]:
    import gymnasium as gym

    env = gym.make("Pendulum-v1")
    rng = np.random.default_rng(seed)
    out = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(rng.uniform(-2.0, 2.0, size=(1,)).astype(np.float32))
            total += float(reward)
            done = terminated or truncated
        out.append(total)
    env.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 2000 steps, 5 episodes (< 1 minute)")
    parser.add_argument("--steps", type=int, default=None, help="env steps per seed (default 15000; quick 2000)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2; quick 0)")
    args = parser.parse_args()
    steps = args.steps or (2000 if args.quick else 15_000)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    episodes = 5 if args.quick else 20
    config = SACConfig(eval_episodes=episodes)

    rows = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as run_dir:
            result = train_sac(config, env_id="Pendulum-v1", run_dir=Path(run_dir), seed=seed, total_steps=steps,
                               log=lambda _: None)
        baseline = random_policy_returns(episodes, seed + 10_000)  # train_sac evaluates on seed + 10_000 too
        rows.append({"seed": seed, "mean_return": round(result.mean_eval_return, 1),
                     "min_return": round(min(result.eval_returns), 1),
                     "random_mean_return": round(float(np.mean(baseline)), 1),
                     "wall_s": round(result.wall_s, 1), "steps_per_s": round(steps / result.wall_s, 1)})
        r = rows[-1]
        print(f"seed {seed}: exported policy {r['mean_return']:8.1f} (worst episode {r['min_return']:8.1f}), "
              f"random {r['random_mean_return']:8.1f}, {steps} steps in {r['wall_s']:.0f} s "
              f"({r['steps_per_s']:.0f} steps/s)", flush=True)
    passed = all(r["mean_return"] >= GOAL for r in rows)
    print(f"goal: mean over {episodes} episodes >= {GOAL} within 30k steps for every seed: "
          f"{'met' if passed else 'NOT met'} with {steps} steps (machine shared and loaded)")
    print(json.dumps({"benchmark": "sac_pendulum", "quick": args.quick, "steps": steps, "episodes": episodes,
                      "seeds": rows, "worst_seed_mean_return": min(r["mean_return"] for r in rows),
                      "goal_met": passed}))


if __name__ == "__main__":
    main()
