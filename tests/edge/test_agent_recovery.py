"""Real agents on a real Mosquitto: a corrupted cache is repaired by the fleet's version; a failed write is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge import EdgeAgent, FleetMonitor, Publisher
from tests._services import Mosquitto
from tests.edge._agents import agent_config, running_agents, wait_until
from tests.edge._policies import cartpole_bundle, make_keys


def test_a_corrupted_active_slot_falls_back_then_the_fleets_version_repairs_it(tmp_path: Path,
                                                                               mosquitto: Mosquitto) -> None:
    key, pub = make_keys(tmp_path / "keys")
    fleet = "repair"
    config = agent_config(tmp_path, "n1", pub, mosquitto.url, fleet=fleet)
    with Publisher(broker=mosquitto.url, fleet=fleet) as publisher:
        with running_agents([config]) as (agent,):
            publisher.publish(cartpole_bundle(key, 1))
            wait_until(lambda: agent.version == 1 and agent.cache.active is not None, what="v1", timeout=60)
            publisher.publish(cartpole_bundle(key, 2))
            wait_until(lambda: agent.cache.active is not None and agent.cache.active.version == 2, what="v2 on disk",
                       timeout=60)
            active = agent.cache.slot_path(agent.cache.pointer.active)  # type: ignore[union-attr]
        active.write_bytes(active.read_bytes()[:-100])  # disk corruption while the node was off
        offline = agent_config(tmp_path, "n1", pub, None, fleet=fleet)
        with running_agents([offline]) as (agent,):
            assert agent.version == 1  # falls back to the previous verified policy
        with running_agents([config]) as (agent,):
            # the retained v2 is the version it already trusts: accepted again, not refused as a rollback
            wait_until(lambda: agent.version == 2 and agent.cache.active is not None and
                       agent.cache.active.version == 2, what="repaired on v2", timeout=60)
            assert agent.counters.refused == []
        with running_agents([offline]) as (agent,):
            assert agent.version == 2


def test_an_install_that_cannot_be_written_is_reported_and_the_status_names_the_running_version(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    key, pub = make_keys(tmp_path / "keys")
    fleet = "unwritable"
    config = agent_config(tmp_path, "n1", pub, mosquitto.url, fleet=fleet)
    with Publisher(broker=mosquitto.url, fleet=fleet) as publisher, running_agents([config]) as (agent,), \
            FleetMonitor(broker=mosquitto.url, fleet=fleet) as monitor:
        publisher.publish(cartpole_bundle(key, 1))
        wait_until(lambda: agent.cache.active is not None and agent.cache.active.version == 1, what="v1", timeout=60)
        slots = Path(config.cache_dir) / "slots"
        slots.rename(slots.with_name("slots.moved"))
        slots.write_bytes(b"")  # a file where the folder was: the slot write fails (also as root)
        publisher.publish(cartpole_bundle(key, 2))
        wait_until(lambda: len(agent.counters.install_failures) == 1, what="the failed install", timeout=60)
        assert "install of cartpole v2 failed" in agent.counters.install_failures[0]
        assert "still running cartpole v1" in agent.counters.install_failures[0]
        assert agent.version == 1
        wait_until(lambda: any(v.node == "n1" and v.version == 1 and "install of cartpole v2 failed" in (
            v.last_error or "") for v in monitor.snapshot()), what="status says v1 runs", timeout=60)


@pytest.mark.parametrize("how", ["garbage", "truncated"])
def test_a_corrupt_outbox_is_moved_aside_and_the_node_still_acts_with_new_record_ids(tmp_path: Path,
                                                                                      how: str) -> None:
    from device import TrustStore, load_public_key
    from edge import PolicyCache

    key, pub = make_keys(tmp_path / "keys")
    config = agent_config(tmp_path, "n1", pub, None, fleet="outbox", steps=300, telemetry_interval_s=0.01)
    cache = PolicyCache(Path(config.cache_dir), trust=TrustStore([load_public_key(pub)]))
    cache.stage(cartpole_bundle(key, 1))
    cache.commit()
    agent = EdgeAgent(config).start()
    agent.run()
    agent.close(drain_s=0)
    old_ids = agent.counters.telemetry_records
    assert old_ids > 0
    outbox = Path(config.cache_dir) / "outbox.sqlite"
    for suffix in ("-wal", "-shm"):
        outbox.with_name(outbox.name + suffix).unlink(missing_ok=True)
    outbox.write_bytes(b"\x00garbage" * 512 if how == "garbage" else outbox.read_bytes()[:1500])
    again = EdgeAgent(config).start()
    try:
        assert again.version == 1  # the policy runs whatever happened to the outbox
        assert "moved to" in (again.last_error or "")
        assert list(Path(config.cache_dir).glob("outbox.sqlite.corrupt-*"))
        record_id = again.outbox.put("strata/outbox/nodes/n1/telemetry", lambda rid: b"x")
        assert record_id is not None and record_id > old_ids
    finally:
        again.close(drain_s=0)
