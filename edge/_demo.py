"""The edge part of `strata demo`: publish a bundle to a few edge agents and show the fleet.

`run_fleet_demo` starts the embedded broker when no broker URL is given, publishes the bundle, runs the agents
(threads of this process, each with its own cache folder and simulator) until each acts on the bundle's
version for a while, and returns the fleet as `strata fleet` shows it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from device import Bundle
from edge._agent import EdgeAgent, EdgeAgentConfig
from edge._embedded_broker import EmbeddedBroker
from edge._errors import EdgeError
from edge._fleet import FleetMonitor, NodeView, format_fleet_table
from edge._publish import Publisher


@dataclass(frozen=True)
class FleetDemoResult:
    """What `run_fleet_demo` saw."""

    broker: str
    views: tuple[NodeView, ...]
    table: str
    seconds: float


@contextlib.contextmanager
def _broker(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    with EmbeddedBroker() as embedded:
        yield embedded.url


def run_fleet_demo(bundle: Bundle, *, trust: Path, work_dir: Path, nodes: int = 2, env: str = "CartPole-v1",
                   fleet: str = "demo", broker: str | None = None, act_seconds: float = 1.0,
                   timeout_s: float = 60.0) -> FleetDemoResult:
    """Publish `bundle` to `nodes` edge agents (on the embedded broker unless `broker` is given).

    Args:
        bundle: A signed bundle whose target tier is ``edge`` or ``any``.
        trust: The public key file that verifies it.
        work_dir: Folder for the agents' caches.
        nodes: Number of edge agents.
        env: Gymnasium env id of the agents' simulators (must match the bundle's spaces).
        fleet: Fleet name.
        broker: Broker URL; None starts the embedded amqtt broker.
        act_seconds: How long the agents act on the new version before the fleet is read.
        timeout_s: Give up (`EdgeError`) when the agents have not switched by then.
    """
    started = time.monotonic()
    with _broker(broker) as url:
        configs = [EdgeAgentConfig(fleet=fleet, node_id=f"edge-{i}", cache_dir=str(Path(work_dir) / f"edge-{i}"),
                                   trust=(str(trust),), env=env, broker=url, control_period_s=0.002,
                                   telemetry_interval_s=0.25) for i in range(nodes)]
        agents = [EdgeAgent(c).start() for c in configs]
        threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
        for t in threads:
            t.start()
        try:
            with Publisher(broker=url, fleet=fleet) as publisher:
                publisher.publish(bundle)
            deadline = time.monotonic() + timeout_s
            while not all(a.version == bundle.version for a in agents):
                if time.monotonic() > deadline:
                    errors = sorted({a.last_error or "no error" for a in agents})
                    raise EdgeError(f"run_fleet_demo: agents did not switch to {bundle.policy} v{bundle.version} "
                                    f"within {timeout_s}s: {errors}")
                time.sleep(0.01)
            time.sleep(act_seconds)
            with FleetMonitor(broker=url, fleet=fleet) as monitor:
                wait_until = time.monotonic() + 10
                while time.monotonic() < wait_until and not (
                        len(monitor.snapshot()) == nodes and all(v.steps for v in monitor.snapshot())):
                    time.sleep(0.05)
                views = tuple(monitor.snapshot())
        finally:
            for a in agents:
                a.stop()
            for t in threads:
                t.join(timeout=10)
            for a in agents:
                a.close(drain_s=0.5)
    return FleetDemoResult(broker=broker or "embedded amqtt", views=views, table=format_fleet_table(views),
                           seconds=time.monotonic() - started)
