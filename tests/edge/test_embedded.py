"""The agent works on the embedded amqtt broker (what `strata demo` uses without a broker)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

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


def test_the_mqtt5_fallback_leaves_no_warning_but_other_refusals_still_say_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key, _ = make_keys(tmp_path / "keys")
    caplog.set_level(logging.WARNING, logger="amqtt")
    with EmbeddedBroker() as broker:
        with Publisher(broker=broker.url, fleet="demo") as publisher:
            publisher.publish(cartpole_bundle(key, 1))
            assert publisher.link.protocol == "3.1.1"  # it did try 5 first and fall back
        assert [r.getMessage() for r in caplog.records if r.name.startswith("amqtt")] == []
        # a CONNECT amqtt refuses for another reason (MQTT 3.1) is still reported, with its reason
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="old", protocol=mqtt.MQTTv31)
        refused = threading.Event()
        client.on_disconnect = lambda *_: refused.set()
        client.connect("127.0.0.1", broker.port)
        client.loop_start()
        try:
            assert refused.wait(30)
        finally:
            client.loop_stop()
    reasons = [r.getMessage() for r in caplog.records if r.name.startswith("amqtt")]
    assert any(m.startswith("Failed to initialize client session:") and "protocol name" in m for m in reasons), reasons


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
    # A budget no loaded machine misses: "the edge decided some" must not depend on how fast the round trip is.
    result = run_fleet_demo(cartpole_bundle(key, 3), trust=pub, work_dir=tmp_path / "edge", nodes=2, act_seconds=0.3,
                            device_bundle=micro, devices=2, device_steps=300, device_threshold=0.02,
                            device_budget_ms=5000.0)
    assert [d["device"] for d in result.devices] == ["device-0", "device-1"]
    assert [d["edge"] for d in result.devices] == ["edge-0", "edge-1"]
    for d in result.devices:
        assert d["steps"] == 300 and d["policy_version"] == 1
        tiers = d["by_tier"]
        assert isinstance(tiers, dict) and tiers["device"] > 0 and tiers["edge"] > 0  # both tiers decided


def test_clients_that_connect_while_others_subscribe_keep_their_session(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    # amqtt 0.12 walks its subscription map with awaits inside (retained messages on connect): a subscription made
    # meanwhile raised "dictionary changed size during iteration", killing the connecting client's session after
    # its CONNACK (a device then escalated into the void: CI, 2026-12-01). Retained messages make the walk yield.
    caplog.set_level(logging.ERROR)
    n = 24
    with EmbeddedBroker() as broker:
        seed = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        seed.connect("127.0.0.1", broker.port)
        seed.loop_start()
        for k in range(5):
            seed.publish(f"r/{k}", b"y" * 1000, qos=1, retain=True).wait_for_publish(5)
        seed.subscribe("r/#", qos=1)
        connects = [0] * n
        got = [threading.Event() for _ in range(n)]
        clients: list[mqtt.Client] = []

        def make(i: int) -> None:
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"race-{i}", protocol=mqtt.MQTTv311)

            def on_connect(c: mqtt.Client, *_: object) -> None:
                connects[i] += 1
                c.subscribe([(f"t/{i}/#", 1), (f"r/{i}", 1), ("all", 1)])

            def on_subscribe(*_: object) -> None:
                subscribed.release()

            client.on_connect = on_connect
            client.on_subscribe = on_subscribe
            client.on_message = lambda _c, _u, m: got[i].set() if m.topic == "all" else None
            client.connect("127.0.0.1", broker.port)
            client.loop_start()
            clients.append(client)

        subscribed = threading.Semaphore(0)
        try:
            threads = [threading.Thread(target=make, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for _ in range(n):  # every session lives on to answer its SUBSCRIBE
                assert subscribed.acquire(timeout=30), "a client's SUBSCRIBE was never answered"
            seed.publish("all", b"x", qos=1).wait_for_publish(5)
            assert all(g.wait(30) for g in got)
            assert connects == [1] * n  # nobody had to reconnect
            assert not [r for r in caplog.records if "changed size during iteration" in r.getMessage()
                        or (r.exc_info and "changed size" in str(r.exc_info[1]))]
        finally:
            for client in [*clients, seed]:
                client.loop_stop()
                client.disconnect()
