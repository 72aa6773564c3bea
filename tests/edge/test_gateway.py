"""Edge gateway + device over real Mosquitto: bundle relay, escalations with correlation ids, busy queue, CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from device import (
    Bundle,
    DeviceLink,
    LinkOptions,
    TrustStore,
    build_bundle,
    generate_keypair,
    load_public_key,
    load_signing_key,
)
from device._device_run import DeviceConfig, DeviceRuntime, run_device
from device._device_topics import DeviceTopics, EscalationReply, EscalationRequest
from edge._gateway import EdgeGateway, GatewayConfig
from edge._policy import OnnxPolicy
from tests._cli import run_strata
from tests._services import Mosquitto
from tests.cloud.test_distill import cartpole_teacher_model
from tests.conftest import MosquittoFactory
from tests.device._models import mlp_policy
from tests.edge._agents import wait_until

OBS = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    generate_keypair(d)
    return d


def _bundle(model: bytes, keys: Path, *, policy: str, version: int, tier: str) -> Bundle:
    return build_bundle(model, policy=policy, version=version, parent_version=None, observation_space=OBS,
                        action_space={"type": "Discrete", "n": 2},
                        signing_key=load_signing_key(keys / "strata-signing.key"), target_tier=tier,  # type: ignore[arg-type]
                        output_names=("action", "logits"))


@pytest.fixture(scope="module")
def edge_policy(keys: Path) -> OnnxPolicy:
    return OnnxPolicy(_bundle(cartpole_teacher_model(), keys, policy="CartPole-v1", version=5, tier="edge"))


@pytest.fixture(scope="module")
def micro(keys: Path) -> Bundle:
    # A 16-unit controller that is unsure near the balance point, so the tiered rule has work to do.
    return _bundle(cartpole_teacher_model(units=16, out_scale=0.25), keys, policy="CartPole-v1-micro", version=5,
                   tier="device")


def _trust(keys: Path) -> TrustStore:
    return TrustStore([load_public_key(keys / "strata-signing.pub")])


def _fleet() -> str:
    return f"f{uuid.uuid4().hex[:8]}"


def _publish_fleet_bundle(broker: Mosquitto, fleet: str, data: bytes) -> None:
    cloud = f"cloud-{uuid.uuid4().hex[:8]}"
    options = LinkOptions(host=broker.host, port=broker.port, client_id=cloud, username=cloud)
    with DeviceLink(options, on_message=lambda *a: None, subscriptions=[]) as c:
        assert c.publish(DeviceTopics(fleet, "x").fleet_device_policy, data, qos=1, retain=True, wait_s=60)


def test_device_gets_its_bundle_through_the_edge_and_escalates(mosquitto: Mosquitto, keys: Path,
                                                               edge_policy: OnnxPolicy, micro: Bundle) -> None:
    import gymnasium as gym

    fleet = _fleet()
    gateway = EdgeGateway(GatewayConfig(broker=mosquitto.url, fleet=fleet, node="edge-a"),
                          policy_source=lambda: edge_policy, trust=_trust(keys)).start()
    try:
        _publish_fleet_bundle(mosquitto, fleet, micro.to_bytes())  # the cloud's fleet-wide device bundle
        config = DeviceConfig(broker=mosquitto.url, fleet=fleet, edge_node="edge-a", device_id="dev-1",
                              threshold=0.3, budget_ms=60_000.0)  # no fallback from a slow machine
        with DeviceRuntime(config, trust=_trust(keys)) as runtime:
            got = runtime.wait_for_policy(60.0)
            assert (got.manifest.policy, got.manifest.version) == ("CartPole-v1-micro", 5)
            decisions = []
            report = run_device(runtime, gym.make("CartPole-v1"), steps=200, seed=1, on_decision=decisions.append)
        summary = report.summary()
    finally:
        gateway.close()
    assert report.steps == 200 and sum(report.by_tier.values()) == 200
    assert {d.tier for d in decisions} <= {"device", "edge", "device-fallback"}
    edge_decisions = [d for d in decisions if d.tier == "edge"]
    assert edge_decisions and all(d.edge_version == 5 and d.reason == "low-confidence" for d in edge_decisions)
    assert all(d.confidence >= 0.3 for d in decisions if d.tier == "device")
    assert gateway.counters.served >= len(edge_decisions)
    assert gateway.counters.relayed == 1
    assert 0 < summary["escalated_fraction"] < 1
    assert summary["latency_ms"]["edge"]["p50"] > 0  # measured; its speed is benchmarks/tiered_decisions.py's business


def test_gateway_refuses_a_bundle_for_the_wrong_tier(mosquitto: Mosquitto, keys: Path, edge_policy: OnnxPolicy
                                                     ) -> None:
    gateway = EdgeGateway(GatewayConfig(broker=mosquitto.url, fleet=_fleet(), node="edge-b"),
                          policy_source=lambda: edge_policy, trust=_trust(keys)).start()
    try:
        assert not gateway.relay(edge_policy.bundle.to_bytes())
        assert gateway.last_refusal is not None and "tier" in gateway.last_refusal
        tampered = bytearray(_bundle(mlp_policy(hidden=(16,)), keys, policy="m", version=1, tier="device").to_bytes())
        tampered[-200] ^= 1
        assert not gateway.relay(bytes(tampered))
        assert gateway.counters.refused_bundles == 2 and gateway.counters.relayed == 0
    finally:
        gateway.close()


def _collect_replies(broker: Mosquitto, topics: DeviceTopics, device: str, requests: list[EscalationRequest],
                     expect: int) -> list[EscalationReply]:
    replies: list[EscalationReply] = []
    done = threading.Event()

    def on_message(topic: str, payload: bytes, retained: bool) -> None:
        replies.append(EscalationReply.decode(topic, payload))
        if len(replies) >= expect:
            done.set()

    options = LinkOptions(host=broker.host, port=broker.port, client_id=device)
    with DeviceLink(options, on_message=on_message, subscriptions=[(topics.reply(device), 0)]) as c:
        for r in requests:
            c.publish(topics.request(device), r.encode())
        c.publish(topics.request(device), b"{not json")  # a bad request is dropped, never answered
        done.wait(60)
    return replies


def test_bounded_queue_answers_busy_and_replies_carry_correlation_ids(mosquitto: Mosquitto,
                                                                      edge_policy: OnnxPolicy) -> None:
    fleet = _fleet()

    def held_policy() -> OnnxPolicy:
        # the first request holds the worker until the queue has overflowed, whatever the machine's speed
        wait_until(lambda: gateway.counters.busy >= 1, timeout=60, what="a busy reply")
        return edge_policy

    gateway = EdgeGateway(GatewayConfig(broker=mosquitto.url, fleet=fleet, node="edge-c", queue_size=2),
                          policy_source=held_policy).start()
    try:
        requests = [EscalationRequest(id=f"r{i}", obs=(0.0, 0.0, 0.05 * i, 0.0), budget_ms=5000.0) for i in range(8)]
        replies = _collect_replies(mosquitto, DeviceTopics(fleet, "edge-c"), "dev-q", requests, expect=8)
    finally:
        gateway.close()
    assert sorted(r.id for r in replies) == sorted(r.id for r in requests)
    busy = [r for r in replies if r.error == "busy"]
    served = [r for r in replies if r.action is not None]
    assert busy and served and len(busy) + len(served) == 8
    assert gateway.counters.busy == len(busy) and gateway.counters.bad_requests == 1
    for r in served:
        obs = np.array(next(q.obs for q in requests if q.id == r.id), np.float32)
        assert r.action == (float(edge_policy.act(obs)),) and r.policy_version == 5


def test_no_edge_policy_is_an_error_reply(mosquitto: Mosquitto) -> None:
    fleet = _fleet()
    gateway = EdgeGateway(GatewayConfig(broker=mosquitto.url, fleet=fleet, node="edge-d"),
                          policy_source=lambda: None).start()
    try:
        replies = _collect_replies(mosquitto, DeviceTopics(fleet, "edge-d"), "dev-n",
                                   [EscalationRequest(id="a", obs=(0.0,) * 4, budget_ms=5000.0)], expect=1)
    finally:
        gateway.close()
    assert [(r.id, r.error) for r in replies] == [("a", "no policy")]


def test_strata_device_run_smoke(mosquitto: Mosquitto, keys: Path, edge_policy: OnnxPolicy, micro: Bundle,
                                 tmp_path: Path) -> None:
    fleet = _fleet()
    gateway = EdgeGateway(GatewayConfig(broker=mosquitto.url, fleet=fleet, node="edge-e"),
                          policy_source=lambda: edge_policy, trust=_trust(keys)).start()
    try:
        assert gateway.relay(micro.to_bytes())
        proc = run_strata("device", "run", "--broker", mosquitto.url, "--fleet", fleet, "--edge-node", "edge-e",
                          "--device-id", "dev-cli", "--env", "CartPole-v1", "--trust", str(keys / "strata-signing.pub"),
                          "--steps", "50", "--threshold", "0.3", "--budget-ms", "200",
                          "--state-path", str(tmp_path / "state.json"), "--decisions-out",
                          str(tmp_path / "decisions.jsonl"), timeout=120)
    finally:
        gateway.close()
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 50 and summary["policy_version"] == 5
    assert summary["by_tier"]["edge"] > 0
    assert json.loads((tmp_path / "state.json").read_text())  # anti-rollback state persisted
    decisions = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert len(decisions) == 50 and {d["tier"] for d in decisions} <= {"device", "edge", "device-fallback"}
    assert sum(d["tier"] == "edge" for d in decisions) == summary["by_tier"]["edge"]


def test_strata_device_run_without_a_policy_is_a_clean_error(mosquitto: Mosquitto, keys: Path) -> None:
    proc = run_strata("device", "run", "--broker", mosquitto.url, "--fleet", _fleet(), "--edge-node", "nobody",
                      "--device-id", "dev-x", "--env", "CartPole-v1", "--trust", str(keys / "strata-signing.pub"),
                      "--policy-wait-s", "0.5", timeout=60)
    assert proc.returncode == 2
    assert "error: strata device run: no micro policy arrived" in proc.stderr


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_strata_device_export_c_smoke(micro: Bundle, keys: Path, tmp_path: Path) -> None:
    path = tmp_path / "micro.bundle"
    path.write_bytes(micro.to_bytes())
    proc = run_strata("device", "export-c", "--bundle", str(path), "--out", str(tmp_path / "c"), "--trust",
                      str(keys / "strata-signing.pub"), timeout=60)  # export-c verifies the bundle first
    assert proc.returncode == 0, proc.stderr
    exe = tmp_path / "policy"
    subprocess.run(["gcc", "-std=c99", "-O2", "-o", str(exe), str(tmp_path / "c" / "strata_policy.c"),
                    str(tmp_path / "c" / "strata_policy_main.c"), "-lm"], check=True)
    out = subprocess.run([str(exe)], input="0.1 0.2 0.3 0.4\n", capture_output=True, text=True, check=True).stdout
    action = int(out.split()[0])
    from device import NumpyExecutor

    assert action == int(NumpyExecutor.from_bundle(micro).act(np.array([[0.1, 0.2, 0.3, 0.4]], np.float32))[0])


def test_box_edge_policy_replies_with_the_action_vector(mosquitto: Mosquitto, keys: Path) -> None:
    box = build_bundle(mlp_policy(n_actions=None, act_dim=2, hidden=(16,)), policy="box", version=3,
                       parent_version=None, observation_space=OBS,
                       action_space={"type": "Box", "shape": [2], "dtype": "float32", "low": [-1, -1],
                                     "high": [1, 1]},
                       signing_key=load_signing_key(keys / "strata-signing.key"), target_tier="edge")
    policy = OnnxPolicy(box)
    fleet = _fleet()
    gateway = EdgeGateway(GatewayConfig(broker=mosquitto.url, fleet=fleet, node="edge-box"),
                          policy_source=lambda: policy).start()
    try:
        obs = (0.1, 0.2, 0.3, 0.4)
        (reply,) = _collect_replies(mosquitto, DeviceTopics(fleet, "edge-box"), "dev-b",
                                    [EscalationRequest(id="b1", obs=obs, budget_ms=5000.0)], expect=1)
    finally:
        gateway.close()
    assert reply.action is not None and len(reply.action) == 2
    np.testing.assert_allclose(reply.action, policy.act(np.array(obs, np.float32)), atol=1e-6)


@pytest.mark.parametrize("bound", [False, True], ids=["plain-broker", "client-id-bound-to-username"])
def test_edge_agent_hosts_the_gateway(mosquitto: Mosquitto, keys: Path, micro: Bundle, tmp_path: Path,
                                      mosquitto_factory: MosquittoFactory, bound: bool) -> None:
    """The gateway shares the agent's connection, so a broker binding client id to username (the generated
    config) does not make the agent and its gateway take each other over."""
    from edge import publish_bundle
    from tests.edge._agents import agent_config, running_agents, wait_until

    if bound:
        mosquitto = mosquitto_factory(["use_username_as_clientid true"])
    fleet = _fleet()
    teacher = _bundle(cartpole_teacher_model(), keys, policy="CartPole-v1", version=6, tier="edge")
    config = agent_config(tmp_path, "edge-host", keys / "strata-signing.pub", mosquitto.url, fleet=fleet,
                          serve_devices=True, username="edge-host")
    with running_agents([config]) as (agent,):
        publish_bundle(teacher, broker=mosquitto.url, fleet=fleet, username="cloud")
        assert agent.wait_for_version(6, timeout=30)
        assert agent.gateway is not None
        wait_until(lambda: agent.gateway is not None and agent.gateway.connected, what="gateway link")
        _publish_fleet_bundle(mosquitto, fleet, micro.to_bytes())
        device = DeviceConfig(broker=mosquitto.url, fleet=fleet, edge_node="edge-host", device_id="dev-h",
                              threshold=0.5, budget_ms=60_000.0, username="dev-h")
        with DeviceRuntime(device, trust=_trust(keys)) as runtime:
            assert runtime.wait_for_policy(60).manifest.target_tier == "device"
            d = runtime.controller().decide(np.array([0.0, 0.0, 0.001, 0.0], np.float32))
        # neither connection of the node was ever taken over (by the other one of the same user)
        assert agent.link is not None and agent.link.connects == 1 and agent.gateway._link.connects == 1
    assert (d.tier, d.edge_version) == ("edge", 6)
    assert (tmp_path / "edge-host" / "device-relay.json").exists()
