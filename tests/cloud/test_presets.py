"""The presets registry and how `strata train` resolves its settings from it (fast checks, no training here
except one tiny subprocess run)."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import gymnasium as gym
import pytest

from cloud.cli import build_parser, main
from cloud.learners._sac import SACConfig
from cloud.runs._presets import (
    ENV_EXTRAS,
    UNVERIFIED,
    apply_preset,
    env_extra,
    find_preset,
    load_presets,
    require_env_extra,
)
from device import ConfigError, MissingDependencyError
from tests._cli import run_strata

REQUIRED = {
    "ppo": {"CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1",
            "LunarLander-v3", "LunarLanderContinuous-v3"},
    "sac": {"MountainCarContinuous-v0", "Pendulum-v1", "LunarLanderContinuous-v3", "HalfCheetah-v5", "Hopper-v5"},
}
THRESHOLDS = {"CartPole-v1": 475, "Acrobot-v1": -100, "MountainCar-v0": -110, "MountainCarContinuous-v0": 90,
              "Pendulum-v1": -200, "LunarLander-v3": 200, "LunarLanderContinuous-v3": 200}


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["train", "--run-dir", "unused", *argv])


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_every_preset_is_complete_and_builds_a_valid_config(algo: str) -> None:
    presets = load_presets(algo)
    assert REQUIRED[algo] <= set(presets)
    for env_id, preset in presets.items():
        assert env_id in gym.registry, env_id
        preset.make_config()  # the dataclass validates every value
        assert preset.budget > 0 and preset.source and preset.verified
        assert "PLACEHOLDER" not in preset.source + preset.verified
        assert preset.extra == env_extra(env_id), f"{algo}/{env_id}: extra {preset.extra} vs entry point"
        if env_id in THRESHOLDS:
            assert preset.solved == THRESHOLDS[env_id]


def test_sac_presets_are_for_box_action_envs_only() -> None:
    discrete = {"CartPole-v1", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3"}
    assert not discrete & set(load_presets("sac"))


def test_the_extra_of_an_env_comes_from_its_entry_point() -> None:
    assert [env_extra(e) for e in ("CartPole-v1", "CarRacing-v3", "Hopper-v5", "NoSuchEnv-v0")] == \
        [None, "box2d", "mujoco", None]


def test_a_preset_fills_the_flags_that_were_not_given() -> None:
    args = parse("--env", "MountainCar-v0")
    lines: list[str] = []
    preset = apply_preset(args, log=lines.append)
    assert preset is find_preset("ppo", "MountainCar-v0") and preset is not None
    assert (args.num_envs, args.num_steps, args.gamma, args.anneal_lr) == (16, 16, 0.99, False)
    assert (args.total_steps, args.target_return) == (preset.budget, -110.0)
    assert lines == ["strata train: preset ppo/MountainCar-v0 (verified by strata; cloud/presets/ppo.toml): 1,000,000 "
                     "env steps, stopping once the return reaches -110; flags given override it, --preset none uses "
                     "the defaults"]


def test_presets_nobody_ran_say_so() -> None:
    import dataclasses

    lunar = find_preset("sac", "LunarLanderContinuous-v3")
    assert lunar is not None and lunar.is_verified
    assert not dataclasses.replace(lunar, verified=f"from the Zoo, {UNVERIFIED}").is_verified
    # Every shipped preset has been run by strata (the text says what it measured), except CarRacing-v3's: the
    # image preset's 4M steps were out of reach of the machine it was written on, and its text says so.
    unverified = {(algo, env) for algo in ("ppo", "sac") for env, p in load_presets(algo).items() if not p.is_verified}
    assert unverified == {("ppo", "CarRacing-v3")}


def test_a_run_given_its_budget_trains_it_without_the_presets_stop() -> None:
    # `--total-steps N` keeps meaning "train N steps" (jobs stopped by a signal rely on it).
    args = parse("--env", "CartPole-v1", "--total-steps", "10000000")
    lines: list[str] = []
    apply_preset(args, log=lines.append)
    assert (args.total_steps, args.target_return) == (10_000_000, None)
    assert lines[0].endswith("10,000,000 env steps; flags given override it, --preset none uses the defaults")


def test_flags_given_override_single_values_of_the_preset() -> None:
    args = parse("--env", "MountainCar-v0", "--num-envs", "4", "--total-steps", "5000", "--target-return", "-150")
    apply_preset(args, log=lambda _: None)
    assert (args.num_envs, args.num_steps) == (4, 16)
    assert (args.total_steps, args.target_return) == (5000, -150.0)


def test_sac_preset_config_and_flag_override() -> None:
    args = parse("--algo", "sac", "--env", "LunarLanderContinuous-v3", "--batch-size", "64")
    if importlib.util.find_spec("Box2D") is None:
        pytest.skip("Box2D is not installed here")
    apply_preset(args, log=lambda _: None)
    assert args.hidden_sizes == (256, 256) and args.batch_size == 64
    assert args.target_return is None  # SAC runs its whole budget
    from device import config_from_args

    config = config_from_args(SACConfig, args)
    assert (config.learning_starts, config.q_lr, config.batch_size) == (10_000, 7.3e-4, 64)


def test_preset_none_keeps_the_defaults_and_needs_a_budget() -> None:
    args = parse("--env", "Pendulum-v1", "--preset", "none")
    with pytest.raises(ConfigError, match=re.escape("train: --total-steps is required (--preset none); give the "
                                                    "env-step budget, e.g. --total-steps 100000")):
        apply_preset(args, log=lambda _: None)
    args = parse("--env", "Pendulum-v1", "--preset", "none", "--total-steps", "100")
    lines: list[str] = []
    assert apply_preset(args, log=lines.append) is None
    assert (args.num_envs, args.gamma, args.target_return, lines) == (None, None, None, [])


def test_an_env_without_preset_trains_on_the_defaults_with_a_note() -> None:
    args = parse("--algo", "sac", "--env", "InvertedPendulum-v5", "--total-steps", "100")
    if importlib.util.find_spec("mujoco") is None:
        pytest.skip("mujoco is not installed here")
    lines: list[str] = []
    assert apply_preset(args, log=lines.append) is None
    assert len(lines) == 1
    assert lines[0].startswith("strata train: no sac preset for InvertedPendulum-v5; training on SACConfig's defaults "
                               "(presets: Pendulum-v1, MountainCarContinuous-v0")
    assert args.batch_size is None


def test_an_env_without_preset_needs_a_budget() -> None:
    args = parse("--env", "CliffWalking-v1")
    with pytest.raises(ConfigError, match=re.escape("train: --total-steps is required (no ppo preset for "
                                                    "CliffWalking-v1)")):
        apply_preset(args, log=lambda _: None)


def test_a_resumed_run_keeps_its_checkpoint_settings_and_takes_the_preset_budget() -> None:
    # The command that resumes a preset run is the one that started it, plus --resume (no --total-steps).
    args = parse("--env", "Pendulum-v1", "--resume")
    lines: list[str] = []
    preset = apply_preset(args, log=lines.append)
    assert preset is not None
    assert args.gamma is None  # hyperparameters come from the checkpoint
    assert (args.total_steps, args.target_return) == (preset.budget, preset.solved)
    assert lines[0].startswith("strata train: budget and solved threshold of preset ppo/Pendulum-v1 (")
    args = parse("--env", "Pendulum-v1", "--resume", "--preset", "none")
    with pytest.raises(ConfigError, match=re.escape("train: --total-steps is required (--preset none)")):
        apply_preset(args, log=lambda _: None)


def test_a_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # Pretend the box2d extra is not installed: its module name points at a module that does not exist.
    monkeypatch.setitem(ENV_EXTRAS, "box2d", "strata_absent_box2d")
    with pytest.raises(MissingDependencyError, match=re.escape(
            "train: 'LunarLander-v3' needs a package that is not installed: strata_absent_box2d; install strata's "
            "box2d extra: pip install 'strata[box2d]'")):
        require_env_extra("LunarLander-v3")
    status = main(["train", "--env", "LunarLander-v3", "--run-dir", "unused"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.splitlines() == ["strata train: error: train: 'LunarLander-v3' needs a package that is not installed: "
                                "strata_absent_box2d; install strata's box2d extra: pip install 'strata[box2d]'"]


def test_an_unknown_preset_choice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("--env", "Pendulum-v1", "--preset", "fast")
    assert exc.value.code == 2
    assert "argument --preset: invalid choice: 'fast'" in capsys.readouterr().err


def test_train_cli_says_which_preset_it_uses(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = run_strata("train", "--env", "Pendulum-v1", "--total-steps", "64", "--run-dir", str(run),
                        "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
                        "--env-mode", "sync")
    assert result.returncode == 0, result.stderr
    assert "strata train: preset ppo/Pendulum-v1 (" in result.stdout
    assert "policy version 2, 64 env steps" in result.stdout
    from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint

    newest = latest_checkpoint(run)
    assert newest is not None
    config = load_checkpoint(newest)["config"]
    preset = find_preset("ppo", "Pendulum-v1")
    assert preset is not None
    assert (config["num_envs"], config["num_steps"]) == (2, 16)  # the flags given
    assert config["gamma"] == preset.config["gamma"] != 0.98  # the preset's, not PPOConfig's default


def test_the_carracing_preset_trains_a_cnn_on_stacked_frames_with_lossless_webp_on_the_wire() -> None:
    from device import ObsPipeline

    preset = find_preset("ppo", "CarRacing-v3")
    assert preset is not None and preset.extra == "box2d" and preset.solved == 900.0
    config = preset.make_config()
    assert config.pipeline == ObsPipeline(frame_stack=2, obs_codec="webp") and config.network == "auto"
    assert (config.normalize_obs, config.use_sde) == (False, False)  # the CNN scales pixels itself; no gSDE
