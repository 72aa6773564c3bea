"""`strata train --algo sac`: a subprocess smoke test with a tiny budget."""

from __future__ import annotations

from pathlib import Path

from tests._cli import run_strata


def test_train_sac_smoke(tmp_path: Path) -> None:
    result = run_strata("train", "--algo", "sac", "--env", "Pendulum-v1", "--total-steps", "300", "--run-dir",
                        str(tmp_path / "run"), "--learning-starts", "64", "--batch-size", "32", "--hidden-sizes",
                        "32", "32", "--eval-episodes", "1", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "SAC, 300 env steps, exported policy's mean evaluation return" in result.stdout
    assert (tmp_path / "run" / "policy.onnx").exists()


def test_train_sac_refuses_discrete_actions(tmp_path: Path) -> None:
    result = run_strata("train", "--algo", "sac", "--env", "CartPole-v1", "--total-steps", "100", "--run-dir",
                        str(tmp_path / "run"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "Discrete" in result.stderr
