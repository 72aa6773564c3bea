"""The steps of a training run, each on its own: the run machinery, the target check and PPO's iteration."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cloud.learners import PPOConfig
from cloud.rollout import Episode
from cloud.runs._run import RunSession, RunSpec, open_run
from cloud.runs._train import CONFIRM_EVERY, RETURN_WINDOW, PPORun, TargetCheck
from cloud.switching import SwitchingConfig, SwitchRules
from device import ConfigError


def _spec(run_dir: Path, **changes: object) -> RunSpec:
    return RunSpec(**{"algo": "ppo", "env_id": "CartPole-v1", "run_dir": run_dir, "total_steps": 64,
                      "rolling_checkpoint_s": 0.0, **changes})  # type: ignore[arg-type]


def test_a_spec_refuses_a_budget_or_interval_that_would_do_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("train: total_steps must be >= 1, got 0")):
        _spec(tmp_path, total_steps=0)
    with pytest.raises(ConfigError, match=re.escape("train: checkpoint_every must be >= 1, got 0")):
        _spec(tmp_path, checkpoint_every=0)
    assert _spec(tmp_path / "r").command == f"strata train --env CartPole-v1 --run-dir {tmp_path / 'r'} " \
                                            "--total-steps 64 --resume"


def test_open_run_refuses_a_taken_dir_and_a_resume_without_a_run(tmp_path: Path) -> None:
    assert open_run(_spec(tmp_path)) is None
    (tmp_path / "policy.onnx").write_bytes(b"x")
    with pytest.raises(ConfigError, match="already holds a run; pass --resume"):
        open_run(_spec(tmp_path), also_taken=("policy.onnx",))
    with pytest.raises(ConfigError, match=re.escape("has no checkpoint (it holds policy.onnx of a run")):
        open_run(_spec(tmp_path, resume=True), also_taken=("policy.onnx",))


def test_a_session_stop_writes_the_last_commit_logs_one_line_then_closes(tmp_path: Path) -> None:
    lines: list[str] = []
    closed: list[str] = []
    with pytest.raises(RuntimeError, match="boom"), RunSession(_spec(tmp_path), start_version=0,
                                                               log=lambda line: lines.append(line) or closed.append(
                                                                   "logged")) as session:
        session.on_close(lambda: closed.append("first registered"))
        session.on_close(lambda: closed.append("second registered"))
        session.begin(mode="sync", step=0, version=0)
        session.commit({"version": 3, "global_step": 48, "algo": "ppo", "env_id": "CartPole-v1"})
        raise RuntimeError("boom")
    assert closed == ["logged", "second registered", "first registered"]
    [line] = lines
    assert line.startswith("strata train: stopped by RuntimeError: boom at step 48 (policy version 3); checkpoint ")
    assert line.endswith("--total-steps 64 --resume")
    assert (tmp_path / "checkpoints" / f"{3:09d}.pt").exists()
    first = json.loads((tmp_path / "switches.jsonl").read_text().splitlines()[0])
    assert (first["to_mode"], first["trigger"], first["at_step"]) == ("sync", "start", 0)


def test_a_refusal_before_begin_creates_no_run_dir(tmp_path: Path) -> None:
    run = tmp_path / "r"
    with pytest.raises(ConfigError), RunSession(_spec(run), start_version=0, log=lambda _: None):
        raise ConfigError("refused")
    assert not run.exists()


def test_the_target_check_crossing_and_confirmation() -> None:
    check = TargetCheck(10.0, confirm_episodes=0)
    earlier = [9.0] * (RETURN_WINDOW - 1)
    new = [Episode(100, 8.0, 8), Episode(110, 40.0, 40), Episode(120, 0.0, 1)]
    assert check.crossing(earlier, new) == new[1]  # the mean crossed there, even if it fell back after
    assert TargetCheck(None, 0).crossing(earlier, new) is None
    confirm = TargetCheck(10.0, confirm_episodes=3)
    assert confirm.crossing(earlier, new) is None  # a confirmation decides instead
    assert not confirm.confirmation_due(12.0, RETURN_WINDOW - 1, version=7)  # the window is not full
    assert confirm.confirmation_due(12.0, RETURN_WINDOW, version=7)
    assert not confirm.confirm(7, lambda episodes: 9.0 + episodes / 10)  # 9.3 < 10
    assert not confirm.confirmation_due(12.0, RETURN_WINDOW, version=7 + CONFIRM_EVERY - 1)
    assert confirm.confirm(7 + CONFIRM_EVERY, lambda episodes: 11.0) and confirm.greedy_return == 11.0
    with pytest.raises(ConfigError, match="confirm_episodes must be >= 0"):
        TargetCheck(1.0, -1)


def test_one_ppo_iteration_step_by_step(tmp_path: Path) -> None:
    config = PPOConfig(num_envs=2, num_steps=16, update_epochs=1, hidden_sizes=(8,), env_mode="sync")
    spec = _spec(tmp_path, total_steps=96)
    with RunSession(spec, start_version=0, log=lambda _: None) as session:
        run = PPORun(spec, session, config=config, state=None, target=TargetCheck(None, 0),
                     switching=SwitchingConfig(control=False), rules=SwitchRules(), log=lambda _: None)
        batch, episodes = run.collect()
        assert (batch.size, run.global_step, run.version) == (32, 32, 0)
        values = run.update(batch)
        assert run.version == 1 and "losses/pg_loss" in values
        values |= run.observe(episodes)
        assert values["perf/env_steps_per_s"] > 0 and "charts/mean_return_20" in values
        assert run.switch() == {}  # one mode: nothing to switch
        run.decide_to_stop()
        assert run.solved_at_step is None
        run.commit()
        assert session.checkpointer.version == 1
        result = run.result(session.finish())
    assert result.checkpoint == tmp_path / "checkpoints" / f"{1:09d}.pt"
    assert result.accounting == {"produced": 32, "consumed": 32, "duplicates": 0, "gaps": 0}
