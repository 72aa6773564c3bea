"""The health check of a new policy, with real onnxruntime and a real gymnasium CartPole."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from edge import HealthConfig, OnnxPolicy, check_policy
from edge._policy import HealthChecker
from tests.edge._policies import cartpole_bundle, cartpole_model


def make_env() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1")


def test_a_good_policy_passes_and_acts() -> None:
    policy, report = check_policy(cartpole_bundle(None, 1), make_env, HealthConfig(min_return=400.0, episodes=2,
                                                                                   latency_budget_ms=5000.0))
    assert report.ok, report.reason
    assert policy is not None and report.mean_return is not None and report.mean_return >= 400
    assert policy.act(np.zeros(4, np.float32)) in (0, 1)


@pytest.mark.parametrize(("model", "config", "reason"), [
    (cartpole_model(obs_dim=3), HealthConfig(), "graph input shape [3] does not match observations of shape [4]"),
    (cartpole_model(nan=True), HealthConfig(), "output 'logits' is not finite"),
    (b"not an onnx model", HealthConfig(), "onnxruntime cannot load the model"),
    # always pushing left: the pole falls in ~10 steps
    (cartpole_model(weights=np.array([[0, 0]] * 4, np.float32)), HealthConfig(min_return=100.0),
     "below the minimum 100.0"),
    (cartpole_model(), HealthConfig(latency_budget_ms=1e-6), "exceeds the budget of 1e-06 ms"),
])
def test_unhealthy_policies_fail_with_the_reason(model: bytes, config: HealthConfig, reason: str) -> None:
    policy, report = check_policy(cartpole_bundle(None, 1, model=model), make_env, config)
    assert policy is None and not report.ok
    assert reason in report.reason


def test_the_deadline_bounds_the_check() -> None:
    ticks = iter(range(100))
    _, report = check_policy(cartpole_bundle(None, 1), make_env, HealthConfig(deadline_s=0.5),
                             clock=lambda: float(next(ticks)))
    assert not report.ok and "deadline of 0.5s passed" in report.reason


def test_manifest_spaces_must_match_the_simulator() -> None:
    bundle = cartpole_bundle(None, 1, action_space={"type": "Discrete", "n": 3})
    _, report = check_policy(bundle, make_env, HealthConfig())
    assert "action space n 3 does not match the simulator's 2" in report.reason


def test_onnx_policy_runs_batches() -> None:
    policy = OnnxPolicy(cartpole_bundle(None, 1))
    assert policy.run(np.zeros((5, 4), np.float32)).shape == (5,)


def test_one_checker_reads_the_simulator_once_and_checks_every_bundle_fully() -> None:
    made = []

    def counting_env() -> gym.Env:
        made.append(1)
        return make_env()

    checker = HealthChecker(counting_env, HealthConfig(latency_budget_ms=5000.0))
    checker.prepare()
    verdicts = [checker.check(cartpole_bundle(None, v, model=m))[1]
                for v, m in ((1, cartpole_model()), (2, cartpole_model(nan=True)), (3, cartpole_model(obs_dim=3)),
                             (4, cartpole_model()))]
    assert [r.ok for r in verdicts] == [True, False, False, True]
    assert "is not finite" in verdicts[1].reason and "graph input shape [3]" in verdicts[2].reason
    assert len(made) == 1  # no min_return: the spaces and probes come from the env made once
    assert set(verdicts[0].stages) == {"load", "spaces", "outputs", "latency"}
    assert verdicts[0].latency_p99_us is not None and verdicts[0].latency_p99_us > 0
    _, with_return = HealthChecker(counting_env, HealthConfig(min_return=100.0, latency_budget_ms=5000.0)).check(
        cartpole_bundle(None, 5))
    assert with_return.ok and "return" in with_return.stages and len(made) == 3  # read once, plus the episode env
