"""Who connects as what, and publishes or subscribes to which strata MQTT topic: the one table of it.

Every topic string of strata is built from `MQTT_TOPICS` (``edge._topics.FleetTopics`` and `DeviceTopics` format
these patterns), every client id from `mqtt_client_id`, and the AWS IoT policy of an edge node
(``infra._iot.policy_document``) is derived from `MQTT_ACCESS`, so the topics the agents use and the operations
the policy grants cannot drift apart. It lives in the device tier because the edge agent, the device
runtime and infra all build on it (infra may not import edge).

Patterns are relative to ``strata/{fleet}/``; ``{node}`` is the edge node, ``{device}`` a terminal device,
``{policy}`` a policy name, ``{index}`` a chunk index:

    role      op         topic                                   retained   note
    agent     subscribe  announce, control, nodes/{node}/control            exact topics (IoT Core sends
              subscribe  policies/{policy}/latest | chunks/{index}          retained messages only to those)
              subscribe  nodes/{node}/receipt                               the learner's receipts of its experience
              publish    nodes/{node}/status                     yes        also the last will
              publish    nodes/{node}/telemetry | experience
    gateway   subscribe  device-policy, edges/{node}/devices/+/request      the one wildcard filter
              publish    edges/{node}/device-policy              yes
              publish    edges/{node}/devices/{device}/reply
    device    subscribe  edges/{node}/device-policy, edges/{node}/devices/{device}/reply
              publish    edges/{node}/devices/{device}/request
    learner   subscribe  nodes/+/experience                                 shared (MQTT 5 ``$share/{group}/``), so
                                                                            several ingesters split the fleet
              publish    nodes/{node}/receipt                               for any node: receipts of its records
              publish    announce, policies/{policy}/latest      yes        the policy the fleet acts with
                         | chunks/{index}

The learner's rows (the cloud's experience ingesters and the policy publisher of an ``edge``-mode run) are not
a node's: a node's IoT policy never grants them, so no node reads another node's experience or forges a receipt.

Client ids carry the fleet (``{fleet}.{node}``, ``{fleet}.{node}.gateway``, ``{fleet}.{node}.device.{device}``,
``{fleet}.learner.{name}``): two fleets on one broker, or two stages of one AWS account (their fleets are
``{stage}.{fleet}``), never take over each other's sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

MQTT_PREFIX = "strata"

MqttTopicName: TypeAlias = Literal[
    "announce", "control", "policy_latest", "policy_chunk", "node_status", "node_telemetry", "node_experience",
    "node_receipt", "node_control", "fleet_device_policy", "device_policy", "device_request", "device_reply"]

MQTT_TOPICS: dict[MqttTopicName, str] = {
    "announce": "announce",
    "control": "control",
    "policy_latest": "policies/{policy}/latest",
    "policy_chunk": "policies/{policy}/chunks/{index}",
    "node_status": "nodes/{node}/status",
    "node_telemetry": "nodes/{node}/telemetry",
    "node_experience": "nodes/{node}/experience",
    "node_receipt": "nodes/{node}/receipt",
    "node_control": "nodes/{node}/control",
    "fleet_device_policy": "device-policy",
    "device_policy": "edges/{node}/device-policy",
    "device_request": "edges/{node}/devices/{device}/request",
    "device_reply": "edges/{node}/devices/{device}/reply",
}
"""Every strata topic under ``strata/{fleet}/``, by name."""

MqttRole: TypeAlias = Literal["agent", "gateway", "device", "learner"]
Operation: TypeAlias = Literal["publish", "subscribe"]
ROLES: tuple[MqttRole, ...] = ("agent", "gateway", "device", "learner")
NODE_ROLES: tuple[MqttRole, ...] = ("agent", "gateway", "device")
"""The roles of an edge node's clients (what a node's IoT policy grants); ``learner`` is the cloud's."""


