"""The cloud's view of a fleet: who is online, on which policy version, how far behind, what it reported.

`FleetMonitor` subscribes to the fleet's retained announcement, every node's retained status (the last will
turns it to ``online: false``), and telemetry. Telemetry records are counted per ``(node, record_id)``, so
repeats (an at-least-once redelivery) are dropped and counted, and gaps are visible.

On Mosquitto the monitor uses wildcards over nodes. AWS IoT Core sends no retained messages to wildcard
subscriptions, so there pass ``nodes=[...]`` and the monitor subscribes to each node's exact topics.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from device import Bundle, BundleError
from edge._errors import PayloadError
from edge._mqtt import LinkConfig, MqttLink
from edge._topics import Announcement, FleetTopics, NodeStatus, Telemetry, is_json_payload

log = logging.getLogger("strata.edge.fleet")


@dataclass(frozen=True)
class NodeView:
    """One row of `strata fleet`."""

    node: str
    online: bool
    policy: str | None
    version: int | None
    latest_version: int | None
    lag: int | None
    """Versions behind the latest published version of its policy."""
    status_age_s: float | None
    last_telemetry: Telemetry | None
    """The newest telemetry record seen live (None for a monitor that joined after it was sent)."""
    steps: int | None
    """Simulator steps so far, from the retained status (or the telemetry)."""
    mean_return: float | None
    latency_p99_us: float | None
    last_error: str | None


class FleetMonitor:
    """Watches one fleet (see the module docstring).

    Args:
        broker: Broker URL.
        fleet: Fleet name.
        nodes: Exact node ids to watch (needed on AWS IoT); None watches every node with wildcards.
        client_id: MQTT client id; with `persistent` a stable id keeps messages queued while away.
        persistent: Keep a persistent session (``clean_session=False``).
        on_telemetry: Called with each first-seen telemetry record, on the link thread.
        username: Broker username.
        password: Its password.
        ca_file: CA bundle for TLS.
        cert_file: Client certificate for TLS.
        key_file: Its key.
        clock: Unix time, for status ages.
    """

    def __init__(self, *, broker: str, fleet: str, nodes: Sequence[str] | None = None, client_id: str | None = None,
                 persistent: bool = False, on_telemetry: Callable[[Telemetry], None] | None = None,
                 username: str | None = None, password: str | None = None, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.topics = FleetTopics(fleet)
        self._clock = clock
        self._lock = threading.Lock()
        self._on_telemetry = on_telemetry
        self.statuses: dict[str, NodeStatus] = {}
        self.telemetry: dict[str, dict[int, Telemetry]] = {}
        self.duplicates: dict[str, int] = {}
        self.latest: dict[str, int] = {}
        self.malformed = 0
        config = LinkConfig(broker=broker, client_id=client_id or f"strata-fleet-{os.getpid()}-{id(self):x}",
                            clean_session=not persistent, username=username, password=password,
                            ca_file=ca_file, cert_file=cert_file, key_file=key_file)
        self.link = MqttLink(config, on_message=self._on_message)
        self.link.subscribe(self.topics.announce)
        if nodes is None:
            self.link.subscribe(self.topics.all_nodes("status"))
            self.link.subscribe(self.topics.all_nodes("telemetry"))
        else:
            for node in nodes:
                self.link.subscribe(self.topics.node(node, "status"))
                self.link.subscribe(self.topics.node(node, "telemetry"))

    def start(self) -> FleetMonitor:
        """Connect in the background."""
        self.link.start()
        return self

    def close(self) -> None:
        """Disconnect."""
        self.link.close()

    def __enter__(self) -> FleetMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _watch_policy(self, policy: str) -> None:
        if policy not in self.latest:
            self.latest[policy] = 0
            self.link.subscribe(self.topics.policy_latest(policy))

    def _on_message(self, topic: str, payload: bytes, retained: bool) -> None:
        if not payload:
            return
        try:
            if topic == self.topics.announce:
                ann = Announcement.decode(topic, payload)
                with self._lock:
                    self._watch_policy(ann.policy)
                    self.latest[ann.policy] = max(self.latest[ann.policy], ann.version)
                return
            if topic.startswith(f"{self.topics.root}/policies/") and topic.endswith("/latest"):
                version = Announcement.decode(topic, payload).version if is_json_payload(payload) else \
                    Bundle.from_bytes(payload).version
                policy = topic.split("/")[3]
                with self._lock:
                    self.latest[policy] = max(self.latest.get(policy, 0), version)
                return
            parsed = self.topics.parse_node_topic(topic)
            if parsed is None:
                return
            node, kind = parsed
            if kind == "status":
                status = NodeStatus.decode(topic, payload)
                with self._lock:
                    self.statuses[node] = status
                    if status.policy:
                        self._watch_policy(status.policy)
            elif kind == "telemetry":
                record = Telemetry.decode(topic, payload)
                with self._lock:
                    seen = self.telemetry.setdefault(node, {})
                    if record.record_id in seen:
                        self.duplicates[node] = self.duplicates.get(node, 0) + 1
                        return
                    seen[record.record_id] = record
                if self._on_telemetry is not None:
                    self._on_telemetry(record)
        except (PayloadError, BundleError) as exc:
            self.malformed += 1
            log.warning("fleet monitor: dropped a message on %s: %s", topic, exc)

    def snapshot(self) -> list[NodeView]:
        """One `NodeView` per node seen, sorted by node id."""
        now = self._clock()
        with self._lock:
            nodes = sorted(set(self.statuses) | set(self.telemetry))
            views = []
            for node in nodes:
                st = self.statuses.get(node)
                records = self.telemetry.get(node)
                last = records[max(records)] if records else None
                policy = st.policy if st else (last.policy if last else None)
                version = st.version if st else (last.version if last else None)
                latest = self.latest.get(policy or "") or None
                lag = None if latest is None or version is None else max(0, latest - version)
                views.append(NodeView(node=node, online=bool(st and st.online), policy=policy, version=version,
                                      latest_version=latest, lag=lag,
                                      status_age_s=None if st is None or not st.updated_at else now - st.updated_at,
                                      last_telemetry=last, steps=st.steps if st else (last.steps if last else None),
                                      mean_return=st.mean_return if st else None,
                                      latency_p99_us=st.latency_p99_us if st else (
                                          last.latency_p99_us if last else None),
                                      last_error=st.last_error if st else None))
            return views


def format_fleet_table(views: Sequence[NodeView]) -> str:
    """A plain-text table of `views`."""
    headers = ["node", "online", "policy", "version", "latest", "lag", "steps", "mean return", "p99 us", "error"]
    rows = []
    for v in views:
        rows.append([v.node, "yes" if v.online else "no", v.policy or "-", _s(v.version), _s(v.latest_version),
                     _s(v.lag), _s(v.steps), "-" if v.mean_return is None else f"{v.mean_return:.1f}",
                     _s(None if v.latency_p99_us is None else round(v.latency_p99_us)), (v.last_error or "")[:60]])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if not rows:
        lines.append("(no nodes seen)")
    return "\n".join(lines)


def _s(value: object) -> str:
    return "-" if value is None else str(value)
