"""The IoT policy grants exactly what a node's clients do on MQTT, and two stages never share a topic or client id.

The live test runs a real edge agent (chunked bundle, telemetry, experience, device gateway) and a real device
against Mosquitto with full logging, reads every CONNECT (and last will), SUBSCRIBE and PUBLISH of the node's
clients from the broker's log, and evaluates each against the node's policy document the way IoT Core does
(``*`` matches any characters). Every grant must also be used: the policy is exactly what the clients do.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from device import (
    DeviceConfig,
    DeviceRuntime,
    TrustStore,
    build_bundle,
    generate_keypair,
    load_public_key,
    load_signing_key,
    mqtt_client_id,
)
from device._mqtt_access import MQTT_ACCESS
from infra._iot import iot_fleet, learner_grants, learner_policy_document, node_grants, policy_document
from tests.cloud.test_distill import cartpole_teacher_model
from tests.conftest import MosquittoFactory

OBS = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}
ARN = "arn:aws:iot:us-east-1:123456789012"


def allowed(doc: dict[str, Any], action: str, resource: str) -> bool:
    """Whether `doc` allows `action` on `resource` (``client/..``, ``topic/..``, ``topicfilter/..``)."""
    for statement in doc["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if statement["Effect"] == "Allow" and action in actions and any(
                fnmatch.fnmatchcase(f"{ARN}:{resource}", pattern) for pattern in statement["Resource"]):
            return True
    return False


def used_grants(doc: dict[str, Any], action: str, resource: str) -> set[str]:
    return {p for s in doc["Statement"] if s["Action"] == action for p in s["Resource"]
            if fnmatch.fnmatchcase(f"{ARN}:{resource}", p)}


_LINE = re.compile(r"^\d+: (?P<text>.*)$")


def broker_operations(log: str, clients: set[str]) -> list[tuple[str, str, str]]:
    """``(action, client, resource)`` of every operation of `clients` in a Mosquitto ``log_type all`` log."""
    ops: list[tuple[str, str, str]] = []
    lines = [m.group("text") if (m := _LINE.match(raw)) else raw for raw in log.splitlines()]
    context: tuple[str, str] | None = None  # ("subscribe" | "will", client) while its indented lines follow
    connecting: str | None = None  # the client of the last CONNECT (a will belongs to it, whoever it is)
    for text in lines:
        if text.startswith("\t") and context is not None:
            kind, who = context
            if kind == "subscribe":
                ops.append(("iot:Subscribe", who, "topicfilter/" + text.strip().rsplit(" (QoS", 1)[0]))
            else:
                ops.append(("iot:Publish", who, "topic/" + text.strip()))
            continue
        if context is not None and text.startswith(f"{context[1]} "):
            continue  # Mosquitto's per-topic line after each topic of a SUBSCRIBE ("client qos topic")
        context = None
        if m := re.match(r"New client connected from \S+ as (\S+) ", text):
            connecting = m.group(1)
            if m.group(1) in clients:
                ops.append(("iot:Connect", m.group(1), f"client/{m.group(1)}"))
        elif m := re.match(r"Will message specified \(\d+ bytes\) \(r(\d), q\d\)\.", text):
            who = connecting
            if who is not None and who in clients:
                context = ("will", who)
                if m.group(1) == "1":
                    ops.append(("will-retained", who, ""))
        elif m := re.match(r"Received SUBSCRIBE from (\S+)$", text):
            if m.group(1) in clients:
                context = ("subscribe", m.group(1))
        elif m := re.match(r"Received PUBLISH from (\S+) \(d\d, q\d, r(\d), m\d+, '([^']*)'", text):
            if m.group(1) in clients:
                ops.append(("iot:Publish", m.group(1), f"topic/{m.group(3)}"))
                if m.group(2) == "1":
                    ops.append(("iot:RetainPublish", m.group(1), f"topic/{m.group(3)}"))
        elif (m := re.match(r"Sending PUBLISH to (\S+) \(d\d, q\d, r\d, m\d+, '([^']*)'", text)) and (
                m.group(1) in clients):
            ops.append(("iot:Receive", m.group(1), f"topic/{m.group(2)}"))
    # A retained will needs RetainPublish on its topic as well.
    out: list[tuple[str, str, str]] = []
    for i, op in enumerate(ops):
        if op[0] == "will-retained":
            will = next(o for o in ops[i + 1:] if o[0] == "iot:Publish" and o[1] == op[1])
            out.append(("iot:RetainPublish", op[1], will[2]))
        else:
            out.append(op)
    return out


def test_the_policy_is_derived_from_the_access_table_and_grants_retained_publish() -> None:
    grants = node_grants("dev.lab", "n1")
    assert grants["iot:RetainPublish"] == ["topic/strata/dev.lab/edges/n1/device-policy",
                                           "topic/strata/dev.lab/nodes/n1/status"]
    assert len(grants["iot:Publish"]) == len([a for a in MQTT_ACCESS if a.op == "publish" and a.role != "learner"])
    assert "topicfilter/strata/dev.lab/edges/n1/devices/*/request" in grants["iot:Subscribe"]
    assert grants["iot:Connect"] == ["client/dev.lab.n1", "client/dev.lab.n1.device.*", "client/dev.lab.n1.gateway"]


def test_two_stages_whose_names_are_prefixes_share_no_topic_and_no_client_id() -> None:
    dev = policy_document(partition="aws", region="us-east-1", account="123456789012",
                          fleet=iot_fleet("dev", "lab"), node="n1")
    other = policy_document(partition="aws", region="us-east-1", account="123456789012",
                            fleet=iot_fleet("dev-x", "lab"), node="n1")
    fleet = iot_fleet("dev-x", "lab")
    probes = [("iot:Connect", f"client/{mqtt_client_id(r, fleet=fleet, node='n1', device='d')}")
              for r in ("agent", "gateway", "device")]
    for action, resources in node_grants(fleet, "n1").items():
        probes += [(action, r.replace("*", "p")) for r in resources]
    assert all(allowed(other, a, r) for a, r in probes)
    assert not any(allowed(dev, a, r) for a, r in probes)


def test_the_learner_policy_grants_shared_experience_receipts_and_policies_and_no_node_grants_any_of_it() -> None:
    fleet = iot_fleet("dev", "lab")
    grants = learner_grants(fleet)
    assert grants["iot:Subscribe"] == [f"topicfilter/$share/strata-learner/strata/{fleet}/nodes/*/experience"]
    assert grants["iot:Receive"] == [f"topic/strata/{fleet}/nodes/*/experience"]
    assert f"topic/strata/{fleet}/nodes/*/receipt" in grants["iot:Publish"]
    assert grants["iot:Connect"] == [f"client/{fleet}.learner.*"]
    node = policy_document(partition="aws", region="us-east-1", account="123456789012", fleet=fleet, node="n1")
    learner_only = [("iot:Subscribe", f"topicfilter/$share/strata-learner/strata/{fleet}/nodes/+/experience"),
                    ("iot:Subscribe", f"topicfilter/strata/{fleet}/nodes/+/experience"),
                    ("iot:Receive", f"topic/strata/{fleet}/nodes/n2/experience"),
                    ("iot:Publish", f"topic/strata/{fleet}/nodes/n1/receipt"),
                    ("iot:Publish", f"topic/strata/{fleet}/nodes/n2/receipt"),
                    ("iot:Publish", f"topic/strata/{fleet}/policies/cartpole/latest"),
                    ("iot:Publish", f"topic/strata/{fleet}/announce"),
                    ("iot:Connect", f"client/{fleet}.learner.ingest-0")]
    assert [probe for probe in learner_only if allowed(node, *probe)] == []  # a node reads no other node's records
    learner = learner_policy_document(partition="aws", region="us-east-1", account="123456789012", fleet=fleet)
    node_only = [("iot:Publish", f"topic/strata/{fleet}/nodes/n1/experience"),
                 ("iot:Publish", f"topic/strata/{fleet}/nodes/n1/status"),
                 ("iot:Subscribe", f"topicfilter/strata/{fleet}/nodes/n1/receipt"),
                 ("iot:Connect", f"client/{fleet}.n1")]
    assert [probe for probe in node_only if allowed(learner, *probe)] == []  # nor forges a node's


@pytest.mark.timeout(600)
def test_every_operation_of_a_live_agent_gateway_and_device_is_granted_and_every_grant_is_used(
        mosquitto_factory: MosquittoFactory, tmp_path: Path) -> None:
    from edge import Publisher
    from edge._ingest import ExperienceIngester, IngestConfig
    from edge._topics import ExperienceSpec
    from tests.edge._agents import agent_config, running_agents, wait_until

    broker = mosquitto_factory(["log_type all"])
    keys = tmp_path / "keys"
    generate_keypair(keys)
    signing = load_signing_key(keys / "strata-signing.key")
    trust = TrustStore([load_public_key(keys / "strata-signing.pub")])
    fleet, node = iot_fleet("dev", "lab"), "n1"
    # Over 100 KB, so the bundle travels in chunks and the agent subscribes to chunk topics too.
    big = build_bundle(cartpole_teacher_model(units=5000), policy="CartPole-v1", version=3, parent_version=None,
                       observation_space=OBS, action_space={"type": "Discrete", "n": 2}, signing_key=signing,
                       target_tier="edge", output_names=("action", "logits"))
    assert len(big.to_bytes()) > 100 * 1024
    micro = build_bundle(cartpole_teacher_model(units=16, out_scale=0.25), policy="CartPole-v1-micro", version=3,
                         parent_version=None, observation_space=OBS, action_space={"type": "Discrete", "n": 2},
                         signing_key=signing, target_tier="device", output_names=("action", "logits"))
    config = agent_config(tmp_path, node, keys / "strata-signing.pub", broker.url, fleet=fleet,
                          serve_devices=True, experience_steps=20)
    # The learner's clients: an experience ingester (shared subscription, receipts) and its policy publisher.
    ingester = ExperienceIngester(
        IngestConfig(broker=broker.url, fleet=fleet, spool=str(tmp_path / "spool.sqlite"), spaces="-"),
        spec=ExperienceSpec(observation_space=OBS, action_space={"type": "Discrete", "n": 2})).start()
    learner_publisher = Publisher(broker=broker.url, fleet=fleet,
                                  client_id=mqtt_client_id("learner", fleet=fleet, node="publisher"))
    with running_agents([config]) as (agent,):
        learner_publisher.publish(big)
        assert agent.wait_for_version(3, timeout=120)
        wait_until(lambda: agent.gateway is not None and agent.gateway.connected, what="gateway link")
        with Publisher(broker=broker.url, fleet=fleet) as cloud:  # the fleet's device bundle, relayed retained
            cloud.publish_device_bundle(micro)
        device = DeviceConfig(broker=broker.url, fleet=fleet, edge_node=node, device_id="d1", threshold=0.5,
                              budget_ms=60_000.0)
        with DeviceRuntime(device, trust=trust) as runtime:
            assert runtime.wait_for_policy(60).manifest.target_tier == "device"
            decision = runtime.controller().decide(np.array([0.0, 0.0, 0.001, 0.0], np.float32))
        assert decision.tier == "edge"
        wait_until(lambda: agent.counters.telemetry_records >= 1 and agent.counters.receipts >= 1,
                   what="telemetry sent, experience records receipted by the learner")
    ingester.close()
    learner_publisher.close()
    # The agent hosts its gateway on its own link; a gateway run on its own connects as itself.
    from edge._gateway import EdgeGateway, GatewayConfig

    EdgeGateway(GatewayConfig(broker=broker.url, fleet=fleet, node=node), policy_source=lambda: None,
                trust=trust).start().close()
    clients = {mqtt_client_id(r, fleet=fleet, node=node, device="d1") for r in ("agent", "gateway", "device")}
    learners = {mqtt_client_id("learner", fleet=fleet, node=name) for name in ("ingest-0", "publisher")}
    broker.stop()  # flush the log
    log = broker.log_path.read_text()
    learner_ops = broker_operations(log, learners)
    learner_doc = learner_policy_document(partition="aws", region="us-east-1", account="123456789012", fleet=fleet)
    assert [op for op in learner_ops if not allowed(learner_doc, op[0], op[2])] == []
    assert {a for a, _, _ in learner_ops} == {"iot:Connect", "iot:Subscribe", "iot:Receive", "iot:Publish",
                                              "iot:RetainPublish"}
    learner_used = {p for a, _, r in learner_ops for p in used_grants(learner_doc, a, r)}
    assert [p for s in learner_doc["Statement"] for p in s["Resource"] if p not in learner_used] == []
    ops = broker_operations(log, clients)
    doc = policy_document(partition="aws", region="us-east-1", account="123456789012", fleet=fleet, node=node)
    refused = [op for op in ops if not allowed(doc, op[0], op[2])]
    assert refused == []
    kinds = {(a, c) for a, c, _ in ops}
    assert {("iot:Connect", c) for c in clients} <= kinds and ("iot:RetainPublish", f"{fleet}.{node}") in kinds
    used = {p for a, _, r in ops for p in used_grants(doc, a, r)}
    unused = [p for s in doc["Statement"] if s["Action"] != "iot:Receive" for p in s["Resource"] if p not in used]
    assert unused == []  # nothing is granted that no client does
