"""`strata train` and `strata export` as a user runs them: subprocesses with tiny budgets."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from device import Bundle
from tests._cli import run_strata

TINY = ("--num-envs", "2", "--num-steps", "16", "--update-epochs", "1", "--hidden-sizes", "16")


def test_train_resume_export(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = run_strata("train", "--env", "CartPole-v1", "--algo", "ppo", "--total-steps", "96", "--run-dir", str(run),
                       "--seed", "3", *TINY)
    assert first.returncode == 0, first.stderr
    assert "policy version 3, 96 env steps" in first.stdout
    assert (run / "checkpoints" / "000000003.pt").exists()
    second = run_strata("train", "--env", "CartPole-v1", "--total-steps", "160", "--run-dir", str(run), "--resume")
    assert second.returncode == 0, second.stderr
    assert "policy version 5, 160 env steps" in second.stdout  # same lineage, the checkpoint's hyperparameters
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == [1, 2, 3, 4, 5]

    out = tmp_path / "cartpole.bundle"
    exported = run_strata("export", "--run", str(run), "--out", str(out), "--tier", "device")
    assert exported.returncode == 0, exported.stderr
    assert f"generated signing key {run / 'keys' / 'strata-signing.key'}" in exported.stdout
    bundle = Bundle.from_bytes(out.read_bytes())
    assert (bundle.manifest.version, bundle.manifest.target_tier) == (5, "device")
    assert bundle.manifest.output_names == ("action", "logits")
    verified = run_strata("bundle", "verify", str(out), "--trust", str(run / "keys" / "strata-signing.pub"),
                          "--tier", "device")
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize(("env_id", "message"), [
    ("Taxi-v4", "strata train: error: Taxi-v4: observation space Discrete(500) is not supported; strata's PPO needs "
                "a Box observation space"),
    ("CarRacing-v3", "strata train: error: train: 'CarRacing-v3' needs a package that is not installed: Box2D"),
])
def test_train_refuses_an_env_it_cannot_run(env_id: str, message: str, tmp_path: Path) -> None:
    if env_id == "CarRacing-v3" and importlib.util.find_spec("Box2D") is not None:
        pytest.skip("Box2D is installed here, so CarRacing-v3 is not missing a dependency")
    result = run_strata("train", "--env", env_id, "--total-steps", "10", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_export_of_an_empty_run_dir_fails_cleanly(tmp_path: Path) -> None:
    result = run_strata("export", "--run", str(tmp_path), "--out", str(tmp_path / "x.bundle"))
    assert result.returncode == 2
    assert f"strata export: error: --run {str(tmp_path)!r} has no checkpoints; train one first" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no key generated into a dir that is not a run


@pytest.mark.parametrize(("env_id", "package"), [("GymV26Environment-v0", "shimmy"), ("phys2d/Pendulum-v0", "jax"),
                                                 ("tabular/CliffWalking-v0", "jax")])
def test_an_env_whose_optional_package_is_missing_is_a_one_line_error(env_id: str, package: str,
                                                                      tmp_path: Path) -> None:
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    result = run_strata("train", "--env", env_id, "--total-steps", "10", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert f"strata train: error: train: {env_id!r} needs" in result.stderr and package in result.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (("--env", "CartPole-v1", "--use-sde"), "strata train: error: PPOConfig: use_sde (state-dependent exploration) "
                                            "needs a Box action space, not Discrete(2); drop --use-sde"),
    (("--env", "Pendulum-v1", "--use-sde", "--modes", "functions"),
     "strata train: error: train: --use-sde cannot run in mode functions"),
    (("--env", "Pendulum-v1", "--sde-sample-freq", "0"),
     "strata train: error: PPOConfig: sde_sample_freq must be -1 (once per rollout) or >= 1, got 0"),
])
def test_gsde_where_it_cannot_act_is_one_line_before_anything_starts(flags: tuple[str, ...], message: str,
                                                                     tmp_path: Path) -> None:
    result = run_strata("train", *flags, "--total-steps", "64", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and message in result.stderr
    assert "stopped by" not in result.stdout and not (tmp_path / "r").exists()


def test_a_negative_phase_steps_is_refused(tmp_path: Path) -> None:
    result = run_strata("train", "--env", "CartPole-v1", "--total-steps", "64", "--run-dir", str(tmp_path / "r"),
                        "--modes", "sync", "colocated", "--phase-steps", "-1", *TINY)
    assert result.returncode == 2
    assert "strata train: error: --phase-steps '-1': must be an integer from 0 to" in result.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated", bytes(range(256)) * 4])
def test_a_corrupt_checkpoint_is_a_one_line_error_for_resume_and_export(content: bytes, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "000000007.pt").write_bytes(content)
    for args in (("train", "--env", "CartPole-v1", "--total-steps", "64", "--run-dir", str(run), "--resume"),
                 ("export", "--run", str(run), "--out", str(tmp_path / "x.bundle"))):
        result = run_strata(*args)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert f"{run / 'checkpoints' / '000000007.pt'} is not a readable strata checkpoint" in result.stderr
        assert "delete it to fall back to the previous checkpoint" in result.stderr


@pytest.mark.parametrize("value", ["nan", "-1", "inf", "soon"])
def test_rolling_checkpoint_interval_must_be_seconds(value: str, tmp_path: Path) -> None:
    result = run_strata("train", "--env", "CartPole-v1", "--rolling-checkpoint-s", value, "--run-dir",
                        str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    assert (f"strata train: error: --rolling-checkpoint-s '{value}': must be a finite number of seconds from 0 to 86400"
            in result.stderr)
    assert "Traceback" not in result.stderr and not (tmp_path / "r").exists()
