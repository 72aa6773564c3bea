"""Each classic-control preset solves its env for one seed, run as a user runs it: `strata train --env ID` with
no other settings (the preset's hyperparameters, budget and solved threshold). Slow: minutes per env."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cloud.runs._presets import find_preset
from tests._cli import run_strata

CLASSIC = [("ppo", "CartPole-v1"), ("ppo", "Acrobot-v1"), ("ppo", "MountainCar-v0"),
           ("ppo", "MountainCarContinuous-v0"), ("ppo", "Pendulum-v1"), ("sac", "Pendulum-v1"),
           ("sac", "MountainCarContinuous-v0")]


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(("algo", "env_id"), CLASSIC)
def test_preset_solves_with_no_other_settings(algo: str, env_id: str, tmp_path: Path) -> None:
    preset = find_preset(algo, env_id)
    assert preset is not None
    result = run_strata("train", "--algo", algo, "--env", env_id, "--run-dir", str(tmp_path / "run"), timeout=3500)
    assert result.returncode == 0, result.stderr
    assert f"strata train: preset {algo}/{env_id} (" in result.stdout
    if algo == "ppo":
        # Stops once the 20-episode training mean and the deterministic policy over 20 fresh episodes both reach it.
        assert f"reached {preset.solved} at step" in result.stdout, result.stdout[-2000:]
    else:
        found = re.search(r"exported policy's mean evaluation return (-?[\d.]+)", result.stdout)
        assert found is not None, result.stdout[-2000:]
        assert float(found.group(1)) >= preset.solved, result.stdout[-2000:]
