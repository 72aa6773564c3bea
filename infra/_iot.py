"""AWS IoT Core for edge nodes: the per-node policy, derived from the MQTT access table, and the credentials file.

What a node's clients do on MQTT is one table in the device tier (``device._mqtt_access.MQTT_ACCESS``), the
same one the edge agent, the device gateway and the devices build their topics and client ids from; the
policy grants exactly that, with IoT's ``*`` where a topic has a free segment (policy name, chunk index,
device id):

    iot:Connect        client/{fleet}.{node}, client/{fleet}.{node}.gateway, client/{fleet}.{node}.device.*
    iot:Subscribe      topicfilter/... of every subscription (the gateway's ``devices/+/request`` included)
    iot:Receive        topic/... of the same subscriptions
    iot:Publish        topic/... of every publish and last will
    iot:RetainPublish  topic/... of the retained ones: the node's status (and its last will), the relayed
                       device bundle; IoT Core refuses a retained publish without it

The learner (the cloud's experience ingesters and the publisher of an ``edge``-mode run) has a policy of its own,
derived from the learner rows of the same table (`learner_policy_document`): it connects as
``{fleet}.learner.*``, subscribes to every node's experience through a shared subscription (``iot:Subscribe`` on
``topicfilter/$share/{group}/...nodes/*/experience``, ``iot:Receive`` on ``topic/...nodes/*/experience``, as IoT
Core authorises shared subscriptions), publishes receipts to every node and the fleet's policies. No node policy
grants any of it.

Two stages of one account must never share a topic or a client id, so a stage's MQTT fleet is
``{stage}.{fleet}`` (`iot_fleet`; a stage has no ``.``) and every client id starts with it.

The credentials file (`write_credentials`) is what ``strata edge run`` reads to reach IoT Core over
mutual TLS: JSON with the endpoint, port, client id, fleet, node, the certificate and private key PEMs,
and the names of the same PEMs written next to it (paho's ``tls_set`` takes file paths), relative to the
credentials file's own folder, so the folder works wherever it is copied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from device import MqttAccess, MqttRole, identifier, inside, mqtt_client_id, mqtt_topic, write_atomic
from device._mqtt_access import MQTT_ACCESS, NODE_ROLES, SHARE_GROUP, shared_filter

CREDENTIALS_SCHEMA = 1
MQTT_TLS_PORT = 8883
AMAZON_ROOT_CA_URL = "https://www.amazontrust.com/repository/AmazonRootCA1.pem"
_ROLES: tuple[MqttRole, ...] = NODE_ROLES


def iot_fleet(stage: str, fleet: str) -> str:
    """The MQTT fleet of `fleet` in `stage` on AWS IoT Core: ``{stage}.{fleet}`` (stages share the account)."""
    return f"{stage}.{fleet}"


def _topic(fleet: str, node: str, access: MqttAccess) -> str:
    """The topic of `access` for `node`, with IoT's ``*`` for every segment the node does not fix."""
    return mqtt_topic(fleet, access.topic, node=node, device="*", policy="*", index="*")


def node_grants(fleet: str, node: str) -> dict[str, list[str]]:
    """IoT action -> the client ids, topic filters or topics (without the ARN head) one node's clients need."""
    grants: dict[str, list[str]] = {
        "iot:Connect": [f"client/{mqtt_client_id(role, fleet=fleet, node=node, device='*')}" for role in _ROLES],
        "iot:Subscribe": [], "iot:Receive": [], "iot:Publish": [], "iot:RetainPublish": []}
    for access in MQTT_ACCESS:
        if access.role not in _ROLES:
            continue
        topic = _topic(fleet, node, access)
        if access.op == "subscribe":
            grants["iot:Subscribe"].append(f"topicfilter/{topic}")
            grants["iot:Receive"].append(f"topic/{topic}")
        else:
            grants["iot:Publish"].append(f"topic/{topic}")
            if access.retain or access.will:
                grants["iot:RetainPublish"].append(f"topic/{topic}")
    return {action: sorted(set(resources)) for action, resources in grants.items()}


