"""Device decisions: confidence, escalation, fallback on timeout, staleness, the tier of every action."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

from device import NumpyExecutor, TrustStore, build_bundle, generate_keypair, load_public_key, load_signing_key
from device._device_run import (
    NONFINITE_REASON,
    DeviceConfig,
    DeviceRunError,
    DeviceRuntime,
    TieredController,
    confidence_of,
)
from device._device_topics import DevicePayloadError, DeviceTopics, EscalationReply, EscalationRequest
from device._errors import ConfigError
from tests._services import Mosquitto
from tests.device._models import export

CARTPOLE_OBS = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}


def identity_logits_model() -> bytes:
    """logits = obs[:, :2] (through a Gemm), action = argmax: the confidence is set by the observation."""
    import torch

    class Policy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)
            with torch.no_grad():
                self.lin.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]))
                self.lin.bias.zero_()

        def forward(self, obs: torch.Tensor) -> object:
            logits = self.lin(obs)
            return torch.argmax(logits, dim=-1), logits

    return export(Policy().eval(), (torch.zeros(1, 4),), ["action", "logits"])


@pytest.fixture(scope="module")
def model() -> bytes:
    return identity_logits_model()


def test_confidence_measures() -> None:
    assert confidence_of(np.array([0.0, 0.0]), "margin") == pytest.approx(0.0)
    assert confidence_of(np.array([10.0, 0.0]), "margin") == pytest.approx(1.0, abs=1e-4)
    assert confidence_of(np.array([0.0, 0.0, 0.0]), "entropy") == pytest.approx(0.0)
    assert confidence_of(np.array([20.0, 0.0, 0.0]), "entropy") == pytest.approx(1.0, abs=1e-6)


def test_confident_obs_stays_on_the_device_and_uncertain_obs_goes_to_the_edge(model: bytes) -> None:
    asked: list[np.ndarray] = []

    def edge(obs: np.ndarray, budget_s: float) -> EscalationReply:
        asked.append(obs)
        return EscalationReply(id="x", action=(0.0,), policy_version=7)

    c = TieredController(NumpyExecutor(model), discrete=True, escalate=edge, threshold=0.5)
    sure = c.decide(np.array([0.0, 5.0, 0, 0], np.float32))
    assert (sure.action, sure.tier, sure.reason) == (1, "device", "confident") and not asked
    unsure = c.decide(np.array([0.0, 0.1, 0, 0], np.float32))
    assert (unsure.action, unsure.tier, unsure.reason, unsure.edge_version) == (0, "edge", "low-confidence", 7)
    np.testing.assert_array_equal(asked[0], np.array([0.0, 0.1, 0, 0], np.float32))


def test_timeout_falls_back_to_the_devices_own_action(model: bytes) -> None:
    c = TieredController(NumpyExecutor(model), discrete=True, escalate=lambda obs, b: None, threshold=0.5)
    d = c.decide(np.array([0.0, 0.1, 0, 0], np.float32))
    assert (d.action, d.tier, d.reason) == (1, "device-fallback", "low-confidence; timeout")
    busy = TieredController(NumpyExecutor(model), discrete=True, threshold=0.5,
                            escalate=lambda obs, b: EscalationReply(id="x", action=None, error="busy"))
    assert busy.decide(np.array([0.0, 0.1, 0, 0], np.float32)).reason == "low-confidence; busy"


def test_a_stale_policy_escalates_even_when_confident(model: bytes) -> None:
    c = TieredController(NumpyExecutor(model), discrete=True, threshold=0.5, is_stale=lambda: True,
                         escalate=lambda obs, b: EscalationReply(id="x", action=(0.0,), policy_version=1))
    d = c.decide(np.array([0.0, 5.0, 0, 0], np.float32))
    assert (d.tier, d.reason, d.action) == ("edge", "stale", 0)


def test_payloads_are_validated() -> None:
    topic = DeviceTopics("f", "e").request("d")
    req = EscalationRequest(id="d-1", obs=(1.0, 2.5), budget_ms=20.0)
    assert EscalationRequest.decode(topic, req.encode()) == req
    with pytest.raises(DevicePayloadError, match=re.escape("field 'budget_ms' must be a number in (0, 60000]")):
        EscalationRequest.decode(topic, b'{"id": "a", "obs": [1], "budget_ms": -1}')
    with pytest.raises(DevicePayloadError, match=re.escape("is not JSON")):
        EscalationReply.decode(topic, b"\x00garbage")
    with pytest.raises(DevicePayloadError, match=re.escape("has neither 'action' nor 'error'")):
        EscalationReply.decode(topic, b'{"id": "a"}')
    assert DeviceTopics("f", "e").device_of_request("strata/f/edges/e/devices/d/request") == "d"
    assert DeviceTopics("f", "e").device_of_request("strata/f/edges/other/devices/d/request") is None
    with pytest.raises(ConfigError, match=re.escape("device id 'a/b' cannot be an MQTT topic segment")):
        DeviceConfig(device_id="a/b")


def _device_bundle(model: bytes, key_dir: Path, *, version: int, tier: str = "device") -> bytes:
    if not (key_dir / "strata-signing.key").exists():
        generate_keypair(key_dir)
    return build_bundle(model, policy="micro", version=version, parent_version=None, observation_space=CARTPOLE_OBS,
                        action_space={"type": "Discrete", "n": 2},
                        signing_key=load_signing_key(key_dir / "strata-signing.key"), target_tier=tier,  # type: ignore[arg-type]
                        output_names=("action", "logits")).to_bytes()


def test_device_verifies_bundles_and_times_out_without_an_edge(model: bytes, tmp_path: Path,
                                                                mosquitto: Mosquitto) -> None:
    trust = TrustStore([load_public_key(generate_keypair(tmp_path / "keys")[1])])
    config = DeviceConfig(broker=mosquitto.url, fleet="f1", edge_node="lonely", device_id="dev-timeout",
                          budget_ms=30.0, threshold=0.5, state_path=str(tmp_path / "state.json"))
    with DeviceRuntime(config, trust=trust) as runtime:
        with pytest.raises(DeviceRunError, match=re.escape("no micro policy arrived")):
            runtime.wait_for_policy(0.2)
        assert not runtime.offer(_device_bundle(model, tmp_path / "keys", version=2, tier="edge"))
        assert "tier" in runtime.refused[-1]
        assert not runtime.offer(_device_bundle(model, tmp_path / "other", version=2))  # untrusted key
        assert runtime.offer(_device_bundle(model, tmp_path / "keys", version=2))
        assert not runtime.offer(_device_bundle(model, tmp_path / "keys", version=1))  # rollback
        assert runtime.bundle is not None and runtime.bundle.manifest.version == 2
        assert runtime.offer(runtime.bundle.to_bytes()) and len(runtime.refused) == 3  # a repeat is no refusal
        controller = runtime.controller()
        start = time.perf_counter()
        d = controller.decide(np.array([0.0, 0.1, 0, 0], np.float32))
        took = time.perf_counter() - start
    assert d.tier == "device-fallback" and d.reason == "low-confidence; timeout"
    assert 0.025 <= took < 60  # it waited out the 30 ms budget; the upper bound fails only a hang
    # A restarted device (same anti-rollback state) reloads the version it ran, and still refuses older ones.
    with DeviceRuntime(config, trust=trust) as restarted:
        assert not restarted.offer(_device_bundle(model, tmp_path / "keys", version=1))
        assert restarted.offer(_device_bundle(model, tmp_path / "keys", version=2))


def test_device_reconnects_after_a_broker_restart_and_escalates_again(model: bytes, tmp_path: Path,
                                                                      mosquitto_factory: object) -> None:
    from device import DeviceLink, LinkOptions

    broker = mosquitto_factory()  # type: ignore[operator]
    trust = TrustStore([load_public_key(generate_keypair(tmp_path / "keys")[1])])
    config = DeviceConfig(broker=broker.url, fleet="f2", edge_node="e", device_id="dev-r", budget_ms=1000.0)
    topics = DeviceTopics("f2", "e")
    with DeviceRuntime(config, trust=trust) as runtime:
        assert runtime.offer(_device_bundle(model, tmp_path / "keys", version=1))
        broker.restart()
        deadline = time.monotonic() + 60
        while runtime.reconnects < 1 and time.monotonic() < deadline:
            # While the link is down, decisions fall back at once instead of waiting out the budget.
            d = runtime.controller().decide(np.array([0.0, 0.1, 0, 0], np.float32))
            assert d.tier in ("device-fallback", "edge")
            time.sleep(0.05)
        assert runtime.reconnects >= 1 and runtime.link.connected

        def answer(topic: str, payload: bytes, retained: bool) -> None:
            req = EscalationRequest.decode(topic, payload)
            # A QoS 1 publish from inside on_message: paho queues it, the callback does not block.
            edge.publish(topics.reply("dev-r"), EscalationReply(id=req.id, action=(0.0,), policy_version=4).encode(),
                         qos=1)

        edge = DeviceLink(LinkOptions(host=broker.host, port=broker.port, client_id="fake-edge"), on_message=answer,
                          subscriptions=[(topics.all_requests, 0)]).connect()
        try:
            d = runtime.controller().decide(np.array([0.0, 0.1, 0, 0], np.float32))
        finally:
            edge.close()
    assert (d.tier, d.edge_version) == ("edge", 4)


def test_box_policies_escalate_only_when_stale() -> None:
    from tests.device._models import mlp_policy

    executor = NumpyExecutor(mlp_policy(n_actions=None, act_dim=2, hidden=(16,)))
    stale = [False]
    c = TieredController(executor, discrete=False, threshold=1.0, is_stale=lambda: stale[0],
                         escalate=lambda obs, b: EscalationReply(id="x", action=(0.25, -0.5), policy_version=2))
    obs = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    d = c.decide(obs)
    assert d.tier == "device" and d.confidence == 1.0
    np.testing.assert_array_equal(d.action, executor.act(obs[None])[0])
    stale[0] = True
    d = c.decide(obs)
    assert d.tier == "edge" and d.action.dtype == np.float32
    np.testing.assert_array_equal(d.action, np.array([0.25, -0.5], np.float32))


def test_the_budget_is_a_deadline_for_the_whole_decision(model: bytes) -> None:
    """Issue 21: the escalation got the full budget after the micro policy's own time. Now it gets what is left,
    and none at all (an immediate fallback) when the budget is already spent."""
    now = [0.0]
    budgets: list[float] = []

    class SlowPolicy:
        def __init__(self, cost_s: float) -> None:
            self.inner, self.cost_s = NumpyExecutor(model), cost_s

        def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            now[0] += self.cost_s  # the fake clock: inference took cost_s
            return self.inner.run(feeds)

        def act(self, obs: np.ndarray) -> np.ndarray:
            return self.inner.act(obs)

    def edge(obs: np.ndarray, budget_s: float) -> None:
        budgets.append(budget_s)
        now[0] += budget_s  # nobody answers: the wait runs out
        return None

    for cost_s, expect in ((0.015, [pytest.approx(0.005)]), (0.025, [])):
        budgets.clear()
        now[0] = 0.0
        c = TieredController(SlowPolicy(cost_s), discrete=True, escalate=edge, threshold=0.5, budget_ms=20.0,
                             clock=lambda: now[0])
        d = c.decide(np.array([0.0, 0.1, 0, 0], np.float32))
        assert (d.tier, d.reason) == ("device-fallback", "low-confidence; timeout")
        assert budgets == expect
        assert d.latency_s == pytest.approx(max(cost_s, 0.020))


def test_an_oversized_retained_message_is_refused_once_without_reconnecting(
        model: bytes, tmp_path: Path, mosquitto_factory: object, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 21: a 1.5 MiB retained message on the device-policy topic made the old client reconnect 58 times in
    6 s. Now it is refused unread, logged once, the link stays up, and a bundle of the right size still installs."""
    from device import DeviceLink, LinkOptions

    broker = mosquitto_factory(["persistence true"])  # type: ignore[operator]  # retained survives the restart
    trust = TrustStore([load_public_key(generate_keypair(tmp_path / "keys")[1])])
    topics = DeviceTopics("f3", "e")
    cloud = DeviceLink(LinkOptions(host=broker.host, port=broker.port, client_id="cloud"), on_message=lambda *a: None,
                       subscriptions=[]).connect()
    try:
        assert cloud.publish(topics.device_policy, b"\x00" * (1536 * 1024), qos=1, retain=True, wait_s=60)
        config = DeviceConfig(broker=broker.url, fleet="f3", edge_node="e", device_id="dev-big")
        with caplog.at_level("WARNING", logger="strata.device"), DeviceRuntime(config, trust=trust) as runtime:
            deadline = time.monotonic() + 60
            while not runtime.refused and time.monotonic() < deadline:
                time.sleep(0.01)
            assert runtime.refused == [f"a 1,572,864 byte message on {topics.device_policy} exceeds "
                                       "max_bundle_bytes=262,144; not a device bundle, or raise --max-bundle-bytes"]
            broker.restart()  # the retained message comes back on the reconnect: refused, but not again
            while runtime.reconnects < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert runtime.reconnects == 1
            cloud.close()
            cloud = DeviceLink(LinkOptions(host=broker.host, port=broker.port, client_id="cloud"),
                               on_message=lambda *a: None, subscriptions=[]).connect()
            assert cloud.publish(topics.device_policy, _device_bundle(model, tmp_path / "keys", version=1), qos=1,
                                 retain=True, wait_s=60)
            assert runtime.wait_for_policy(60).manifest.version == 1
            assert len(runtime.refused) == 1 and runtime.reconnects == 1
        assert [r.getMessage() for r in caplog.records].count(
            f"strata device dev-big: refused a device bundle: {runtime.refused[0]}") == 1
    finally:
        cloud.close()


