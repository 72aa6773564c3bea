"""The edge part of `strata demo`: publish a bundle to a few edge agents, serve devices, show the fleet.

`run_fleet_demo` starts the embedded broker when no broker URL is given, publishes the bundle, runs the agents
(threads of this process, each with its own cache folder and simulator) until each acts on the bundle's
version for a while, and returns the fleet as `strata fleet` shows it. With a device bundle, the agents also
serve terminal devices (`edge._gateway`): the bundle is published to the fleet's device topic, each edge
relays it, and `devices` device runtimes (the device tier's paho link and numpy executor) act on
their own simulators, escalating low-confidence observations to their edge.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from device import Bundle, DeviceConfig, DeviceReport, DeviceRuntime, run_device
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
    devices: tuple[dict[str, object], ...] = ()
    """Per device: its id, edge, and `device.DeviceReport.summary()` (tiers that decided, escalations, return)."""


@contextlib.contextmanager
def _broker(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    with EmbeddedBroker() as embedded:
        yield embedded.url


def run_fleet_demo(bundle: Bundle, *, trust: Path, work_dir: Path, nodes: int = 2, env: str = "CartPole-v1",
                   fleet: str = "demo", broker: str | None = None, act_seconds: float = 1.0,
                   timeout_s: float = 60.0, device_bundle: Bundle | None = None, devices: int = 0,
                   device_steps: int = 1000, device_threshold: float = 0.2,
                   device_budget_ms: float = 50.0) -> FleetDemoResult:
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
        device_bundle: A signed device-tier bundle for terminal devices (needed when `devices` > 0).
        devices: Terminal devices, spread over the edge nodes.
        device_steps: Decisions each device takes.
        device_threshold: Confidence (probability margin) under which a device escalates to its edge.
        device_budget_ms: How long a device waits for its edge's answer before deciding itself.
    """
    if devices and device_bundle is None:
        raise EdgeError("run_fleet_demo: devices need a device_bundle (strata export --tier device)")
    started = time.monotonic()
    with _broker(broker) as url:
        configs = [EdgeAgentConfig(fleet=fleet, node_id=f"edge-{i}", cache_dir=str(Path(work_dir) / f"edge-{i}"),
                                   trust=(str(trust),), env=env, broker=url, control_period_s=0.002,
                                   telemetry_interval_s=0.25, serve_devices=devices > 0,
                                   # The demo shows propagation, not the latency gate: several agents, devices
                                   # and a broker share one machine, where a 20 ms p99 budget fails on load alone.
                                   health_latency_budget_ms=200.0) for i in range(nodes)]
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
            reports = _run_devices(device_bundle, url=url, fleet=fleet, trust=trust, work_dir=Path(work_dir),
                                   nodes=nodes, devices=devices, env=env, steps=device_steps,
                                   threshold=device_threshold, budget_ms=device_budget_ms,
                                   timeout_s=timeout_s) if devices else ()
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
                           seconds=time.monotonic() - started, devices=reports)


def _run_devices(bundle: Bundle | None, *, url: str, fleet: str, trust: Path, work_dir: Path, nodes: int,
                 devices: int, env: str, steps: int, threshold: float, budget_ms: float, timeout_s: float,
                 ) -> tuple[dict[str, object], ...]:
    import gymnasium as gym

    assert bundle is not None
    with Publisher(broker=url, fleet=fleet) as publisher:
        publisher.publish_device_bundle(bundle)
    runtimes = [DeviceRuntime(DeviceConfig(broker=url, fleet=fleet, edge_node=f"edge-{i % nodes}",
                                           device_id=f"device-{i}", trust=(str(trust),), threshold=threshold,
                                           budget_ms=budget_ms,
                                           state_path=str(work_dir / f"device-{i}.json"))).connect()
                for i in range(devices)]
    reports: list[DeviceReport | None] = [None] * devices
    errors: list[BaseException] = []

    def drive(i: int) -> None:
        try:
            runtimes[i].wait_for_policy(timeout_s)
            simulator = gym.make(env)
            try:
                reports[i] = run_device(runtimes[i], simulator, steps=steps, seed=1000 + i)
            finally:
                simulator.close()
        except BaseException as exc:  # surfaced below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(i,), daemon=True) for i in range(devices)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=timeout_s + 60)
    finally:
        for r in runtimes:
            r.close()
    if errors:
        raise EdgeError(f"run_fleet_demo: a device failed: {errors[0]}") from errors[0]
    return tuple({"device": f"device-{i}", "edge": f"edge-{i % nodes}", **report.summary()}
                 for i, report in enumerate(reports) if report is not None)