def learner_grants(fleet: str, *, group: str = SHARE_GROUP) -> dict[str, list[str]]:
    """IoT action -> what the learner's clients need (the ``learner`` rows of the table; free segments are ``*``)."""
    grants: dict[str, list[str]] = {
        "iot:Connect": [f"client/{mqtt_client_id('learner', fleet=fleet, node='*')}"],
        "iot:Subscribe": [], "iot:Receive": [], "iot:Publish": [], "iot:RetainPublish": []}
    for access in MQTT_ACCESS:
        if access.role != "learner":
            continue
        topic = mqtt_topic(fleet, access.topic, node="*", device="*", policy="*", index="*")
        if access.op == "subscribe":
            grants["iot:Subscribe"].append(f"topicfilter/{shared_filter(group, topic) if access.shared else topic}")
            grants["iot:Receive"].append(f"topic/{topic}")
        else:
            grants["iot:Publish"].append(f"topic/{topic}")
            if access.retain:
                grants["iot:RetainPublish"].append(f"topic/{topic}")
    return {action: sorted(set(resources)) for action, resources in grants.items()}


_SIDS = {"iot:Connect": "ConnectAsItsClients", "iot:Subscribe": "SubscribeFleetAndOwn",
         "iot:Receive": "ReceiveFleetAndOwn", "iot:Publish": "PublishOwnOnly",
         "iot:RetainPublish": "RetainOwnStatusAndRelay"}


def policy_document(*, partition: str, region: str, account: str, fleet: str, node: str) -> dict[str, Any]:
    """The IoT policy of one node (`fleet` is the MQTT fleet, `iot_fleet`): exactly what `node_grants` lists."""
    arn = f"arn:{partition}:iot:{region}:{account}"
    return {
        "Version": "2012-10-17",
        "Statement": [{"Sid": _SIDS[action], "Effect": "Allow", "Action": action,
                       "Resource": [f"{arn}:{r}" for r in resources]}
                      for action, resources in node_grants(fleet, node).items()],
    }


_LEARNER_SIDS = {"iot:Connect": "ConnectAsLearnerClients", "iot:Subscribe": "SubscribeFleetExperienceShared",
                 "iot:Receive": "ReceiveFleetExperience", "iot:Publish": "PublishReceiptsAndPolicies",
                 "iot:RetainPublish": "RetainPolicies"}


def learner_policy_document(*, partition: str, region: str, account: str, fleet: str,
                            group: str = SHARE_GROUP) -> dict[str, Any]:
    """The IoT policy of the learner's identity for `fleet` (the MQTT fleet): exactly what `learner_grants` lists."""
    arn = f"arn:{partition}:iot:{region}:{account}"
    return {
        "Version": "2012-10-17",
        "Statement": [{"Sid": _LEARNER_SIDS[action], "Effect": "Allow", "Action": action,
                       "Resource": [f"{arn}:{r}" for r in resources]}
                      for action, resources in learner_grants(fleet, group=group).items()],
    }


def credentials_path(state_dir: Path, stage: str, node: str) -> Path:
    """Where the credentials file of `node` in `stage` lives (absolute, inside `state_dir`)."""
    return inside(state_dir, identifier(stage, what="stage"), "iot", identifier(node, what="node"),
                  "credentials.json", what="node credentials")


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by the owner only, through a temp file renamed into place."""
    write_atomic(path, text, mode=0o600)


def write_credentials(path: Path, *, endpoint: str, client_id: str, fleet: str, node: str, stage: str,
                      certificate_arn: str, certificate_pem: str, private_key_pem: str) -> Path:
    """Write a node's credentials file (and its two PEM files next to it); return the file's path."""
    cert_path = path.with_name("certificate.pem.crt")
    key_path = path.with_name("private.pem.key")
    _write_private(cert_path, certificate_pem)
    _write_private(key_path, private_key_pem)
    payload = {
        "schema": CREDENTIALS_SCHEMA,
        "kind": "strata-aws-iot-credentials",
        "endpoint": endpoint,
        "port": MQTT_TLS_PORT,
        "client_id": client_id,
        "fleet": fleet,
        "node": node,
        "stage": stage,
        "certificate_arn": certificate_arn,
        "certificate_pem": certificate_pem,
        "private_key_pem": private_key_pem,
        "certificate_file": cert_path.name,  # relative to this file's folder: the folder travels to the node
        "private_key_file": key_path.name,
        "ca_url": AMAZON_ROOT_CA_URL,
    }
    _write_private(path, json.dumps(payload, indent=2) + "\n")
    return path


def remove_credentials(path: Path) -> None:
    """Delete a node's credentials file and PEMs (after its certificate was deleted)."""
    for p in (path, path.with_name("certificate.pem.crt"), path.with_name("private.pem.key")):
        p.unlink(missing_ok=True)
    if path.parent.exists() and not any(path.parent.iterdir()):
        path.parent.rmdir()
