"""SAC is a learner like PPO: checkpoints, a resume that continues (or refuses), export, and refused flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from cloud.learners._sac import SACConfig
from cloud.runs._checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from cloud.runs._export import export_run
from cloud.runs._metrics import read_metrics
from cloud.runs._sac_run import train_sac
from device import ConfigError, generate_keypair, load_signing_key
from tests._cli import run_strata

TINY = SACConfig(hidden_sizes=(16,), batch_size=16, learning_starts=32, buffer_size=500, log_every=25,
                 eval_episodes=1, replay="local")


def test_sac_checkpoints_resumes_exactly_and_exports(tmp_path: Path) -> None:
    lines: list[str] = []
    first = train_sac(TINY, env_id="Pendulum-v1", run_dir=tmp_path, seed=1, total_steps=100, checkpoint_every=2,
                      log=lines.append)
    assert first.global_step == 100
    assert [p.name for p in list_checkpoints(tmp_path)] == ["000000050.pt", "000000100.pt"]
    state = load_checkpoint(latest_checkpoint(tmp_path))  # type: ignore[arg-type]
    assert (state["algo"], state["global_step"], state["gradient_steps"]) == ("sac", 100, 100 - 32 + 1)
    assert state["replay_meta"]["inserts"] == 100 and state["replay"]["obs"].shape == (100, 3)

    second = train_sac(None, env_id="Pendulum-v1", run_dir=tmp_path, seed=1, total_steps=150, resume=True,
                       checkpoint_every=2, log=lines.append)
    assert second.global_step == 150 and second.replay.inserts == 150  # the replay's contents came back
    versions = [r["policy_version"] for r in read_metrics(tmp_path) if "eval/mean_return" not in r]
    assert versions == [25, 50, 75, 100, 125, 150]

    key_dir = tmp_path / "keys"
    generate_keypair(key_dir)
    exported = export_run(tmp_path, signing_key=load_signing_key(key_dir / "strata-signing.key"))
    assert exported.bundle.manifest.version == 150
    assert exported.bundle.manifest.producer["algo"] == "sac"
    assert max(exported.max_abs_diff.values()) < 1e-4


def test_sac_never_overwrites_a_run(tmp_path: Path) -> None:
    (tmp_path / "policy.onnx").write_bytes(b"a trained policy")
    with pytest.raises(ConfigError, match=r"has no checkpoint .*it is not overwritten"):
        train_sac(TINY, env_id="Pendulum-v1", run_dir=tmp_path, seed=0, total_steps=50, resume=True)
    with pytest.raises(ConfigError, match="already holds a run; pass --resume"):
        train_sac(TINY, env_id="Pendulum-v1", run_dir=tmp_path, seed=0, total_steps=50)
    assert (tmp_path / "policy.onnx").read_bytes() == b"a trained policy"


class FlakyPendulum(gym.Wrapper[Any, Any, Any, Any]):
    """Pendulum that raises on step `fail_at` of this process."""

    fail_at = 10**9
    steps = 0

    def __init__(self) -> None:
        super().__init__(gym.make("Pendulum-v1"))

    def step(self, action: Any) -> Any:
        FlakyPendulum.steps += 1
        if FlakyPendulum.steps == FlakyPendulum.fail_at:
            raise RuntimeError("the simulator crashed")
        return self.env.step(action)


def test_a_sac_learner_error_checkpoints_the_last_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gym.register("strata-test/FlakyPendulum-v0", entry_point=FlakyPendulum)
    monkeypatch.setattr(FlakyPendulum, "steps", 0)
    monkeypatch.setattr(FlakyPendulum, "fail_at", 90)
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="the simulator crashed"):
        train_sac(TINY, env_id="strata-test/FlakyPendulum-v0", run_dir=tmp_path, seed=0, total_steps=1000,
                  checkpoint_every=100, log=lines.append)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["000000075.pt"]
    assert any("stopped by RuntimeError: the simulator crashed at step 75 (policy version 75)" in line
               for line in lines)
    assert not (tmp_path / "policy.onnx").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--algo", "sac", "--modes", "sync", "colocated"), "train: --algo sac does not use --modes"),
    (("--algo", "sac", "--phase-steps", "10"), "train: --algo sac does not use --phase-steps"),
    (("--algo", "sac", "--target-return", "-200"), "train: --algo sac does not use --target-return"),
    (("--algo", "sac", "--num-envs", "4"), "train: --algo sac does not use --num-envs"),
    (("--algo", "ppo", "--q-lr", "0.01"), "train: --algo ppo does not use --q-lr: they are SAC hyperparameters"),
])
def test_a_flag_the_learner_does_not_use_is_an_error(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    result = run_strata("train", "--env", "Pendulum-v1", "--total-steps", "50", "--run-dir", str(tmp_path / "r"),
                        *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_sac_resume_from_the_cli_keeps_the_policy(tmp_path: Path) -> None:
    run = tmp_path / "run"
    flags = ("--algo", "sac", "--env", "Pendulum-v1", "--run-dir", str(run), "--hidden-sizes", "16",
             "--batch-size", "16", "--learning-starts", "32", "--buffer-size", "500", "--log-every", "25",
             "--eval-episodes", "1", "--replay", "local", "--no-control")
    first = run_strata("train", *flags, "--total-steps", "50")
    assert first.returncode == 0, first.stderr
    again = run_strata("train", *flags, "--total-steps", "75")
    assert again.returncode == 2 and "already holds a run; pass --resume" in again.stderr
    resumed = run_strata("train", *flags, "--total-steps", "75", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "SAC, 75 env steps" in resumed.stdout
    assert np.isfinite([r.get("losses/qf1_loss", 0.0) or 0.0 for r in read_metrics(run)]).all()


def test_resume_of_a_finished_sac_run_says_so_and_touches_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    flags = ("--algo", "sac", "--env", "Pendulum-v1", "--run-dir", str(run), "--hidden-sizes", "16",
             "--batch-size", "16", "--learning-starts", "32", "--buffer-size", "500", "--log-every", "25",
             "--eval-episodes", "1", "--replay", "local", "--no-control", "--total-steps", "50")
    assert run_strata("train", *flags).returncode == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    again = run_strata("train", *flags, "--resume")
    assert again.returncode == 0, again.stderr
    assert f"run dir {run} holds a finished SAC run (50 env steps" in again.stdout
    assert "pass a --total-steps above 50 to train it further" in again.stdout
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # no duplicate rows, no new files


def test_sac_status_moves_every_step_and_commits_every_commit_every(tmp_path: Path) -> None:
    from cloud.runs._run import RunSession

    statuses: list[int] = []
    commits: list[int] = []
    original_status, original_commit = RunSession.status, RunSession.commit

    def status(self: RunSession, **values: Any) -> None:
        if "step" in values:
            statuses.append(values["step"])
        original_status(self, **values)

    def commit(self: RunSession, state: dict[str, Any]) -> None:
        commits.append(int(state["version"]))
        original_commit(self, state)

    config = SACConfig(hidden_sizes=(16,), batch_size=16, learning_starts=32, buffer_size=500, log_every=40,
                       commit_every=15, eval_episodes=1, replay="local")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunSession, "status", status)
        patch.setattr(RunSession, "commit", commit)
        train_sac(config, env_id="Pendulum-v1", run_dir=tmp_path, seed=0, total_steps=90, log=lambda line: None)
    assert list(dict.fromkeys(statuses)) == list(range(1, 91))  # every step (a log step reports twice)
    assert commits == [15, 30, 40, 45, 60, 75, 80, 90]
