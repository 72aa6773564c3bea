"""SAC: pure losses against hand-computed values, networks, export, learning, and the replay in both deployments."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cloud.learners._sac import (  # noqa: E402
    SACConfig,
    SACTrainer,
    actor_loss_fn,
    alpha_loss_fn,
    polyak_update,
    q_losses,
    soft_q_target,
)
from cloud.learners._sac_networks import squashed_log_prob  # noqa: E402
from cloud.replay._grpc import GrpcReplayClient, ReplayServer  # noqa: E402
from cloud.replay._tables import ReplayTable  # noqa: E402
from cloud.runs._sac_run import evaluate_onnx_policy, train_sac  # noqa: E402
from device import ConfigError, TrustStore, Verifier, generate_keypair, load_public_key, load_signing_key  # noqa: E402

T = torch.tensor
TINY = SACConfig(hidden_sizes=(32, 32), batch_size=32, learning_starts=64, replay="local", eval_episodes=2,
                 log_every=100)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


# -- pure losses ---------------------------------------------------------------------------------------


def test_soft_q_target_by_hand() -> None:
    # min over heads [3, 1]; minus alpha * log_pi = [3 - 0.1, 1 + 0.2]; no bootstrap for the terminated item.
    target = soft_q_target(T([1.0, 2.0]), T([0.0, 1.0]), T([[3.0, 1.0], [5.0, 4.0]]), T([0.5, -1.0]),
                           alpha=0.2, gamma=0.9)
    torch.testing.assert_close(target, T([1.0 + 0.9 * 2.9, 2.0]))


def test_q_losses_by_hand() -> None:
    qf = T([[1.0, 2.0], [3.0, 0.0]])
    target = T([2.0, 2.0])
    qf1_loss, qf2_loss = q_losses(qf, target)
    assert (qf1_loss.item(), qf2_loss.item()) == (0.5, 2.5)  # mean([1, 0]), mean([1, 4])
    qf1_loss, qf2_loss = q_losses(qf, target, T([1.0, 0.5]))
    assert (qf1_loss.item(), qf2_loss.item()) == (0.5, 1.5)  # mean([1, 0]), mean([1, 2])


def test_actor_loss_by_hand() -> None:
    loss = actor_loss_fn(T([1.0, -1.0]), T([2.0, 3.0]), alpha=0.5)
    assert loss.item() == pytest.approx(-2.5)  # mean([0.5 - 2, -0.5 - 3])


def test_alpha_loss_and_its_gradient_by_hand() -> None:
    log_alpha = torch.tensor([math.log(2.0)], requires_grad=True)
    loss = alpha_loss_fn(log_alpha, T([1.0, -3.0]), target_entropy=-1.0)
    assert loss.item() == pytest.approx(4.0)  # mean(-2 * [0, -4])
    loss.backward()
    assert log_alpha.grad is not None
    assert log_alpha.grad.item() == pytest.approx(4.0)  # d/dlog_alpha of -exp(la) * c is the loss itself
    # entropy below target (log_pi + target > 0) pushes alpha up: gradient descent lowers the loss
    assert alpha_loss_fn(torch.tensor([0.0]), T([2.0]), target_entropy=-1.0).item() == pytest.approx(-1.0)


def test_squashed_log_prob_by_hand() -> None:
    x = T([[0.0, math.atanh(0.5)]])
    got = squashed_log_prob(T([[-1.0, -2.0]]), x, T([2.0, 1.0]))
    expected = -1.0 - math.log(2.0 + 1e-6) - 2.0 - math.log(0.75 + 1e-6)
    assert got.shape == (1,)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_polyak_update() -> None:
    target, online = [torch.zeros(3)], [torch.ones(3)]
    polyak_update(target, online, 0.1)
    torch.testing.assert_close(target[0], torch.full((3,), 0.1))


# -- networks and export -------------------------------------------------------------------------------


@pytest.fixture
def trainer() -> Iterator[SACTrainer]:
    t = SACTrainer(TINY, env_id="Pendulum-v1", seed=0, total_steps=1000)
    yield t
    t.close()


def test_twin_q_heads_are_two_independent_mlps(trainer: SACTrainer) -> None:
    obs, act = torch.randn(5, 3), torch.randn(5, 1)
    q = trainer.qf(obs, act)
    assert q.shape == (2, 5)
    for head in range(2):
        x = torch.cat([obs, act], dim=-1)
        ws, bs = list(trainer.qf.weights), list(trainer.qf.biases)
        for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
            x = x @ w[head] + b[head]
            x = torch.relu(x) if i < len(ws) - 1 else x
        torch.testing.assert_close(q[head], x.squeeze(-1))


def test_actor_samples_inside_the_bounds_with_the_right_log_prob(trainer: SACTrainer) -> None:
    obs = torch.randn(64, 3)
    with torch.no_grad():
        action, log_prob, mean_action = trainer.actor.get_action(obs)
    assert action.shape == (64, 1) and log_prob.shape == (64,)
    assert float(action.abs().max()) <= 2.0 and float(mean_action.abs().max()) <= 2.0
    # the same density from torch.distributions: Normal on x, then the tanh-and-scale change of variables
    with torch.no_grad():
        mean, log_std = trainer.actor(obs)
    x = torch.atanh(((action - trainer.actor.action_bias) / trainer.actor.action_scale).clamp(-0.999999, 0.999999))
    ref = torch.distributions.Normal(mean, log_std.exp()).log_prob(x) - torch.log(
        trainer.actor.action_scale * (1 - torch.tanh(x) ** 2) + 1e-6)
    torch.testing.assert_close(log_prob, ref.sum(-1), atol=1e-3, rtol=1e-3)


def test_export_is_the_deterministic_scaled_mean_and_matches_onnxruntime(trainer: SACTrainer) -> None:
    import onnx
    import onnxruntime as ort

    model = trainer.export_onnx()
    onnx.checker.check_model(onnx.load_from_string(model))
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["obs"]
    assert [o.name for o in session.get_outputs()] == ["action"]
    for batch in (1, 3):
        obs = np.random.default_rng(batch).normal(size=(batch, 3)).astype(np.float32)
        (got,) = session.run(["action"], {"obs": obs})
        with torch.no_grad():
            _, _, want = trainer.actor.get_action(torch.from_numpy(obs))
        assert got.dtype == np.float32 and got.shape == (batch, 1)
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5)


def test_signed_bundle_verifies_and_runs_on_the_numpy_executor(trainer: SACTrainer, tmp_path: Path) -> None:
    from device import NumpyExecutor

    key_path, pub_path = generate_keypair(tmp_path)
    model = trainer.export_onnx()
    bundle = trainer.build_bundle(model, signing_key=load_signing_key(key_path), policy="pendulum-sac")
    verified = Verifier(trust=TrustStore([load_public_key(pub_path)]), tier="device").verify(bundle.to_bytes())
    m = verified.manifest
    assert (m.policy, m.version, m.output_names, m.producer["algo"]) == ("pendulum-sac", 1, ("action",), "sac")
    assert m.action_space["type"] == "Box" and m.preprocessing["action"] == "tanh_mean_scaled"
    obs = np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)
    with torch.no_grad():
        want = trainer.policy_graph()(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(NumpyExecutor.from_bundle(verified).act(obs), want, atol=1e-5)


def test_config_and_env_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match=re.escape(
        "SACConfig: learning_starts=10 is below batch_size=256; collect at least one batch before learning"
    )):
        SACConfig(learning_starts=10)
    with pytest.raises(ConfigError, match=re.escape(
        "SACTrainer: 'CartPole-v1' has action space Discrete(2); SAC needs a Box action space"
    )):
        SACTrainer(TINY, env_id="CartPole-v1", seed=0, total_steps=10)
    with pytest.raises(ConfigError, match=re.escape(
        "SACConfig: sde_sample_freq=0 must be -1 (each episode) or a positive number of env steps"
    )):
        SACConfig(use_sde=True, sde_sample_freq=0)


# -- gSDE: state-dependent exploration -------------------------------------------------------------------

SDE = SACConfig(hidden_sizes=(32, 32), batch_size=32, learning_starts=64, replay="local", eval_episodes=2,
                log_every=100, use_sde=True, sde_sample_freq=4, sde_log_std_init=-1.0)


@pytest.fixture
def sde_trainer() -> Iterator[SACTrainer]:
    t = SACTrainer(SDE, env_id="Pendulum-v1", seed=0, total_steps=1000)
    yield t
    t.close()


def test_sde_noise_is_the_features_times_the_matrix_and_the_log_prob_is_its_density(sde_trainer: SACTrainer) -> None:
    actor = sde_trainer.actor
    assert actor.sde_noise_shape() == (32, 1) and not hasattr(actor, "fc_logstd")
    torch.testing.assert_close(actor.sde_log_std.detach(), torch.full((32, 1), -1.0))
    obs, eps = torch.randn(64, 3), torch.randn(32, 1)
    with torch.no_grad():
        action, log_prob, mean_action = actor.get_action(obs, eps)
        features = actor.trunk(obs)
        mean = actor.fc_mean(features)
    std = actor.sde_log_std.detach().exp()
    x = mean + features @ (std * eps)  # the same matrix for every state: the noise is a function of the state
    torch.testing.assert_close(action, torch.tanh(x) * actor.action_scale + actor.action_bias)
    torch.testing.assert_close(mean_action, torch.tanh(mean) * actor.action_scale + actor.action_bias)
    sigma = torch.sqrt(features.pow(2) @ std.pow(2) + 1e-6)
    ref = torch.distributions.Normal(mean, sigma).log_prob(x) - torch.log(
        actor.action_scale * (1 - torch.tanh(x) ** 2) + 1e-6)
    torch.testing.assert_close(log_prob, ref.sum(-1), atol=1e-4, rtol=1e-4)
    # and that density is the one the noise is drawn from: over many matrices, x's spread per state is sigma
    draws = torch.stack([features @ (std * torch.randn(32, 1)) for _ in range(4000)])
    np.testing.assert_allclose(draws.std(dim=0).numpy(), sigma.numpy(), rtol=0.08)


def test_sde_trains_the_log_std_matrix_through_noise_and_variance(sde_trainer: SACTrainer) -> None:
    _, log_prob, _ = sde_trainer.actor.get_action(torch.randn(8, 3), torch.randn(32, 1))
    log_prob.sum().backward()
    grad = sde_trainer.actor.sde_log_std.grad
    assert grad is not None and float(grad.abs().sum()) > 0


def test_sde_noise_and_variance_train_the_features_as_sb3s_sac_does(sde_trainer: SACTrainer) -> None:
    """SB3's SAC runs gSDE with learn_features=True (its PPO detaches them): the actor loss reaches the trunk
    through the noise and the variance as well as through the mean."""
    actor = sde_trainer.actor
    obs, eps = torch.randn(16, 3), torch.randn(32, 1)

    def trunk_grads(loss: Any) -> list[Any]:
        return list(torch.autograd.grad(loss, list(actor.trunk.parameters()), retain_graph=True))

    action, log_prob, _ = actor.get_action(obs, eps)
    got = trunk_grads(action.sum() + 0.1 * log_prob.sum())
    features = actor.trunk(obs)
    mean = actor.fc_mean(features).clamp(-2.0, 2.0)
    std = actor.sde_log_std.exp()
    x = mean + features @ (std * eps)
    sigma = torch.sqrt(features.pow(2) @ std.pow(2) + 1e-6)
    ref_log_prob = (torch.distributions.Normal(mean, sigma).log_prob(x)
                    - torch.log(actor.action_scale * (1 - torch.tanh(x) ** 2) + 1e-6)).sum(-1)
    ref_action = torch.tanh(x) * actor.action_scale + actor.action_bias
    want = trunk_grads(ref_action.sum() + 0.1 * ref_log_prob.sum())
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-3)
    # and the noise's own share is not nothing: detaching the features changes the gradient
    frozen = features.detach()
    x_frozen = mean + frozen @ (std * eps)
    detached = trunk_grads((torch.tanh(x_frozen) * actor.action_scale + actor.action_bias).sum())
    assert any(not torch.allclose(d, w0, atol=1e-4) for d, w0 in zip(
        detached, trunk_grads(ref_action.sum()), strict=True))


def test_sde_mean_is_clipped_in_training_and_in_the_exported_policy(sde_trainer: SACTrainer) -> None:
    import onnxruntime as ort

    from device import NumpyExecutor

    with torch.no_grad():
        sde_trainer.actor.fc_mean.weight.zero_()
        sde_trainer.actor.fc_mean.bias.fill_(5.0)  # a mean far beyond the +-2 clip
    obs = np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)
    with torch.no_grad():
        _, _, mean_action = sde_trainer.actor.get_action(torch.from_numpy(obs))
    model = sde_trainer.export_onnx()
    (got,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["action"], {"obs": obs})
    want = np.full((3, 1), np.tanh(2.0) * 2.0, dtype=np.float32)  # Pendulum's bounds are +-2
    np.testing.assert_allclose(mean_action.numpy(), want, atol=1e-5)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(NumpyExecutor(model).act(obs), got, atol=1e-5)


def test_sde_holds_one_exploration_matrix_for_sde_sample_freq_steps(sde_trainer: SACTrainer) -> None:
    sde_trainer.run(64)  # the random warm-up draws no matrix
    assert sde_trainer._sde_eps is None
    seen: list[tuple[int, int]] = []
    for step in range(64, 76):
        sde_trainer.run(step + 1)
        seen.append((step, id(sde_trainer._sde_eps)))
    ids = [i for _, i in seen]
    # a new matrix at steps 64, 68 and 72, the same one in between
    assert [ids[k] == ids[k - 1] for k in range(1, 12)] == [True, True, True, False] * 2 + [True, True, True]


def test_sde_at_warmup_acts_with_the_policy_before_learning_starts() -> None:
    import dataclasses

    trainer = SACTrainer(dataclasses.replace(SDE, sde_at_warmup=True), env_id="Pendulum-v1", seed=0,
                         total_steps=1000)
    try:
        taken: list[np.ndarray] = []
        step = trainer.envs.step
        trainer.envs.step = lambda actions: (taken.append(actions), step(actions))[1]  # type: ignore[method-assign]
        obs = torch.as_tensor(trainer.obs, dtype=torch.float32)
        trainer.run(1)  # the first step already draws the exploration matrix and acts with the policy
        assert trainer._sde_eps is not None and trainer.gradient_steps == 0
        with torch.no_grad():
            expected, _, _ = trainer.actor.get_action(obs, trainer._sde_eps)
        np.testing.assert_allclose(taken[0], expected.numpy(), rtol=1e-6)
        trainer.run(SDE.learning_starts - 1)
        assert trainer.gradient_steps == 0  # learning still waits for learning_starts
        trainer.run(SDE.learning_starts + 1)
        assert trainer.gradient_steps >= 1
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match="sde_at_warmup acts with the gSDE policy during warm-up; it needs use_sde"):
        dataclasses.replace(SDE, use_sde=False, sde_at_warmup=True)


def test_sde_per_episode_redraws_only_when_an_episode_ends() -> None:
    import dataclasses

    trainer = SACTrainer(dataclasses.replace(SDE, sde_sample_freq=-1), env_id="Pendulum-v1", seed=0,
                         total_steps=1000)
    try:
        trainer.run(250)  # Pendulum's episodes are 200 steps
        first = trainer._sde_eps
        trainer.run(399)
        assert trainer._sde_eps is first
        trainer.run(401)  # the episode ended at step 400: the matrix was dropped and a new one drawn
        assert trainer._sde_eps is not first and trainer._sde_eps is not None
    finally:
        trainer.close()


def test_sde_run_checkpoints_resumes_and_exports_from_the_checkpoint(tmp_path: Path) -> None:
    from cloud.runs._export import export_run

    cfg = SACConfig(hidden_sizes=(16,), batch_size=16, learning_starts=32, buffer_size=500, log_every=50,
                    eval_episodes=1, replay="local", use_sde=True, sde_sample_freq=8)
    train_sac(cfg, env_id="Pendulum-v1", run_dir=tmp_path, seed=0, total_steps=100, log=lambda _: None)
    resumed = train_sac(None, env_id="Pendulum-v1", run_dir=tmp_path, seed=0, total_steps=150, resume=True,
                        log=lambda _: None)
    assert resumed.global_step == 150
    key_path, _ = generate_keypair(tmp_path / "keys")
    exported = export_run(tmp_path, signing_key=load_signing_key(key_path))
    assert max(exported.max_abs_diff.values()) < 1e-4
    obs = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_allclose(
        evaluate_and_act(exported.bundle.model, obs), evaluate_and_act(resumed.model, obs), atol=1e-6)


def evaluate_and_act(model: bytes, obs: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    (out,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["action"], {"obs": obs})
    return np.asarray(out)


# -- training with the replay in both deployments -------------------------------------------------------


@pytest.mark.parametrize("deployment", ["shared_memory", "grpc"])
def test_sac_trains_from_either_deployment(deployment: str, tmp_path: Path) -> None:
    config = SACConfig(**{**TINY.to_dict(), "hidden_sizes": (32, 32), "replay": deployment})
    result = train_sac(config, env_id="Pendulum-v1", run_dir=tmp_path, seed=1, total_steps=300, log=lambda _: None)
    assert result.global_step == 300
    stats = result.replay
    assert (stats.size, stats.inserts) == (300, 300)
    assert stats.samples == (300 - 64 + 1) * 32  # one batch per env step from learning_starts on
    assert (tmp_path / "policy.onnx").read_bytes() == result.model
    assert len(result.eval_returns) == 2
    assert (tmp_path / "metrics.jsonl").exists()


def test_replay_moves_between_shared_memory_and_grpc_mid_training_without_loss(tmp_path: Path) -> None:
    trainer = SACTrainer(TINY, env_id="Pendulum-v1", seed=2, total_steps=600)
    server = ReplayServer(trainer.signature, TINY.replay_config(), seed=2).start()
    try:
        assert isinstance(trainer.replay, ReplayTable)
        trainer.run(250)
        before = trainer.replay.stats()
        trainer.switch_replay(GrpcReplayClient(server.address, signature=trainer.signature))
        assert isinstance(trainer.replay, GrpcReplayClient)
        after = trainer.replay.stats()
        assert (after.size, after.inserts, after.samples) == (before.size, before.inserts, before.samples)
        trainer.run(600)  # learning continues on the gRPC deployment
        _, arrays = trainer.replay.export_state()
        np.testing.assert_array_equal(arrays["step"], np.arange(600))  # every transition, once, in order
        assert trainer.gradient_steps == 600 - 64 + 1
        assert server.table.stats().inserts == 600
        # ... and back to shared memory (the switcher goes both ways)
        trainer.switch_replay(ReplayTable.create(trainer.signature, TINY.replay_config(), shared=True, seed=3))
        trainer.run(700)
        _, arrays = trainer.replay.export_state()
        np.testing.assert_array_equal(arrays["step"], np.arange(700))
    finally:
        trainer.close()
        server.stop(grace=None)


def test_sac_beats_a_random_policy_within_a_few_thousand_steps(tmp_path: Path) -> None:
    # Small nets and batches keep this under a minute on 2 shared cores; the full budget is the slow test below.
    config = SACConfig(hidden_sizes=(64, 64), batch_size=64, learning_starts=500, eval_episodes=10, log_every=500,
                       replay="shared_memory")
    # 5,000 steps: at 3,000 the outcome hung on the seed (9 of 12 seeds passed; 3 of 3 tried at 5,000, incl.
    # two that failed at 3,000).
    result = train_sac(config, env_id="Pendulum-v1", run_dir=tmp_path, seed=0, total_steps=5000, log=lambda _: None)
    rng = np.random.default_rng(0)
    random_returns = []
    import gymnasium as gym

    env = gym.make("Pendulum-v1")
    for episode in range(10):
        env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = env.step(rng.uniform(-2, 2, size=(1,)).astype(np.float32))
            total += float(r)
            done = term or trunc
        random_returns.append(total)
    env.close()
    assert result.mean_eval_return > np.mean(random_returns) + 300, (result.eval_returns, random_returns)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~4-6 minutes per seed on a loaded 2-core machine
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pendulum_exported_policy_reaches_minus_200_within_30k_steps(seed: int, tmp_path: Path) -> None:
    result = train_sac(SACConfig(), env_id="Pendulum-v1", run_dir=tmp_path, seed=seed, total_steps=15_000,
                       log=lambda _: None)
    assert len(result.eval_returns) == 20
    assert result.mean_eval_return >= -200, result.eval_returns
    assert evaluate_onnx_policy(result.model, env_id="Pendulum-v1", episodes=1, seed=0)[0] > -1000


def test_anneal_lr_decays_every_learning_rate_linearly_to_zero_over_the_run() -> None:
    """SB3's ``lin_`` schedules, which the Zoo's SAC LunarLanderContinuous entry uses: before each gradient step,
    each rate is its start times the fraction of the planned env steps still to come."""
    import dataclasses

    config = dataclasses.replace(TINY, anneal_lr=True, q_lr=1e-3, policy_lr=4e-4)
    trainer = SACTrainer(config, env_id="Pendulum-v1", seed=0, total_steps=400)
    try:
        trainer.run(100)
        rates = [o.param_groups[0]["lr"] for o in (trainer.q_optimizer, trainer.actor_optimizer, trainer.a_optimizer)]
        np.testing.assert_allclose(rates, [0.75e-3, 3e-4, 3e-4])  # the last step learned at global_step 100
        trainer.run(400)
        rates = [o.param_groups[0]["lr"] for o in (trainer.q_optimizer, trainer.actor_optimizer, trainer.a_optimizer)]
        np.testing.assert_allclose(rates, [0.0, 0.0, 0.0], atol=1e-12)
    finally:
        trainer.close()
    plain = SACTrainer(dataclasses.replace(TINY, q_lr=1e-3, policy_lr=4e-4), env_id="Pendulum-v1", seed=0,
                       total_steps=400)
    try:
        plain.run(100)
        assert [o.param_groups[0]["lr"] for o in (plain.q_optimizer, plain.actor_optimizer)] == [1e-3, 4e-4]
    finally:
        plain.close()
