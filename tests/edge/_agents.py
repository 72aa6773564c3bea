"""Running real edge agents in threads of the test process, against a real broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edge import EdgeAgent, EdgeAgentConfig, FleetMonitor, FleetTopics, LinkConfig, MqttLink


def agent_config(tmp: Path, node: str, pub: Path, broker: str | None, **kwargs: Any) -> EdgeAgentConfig:
    args: dict[str, Any] = {"fleet": "test", "node_id": node, "cache_dir": str(tmp / node), "trust": (str(pub),),
                            "broker": broker, "control_period_s": 0.002, "telemetry_interval_s": 0.2,
                            "health_deadline_s": 60.0, "health_latency_budget_ms": 5000.0}
    args.update(kwargs)
    return EdgeAgentConfig(**args)


@contextmanager
def running_agents(configs: list[EdgeAgentConfig]) -> Iterator[list[EdgeAgent]]:
    """Start agents (each `run` on its own thread); stop and close them afterwards."""
    agents = [EdgeAgent(c).start() for c in configs]
    threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
    for t in threads:
        t.start()
    try:
        yield agents
    finally:
        for a in agents:
            a.stop()
        for t in threads:
            t.join(timeout=60)
        for a in agents:
            a.close(drain_s=0.5)


def wait_subscribed(monitor: FleetMonitor, broker: str, fleet: str) -> None:
    """Block until `monitor`'s telemetry subscription is in force at the broker (its SUBACK is not exposed).

    A malformed record on a probe node's telemetry topic is published until the monitor counts it as dropped.
    """
    seen = monitor.malformed
    with MqttLink(LinkConfig(broker=broker, client_id=f"probe-{id(monitor):x}")) as probe:
        topic = FleetTopics(fleet).node("subscription-probe", "telemetry")

        def arrived() -> bool:
            probe.publish(topic, b"not a telemetry record")
            return monitor.malformed > seen

        wait_until(arrived, what="the monitor's subscription")


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)