@dataclass(frozen=True, kw_only=True)
class MqttAccess:
    """One MQTT operation a client of an edge node performs."""

    role: MqttRole
    op: Operation
    topic: MqttTopicName
    retain: bool = False
    """Published retained (AWS IoT Core needs ``iot:RetainPublish`` for it)."""
    will: bool = False
    """Also the client's last will (published retained by the broker when the client vanishes)."""
    wildcard: tuple[str, ...] = ()
    """Placeholders subscribed with the MQTT ``+`` wildcard rather than a value (for a publish: placeholders the
    client fills with any value, e.g. the learner's receipts to every node)."""
    shared: bool = False
    """Subscribed as an MQTT 5 shared subscription ``$share/{group}/{filter}`` (on a 3.1.1-only broker: the plain
    filter, by one client)."""


MQTT_ACCESS: tuple[MqttAccess, ...] = (
    MqttAccess(role="agent", op="subscribe", topic="announce"),
    MqttAccess(role="agent", op="subscribe", topic="control"),
    MqttAccess(role="agent", op="subscribe", topic="node_control"),
    MqttAccess(role="agent", op="subscribe", topic="policy_latest"),
    MqttAccess(role="agent", op="subscribe", topic="policy_chunk"),
    MqttAccess(role="agent", op="subscribe", topic="node_receipt"),
    MqttAccess(role="agent", op="publish", topic="node_status", retain=True, will=True),
    MqttAccess(role="agent", op="publish", topic="node_telemetry"),
    MqttAccess(role="agent", op="publish", topic="node_experience"),
    MqttAccess(role="gateway", op="subscribe", topic="fleet_device_policy"),
    MqttAccess(role="gateway", op="subscribe", topic="device_request", wildcard=("device",)),
    MqttAccess(role="gateway", op="publish", topic="device_policy", retain=True),
    MqttAccess(role="gateway", op="publish", topic="device_reply"),
    MqttAccess(role="device", op="subscribe", topic="device_policy"),
    MqttAccess(role="device", op="subscribe", topic="device_reply"),
    MqttAccess(role="device", op="publish", topic="device_request"),
    MqttAccess(role="learner", op="subscribe", topic="node_experience", wildcard=("node",), shared=True),
    MqttAccess(role="learner", op="publish", topic="node_receipt", wildcard=("node",)),
    MqttAccess(role="learner", op="publish", topic="announce", retain=True),
    MqttAccess(role="learner", op="publish", topic="policy_latest", retain=True, wildcard=("policy",)),
    MqttAccess(role="learner", op="publish", topic="policy_chunk", retain=True, wildcard=("policy", "index")),
)
"""Every operation the agent, the device gateway and the devices of one edge node perform, and the learner's."""

SHARE_GROUP = "strata-learner"
"""Default group of the learner's shared subscription (``$share/{group}/...``)."""


def mqtt_topic(fleet: str, name: MqttTopicName, **values: str | int) -> str:
    """``strata/{fleet}/`` plus the pattern `name` with `values` filled in (the caller validates the segments)."""
    return f"{MQTT_PREFIX}/{fleet}/" + MQTT_TOPICS[name].format(**values)


def shared_filter(group: str, topic_filter: str) -> str:
    """The MQTT 5 shared-subscription filter ``$share/{group}/{topic_filter}``."""
    return f"$share/{group}/{topic_filter}"


def mqtt_client_id(role: MqttRole, *, fleet: str, node: str, device: str = "") -> str:
    """The MQTT client id of `role` on edge node `node` of `fleet` (`device` names the device for ``"device"``).

    For ``"learner"``, `node` is the name of the learner's client (an ingester: ``ingest-0``, the publisher).
    """
    if role == "agent":
        return f"{fleet}.{node}"
    if role == "gateway":
        return f"{fleet}.{node}.gateway"
    if role == "device":
        return f"{fleet}.{node}.device.{device}"
    if role == "learner":
        return f"{fleet}.learner.{node}"
    raise ValueError(f"mqtt_client_id: role must be one of {ROLES}, got {role!r}")