def test_a_non_finite_observation_is_refused_and_decided_by_the_fallback_at_once(model: bytes) -> None:
    """A broken sensor (NaN or +-inf) follows the C export's rule: refused, never escalated, the last action held.

    (It used to be escalated: a NaN went out as non-standard JSON that every edge refuses, so the device waited
    out its whole budget; issue 34.)
    """
    asked: list[np.ndarray] = []

    def edge(obs: np.ndarray, budget_s: float) -> EscalationReply:
        asked.append(obs)
        return EscalationReply(id="x", action=(1.0,), policy_version=2)

    c = TieredController(NumpyExecutor(model), discrete=True, escalate=edge, threshold=0.0)
    first = c.decide(np.array([0.0, np.inf, 0, 0], np.float32))  # before any decision: the neutral action
    assert (first.tier, first.action, first.reason) == ("device-fallback", 0, NONFINITE_REASON)
    good = c.decide(np.array([0.0, 0.0, 0.2, 0.0], np.float32))
    for bad in (np.nan, np.inf, -np.inf):
        d = c.decide(np.array([0.0, bad, 0, 0], np.float32))
        assert (d.tier, d.action, d.reason, d.confidence) == ("device-fallback", good.action, NONFINITE_REASON, 0.0)
    assert asked == [] and c.nonfinite == 4
