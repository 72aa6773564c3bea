"""The agent works on the embedded amqtt broker (what `strata demo` uses without a broker)."""

from __future__ import annotations

from pathlib import Path

from edge import EmbeddedBroker, FleetMonitor, Publisher
from tests.edge._agents import agent_config, running_agents, wait_until
from tests.edge._policies import cartpole_bundle, make_keys


def test_agents_switch_on_the_embedded_broker(tmp_path: Path) -> None:
    key, pub = make_keys(tmp_path / "keys")
    with EmbeddedBroker() as broker:
        configs = [agent_config(tmp_path, f"n{i}", pub, broker.url, fleet="demo") for i in range(2)]
        with running_agents(configs) as agents, Publisher(broker=broker.url, fleet="demo") as publisher:
            publisher.publish(cartpole_bundle(key, 1))
            assert publisher.link.protocol == "3.1.1"  # amqtt refuses MQTT 5: the publisher fell back
            wait_until(lambda: all(a.version == 1 for a in agents), timeout=30, what="both on v1")
            publisher.publish(cartpole_bundle(key, 2))
            wait_until(lambda: all(a.version == 2 for a in agents), timeout=30, what="both on v2")
            with FleetMonitor(broker=broker.url, fleet="demo") as monitor:
                wait_until(lambda: sorted((v.node, v.version) for v in monitor.snapshot()) == [("n0", 2), ("n1", 2)],
                           timeout=30, what="fleet view")


def test_run_fleet_demo_on_the_embedded_broker(tmp_path: Path) -> None:
    from edge import run_fleet_demo

    key, pub = make_keys(tmp_path / "keys")
    result = run_fleet_demo(cartpole_bundle(key, 3), trust=pub, work_dir=tmp_path / "edge", nodes=2,
                            act_seconds=0.3)
    assert [(v.node, v.version, v.online) for v in result.views] == [("edge-0", 3, True), ("edge-1", 3, True)]
    assert all(v.steps for v in result.views)
    assert "edge-0" in result.table


def test_run_fleet_demo_serves_devices_that_escalate_to_their_edge(tmp_path: Path) -> None:
    from edge import run_fleet_demo

    key, pub = make_keys(tmp_path / "keys")
    micro = cartpole_bundle(key, 1, policy="cartpole-micro", target_tier="device")
    result = run_fleet_demo(cartpole_bundle(key, 3), trust=pub, work_dir=tmp_path / "edge", nodes=2, act_seconds=0.3,
                            device_bundle=micro, devices=2, device_steps=300, device_threshold=0.02)
    assert [d["device"] for d in result.devices] == ["device-0", "device-1"]
    assert [d["edge"] for d in result.devices] == ["edge-0", "edge-1"]
    for d in result.devices:
        assert d["steps"] == 300 and d["policy_version"] == 1
        tiers = d["by_tier"]
        assert isinstance(tiers, dict) and tiers["device"] > 0 and tiers["edge"] > 0  # both tiers decided
