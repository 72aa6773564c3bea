"""Devices as identities on the secure broker of `strata broker config --devices`, with a real Mosquitto.

The whole path with passwords and ACLs: `strata publish --tier device` (cloud user) -> the edge gateway (the
node's user ``e1``, as when it shares the agent's connection) verifies and relays -> `strata device run
--username d1 --password-file ...` receives it and escalates to the gateway. Then what the ACL forbids: a wrong
password, a device acting as another, and a user that may not relay (the failure is logged and reported).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from device import (
    Bundle,
    DeviceConfig,
    DeviceRunError,
    DeviceRuntime,
    TrustStore,
    build_bundle,
    generate_keypair,
    load_public_key,
    load_signing_key,
)
from tests._cli import run_strata
from tests.conftest import MosquittoFactory
from tests.device._models import mlp_policy

edge = pytest.importorskip("edge")
from edge._broker_config import BrokerFiles, write_broker_config  # noqa: E402
from edge._gateway import EdgeGateway, GatewayConfig  # noqa: E402
from edge._policy import OnnxPolicy  # noqa: E402

OBS = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}
FLEET = "secure"


def _bundle(keys: Path, *, tier: str, version: int, hidden: tuple[int, ...]) -> Bundle:
    return build_bundle(mlp_policy(seed=version, hidden=hidden), policy=f"cartpole-{tier}", version=version,
                        parent_version=None, observation_space=OBS, action_space={"type": "Discrete", "n": 2},
                        signing_key=load_signing_key(keys / "strata-signing.key"), target_tier=tier,  # type: ignore[arg-type]
                        output_names=("action", "logits"))


@pytest.fixture
def secure(tmp_path: Path, mosquitto_factory: MosquittoFactory) -> tuple[BrokerFiles, str, Path]:
    files = write_broker_config(tmp_path / "broker", fleet=FLEET, nodes=["e1"], devices=["d1", "d2"])
    broker = mosquitto_factory([f"password_file {files.passwd}", f"acl_file {files.acl}",
                                "use_username_as_clientid true"], anonymous=False)
    keys = tmp_path / "keys"
    generate_keypair(keys)
    return files, broker.url, keys


def _gateway(files: BrokerFiles, url: str, keys: Path, *, user: str, confirm_s: float = 10.0) -> EdgeGateway:
    policy = OnnxPolicy(_bundle(keys, tier="edge", version=3, hidden=(16,)))
    password = files.credentials[user].read_text().strip()
    config = GatewayConfig(broker=url, fleet=FLEET, node="e1", username=user, password=password,
                           relay_confirm_s=confirm_s)
    return EdgeGateway(config, policy_source=lambda: policy,
                       trust=TrustStore([load_public_key(keys / "strata-signing.pub")])).start(connect_timeout=60)


def _publish_micro(files: BrokerFiles, url: str, keys: Path, tmp_path: Path) -> Path:
    path = tmp_path / "micro.bundle"
    path.write_bytes(_bundle(keys, tier="device", version=1, hidden=(8,)).to_bytes())
    proc = run_strata("publish", str(path), "--tier", "device", "--broker", url, "--fleet", FLEET, "--username",
                      "cloud", "--password-file", str(files.credentials["cloud"]))
    assert proc.returncode == 0, proc.stderr
    assert f"to strata/{FLEET}/device-policy" in proc.stdout
    return path


def test_device_run_on_the_secure_broker(secure: tuple[BrokerFiles, str, Path], tmp_path: Path) -> None:
    files, url, keys = secure
    acl = files.acl.read_text()
    assert f"topic write strata/{FLEET}/nodes/e1/experience\ntopic read strata/{FLEET}/device-policy" in acl
    assert f"user d1\ntopic read strata/{FLEET}/edges/+/device-policy" in acl
    gateway = _gateway(files, url, keys, user="e1")
    try:
        _publish_micro(files, url, keys, tmp_path)
        proc = run_strata("device", "run", "--env", "CartPole-v1", "--steps", "40", "--broker", url, "--fleet", FLEET,
                          "--edge-node", "e1", "--device-id", "d1", "--username", "d1", "--password-file",
                          str(files.credentials["d1"]), "--trust", str(keys / "strata-signing.pub"),
                          "--threshold", "1.0", "--budget-ms", "5000", timeout=300)
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert summary["policy"] == "cartpole-device" and summary["steps"] == 40
        assert summary["by_tier"]["edge"] >= 1  # threshold 1.0: escalations answered through the ACL
        assert gateway.counters.relay_failures == 0 and gateway.relay_error is None
    finally:
        gateway.close()


def test_what_the_acl_forbids(secure: tuple[BrokerFiles, str, Path], tmp_path: Path,
                              caplog: pytest.LogCaptureFixture) -> None:
    files, url, keys = secure
    trust = TrustStore([load_public_key(keys / "strata-signing.pub")])
    # A wrong password is refused with the fix named.
    (tmp_path / "wrong").write_text("not-the-password\n")
    bad = DeviceConfig(broker=url, fleet=FLEET, edge_node="e1", device_id="d1", username="d1",
                       password_file=str(tmp_path / "wrong"))
    with pytest.raises(DeviceRunError, match=r"refused the connection: Not authorized.*--password-file"):
        DeviceRuntime(bad, trust=trust).connect()
    # A user that may not relay device bundles (here a device's): the broker drops the relay, the gateway says so.
    with caplog.at_level(logging.WARNING, logger="edge._gateway"):
        gateway = _gateway(files, url, keys, user="d1", confirm_s=2.0)
        try:
            assert gateway.relay(_bundle(keys, tier="device", version=1, hidden=(8,)).to_bytes())
            deadline = time.monotonic() + 60
            while gateway.counters.relay_failures == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert gateway.counters.relayed == 1 and gateway.counters.relay_failures == 1
            assert gateway.relay_error is not None and "was not read back within 2 s" in gateway.relay_error
        finally:
            gateway.close()
    assert any("may 'd1' write and read that topic" in r.getMessage() for r in caplog.records)
    # d1's credentials with another device's id: its requests to d2's topics are dropped, so it falls back.
    _publish_micro(files, url, keys, tmp_path)
    gateway = _gateway(files, url, keys, user="e1")
    try:
        as_d2 = DeviceConfig(broker=url, fleet=FLEET, edge_node="e1", device_id="d2", username="d1",
                             password_file=str(files.credentials["d1"]), budget_ms=300.0, threshold=1.0)
        with DeviceRuntime(as_d2, trust=trust) as runtime:
            assert runtime.wait_for_policy(60).manifest.version == 1  # reading bundles is allowed
            d = runtime.controller().decide(np.array([0.0, 0.1, 0.0, 0.0], np.float32))
        assert d.tier == "device-fallback"
        assert gateway.counters.served == 0
    finally:
        gateway.close()


def test_broker_config_cli_writes_device_and_gateway_identities(tmp_path: Path) -> None:
    generate_keypair(tmp_path / "keys")
    proc = run_strata("broker", "config", "--out", str(tmp_path / "b"), "--fleet", FLEET, "--nodes", "e1,e2",
                      "--devices", "d1", "--kits", str(tmp_path / "kits"), "--trust",
                      str(tmp_path / "keys" / "strata-signing.pub"))
    assert proc.returncode == 0, proc.stderr
    creds = sorted(p.name for p in (tmp_path / "b" / "credentials").iterdir())
    assert creds == ["cloud.password", "d1.password", "e1.password", "e2.password"]
    acl = (tmp_path / "b" / "acl").read_text()
    assert f"topic write strata/{FLEET}/nodes/e2/experience\ntopic read strata/{FLEET}/device-policy\n" \
           f"topic readwrite strata/{FLEET}/edges/e2/device-policy" in acl
    assert f"topic write strata/{FLEET}/edges/+/devices/d1/request\ntopic read strata/{FLEET}/edges/+/devices/d1/" \
           "reply" in acl
    kit = tmp_path / "kits" / "e1"
    toml = (kit / "edge.toml").read_text()
    assert "serve_devices = true" in toml


def test_a_failed_relay_shows_in_the_nodes_status(tmp_path: Path, mosquitto_factory: MosquittoFactory) -> None:
    """An edge agent serving devices on a broker configured without --devices may not relay: its node status (what
    `strata fleet` shows) carries the gateway's relay error instead of staying silent."""
    from tests.edge._agents import agent_config, running_agents, wait_until

    files = write_broker_config(tmp_path / "broker", fleet=FLEET, nodes=["e1"])  # no --devices: no relay topics
    broker = mosquitto_factory([f"password_file {files.passwd}", f"acl_file {files.acl}",
                                "use_username_as_clientid true"], anonymous=False)
    keys = tmp_path / "keys"
    generate_keypair(keys)
    config = agent_config(tmp_path, "e1", keys / "strata-signing.pub", broker.url, fleet=FLEET, serve_devices=True,
                          username="e1", password_file=str(files.credentials["e1"]))
    with running_agents([config]) as (agent,):
        wait_until(lambda: agent.gateway is not None and agent.gateway.connected, what="gateway link")
        assert agent.gateway is not None
        assert agent.gateway.relay(_bundle(keys, tier="device", version=1, hidden=(8,)).to_bytes())
        wait_until(lambda: agent.status().last_error is not None, timeout=60, what="the relay error in the status")
        assert "relay of device bundle cartpole-device v1" in (agent.status().last_error or "")
        assert agent.gateway.counters.relay_failures == 1
