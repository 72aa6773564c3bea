"""AWS IoT Core for edge nodes: the per-node policy that mirrors the Mosquitto ACL, and the credentials file.

The topic layout is edge's contract (``edge/_topics.py``, ``strata/{fleet}/...``). infra may not import
edge (ARCHITECTURE's dependency direction), so the few topic strings a policy needs are written once here
and a test compares them with ``edge._topics.FleetTopics``:

    node reads   strata/{fleet}/announce, strata/{fleet}/control, strata/{fleet}/policies/*,
                 strata/{fleet}/nodes/{node}/control
    node writes  strata/{fleet}/nodes/{node}/status | telemetry | experience   (status is also its last will)

The credentials file (`write_credentials`) is what ``strata edge run`` reads to reach IoT Core over
mutual TLS: JSON with the endpoint, port, client id, fleet, node, the certificate and private key PEMs,
and the paths of the same PEMs written next to it (paho's ``tls_set`` takes file paths).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from device import write_atomic

TOPIC_PREFIX = "strata"
CREDENTIALS_SCHEMA = 1
MQTT_TLS_PORT = 8883
AMAZON_ROOT_CA_URL = "https://www.amazontrust.com/repository/AmazonRootCA1.pem"

NODE_READS = ("announce", "control", "policies/*")
"""Fleet-level topics (under ``strata/{fleet}/``) every node subscribes to; ``*`` is IoT's policy wildcard."""
NODE_OWN_READS = ("control",)
"""Per-node topics (under ``strata/{fleet}/nodes/{node}/``) the node subscribes to."""
NODE_OWN_WRITES = ("status", "telemetry", "experience")
"""Per-node topics (under ``strata/{fleet}/nodes/{node}/``) the node publishes to; nothing else."""


def node_topics(fleet: str, node: str) -> tuple[list[str], list[str]]:
    """``(topics the node reads, topics the node writes)``, with IoT's ``*`` wildcard where edge has one."""
    root = f"{TOPIC_PREFIX}/{fleet}"
    reads = [f"{root}/{t}" for t in NODE_READS] + [f"{root}/nodes/{node}/{t}" for t in NODE_OWN_READS]
    writes = [f"{root}/nodes/{node}/{t}" for t in NODE_OWN_WRITES]
    return reads, writes


def policy_document(*, partition: str, region: str, account: str, fleet: str, node: str,
                    client_id: str) -> dict[str, Any]:
    """The IoT policy of one node: connect as itself, read the fleet's policy topics, write only its own."""
    arn = f"arn:{partition}:iot:{region}:{account}"
    reads, writes = node_topics(fleet, node)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ConnectAsItself", "Effect": "Allow", "Action": "iot:Connect",
             "Resource": f"{arn}:client/{client_id}"},
            {"Sid": "SubscribeFleetAndOwn", "Effect": "Allow", "Action": "iot:Subscribe",
             "Resource": [f"{arn}:topicfilter/{t}" for t in reads]},
            {"Sid": "ReceiveFleetAndOwn", "Effect": "Allow", "Action": "iot:Receive",
             "Resource": [f"{arn}:topic/{t}" for t in reads]},
            {"Sid": "PublishOwnOnly", "Effect": "Allow", "Action": "iot:Publish",
             "Resource": [f"{arn}:topic/{t}" for t in writes]},
        ],
    }


def credentials_path(state_dir: Path, stage: str, node: str) -> Path:
    """Where the credentials file of `node` in `stage` lives."""
    return state_dir / stage / "iot" / node / "credentials.json"


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
        "certificate_file": str(cert_path),
        "private_key_file": str(key_path),
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
