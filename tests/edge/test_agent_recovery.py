"""Real agents on a real Mosquitto: a corrupted cache is repaired by the fleet's version; a failed write is reported."""

from __future__ import annotations

from pathlib import Path

from edge import FleetMonitor, Publisher
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
