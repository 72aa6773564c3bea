"""Learning speed: strata PPO vs Stable-Baselines3 PPO on CartPole-v1, same hyperparameters, same envs, one run.

For each seed, both learners train until the mean return of their last 20 training episodes first
reaches 475 (or the step budget runs out), and we record the wall-clock seconds (from constructing
the learner to that moment, in this process, one torch thread each) and the env steps taken.
Both use 8 envs x 32 steps, 20 epochs of one 256-sample minibatch, Adam (eps 1e-5) at 1e-3
annealed linearly to 0 over the budget, gamma 0.98, GAE lambda 0.8, clip 0.2 (value clip 0.2),
no entropy bonus, vf_coef 0.5, grad-norm 0.5, tanh 64x64 actor and critic, orthogonal init and
running observation normalisation (SB3: VecNormalize, rewards not normalised).

    .venv/bin/python benchmarks/learning_speed.py            # 3 seeds, 150k-step budget
    .venv/bin/python benchmarks/learning_speed.py --quick    # 1 seed, 60k budget, < 1 minute

The last line of output is one JSON object with the figures and the strata / SB3 ratios. CPU seconds
(this process) are reported next to wall-clock seconds: on a shared, loaded machine they vary less.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SOLVED = 475.0
WINDOW = 20
ENV_ID = "CartPole-v1"


def run_strata(seed: int, budget: int) -> dict[str, Any]:
    from cloud.learners._ppo_config import PPOConfig
    from cloud.runs._train import train

    with tempfile.TemporaryDirectory() as run_dir:
        started, cpu_started = time.perf_counter(), time.process_time()
        # In-process envs, like SB3's DummyVecEnv: the comparison is learner against learner.
        result = train(env_id=ENV_ID, total_steps=budget, run_dir=Path(run_dir), seed=seed,
                       config=PPOConfig(env_mode="sync"), target_return=SOLVED, progress=False, log=lambda _: None)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    solved = result.solved_at_step is not None
    return {"solved": solved, "steps": result.solved_at_step if solved else budget, "wall_s": wall, "cpu_s": cpu,
            "steps_per_s": result.global_step / wall}


def run_sb3(seed: int, budget: int) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    class StopWhenSolved(BaseCallback):  # type: ignore[misc]
        """Stop once the last 20 finished episodes (Monitor's returns) average >= 475."""

        def __init__(self) -> None:
            super().__init__()
            self.returns: collections.deque[float] = collections.deque(maxlen=WINDOW)
            self.solved_at: tuple[int, float, float] | None = None

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            if len(self.returns) == WINDOW and sum(self.returns) / WINDOW >= SOLVED:
                self.solved_at = (self.num_timesteps, time.perf_counter(), time.process_time())
                return False
            return True

    started, cpu_started = time.perf_counter(), time.process_time()
    envs = VecNormalize(make_vec_env(ENV_ID, n_envs=8, seed=seed), norm_obs=True, norm_reward=False, clip_obs=10.0)
    model = PPO(
        "MlpPolicy", envs, n_steps=32, batch_size=256, n_epochs=20, learning_rate=lambda remaining: 1e-3 * remaining,
        gamma=0.98, gae_lambda=0.8, clip_range=0.2, clip_range_vf=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
        normalize_advantage=True, seed=seed, device="cpu", verbose=0,
        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.Tanh,
                       "optimizer_kwargs": {"eps": 1e-5}},
    )
    callback = StopWhenSolved()
    model.learn(total_timesteps=budget, callback=callback)
    end, cpu_end = time.perf_counter(), time.process_time()
    envs.close()
    if callback.solved_at is None:
        return {"solved": False, "steps": budget, "wall_s": end - started, "cpu_s": cpu_end - cpu_started,
                "steps_per_s": model.num_timesteps / (end - started)}
    steps, at, cpu_at = callback.solved_at
    return {"solved": True, "steps": steps, "wall_s": at - started, "cpu_s": cpu_at - cpu_started,
            "steps_per_s": steps / (at - started)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 60k-step budget (under a minute)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per learner (default: %(default)s)")
    parser.add_argument("--budget", type=int, default=150_000, help="env-step budget per run (default: %(default)s)")
    args = parser.parse_args()
    seeds = list(range(1 if args.quick else args.seeds))
    budget = 60_000 if args.quick else args.budget

    import torch

    torch.set_num_threads(1)
    rows: dict[str, list[dict[str, Any]]] = {"strata": [], "sb3": []}
    for seed in seeds:  # interleaved, so load changes on the shared machine hit both learners alike
        rows["strata"].append(run_strata(seed, budget))
        rows["sb3"].append(run_sb3(seed, budget))

    print(f"{ENV_ID}: env steps and wall-clock seconds until the {WINDOW}-episode mean first reaches {SOLVED:g} "
          f"(budget {budget:,} steps; unsolved runs count as the budget)")
    print(f"{'learner':<8} {'seed':>4} {'solved':>6} {'env steps':>10} {'wall s':>8} {'cpu s':>8} {'steps/s':>8}")
    for name, runs in rows.items():
        for seed, r in zip(seeds, runs, strict=True):
            print(f"{name:<8} {seed:>4} {'yes' if r['solved'] else 'no':>6} {r['steps']:>10,} {r['wall_s']:>8.2f} "
                  f"{r['cpu_s']:>8.2f} {r['steps_per_s']:>8,.0f}")
    figures: dict[str, Any] = {"benchmark": "learning_speed", "env": ENV_ID, "budget": budget, "seeds": seeds}
    for name, runs in rows.items():
        figures[name] = {"median_wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
                         "median_cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
                         "median_steps": statistics.median(r["steps"] for r in runs),
                         "solved": sum(r["solved"] for r in runs),
                         "wall_s": [round(r["wall_s"], 3) for r in runs], "steps": [r["steps"] for r in runs]}
    strata, sb3 = figures["strata"], figures["sb3"]
    figures["wall_ratio_strata_over_sb3"] = round(strata["median_wall_s"] / sb3["median_wall_s"], 3)
    figures["cpu_ratio_strata_over_sb3"] = round(strata["median_cpu_s"] / sb3["median_cpu_s"], 3)
    figures["steps_ratio_strata_over_sb3"] = round(strata["median_steps"] / sb3["median_steps"], 3)
    print(f"median: strata {figures['strata']['median_wall_s']:.2f} s / {figures['strata']['median_steps']:,.0f} "
          f"steps; SB3 {figures['sb3']['median_wall_s']:.2f} s / {figures['sb3']['median_steps']:,.0f} steps; "
          f"wall ratio {figures['wall_ratio_strata_over_sb3']}, cpu ratio {figures['cpu_ratio_strata_over_sb3']}, "
          f"steps ratio {figures['steps_ratio_strata_over_sb3']}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
