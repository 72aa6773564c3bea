"""PPO solves classic control: the exported bundle, run by the numpy device executor, must reach the target.

One CartPole-v1 seed runs in the default suite; the other seeds and Pendulum-v1 are ``slow``.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from cloud.learners._ppo_config import PPOConfig
from cloud.runs._export import export_run
from cloud.runs._train import train
from device import NumpyExecutor, SigningKey

torch.set_num_threads(1)


def evaluate(bundle_model: bytes, env_id: str, *, episodes: int = 20, seed: int = 10_000) -> float:
    """Mean return of the exported policy over `episodes` episodes, run by `NumpyExecutor`."""
    executor = NumpyExecutor(bundle_model)
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            action = executor.act(np.asarray(obs, dtype=np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def solve_cartpole(seed: int, run_dir: Path) -> tuple[int, float]:
    result = train(env_id="CartPole-v1", total_steps=150_000, run_dir=run_dir, seed=seed, target_return=475,
                   confirm_episodes=20, progress=False, log=lambda _: None)
    bundle = export_run(run_dir, signing_key=SigningKey.generate(), target_tier="device").bundle
    return result.global_step, evaluate(bundle.model, "CartPole-v1")


def test_cartpole_solved_within_150k_steps_by_the_exported_policy(tmp_path: Path) -> None:
    steps, eval_mean = solve_cartpole(0, tmp_path)
    assert steps <= 150_000
    assert eval_mean >= 475, f"exported policy averaged {eval_mean} after {steps} env steps"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_cartpole_solved_for_more_seeds(seed: int, tmp_path: Path) -> None:
    steps, eval_mean = solve_cartpole(seed, tmp_path)
    assert steps <= 150_000
    assert eval_mean >= 475, f"seed {seed}: exported policy averaged {eval_mean} after {steps} env steps"


PENDULUM = PPOConfig(num_envs=8, num_steps=256, num_minibatches=32, update_epochs=10, gamma=0.9, gae_lambda=0.95,
                     learning_rate=1e-3)
"""Pendulum-v1 hyperparameters (short horizon: gamma 0.9; larger batches, smaller minibatches)."""


@pytest.mark.slow
def test_pendulum_reaches_minus_400_within_500k_steps(tmp_path: Path) -> None:
    train(env_id="Pendulum-v1", total_steps=500_000, run_dir=tmp_path, seed=0, config=PENDULUM, progress=False,
          log=lambda _: None)
    bundle = export_run(tmp_path, signing_key=SigningKey.generate()).bundle
    eval_mean = evaluate(bundle.model, "Pendulum-v1")
    assert eval_mean >= -400, f"exported Pendulum policy averaged {eval_mean}"
