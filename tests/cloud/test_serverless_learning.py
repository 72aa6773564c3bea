"""PPO trained entirely on serverless functions learns CartPole as fast as co-located (episodes carried over).

Before episodes travelled between invocations, an episode in the functions mode ended at the fragment
length (128 steps), so CartPole's 20-episode mean could never pass ~128 there. Now a stream's running
episode is carried into its next invocation (`functions._envstate`), and the learner sees whole episodes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cloud.runs._train import train
from cloud.switching._modes import SwitchingConfig

torch.set_num_threads(1)


def _solved_at(run_dir: Path, seed: int, *, functions: bool) -> int | None:
    switching = SwitchingConfig(modes=("functions",), control=False) if functions else None
    result = train(env_id="CartPole-v1", total_steps=250_000, run_dir=run_dir, seed=seed, target_return=475,
                   confirm_episodes=20, progress=False, log=lambda _: None, switching=switching)
    if functions:
        assert result.accounting is not None and result.accounting["duplicates"] == 0
        assert result.accounting["gaps"] == 0
        # the training returns are whole episodes: the deterministic policy solves fresh episodes too
        assert result.greedy_return is not None and result.greedy_return >= 475, result.greedy_return
    return result.solved_at_step


@pytest.mark.slow
@pytest.mark.timeout(3600)  # six trainings; ~1-3 minutes each on a loaded 2-core machine
def test_ppo_in_functions_mode_solves_cartpole_within_1_3x_the_colocated_env_steps(tmp_path: Path) -> None:
    colocated, functions = [], []
    for seed in (0, 1, 2):
        colocated.append(_solved_at(tmp_path / f"colocated-{seed}", seed, functions=False))
        functions.append(_solved_at(tmp_path / f"functions-{seed}", seed, functions=True))
    print(f"\nenv steps to a 20-episode mean of 475 (seeds 0, 1, 2): co-located {colocated}, functions {functions}")
    assert None not in colocated, f"co-located PPO did not reach 475: {colocated}"
    assert None not in functions, f"PPO in functions mode did not reach a 20-episode mean of 475: {functions}"
    assert sum(functions) <= 1.3 * sum(colocated), (  # type: ignore[arg-type]
        f"functions mode needed {functions} env steps, co-located {colocated} (seeds 0, 1, 2)")
