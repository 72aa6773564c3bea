"""Two hybrid units learn as fast per env step as one learner with the same batch (3 seeds, slow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cloud.hybrid import HybridConfig, UnitSpec, train_hybrid
from cloud.learners._ppo_config import PPOConfig
from cloud.runs._train import train
from cloud.switching._modes import SwitchingConfig

SEEDS = (0, 1, 2)
BUDGET = 150_000


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 6 runs of ~30k env steps: ~15 minutes on a loaded 2-core machine
def test_cartpole_solved_by_two_units_within_1_2x_the_env_steps_of_one_learner(tmp_path: Path) -> None:
    single, hybrid = [], []
    for seed in SEEDS:
        one = train(env_id="CartPole-v1", total_steps=BUDGET, run_dir=tmp_path / f"one-{seed}", seed=seed,
                    config=PPOConfig(num_envs=8, num_steps=32, env_mode="sync"), target_return=475,
                    confirm_episodes=20, progress=False, log=lambda _: None)
        two = train_hybrid(UnitSpec(env_id="CartPole-v1", total_steps=BUDGET, run_dir=tmp_path / f"two-{seed}",
                                    seed=seed, config=PPOConfig(num_envs=4, num_steps=32),  # same 256-step update
                                    switching=SwitchingConfig(modes=("sync",), control=False),
                                    hybrid=HybridConfig(units=2), target_return=475, confirm_episodes=20,
                                    progress=False))
        assert one.solved_at_step is not None, f"seed {seed}: one learner did not solve CartPole in {BUDGET:,}"
        assert two.solved_at_step is not None, f"seed {seed}: two units did not solve CartPole in {BUDGET:,}"
        assert len(set(two.digests)) == 1
        single.append(one.solved_at_step)
        hybrid.append(two.solved_at_step)
    assert np.mean(hybrid) <= 1.2 * np.mean(single), f"env steps to solve: two units {hybrid}, one learner {single}"
