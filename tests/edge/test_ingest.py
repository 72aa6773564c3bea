"""Experience ingesters on real brokers: shared subscriptions, a kill -9, receipts, refusals, the 3.1.1 fallback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from device import RolloutBatch
from edge import EmbeddedBroker, Experience, FleetTopics, LinkConfig, MqttLink
from edge._ingest import ExperienceIngester, IngestConfig
from edge._spool import ExperienceSpool
from edge._topics import ExperienceSpec, Receipt
from functions._lifetime import child_environment
from tests._services import Mosquitto
from tests.conftest import MosquittoFactory
from tests.edge._agents import agent_config, running_agents, wait_until
from tests.edge._policies import OBS_SPACE, cartpole_bundle, make_keys

SPEC = ExperienceSpec(observation_space=OBS_SPACE, action_space={"type": "Discrete", "n": 2})
SPACES = {"observation_space": OBS_SPACE, "action_space": {"type": "Discrete", "n": 2}, "max_steps": 64}


def payload(node: str, record_id: int, *, obs_dim: int = 4, t: int = 8) -> bytes:
    batch = RolloutBatch(source="x", obs=np.zeros((t, 1, obs_dim), np.float32), actions=np.zeros((t, 1), np.int64),
                         rewards=np.ones((t, 1), np.float32), terminations=np.zeros((t, 1), bool),
                         truncations=np.zeros((t, 1), bool), final_obs=np.zeros((t, 1, obs_dim), np.float32),
                         next_obs=np.zeros((1, obs_dim), np.float32), policy_version=np.ones((t, 1), np.int64),
                         worker=np.zeros(1, np.int64), seq=np.arange(t, dtype=np.int64)[:, None])
    return Experience(record_id=record_id, node=node, batch=batch).encode()


def publish_records(url: str, fleet: str, keys: list[tuple[str, int]]) -> None:
    """Publish records at QoS 1 and wait for every PUBACK (what a node's outbox does)."""
    acked: set[int] = set()
    topics = FleetTopics(fleet)
    with MqttLink(LinkConfig(broker=url, client_id=f"pub-{os.getpid()}", clean_session=True),
                  on_ack=acked.add) as link:
        assert link.wait_connected(30)
        mids = {link.publish(topics.node(node, "experience"), payload(node, rid)).mid for node, rid in keys}
        wait_until(lambda: mids <= acked, what="PUBACKs of the records")


def stored(spool: Path) -> list[tuple[str, int]]:
    s = ExperienceSpool(spool)
    try:
        return sorted((r.node, r.record_id) for r in s.pending(limit=100_000))
    finally:
        s.close()


def test_two_ingesters_split_the_fleet_and_store_each_record_once(mosquitto: Mosquitto, tmp_path: Path) -> None:
    spool = tmp_path / "spool.sqlite"
    ingesters = [ExperienceIngester(IngestConfig(broker=mosquitto.url, fleet="split", spool=str(spool), spaces="-",
                                                 name=f"ingest-{k}"), spec=SPEC).start() for k in range(2)]
    try:
        for ingester in ingesters:
            wait_until(lambda i=ingester: i.link.connected and i.link.protocol == "5", what="an MQTT 5 link")
            assert ingester.topic_filter.startswith("$share/strata-learner/")
        # Subscriptions are made on connect; a probe record tells when both are in force.
        keys = [(f"n{i % 4}", 1 + i // 4) for i in range(200)]
        publish_records(mosquitto.url, "split", keys)
        wait_until(lambda: sum(i.counters.received for i in ingesters) >= 200, what="every record received")
    finally:
        for ingester in ingesters:
            ingester.close()
    assert stored(spool) == sorted(keys)
    assert all(i.counters.received > 0 for i in ingesters)  # the group split them
    assert sum(i.counters.received for i in ingesters) == 200


def _ingest_process(url: str, fleet: str, spool: Path, spaces: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cloud.cli", "edge", "ingest", "--broker", url, "--fleet", fleet,
                             "--spool", str(spool), "--spaces", str(spaces), "--batch-s", "0.005"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_environment())


@pytest.mark.timeout(300)
def test_an_ingester_killed_mid_stream_loses_nothing_and_stores_nothing_twice(mosquitto_factory: MosquittoFactory,
                                                                              tmp_path: Path) -> None:
    broker = mosquitto_factory(["max_queued_messages 100000"])
    spool, spaces = tmp_path / "spool.sqlite", tmp_path / "spaces.json"
    spaces.write_text(json.dumps(SPACES))
    proc = _ingest_process(broker.url, "kill", spool, spaces)
    probes = iter(range(1, 10**6))

    def probe_stored() -> bool:  # a probe record published before the subscription is in force reaches nobody
        publish_records(broker.url, "kill", [("probe", next(probes))])
        return bool(stored(spool))

    try:
        wait_until(probe_stored, timeout=120, what="the ingester's subscription")
        keys = [(f"n{i % 3}", 1 + i // 3) for i in range(1500)]
        publish_records(broker.url, "kill", keys)
        wait_until(lambda: len(stored(spool)) > 100, timeout=120, what="some records stored")
        proc.send_signal(signal.SIGKILL)  # in the middle of the stream: some received, not stored or acknowledged
        assert proc.wait(30) == -signal.SIGKILL
        assert len([k for k in stored(spool) if k[0] != "probe"]) < len(keys)
        proc = _ingest_process(broker.url, "kill", spool, spaces)  # the same client id: the session's records
        wait_until(lambda: [k for k in stored(spool) if k[0] != "probe"] == sorted(keys), timeout=120,
                   what="every record stored")
    finally:
        proc.terminate()
        proc.wait(30)
    opened = ExperienceSpool(spool)
    counters = opened.counters()
    opened.close()
    assert counters["stored"] == len(stored(spool))  # each exactly once
    assert counters["received"] >= counters["stored"]


def test_records_are_receipted_so_the_node_deletes_them_and_refused_ones_say_why(mosquitto: Mosquitto,
                                                                                tmp_path: Path) -> None:
    from edge import Publisher

    key, pub = make_keys(tmp_path)
    spool = tmp_path / "spool.sqlite"
    ingester = ExperienceIngester(IngestConfig(broker=mosquitto.url, fleet="receipts", spool=str(spool), spaces="-"),
                                  spec=SPEC).start()
    receipts: list[Receipt] = []
    topics = FleetTopics("receipts")
    watcher = MqttLink(LinkConfig(broker=mosquitto.url, client_id="receipt-watcher"),
                       on_message=lambda t, p, r: receipts.append(Receipt.decode(t, p)))
    watcher.subscribe(topics.node("bad", "receipt"))
    try:
        with watcher.start(), Publisher(broker=mosquitto.url, fleet="receipts") as publisher:
            assert watcher.wait_connected(30) and ingester.link.wait_connected(30)
            publisher.publish(cartpole_bundle(key, 1))
            config = agent_config(tmp_path, "n1", pub, mosquitto.url, fleet="receipts", experience_steps=16,
                                  steps=16 * 6, control_period_s=0.0)
            with running_agents([config]) as (agent,):
                wait_until(lambda: agent.counters.receipts >= 6 and agent.outbox.stats().pending == 0,
                           what="six records receipted and deleted from the node's outbox")
            # a record of another simulator (3 observations instead of 4): refused, and the node is told why
            publish_records(mosquitto.url, "receipts", [])
            with MqttLink(LinkConfig(broker=mosquitto.url, client_id="bad-node")) as bad:
                assert bad.wait_connected(30)
                bad.publish(topics.node("bad", "experience"), payload("bad", 5, obs_dim=3))
                wait_until(lambda: bool(receipts), what="the refusal's receipt")
    finally:
        ingester.close()
    assert receipts[0].record_ids == () and "obs must be float32 [8, 1, 4]" in receipts[0].refused["5"]
    assert [r for _, r in stored(spool)] == list(range(1, 7))


def test_on_a_broker_that_speaks_only_3_1_1_one_ingester_takes_the_plain_filter(tmp_path: Path) -> None:
    with EmbeddedBroker() as broker:
        ingester = ExperienceIngester(IngestConfig(broker=broker.url, fleet="old", spool=str(tmp_path / "s.sqlite"),
                                                   spaces="-"), spec=SPEC).start()
        try:
            wait_until(lambda: ingester.link.connected, what="the ingester's link")
            assert ingester.link.protocol == "3.1.1" and ingester.topic_filter == "strata/old/nodes/+/experience"
            keys = [("n1", 1), ("n1", 2), ("n2", 1)]
            publish_records(broker.url, "old", keys)
            wait_until(lambda: ingester.counters.stored == 3, what="three records stored")
        finally:
            ingester.close()
    assert stored(tmp_path / "s.sqlite") == sorted(keys)
