"""Box micro policies' confidence: StateRegion (Mahalanobis distance from the distilled-on states) and its use."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from device import (
    ModelError,
    NumpyExecutor,
    StateRegion,
    TrustStore,
    build_bundle,
    generate_keypair,
    load_public_key,
    load_signing_key,
)
from device._device_run import DeviceConfig, DeviceRuntime, TieredController
from device._device_topics import EscalationReply
from device._errors import ConfigError
from tests._services import Mosquitto
from tests.device._models import mlp_policy

# Mean 0, variances 0.5 (x) and 2 (y), no covariance: every state is sqrt(2) from the mean, so radius = sqrt(2).
CROSS = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, -2.0], [0.0, 2.0]])


def test_fit_pins_mean_whitening_distance_and_confidence() -> None:
    region = StateRegion.fit(CROSS)
    np.testing.assert_allclose(region.mean, [0.0, 0.0])
    np.testing.assert_allclose(region.whiten, np.diag([1 / math.sqrt(0.5), 1 / math.sqrt(2.0)]), rtol=1e-5)
    assert region.radius == pytest.approx(math.sqrt(2.0), rel=1e-5) and region.samples == 4
    assert region.distance(np.array([2.0, 0.0])) == pytest.approx(2 * math.sqrt(2.0), rel=1e-5)
    assert region.confidence(np.array([0.0, 1.0])) == 1.0  # inside the median radius
    assert region.confidence(np.array([2.0, 0.0])) == pytest.approx(0.5, rel=1e-5)  # twice the radius out
    assert region.confidence(np.array([0.0, 8.0])) == pytest.approx(0.25, rel=1e-5)  # y spreads more: same 4x
    assert region.confidence(np.array([np.nan, 0.0])) == 0.0


def test_correlations_count_and_a_constant_feature_makes_any_change_far_out() -> None:
    rng = np.random.default_rng(0)
    t = rng.normal(size=500)
    diagonal = StateRegion.fit(np.stack([t, t + 0.05 * rng.normal(size=500)], axis=1))
    # Same Euclidean distance from the mean: along the training correlation it is typical, across it far out.
    assert diagonal.confidence(np.array([1.0, 1.0])) == 1.0
    assert diagonal.confidence(np.array([1.0, -1.0])) < 0.1
    flat = StateRegion.fit(np.stack([t, np.full(500, 3.0)], axis=1))
    assert flat.confidence(np.array([0.0, 3.0])) == 1.0
    assert flat.confidence(np.array([0.0, 3.01])) < 0.1  # a ridge of 1e-6 of the mean variance: std ~7e-4


def test_manifest_round_trip_and_refusals() -> None:
    region = StateRegion.fit(CROSS)
    back = StateRegion.from_manifest({StateRegion.KEY: region.to_manifest()}, dim=2)
    assert back is not None and back.radius == region.radius and back.samples == 4
    np.testing.assert_array_equal(back.whiten, region.whiten)
    assert StateRegion.from_manifest({"in_graph": True}, dim=2) is None
    assert StateRegion.from_manifest(None, dim=2) is None
    with pytest.raises(ModelError, match=re.escape("mean (2,) / whiten (2, 2) do not match 3 observation values")):
        StateRegion.from_manifest({StateRegion.KEY: region.to_manifest()}, dim=3)
    with pytest.raises(ModelError, match=re.escape("preprocessing['state_region'] is malformed ('radius')")):
        StateRegion.from_manifest({StateRegion.KEY: {"kind": "mahalanobis", "mean": [0], "whiten": [[1]]}}, dim=1)
    with pytest.raises(ModelError, match=re.escape("kind 'boxes' is not 'mahalanobis'")):
        StateRegion.from_manifest({StateRegion.KEY: {**region.to_manifest(), "kind": "boxes"}}, dim=2)
    with pytest.raises(ConfigError, match=re.escape("StateRegion.fit: needs at least 2 finite states, got 1")):
        StateRegion.fit(np.zeros((1, 3)))
    with pytest.raises(ConfigError, match=re.escape("(1 non-finite values)")):
        StateRegion.fit(np.array([[0.0], [np.inf], [1.0]]))


def _box_executor() -> NumpyExecutor:
    return NumpyExecutor(mlp_policy(n_actions=None, act_dim=2, hidden=(16,)))


def test_box_controller_escalates_out_of_region_observations() -> None:
    executor = _box_executor()
    region = StateRegion.fit(np.random.default_rng(1).normal(size=(400, 4)))
    asked: list[np.ndarray] = []

    def edge(obs: np.ndarray, budget_s: float) -> EscalationReply:
        asked.append(obs)
        return EscalationReply(id="x", action=(0.25, -0.5), policy_version=3)

    c = TieredController(executor, discrete=False, threshold=0.5, escalate=edge, region=region)
    near = np.array([0.1, -0.2, 0.3, 0.0], np.float32)
    d = c.decide(near)
    assert (d.tier, d.reason, d.confidence) == ("device", "confident", 1.0) and not asked
    np.testing.assert_array_equal(d.action, executor.act(near[None])[0])
    far = np.array([6.0, 0.0, 0.0, 0.0], np.float32)
    d = c.decide(far)
    assert (d.tier, d.reason, d.edge_version) == ("edge", "low-confidence", 3)
    assert d.confidence == pytest.approx(region.radius / region.distance(far))
    np.testing.assert_array_equal(d.action, np.array([0.25, -0.5], np.float32))
    # Threshold 0 never escalates for confidence.
    assert TieredController(executor, discrete=False, threshold=0.0, escalate=edge, region=region
                            ).decide(far).tier == "device"


def test_discrete_decisions_ignore_the_region() -> None:
    executor = NumpyExecutor(mlp_policy(n_actions=2, hidden=(16,)))
    never = StateRegion.fit(np.random.default_rng(5).normal(loc=100.0, scale=0.01, size=(50, 4)))  # all far out
    plain = TieredController(executor, discrete=True, threshold=0.3, escalate=lambda obs, b: None)
    gated = TieredController(executor, discrete=True, threshold=0.3, escalate=lambda obs, b: None, region=never)
    for obs in np.random.default_rng(2).normal(scale=3.0, size=(20, 4)).astype(np.float32):
        a, b = plain.decide(obs), gated.decide(obs)
        assert (a.tier, a.reason, a.action, a.confidence) == (b.tier, b.reason, b.action, b.confidence)


def _box_bundle(key_dir: Path, *, version: int, preprocessing: Mapping[str, Any] | None) -> bytes:
    if not (key_dir / "strata-signing.key").exists():
        generate_keypair(key_dir)
    return build_bundle(mlp_policy(n_actions=None, act_dim=2, hidden=(16,)), policy="micro-box", version=version,
                        parent_version=None,
                        observation_space={"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4,
                                           "high": ["inf"] * 4},
                        action_space={"type": "Box", "shape": [2], "dtype": "float32", "low": [-1.0, -1.0],
                                      "high": [1.0, 1.0]},
                        preprocessing=preprocessing, signing_key=load_signing_key(key_dir / "strata-signing.key"),
                        target_tier="device", output_names=("action",)).to_bytes()


def test_runtime_takes_the_region_from_the_signed_manifest(tmp_path: Path, mosquitto: Mosquitto) -> None:
    trust = TrustStore([load_public_key(generate_keypair(tmp_path / "keys")[1])])
    region = StateRegion.fit(np.random.default_rng(3).normal(size=(400, 4)))
    config = DeviceConfig(broker=mosquitto.url, fleet="fr", edge_node="lonely", device_id="dev-region",
                          budget_ms=5.0, threshold=0.5)
    far = np.array([0.0, 0.0, 7.0, 0.0], np.float32)
    with DeviceRuntime(config, trust=trust) as runtime:
        assert runtime.offer(_box_bundle(tmp_path / "keys", version=1, preprocessing=None))
        assert runtime.region is None and runtime.controller().decide(far).tier == "device"  # no region: conf 1
        bad = {StateRegion.KEY: {**region.to_manifest(), "mean": [0.0, 0.0]}}
        assert not runtime.offer(_box_bundle(tmp_path / "keys", version=2, preprocessing=bad))
        assert "do not match 4 observation values" in runtime.refused[-1] and runtime.region is None
        assert runtime.offer(_box_bundle(tmp_path / "keys", version=3,
                                         preprocessing={StateRegion.KEY: region.to_manifest()}))
        controller = runtime.controller()
        assert controller.decide(np.zeros(4, np.float32)).tier == "device"
        d = controller.decide(far)  # no edge answers: the device's own action after the budget
        assert (d.tier, d.reason) == ("device-fallback", "low-confidence; timeout")
        assert d.confidence == pytest.approx(region.radius / region.distance(far), rel=1e-6)
