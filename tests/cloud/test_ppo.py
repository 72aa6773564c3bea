"""PPO's parts with real gymnasium envs: config, env factory, rollout collection, bootstrapping, checkpoints."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from cloud.learners._agent import Agent, ObsNormalizer, RewardScaler
from cloud.learners._ppo import bootstrap_next_values, clip_grad_norm
from cloud.learners._ppo_config import PPOConfig
from cloud.rollout._collector import RolloutCollector
from cloud.rollout._envs import VECTOR_ENV_MODES, make_vector_env
from cloud.runs._checkpoint import list_checkpoints, load_checkpoint, load_latest_checkpoint, save_checkpoint
from cloud.runs._metrics import read_metrics
from cloud.runs._train import train
from device import ConfigError, RolloutBatch, add_config_arguments

torch.set_num_threads(1)


def test_config_validates_and_round_trips() -> None:
    with pytest.raises(ConfigError, match=re.escape("PPOConfig: num_envs must be >= 1, got 0")):
        PPOConfig(num_envs=0)
    with pytest.raises(ConfigError, match=re.escape(
            "PPOConfig: num_envs * num_steps = 256 must be divisible by num_minibatches = 3")):
        PPOConfig(num_minibatches=3)
    with pytest.raises(ConfigError, match=re.escape("PPOConfig: gamma must be within [0, 1], got 1.5")):
        PPOConfig(gamma=1.5)
    config = PPOConfig(hidden_sizes=(32,), num_envs=4, num_steps=16, num_minibatches=2)
    assert config.batch_size == 64 and config.minibatch_size == 32 and config.num_updates(1000) == 15
    assert PPOConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match=re.escape("PPOConfig.from_dict: unknown fields ['bogus']")):
        PPOConfig.from_dict({"bogus": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gamma = 0.5  # type: ignore[misc]


def test_every_config_field_is_documented_in_help() -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, PPOConfig)
    text = parser.format_help()
    for f in dataclasses.fields(PPOConfig):
        assert "--" + f.name.replace("_", "-") in text
    assert "Lambda of generalised advantage estimation. (default: 0.8)" in " ".join(text.split())


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_float_flags_refuse_what_is_not_a_finite_number(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from cloud.learners._sac import SACConfig

    parser = argparse.ArgumentParser(prog="strata train")
    add_config_arguments(parser, SACConfig)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([f"--sde-log-std-init={value}"])
    assert exited.value.code == 2
    assert f"argument --sde-log-std-init: '{value}' is not a finite number" in capsys.readouterr().err
    assert parser.parse_args(["--sde-log-std-init", "-2.5"]).sde_log_std_init == -2.5


def test_factory_builds_same_step_autoreset_envs() -> None:
    assert "sync" in VECTOR_ENV_MODES
    envs = make_vector_env("CartPole-v1", num_envs=3, seed=0)
    try:
        assert envs.num_envs == 3
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    finally:
        envs.close()


@pytest.mark.parametrize(("env_id", "message"), [
    ("Taxi-v4", "Taxi-v4: observation space Discrete(500) is not supported; strata's PPO needs a Box observation"),
    ("Blackjack-v1", "Blackjack-v1: observation space Tuple(Discrete(32), Discrete(11), Discrete(2)) is not"),
    ("NoSuchEnv-v0", "make_vector_env: 'NoSuchEnv-v0' is not a registered gymnasium env id"),
])
def test_factory_refuses_unsupported_envs_naming_the_space(env_id: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_vector_env(env_id, num_envs=1, seed=0)


def test_factory_refuses_unknown_mode() -> None:
    with pytest.raises(ConfigError, match=re.escape("make_vector_env: mode 'gpu' is not available; choose one of")):
        make_vector_env("CartPole-v1", num_envs=1, seed=0, mode="gpu")


def _short_cartpoles(num_envs: int, max_steps: int) -> gym.vector.SyncVectorEnv:
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=max_steps)] * num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=3)
    return envs


def _agent(discrete: bool = True, obs_dim: int = 4, action_dim: int = 2) -> Agent:
    torch.manual_seed(0)
    return Agent(obs_dim=obs_dim, action_dim=action_dim, discrete=discrete, hidden_sizes=(16,))


def test_collector_returns_a_rollout_batch_with_real_final_observations() -> None:
    envs = _short_cartpoles(2, max_steps=5)
    try:
        collector = RolloutCollector(envs, num_steps=12)
        normalizer = ObsNormalizer((4,), clip=10.0)
        batch, episodes = collector.collect(_agent(), normalizer, policy_version=7, global_step=0)
        batch2, _ = collector.collect(_agent(), normalizer, policy_version=8, global_step=24)
    finally:
        envs.close()
    assert isinstance(batch, RolloutBatch) and batch.size == 24
    assert batch.obs.shape == (12, 2, 4) and batch.actions.shape == (12, 2) and batch.actions.dtype == np.int64
    assert (batch.policy_version == 7).all() and (batch2.policy_version == 8).all()
    assert batch.seq[:, 0].tolist() == list(range(12)) and batch2.seq[0].tolist() == [12, 12]
    assert RolloutBatch.from_bytes(batch.to_bytes()).logprobs is not None
    ended = batch.terminations | batch.truncations
    assert batch.truncations.any(), "a 5-step time limit must truncate within 12 steps"
    # Every finished episode has a real final observation; none leaks into the next episode's first obs.
    for t, n in zip(*np.nonzero(ended), strict=True):
        assert np.abs(batch.final_obs[t, n]).sum() > 0
        if t + 1 < 12:
            assert not np.array_equal(batch.final_obs[t, n], batch.obs[t + 1, n])
    assert not batch.final_obs[~ended].any()
    assert all(e.episodic_length <= 5 for e in episodes) and len(episodes) == int(ended.sum())


def test_bootstrap_uses_final_observation_on_truncation_only() -> None:
    envs = _short_cartpoles(2, max_steps=5)
    agent = _agent()
    normalizer = ObsNormalizer((4,), clip=10.0)
    try:
        batch, _ = RolloutCollector(envs, num_steps=12).collect(agent, normalizer, policy_version=0, global_step=0)
    finally:
        envs.close()
    next_values = bootstrap_next_values(agent, normalizer, batch)
    with torch.no_grad():
        v_final = agent.get_value(torch.from_numpy(normalizer(batch.final_obs))).numpy().reshape(12, 2)
        v_next = agent.get_value(torch.from_numpy(normalizer(batch.next_obs))).numpy()
    truncated = batch.truncations & ~batch.terminations
    assert truncated.any()
    np.testing.assert_allclose(next_values[truncated], v_final[truncated], rtol=1e-6)
    inside = ~truncated
    inside[-1] = False
    assert batch.values is not None
    np.testing.assert_allclose(next_values[:-1][inside[:-1]], batch.values[1:][inside[:-1]], rtol=1e-6)
    np.testing.assert_allclose(next_values[-1][~truncated[-1]], v_next[~truncated[-1]], rtol=1e-6)


def test_box_actions_are_clipped_for_the_env_but_stored_raw() -> None:
    envs = make_vector_env("Pendulum-v1", num_envs=2, seed=0)
    agent = Agent(obs_dim=3, action_dim=1, discrete=False, hidden_sizes=(8,), init_log_std=2.0)
    try:
        batch, _ = RolloutCollector(envs, num_steps=20).collect(agent, ObsNormalizer((3,), clip=10.0),
                                                                policy_version=0, global_step=0)
    finally:
        envs.close()
    assert batch.actions.shape == (20, 2, 1) and batch.actions.dtype == np.float32
    assert np.abs(batch.actions).max() > 2.0  # std e^2: samples leave [-2, 2]; the env got them clipped


def test_normalizer_matches_numpy_statistics() -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(300, 4))
    normalizer = ObsNormalizer((4,), clip=5.0)
    for chunk in np.split(data, 3):
        normalizer.update(chunk)
    np.testing.assert_allclose(normalizer.mean, data.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(normalizer.var, data.var(axis=0), rtol=1e-10)
    assert np.abs(normalizer(data)).max() <= 5.0
    restored = ObsNormalizer((4,), clip=1.0)
    restored.load_state_dict(normalizer.state_dict())
    np.testing.assert_array_equal(restored(data), normalizer(data))


def test_reward_scaler_keeps_each_streams_discounted_return_across_batches_and_sources() -> None:
    scaler = RewardScaler(gamma=0.5, clip=10.0)
    rewards = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    dones = np.array([[False, False], [True, False], [False, False]])
    np.testing.assert_allclose(scaler.discounted_returns(rewards, dones, np.array([7, 9])),
                               [[1.0, 2.0], [1.5, 3.0], [1.0, 3.5]])  # stream 7 ended at t=1 and starts again
    # The next batch continues each stream by its worker id, whatever column it arrives in; a new worker starts at 0.
    np.testing.assert_allclose(scaler.discounted_returns(np.ones((1, 3)), np.zeros((1, 3), bool), np.array([9, 8, 7])),
                               [[2.75, 1.0, 1.5]])


def test_reward_scaler_matches_sb3_vecnormalize_and_leaves_the_optimum_alone() -> None:
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    rng = np.random.default_rng(3)
    rewards = rng.normal(-8.0, 4.0, size=(3, 64, 4))  # three batches of [T=64, N=4]
    dones = rng.random((3, 64, 4)) < 0.02
    scaler = RewardScaler(gamma=0.99, clip=10.0)
    # SB3's VecNormalize, step by step: returns = returns * gamma + r; ret_rms.update(returns); returns[dones] = 0.
    oracle, running = RunningMeanStd(shape=()), np.zeros(4)
    for b in range(3):
        batch = _batch(rewards[b].astype(np.float32), dones[b])
        scaled = scaler.fit_scale(batch)
        for t in range(64):
            running = running * 0.99 + rewards[b, t].astype(np.float32)
            oracle.update(running)
            running[dones[b, t]] = 0.0
        np.testing.assert_allclose(scaler.stats.var, oracle.var, rtol=1e-4)  # SB3 starts at count 1e-4
        np.testing.assert_allclose(scaled.rewards, np.clip(rewards[b] / np.sqrt(oracle.var + 1e-8), -10, 10),
                                   rtol=1e-4)
        assert scaled.rewards.dtype == np.float32 and scaled.obs is batch.obs
    assert np.array_equal(np.argsort(scaled.rewards, axis=None), np.argsort(rewards[2].astype(np.float32), axis=None))
    assert RewardScaler(gamma=0.99, clip=10.0, enabled=False).fit_scale(batch) is batch
    restored = RewardScaler(gamma=0.99, clip=10.0)
    restored.load_state_dict(scaler.state_dict())
    np.testing.assert_array_equal(restored.scale(rewards[0]), scaler.scale(rewards[0]))


def _batch(rewards: np.ndarray, dones: np.ndarray) -> RolloutBatch:
    t, n = rewards.shape
    return RolloutBatch(source="t", obs=np.zeros((t, n, 1), np.float32), actions=np.zeros((t, n), np.int64),
                        rewards=rewards, terminations=dones, truncations=np.zeros_like(dones),
                        final_obs=np.zeros((t, n, 1), np.float32), next_obs=np.zeros((n, 1), np.float32),
                        policy_version=np.zeros((t, n), np.int64), worker=np.arange(n),
                        seq=np.zeros((t, n), np.int64))


def test_checkpoints_are_atomic_sorted_and_weights_only(tmp_path: Path) -> None:
    for version in (10, 2):
        save_checkpoint(tmp_path, {"version": version, "weights": torch.ones(3) * version})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["000000002.pt", "000000010.pt"]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.suffix != ".pt"]
    assert load_latest_checkpoint(tmp_path, caller="t")["weights"].tolist() == [10.0] * 3
    with pytest.raises(ConfigError, match=re.escape("t: run dir 'nowhere' has no checkpoints under checkpoints/")):
        load_latest_checkpoint(Path("nowhere"), caller="t")
    # A checkpoint holding an arbitrary object is refused by weights_only loading.
    torch.save({"format": 1, "version": 11, "evil": Path("/")}, tmp_path / "checkpoints" / "000000011.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        load_checkpoint(tmp_path / "checkpoints" / "000000011.pt")


def test_resume_continues_the_version_lineage(tmp_path: Path) -> None:
    config = PPOConfig(num_envs=2, num_steps=16, update_epochs=2, hidden_sizes=(16,))
    first = train(env_id="CartPole-v1", total_steps=160, run_dir=tmp_path, seed=1, config=config,
                  checkpoint_every=2, progress=False, log=lambda _: None)
    assert (first.policy_version, first.global_step) == (5, 160)
    assert [int(p.stem) for p in list_checkpoints(tmp_path)] == [2, 4, 5]
    with pytest.raises(ConfigError, match=re.escape("already holds a run; pass --resume")):
        train(env_id="CartPole-v1", total_steps=320, run_dir=tmp_path, config=config, progress=False)
    with pytest.raises(ConfigError, match=re.escape("trains 'CartPole-v1', not 'Pendulum-v1'")):
        train(env_id="Pendulum-v1", total_steps=320, run_dir=tmp_path, resume=True, progress=False)
    second = train(env_id="CartPole-v1", total_steps=320, run_dir=tmp_path, seed=1, resume=True, progress=False,
                   log=lambda _: None)
    assert (second.policy_version, second.global_step) == (10, 320)
    state = load_checkpoint(second.checkpoint)
    assert state["version"] == 10 and PPOConfig.from_dict(state["config"]) == config
    records = read_metrics(tmp_path)
    assert [r["policy_version"] for r in records] == list(range(1, 11))
    assert [r["global_step"] for r in records] == [32 * i for i in range(1, 11)]
    for key in ("losses/pg_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "perf/env_steps_per_s",
                "charts/learning_rate"):
        assert key in records[-1]
    assert any("charts/episodic_return" in r for r in records)


def test_resume_without_checkpoint_or_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("--resume given but run dir")):
        train(env_id="CartPole-v1", total_steps=100, run_dir=tmp_path, resume=True, progress=False)
    # A SAC run's checkpoint is not read as PPO's (its config would fail as "unknown fields", naming nothing useful).
    save_checkpoint(tmp_path, {"algo": "sac", "env_id": "Pendulum-v1", "version": 3, "config": {"tau": 0.005}})
    with pytest.raises(ConfigError, match=re.escape(f"train: run dir {str(tmp_path)!r} holds a 'sac' run; resume "
                                                    "it with --algo sac")):
        train(env_id="Pendulum-v1", total_steps=100, run_dir=tmp_path, resume=True, progress=False)


def test_progress_bar_and_progress_lines(tmp_path: Path) -> None:
    from cloud.runs._progress import Progress

    config = PPOConfig(num_envs=2, num_steps=16, update_epochs=1, hidden_sizes=(8,))
    result = train(env_id="CartPole-v1", total_steps=64, run_dir=tmp_path, config=config, progress=True)
    assert result.global_step == 64  # the rich bar ran without getting in the way
    lines: list[str] = []
    with Progress(1000, 0, enabled=False, log=lines.append, env_id="CartPole-v1", every_s=0.0) as progress:
        progress.update(512, float("nan"), 1234.5)
        progress.update(1000, 77.25, 2345.0)
    assert lines == ["train CartPole-v1: step 512/1,000  return(20) -  1,234 steps/s",
                     "train CartPole-v1: step 1,000/1,000  return(20) 77.2  2,345 steps/s"]


@pytest.mark.parametrize(("obs_space", "action_space", "message"), [
    (gym.spaces.Box(0, 1, (2, 3)), gym.spaces.Discrete(2),
     "X: observation space Box(0.0, 1.0, (2, 3), float32) is not flat or an image; strata's learners need a 1-D Box"),
    (gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), gym.spaces.Discrete(2),
     "X: image observations of shape (8, 8, 3) are not [H, W], [H, W, C] or a frame stack [k, H, W, C] of frames "
     "at least 36 x 36"),
    (gym.spaces.Box(0, 1, (3,)), gym.spaces.MultiBinary(2),
     "X: action space MultiBinary(2) is not supported; strata's PPO needs a Discrete or a Box action space"),
    (gym.spaces.Box(0, 1, (3,)), gym.spaces.Discrete(2, start=1),
     "X: action space Discrete(2, start=1) starts at 1; strata's PPO needs Discrete actions numbered from 0"),
])
def test_check_spaces_names_the_space(obs_space: gym.Space, action_space: gym.Space, message: str) -> None:
    from cloud.rollout._envs import check_spaces

    with pytest.raises(ConfigError, match=re.escape(message)):
        check_spaces("X", obs_space, action_space)


@pytest.mark.parametrize("shape", [(40, 40), (40, 40, 3), (4, 40, 40, 3), (96, 96, 1)])
def test_check_spaces_admits_image_frames(shape: tuple[int, ...]) -> None:
    from cloud.rollout._envs import check_spaces

    check_spaces("X", gym.spaces.Box(0, 255, shape, np.uint8), gym.spaces.Discrete(2))


def test_the_first_crossing_is_the_episode_that_took_the_window_over_the_target() -> None:
    from cloud.rollout._collector import Episode
    from cloud.runs._train import TargetCheck

    def first_crossing(earlier: list[float], target: float | None) -> Episode | None:
        return TargetCheck(target, confirm_episodes=0).crossing(earlier, new)

    new = [Episode(100 + i, r, 10) for i, r in enumerate([20.0, 40.0, 0.0, 0.0])]
    # 18 earlier returns of 10: the 20.0 makes 19 returns, the 40.0 fills the window at (180 + 60) / 20 = 12
    assert first_crossing([10.0] * 18, 12.0) is new[1]
    assert first_crossing([10.0] * 18, 12.5) is None  # never reached, though the last rollout's mean is lower
    assert first_crossing([10.0] * 30, 10.5) is new[0]  # the earlier returns fill the window
    assert first_crossing([], -1e9) is None  # fewer than 20 returns never count
    assert first_crossing([10.0] * 30, None) is None


def test_target_return_with_and_without_confirmation(tmp_path: Path) -> None:
    config = PPOConfig(num_envs=4, num_steps=64, update_epochs=1, hidden_sizes=(8,))
    # Any 20 finished episodes reach a target of 0; without confirmation that stops the run.
    plain = train(env_id="CartPole-v1", total_steps=100_000, run_dir=tmp_path / "plain", config=config,
                  target_return=0.0, progress=False)
    assert plain.solved_at_step is not None and plain.global_step < 2000 and plain.greedy_return is None
    # solved when the 20th episode ended, as a per-step callback sees it, not at the end of that rollout
    assert plain.solved_at_step == plain.episodes[19].global_step <= plain.global_step
    # the moment it was solved, in wall and CPU seconds, lies within the call (what benchmarks/presets.py reads)
    assert plain.solved_at_s is not None and 0 < plain.solved_at_s <= plain.wall_s
    assert plain.solved_at_cpu_s is not None and 0 < plain.solved_at_cpu_s <= plain.cpu_s
    # With confirmation, the deterministic policy is evaluated on fresh episodes before the run stops.
    confirmed = train(env_id="CartPole-v1", total_steps=2560, run_dir=tmp_path / "confirmed", config=config,
                      target_return=0.0, confirm_episodes=3, progress=False)
    assert confirmed.solved_at_step is not None and confirmed.greedy_return is not None
    assert confirmed.greedy_return > 0
    greedy = [r for r in read_metrics(tmp_path / "confirmed") if "charts/greedy_return" in r]
    assert len(greedy) == 1 and greedy[0]["charts/greedy_return"] == confirmed.greedy_return
    # A target the training episodes never reach: the run goes on to its budget.
    failing = train(env_id="CartPole-v1", total_steps=2560, run_dir=tmp_path / "failing", config=config,
                    target_return=10_000.0, confirm_episodes=3, progress=False)
    assert failing.solved_at_step is None and failing.global_step == 2560
    assert failing.solved_at_s is None and failing.solved_at_cpu_s is None and failing.cpu_s > 0


def test_gsde_samples_what_evaluate_actions_scores_and_holds_its_noise_between_draws() -> None:
    torch.manual_seed(0)
    agent = Agent(obs_dim=3, action_dim=2, discrete=False, hidden_sizes=(16, 8), init_log_std=-1.0, sde=True)
    assert agent.actor_logstd.shape == (8, 2)  # one scale per (last hidden feature, action)
    x = torch.randn(1, 3).repeat(20_000, 1)
    with torch.no_grad():
        actions = agent.sample_action(x)  # 20,000 streams, each with its own noise matrix: the marginal
        logprob, entropy = agent.evaluate_actions(x[:1], actions[:1])
        features, mean = agent._features(x[:1])
        var = ((features**2) @ torch.exp(2 * agent.actor_logstd))[0]
    np.testing.assert_allclose(actions.var(0), var, rtol=0.05)
    np.testing.assert_allclose(actions.mean(0), mean[0], atol=4 * float(var.max().sqrt()) / 20_000**0.5)
    expected = torch.distributions.Normal(mean, (var + 1e-6).sqrt()).log_prob(actions[:1]).sum(-1)
    np.testing.assert_allclose(logprob, expected, rtol=1e-5)
    assert torch.allclose(entropy, torch.distributions.Normal(mean, (var + 1e-6).sqrt()).entropy().sum(-1))
    # The noise matrix is held until the next draw (smooth exploration), then changes.
    with torch.no_grad():
        probe = torch.randn(4, 3)
        first = agent.sample_action(probe)
        assert torch.equal(agent.sample_action(probe), first)
        agent.reset_noise(4)
        assert not torch.equal(agent.sample_action(probe), first)
        assert torch.equal(agent.greedy_action(probe), agent.actor(probe))  # what the exported graph computes
    with pytest.raises(ValueError, match="needs a Box action space"):
        Agent(obs_dim=3, action_dim=2, discrete=True, hidden_sizes=(8,), sde=True)


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1e9])
def test_clip_grad_norm_is_torchs_bit_for_bit(max_norm: float) -> None:
    torch.manual_seed(0)
    agent = Agent(obs_dim=3, action_dim=2, discrete=False, hidden_sizes=(16, 8), sde=True)
    params = list(agent.parameters())
    grads = [torch.randn_like(p) * 3 for p in params]
    grads[1] = None  # a parameter the loss did not reach
    for p, g in zip(params, grads, strict=True):
        p.grad = None if g is None else g.clone()
    ours = clip_grad_norm(params, max_norm)
    got = [p.grad for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad = None if g is None else g.clone()
    theirs = torch.nn.utils.clip_grad_norm_(params, max_norm)
    assert torch.equal(ours, theirs)
    for a, b in zip(got, (p.grad for p in params), strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    assert got[1] is None and float(ours) > 1  # the norm returned is the one before clipping


@pytest.mark.parametrize("discrete", [True, False])
def test_the_agent_computes_what_its_modules_hold_and_initialises_as_asked(discrete: bool) -> None:
    """The functional forward pass walks the registered Sequentials' layers (what export and checkpoints see);
    ortho_init=False keeps torch's default Linear initialisation (SB3's ortho_init=False)."""
    torch.manual_seed(0)
    x = torch.randn(5, 3)
    for ortho in (True, False):
        agent = Agent(obs_dim=3, action_dim=2, discrete=discrete, hidden_sizes=(16, 8), ortho_init=ortho)
        features, out = agent._features(x)
        torch.testing.assert_close(out, agent.actor(x), rtol=0, atol=0)
        torch.testing.assert_close(features, agent.actor[:-1](x), rtol=0, atol=0)
        torch.testing.assert_close(agent.get_value(x), agent.critic(x).squeeze(-1), rtol=0, atol=0)
        with torch.no_grad():
            agent.actor[0].weight.add_(1.0)  # a change to the registered module is what the forward pass sees
        torch.testing.assert_close(agent._features(x)[1], agent.actor(x), rtol=0, atol=0)
        linears = [m for m in [*agent.actor, *agent.critic] if isinstance(m, torch.nn.Linear)]
        head = agent.actor[-1].weight.detach()
        biases = [m.bias.detach().abs() for m in linears]
        if ortho:
            assert all(float(b.max()) == 0 for b in biases)
            assert float(head.norm(dim=1).max()) <= 0.0101  # orthogonal rows of gain 0.01
        else:
            assert all(float(b.min()) > 0 for b in biases)
            for m in linears[1:]:  # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
                assert float(m.weight.detach().abs().max()) <= 1 / m.in_features ** 0.5
            assert float(head.abs().max()) > 0.05
    config = PPOConfig(ortho_init=False)
    assert PPOConfig.from_dict(config.to_dict()).ortho_init is False


def test_gsde_config_is_checked_and_refused_where_it_cannot_act(tmp_path: Path) -> None:
    from cloud.switching._modes import SwitchingConfig

    with pytest.raises(ConfigError, match=re.escape("sde_sample_freq must be -1 (once per rollout) or >= 1, got 0")):
        PPOConfig(sde_sample_freq=0)
    with pytest.raises(ConfigError, match=re.escape("use_sde (state-dependent exploration) needs a Box action space")):
        train(env_id="CartPole-v1", total_steps=64, run_dir=tmp_path / "d", config=PPOConfig(use_sde=True),
              progress=False, log=lambda _: None)
    with pytest.raises(ConfigError, match=re.escape("train: --use-sde cannot run in mode functions")):
        train(env_id="Pendulum-v1", total_steps=64, run_dir=tmp_path / "f", config=PPOConfig(use_sde=True),
              switching=SwitchingConfig(modes=("functions",), control=False), progress=False, log=lambda _: None)


def test_a_gsde_run_redraws_its_noise_resumes_and_exports_its_mean(tmp_path: Path) -> None:
    from cloud.runs._export import export_run
    from device import SigningKey

    config = PPOConfig(num_envs=2, num_steps=32, update_epochs=1, hidden_sizes=(8,), use_sde=True,
                       sde_sample_freq=8, init_log_std=-2.0, env_mode="sync")
    first = train(env_id="Pendulum-v1", total_steps=128, run_dir=tmp_path, seed=2, config=config,
                  progress=False, log=lambda _: None)
    again = train(env_id="Pendulum-v1", total_steps=256, run_dir=tmp_path, seed=2, resume=True, progress=False,
                  log=lambda _: None)
    assert (first.policy_version, again.policy_version) == (2, 4)
    assert load_checkpoint(again.checkpoint)["agent"]["actor_logstd"].shape == (8, 1)
    assert export_run(tmp_path, signing_key=SigningKey.generate()).bundle.manifest.version == 4
    # Within a rollout the noise changes every sde_sample_freq steps, and not in between.
    agent = Agent(obs_dim=3, action_dim=1, discrete=False, hidden_sizes=(8,), init_log_std=-1.0, sde=True,
                  sde_sample_freq=8)
    envs = make_vector_env("Pendulum-v1", num_envs=2, seed=0)
    draws: list[int] = []
    original = agent.reset_noise

    def counting(streams: int) -> None:
        draws.append(streams)
        original(streams)

    agent.reset_noise = counting  # type: ignore[method-assign]
    try:
        RolloutCollector(envs, num_steps=32).collect(agent, ObsNormalizer((3,), clip=10.0), policy_version=0,
                                                     global_step=0)
    finally:
        envs.close()
    assert draws == [2, 2, 2, 2]  # steps 0, 8, 16, 24


def test_every_decision_at_the_target_is_one_log_line_and_one_metrics_record(tmp_path: Path) -> None:
    from cloud.runs._train import TargetCheck

    config = PPOConfig(num_envs=4, num_steps=64, update_epochs=1, hidden_sizes=(8,))
    lines: list[str] = []
    plain = train(env_id="CartPole-v1", total_steps=100_000, run_dir=tmp_path / "plain", config=config,
                  target_return=0.0, progress=False, log=lines.append)
    [line] = [line for line in lines if "stopping" in line or "goes on" in line]
    assert line.startswith(f"train: target return 0 reached at step {plain.solved_at_step:,}: mean of the last 20 ")
    assert [r["decision/stop"] for r in read_metrics(tmp_path / "plain") if "decision/stop" in r] == [1.0]
    # A confirmation the deterministic policy fails: the run goes on, and says why.
    check = TargetCheck(100.0, confirm_episodes=5)
    assert not check.confirm(7, lambda episodes: 42.0)
    line, values = check.decision(stop=False, step=4096, mean_return=120.0)
    assert line == ("training mean reached the target return 100 at step 4,096, but the deterministic policy averaged "
                    "42.0 over 5 fresh episodes (training mean 120.0): below the target, training goes on (next "
                    "check in 5 updates)")
    assert values == {"decision/stop": 0.0, "charts/greedy_return": 42.0}
