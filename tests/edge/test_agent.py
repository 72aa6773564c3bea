"""Edge agents against a real Mosquitto with real onnxruntime and gymnasium: updates, refusals, outages."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from device import SigningKey, build_bundle
from edge import Control, FleetMonitor, FleetTopics, MqttLink, Publisher
from edge._mqtt import LinkConfig
from tests._services import Mosquitto
from tests.conftest import MosquittoFactory
from tests.edge._agents import agent_config, running_agents, wait_subscribed, wait_until
from tests.edge._policies import ACT_SPACE, OBS_SPACE, cartpole_bundle, cartpole_model, make_keys

Keys = tuple[SigningKey, Path]


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return make_keys(tmp_path / "keys")


def test_a_new_version_reaches_every_agent(tmp_path: Path, mosquitto: Mosquitto, keys: Keys) -> None:
    key, pub = keys
    fleet = "switch"
    configs = [agent_config(tmp_path, f"n{i}", pub, mosquitto.url, fleet=fleet) for i in range(3)]
    with Publisher(broker=mosquitto.url, fleet=fleet) as publisher, running_agents(configs) as agents:
        publisher.publish(cartpole_bundle(key, 1))
        wait_until(lambda: all(a.version == 1 for a in agents), what="all agents on v1")
        publisher.publish(cartpole_bundle(key, 2))
        wait_until(lambda: all(a.version == 2 for a in agents), what="all agents on v2")
        wait_until(lambda: all(2 in a.counters.first_act_at for a in agents), what="decisions with v2")
        wait_until(lambda: all("persist" in a.counters.update_stages.get(2, {}) for a in agents), what="v2 traced")
        stages = agents[0].counters.update_stages[2]
        assert {"queued", "verify", "health_load", "health_latency", "install", "first_act", "critical_cpu"} <= set(
            stages) and all(v >= 0 for v in stages.values()), stages
        with FleetMonitor(broker=mosquitto.url, fleet=fleet) as monitor:
            wait_until(lambda: len(monitor.snapshot()) == 3 and all(
                v.online and v.version == 2 and v.lag == 0 for v in monitor.snapshot()), what="fleet view")


def test_bad_bundles_are_refused_and_the_running_policy_stays(tmp_path: Path, mosquitto: Mosquitto,
                                                              keys: Keys) -> None:
    key, pub = keys
    other_key, _ = make_keys(tmp_path / "other")
    fleet = "refuse"
    good2 = cartpole_bundle(key, 2)
    tampered = bytearray(cartpole_bundle(key, 3).to_bytes())
    tampered[-20] ^= 0x01
    expired = build_bundle(cartpole_model(), policy="cartpole", version=3, parent_version=2,
                           observation_space=OBS_SPACE, action_space=ACT_SPACE, signing_key=key, target_tier="edge",
                           ttl_s=5.0, clock=lambda: time.time() - 60, output_names=("action", "logits"))
    bad = [
        ("TamperedBundleError", bytes(tampered)),
        ("RollbackError", cartpole_bundle(key, 1).to_bytes()),
        ("ExpiredBundleError", expired.to_bytes()),
        ("WrongTierError", cartpole_bundle(key, 3, target_tier="device").to_bytes()),
        ("UnsignedBundleError", cartpole_bundle(None, 3).to_bytes()),
        ("UnknownKeyError", cartpole_bundle(other_key, 3).to_bytes()),
    ]
    with Publisher(broker=mosquitto.url, fleet=fleet) as publisher, \
            running_agents([agent_config(tmp_path, "n1", pub, mosquitto.url, fleet=fleet)]) as (agent,):
        publisher.publish(good2)
        wait_until(lambda: agent.version == 2, what="v2")
        for i, (error, data) in enumerate(bad, start=1):
            publisher.publish(data)
            wait_until(lambda i=i: len(agent.counters.refused) == i, what=f"refusal {error}")  # type: ignore[misc]
            assert agent.counters.refused[-1].startswith(error), agent.counters.refused[-1]
            assert agent.version == 2
        # a version that passes verification but fails its health check (NaN outputs) is reverted ...
        publisher.publish(cartpole_bundle(key, 3, model=cartpole_model(nan=True)))
        wait_until(lambda: len(agent.counters.health_failures) == 1, what="health failure")
        assert "is not finite" in agent.counters.health_failures[0]
        assert agent.version == 2
        # ... and does not block the next one
        publisher.publish(cartpole_bundle(key, 4))
        wait_until(lambda: agent.version == 4, what="v4 after a failed v3")
        # the status message reports the last problem until a policy loads, then clears it
        assert agent.last_error is None


def test_a_large_bundle_travels_in_chunks(tmp_path: Path, mosquitto: Mosquitto, keys: Keys) -> None:
    key, pub = keys
    fleet = "chunks"
    big = cartpole_bundle(key, 1, model=cartpole_model(pad_bytes=350_000))
    with Publisher(broker=mosquitto.url, fleet=fleet) as publisher:
        ann = publisher.publish(big)
    assert ann.chunks == 4
    # the agent starts after the publish: everything comes from retained messages on exact topics
    with running_agents([agent_config(tmp_path, "n1", pub, mosquitto.url, fleet=fleet)]) as (agent,):
        wait_until(lambda: agent.version == 1, what="chunked v1")


def test_malformed_payloads_are_logged_and_dropped(tmp_path: Path, mosquitto: Mosquitto, keys: Keys) -> None:
    key, pub = keys
    fleet = "garbage"
    topics = FleetTopics(fleet)
    with running_agents([agent_config(tmp_path, "n1", pub, mosquitto.url, fleet=fleet, policy="cartpole")]) as (
            agent,), MqttLink(LinkConfig(broker=mosquitto.url, client_id="vandal")).start() as vandal:
        assert vandal.wait_connected(60)
        wait_until(lambda: agent.link is not None and agent.link.connected, what="agent connected")
        # one at a time: the agent's inbox keeps only the newest payload per topic
        vandal.publish(topics.announce, b"{not json", retain=True)  # retained: arrives even if subscribed late
        wait_until(lambda: agent.counters.malformed >= 1, what="bad announcement dropped")
        vandal.publish(topics.control, b'{"kind": "control", "command": "format-disk", "issued_at": 0}')
        wait_until(lambda: agent.counters.malformed >= 2, what="bad control dropped")
        vandal.publish(topics.policy_latest("cartpole"), b'{"kind": "announcement"}')
        wait_until(lambda: agent.counters.malformed >= 3, what="bad chunk announcement dropped")
        vandal.publish(topics.policy_latest("cartpole"), b"STRB garbage")
        wait_until(lambda: len(agent.counters.refused) >= 1, what="garbage bundle refused")
        assert agent.counters.refused[0].startswith("BundleFormatError")
        vandal.publish(topics.node("n1", "control"), Control(command="status").encode())
        with Publisher(broker=mosquitto.url, fleet=fleet) as publisher:
            publisher.publish(cartpole_bundle(key, 1))
        wait_until(lambda: agent.version == 1, what="v1 after garbage")


def test_offline_start_then_the_outbox_drains_when_the_broker_appears(tmp_path: Path, mosquitto: Mosquitto,
                                                                      keys: Keys) -> None:
    key, pub = keys
    fleet = "offline"
    with Publisher(broker=mosquitto.url, fleet=fleet) as publisher:
        publisher.publish(cartpole_bundle(key, 1))
    with running_agents([agent_config(tmp_path, "n1", pub, mosquitto.url, fleet=fleet)]) as (agent,):
        wait_until(lambda: agent.version == 1, what="v1")
    # a broker that will come later; a persistent watcher session is set up on it first, so it queues the
    # telemetry that arrives before the watcher is back
    later = Mosquitto(tmp_path / "later", ["persistence true", "max_queued_messages 100000"])
    later.start()
    watcher = FleetMonitor(broker=later.url, fleet=fleet, client_id="watcher", persistent=True).start()
    assert watcher.link.wait_connected(60)
    wait_subscribed(watcher, later.url, fleet)  # the persistent session holds the subscription
    watcher.close()
    later.stop()
    # restart with no broker at all
    config = agent_config(tmp_path, "n1", pub, later.url, fleet=fleet, steps=300)
    with running_agents([config]) as (agent,):
        assert agent.version == 1  # acting on the cached policy right away
        wait_until(lambda: agent.counters.steps >= 300, what="300 offline steps")
        wait_until(lambda: agent.outbox.stats().pending >= 1, what="telemetry held on disk")
        assert agent.link is not None and not agent.link.connected
        later.start()
        try:
            wait_until(lambda: agent.outbox.stats().pending == 0, timeout=30, what="outbox drained")
            records = agent.counters.telemetry_records  # the run has ended: no more records
            with FleetMonitor(broker=later.url, fleet=fleet, client_id="watcher", persistent=True) as monitor:
                wait_until(lambda: len(monitor.telemetry.get("n1", {})) >= records, what="every record received")
                ids = sorted(monitor.telemetry["n1"])  # ids continue after the first run's records
                assert ids == list(range(ids[0], ids[0] + records))
        finally:
            later.stop()


def test_broker_restart_mid_telemetry_loses_and_duplicates_nothing(tmp_path: Path, mosquitto_factory: MosquittoFactory,
                                                                   keys: Keys) -> None:
    key, pub = keys
    fleet = "restart"
    broker = mosquitto_factory(["persistence true", "max_queued_messages 100000"])
    # a persistent monitor session: messages for it wait at the broker (and in its persistence file)
    monitor = FleetMonitor(broker=broker.url, fleet=fleet, client_id="monitor", persistent=True).start()
    assert monitor.link.wait_connected(60)
    with Publisher(broker=broker.url, fleet=fleet) as publisher:
        publisher.publish(cartpole_bundle(key, 1))
    config = agent_config(tmp_path, "n1", pub, broker.url, fleet=fleet, telemetry_interval_s=0.02)
    try:
        with running_agents([config]) as (agent,):
            wait_until(lambda: agent.counters.telemetry_records >= 20, what="telemetry flowing")
            broker.stop()
            away = agent.counters.telemetry_records
            # telemetry keeps being recorded while the broker is away
            wait_until(lambda: agent.counters.telemetry_records >= away + 20, what="records while away")
            broker.start()
            wait_until(lambda: agent.link is not None and agent.link.connected, timeout=60, what="reconnect")
            back = agent.counters.telemetry_records
            wait_until(lambda: agent.counters.telemetry_records >= back + 20, what="records after the reconnect")
            agent.stop()
        sent = agent.counters.telemetry_records
        wait_until(lambda: len(monitor.telemetry.get("n1", {})) >= sent, timeout=30, what="all records received")
        ids = sorted(monitor.telemetry["n1"])
        assert ids == list(range(1, sent + 1))  # none lost
        # none duplicated: repeats (at-least-once redelivery) are recognised by record id and dropped
        assert sum(monitor.duplicates.values()) <= 1
    finally:
        monitor.close()


def test_experience_records_reach_the_learner_side(tmp_path: Path, mosquitto: Mosquitto, keys: Keys) -> None:
    from edge import Experience

    key, pub = keys
    fleet = "experience"
    topics = FleetTopics(fleet)
    got: list[Experience] = []
    listener = MqttLink(LinkConfig(broker=mosquitto.url, client_id="learner"),
                        on_message=lambda topic, payload, retained: got.append(Experience.decode(topic, payload)))
    listener.subscribe(topics.node("n1", "experience"))
    with listener.start(), Publisher(broker=mosquitto.url, fleet=fleet) as publisher:
        assert listener.wait_connected(60)
        publisher.publish(cartpole_bundle(key, 1))
        config = agent_config(tmp_path, "n1", pub, mosquitto.url, fleet=fleet, experience_steps=64, steps=64 * 5,
                              control_period_s=0.0)
        with running_agents([config]) as (agent,):
            wait_until(lambda: agent.counters.steps >= 64 * 5, what="steps")
            wait_until(lambda: len(got) == 5, what="five experience records")
            kept = agent.outbox.stats().pending
    assert [e.record_id for e in got] == list(range(1, 6))
    # Every transition is named (edge:{node}:{record_id}, column, step): nothing repeated, no step missing.
    ids = [i for e in got for i in e.batch.transition_ids()]
    assert len(set(ids)) == len(ids) == 64 * 5
    assert all(sorted(int(s) for s in e.batch.seq.ravel()) == list(range(64)) for e in got)
    assert {int(v) for e in got for v in e.batch.policy_version.ravel()} == {1}  # every decision tagged
    # Sampled actions (the node's default without a request): the behaviour log-probs travel with them.
    assert all(e.batch.behaviour_logprobs is not None and (e.batch.behaviour_logprobs <= 0).all() for e in got)
    # Nobody receipted them: the outbox keeps every record (a learner's ingester would confirm them).
    assert agent.counters.receipts == 0 and kept >= 5


def test_publisher_offer_publishes_every_nth_version(mosquitto: Mosquitto, tmp_path: Path, keys: Keys) -> None:
    key, _ = keys
    with Publisher(broker=mosquitto.url, fleet="offer", every=3) as publisher:
        published = [publisher.offer(cartpole_bundle(key, v)) is not None for v in range(1, 8)]
    assert published == [True, False, True, False, False, True, False]
