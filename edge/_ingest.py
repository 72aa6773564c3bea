"""An experience ingester: the fleet's ``nodes/+/experience`` records into the learner's spool, each exactly stored.

Pipeline of one ingester (``strata edge ingest``; an ``edge``-mode training run starts and supervises its own):

    link     MQTT 5 with a persistent session (``clean_start`` false, the session kept `session_expiry_s`) and a
             shared subscription ``$share/{group}/strata/{fleet}/nodes/+/experience``: several ingesters split the
             fleet's records between them, and records for an ingester that is away wait at the broker. On a broker
             that speaks only MQTT 3.1.1 the link falls back to it with a persistent session and the plain filter:
             one ingester then receives every record (run one; a second would receive every record too, and the
             spool would store each once). Messages are acknowledged by hand, only once stored.
    writer   takes what arrived (up to `batch_max` messages, or what came within `batch_s`), validates each record
             (`edge._topics.Experience.decode`: the node named by the topic, which the broker's ACL or the IoT
             policy binds to the node's identity, shapes, dtypes and finite values against the learner's spaces,
             the size limit; raw buffers, never pickle), stores the valid ones in one spool transaction
             (`edge._spool`, a repeat stored once), then acknowledges every message to the broker and sends each
             node one `Receipt` naming its stored records (and the refused ones, with the reason).

A kill -9 loses nothing: what was not stored was not acknowledged (the broker delivers it again) and not receipted
(the node sends it again); what was stored and not acknowledged comes again and is counted as a duplicate.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from device import mqtt_client_id, shared_filter
from device._mqtt_access import SHARE_GROUP
from edge._errors import EdgeConfigError, PayloadError
from edge._mqtt import LinkConfig, MqttLink
from edge._spool import ExperienceSpool
from edge._topics import Experience, ExperienceSpec, FleetTopics, Receipt, check_segment

log = logging.getLogger("strata.edge.ingest")


@dataclass(frozen=True, kw_only=True)
class IngestConfig:
    """Settings of one experience ingester (``strata edge ingest``)."""

    broker: str
    """Broker URL (mqtt://host:1883, mqtts://host:8883)."""
    fleet: str
    """Fleet name: the topic namespace strata/{fleet}/."""
    spool: str
    """The learner's spool file (RUN_DIR/edge/spool.sqlite)."""
    spaces: str
    """JSON file with the learner's "observation_space", "action_space" (manifest form) and "max_steps"."""
    name: str = "ingest-0"
    """This ingester's name; its MQTT client id is {fleet}.learner.{name} (stable: the persistent session)."""
    group: str = SHARE_GROUP
    """Shared-subscription group: ingesters of one learner share one group and split the fleet."""
    username: str | None = None
    """Broker username (the learner's identity)."""
    password_file: str | None = None
    """File holding the broker password."""
    ca_file: str | None = None
    """CA bundle of the broker's TLS certificate (AWS IoT: AmazonRootCA1.pem)."""
    cert_file: str | None = None
    """Client certificate for TLS (the learner's AWS IoT certificate)."""
    key_file: str | None = None
    """Private key of the client certificate."""
    session_expiry_s: int = 3600
    """Seconds the broker keeps this ingester's session (and its records) while it is away (MQTT 5)."""
    protocol: Literal["auto", "5", "3.1.1"] = "auto"
    """MQTT version: auto tries 5 (shared subscription) and falls back to 3.1.1 (plain filter: one ingester)."""
    batch_s: float = 0.02
    """Longest wait gathering one batch after its first message (seconds)."""
    batch_max: int = 512
    """Messages per batch at most (one spool transaction)."""

    def __post_init__(self) -> None:
        check_segment(self.fleet, "fleet")
        check_segment(self.name, "ingester name")
        check_segment(self.group, "share group")
        if not 0 < self.batch_s <= 10 or self.batch_max < 1 or self.session_expiry_s < 0:
            raise EdgeConfigError(f"IngestConfig: batch_s={self.batch_s} must lie in (0, 10], batch_max="
                                  f"{self.batch_max} be >= 1 and session_expiry_s={self.session_expiry_s} >= 0")


def read_spec(path: str | Path) -> ExperienceSpec:
    """The `ExperienceSpec` in a spaces file (written by the learner); `EdgeConfigError` when unreadable."""
    try:
        obj = json.loads(Path(path).read_text()[:1_000_000])
        return ExperienceSpec(observation_space=dict(obj["observation_space"]),
                              action_space=dict(obj["action_space"]), max_steps=int(obj.get("max_steps", 4096)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EdgeConfigError(f"--spaces {str(path)[:80]!r} is not a spaces file written by the learner ({exc}); "
                              "pass RUN_DIR/edge/spaces.json") from None


@dataclass
class IngestCounters:
    """What one ingester did (also in the spool's shared counters)."""

    received: int = 0
    stored: int = 0
    duplicates: int = 0
    refused: int = 0
    batches: int = 0
    receipts: int = 0


class ExperienceIngester:
    """One ingester (see the module docstring): `start`, then `close`."""

    def __init__(self, config: IngestConfig, *, spec: ExperienceSpec | None = None, password: str | None = None
                 ) -> None:
        self.config = config
        self.spec = spec or read_spec(config.spaces)
        self.topics = FleetTopics(config.fleet)
        self.counters = IngestCounters()
        self._plain = self.topics.all_nodes("experience")
        self._queue: queue.Queue[tuple[str, bytes, int]] = queue.Queue()
        self._stop = threading.Event()
        self.spool = ExperienceSpool(Path(config.spool))
        link_config = LinkConfig(broker=config.broker,
                                 client_id=mqtt_client_id("learner", fleet=config.fleet, node=config.name),
                                 clean_session=False, protocol=config.protocol,
                                 session_expiry_s=config.session_expiry_s,
                                 manual_ack=True, username=config.username, password=password,
                                 ca_file=config.ca_file, cert_file=config.cert_file, key_file=config.key_file)
        self.link = MqttLink(link_config, on_delivery=self._deliver, on_connect=self._subscribe)
        self._writer = threading.Thread(target=self._write, name=f"ingest-{config.name}", daemon=True)

    @property
    def topic_filter(self) -> str:
        """What this ingester subscribes to now: the shared filter on MQTT 5, the plain one on 3.1.1."""
        return shared_filter(self.config.group, self._plain) if self.link.protocol == "5" else self._plain

    def start(self) -> ExperienceIngester:
        """Connect (in the background) and start the writer."""
        self._writer.start()
        self.link.start()
        return self

    def close(self) -> None:
        """Stop: what was received and not stored stays unacknowledged, so the broker delivers it again."""
        self._stop.set()
        self._writer.join(timeout=30)
        self.link.close()
        self.spool.close()

    def _subscribe(self) -> None:
        self.link.subscribe(self.topic_filter)  # remembered: renewed after every reconnect

    def _deliver(self, topic: str, payload: bytes, mid: int) -> None:
        self._queue.put((topic, payload, mid))

    def _batch(self) -> list[tuple[str, bytes, int]]:
        try:
            batch = [self._queue.get(timeout=0.1)]
        except queue.Empty:
            return []
        deadline = time.monotonic() + self.config.batch_s
        while len(batch) < self.config.batch_max:
            left = deadline - time.monotonic()
            try:
                # A short gap ends the batch early: the broker sends at most its in-flight window before our acks.
                batch.append(self._queue.get(timeout=max(0.0, min(left, 0.002))))
            except queue.Empty:
                if left <= 0 or self._queue.empty():
                    break
        return batch

    def _write(self) -> None:
        while not self._stop.is_set():
            batch = self._batch()
            if batch:
                try:
                    self._ingest(batch)
                except Exception:  # the spool is unwritable: nothing acknowledged, the broker keeps the records
                    log.exception("%s: storing a batch of %d records failed", self.config.name, len(batch))
                    time.sleep(0.5)

    def _ingest(self, batch: list[tuple[str, bytes, int]]) -> None:
        valid: list[tuple[str, int, int, bytes]] = []
        stored_ids: dict[str, list[int]] = defaultdict(list)
        refused: dict[str, dict[str, str]] = defaultdict(dict)
        for topic, payload, _ in batch:
            parsed = self.topics.parse_node_topic(topic)
            if parsed is None or parsed[1] != "experience":
                continue  # not a record topic: acknowledged and dropped
            node = parsed[0]
            try:
                record = Experience.decode(topic, payload, spec=self.spec, node=node)
            except PayloadError as exc:
                rid = _record_id(payload)
                if rid is not None:
                    refused[node][str(rid)] = exc.problem
                self.counters.refused += 1
                log.warning("%s: refused a record: %s", self.config.name, exc)
                continue
            valid.append((node, record.record_id, int(record.batch.policy_version.max()), payload))
        new = self.spool.store(valid, refused=len(batch) - len(valid))
        for (node, rid, _, _), fresh in zip(valid, new, strict=True):
            stored_ids[node].append(rid)  # a repeat is receipted again: its first receipt may have been lost
            self.counters.duplicates += not fresh
        self.counters.received += len(batch)
        self.counters.stored += sum(new)
        self.counters.batches += 1
        for _, _, mid in batch:
            self.link.ack(mid)
        for node in sorted(set(stored_ids) | set(refused)):
            receipt = Receipt(node=node, record_ids=tuple(stored_ids.get(node, ())), refused=refused.get(node, {}))
            if self.link.publish(self.topics.node(node, "receipt"), receipt.encode()).accepted:
                self.counters.receipts += 1

    def stats(self) -> dict[str, Any]:
        """This ingester's counters and link state."""
        return {**self.counters.__dict__, "protocol": self.link.protocol, "state": self.link.state.value,
                "topic_filter": self.topic_filter}


def _record_id(payload: bytes) -> int | None:
    """The record id a refused payload names, if it names one (to receipt it as refused)."""
    from device import WireError, unpack_arrays

    try:
        meta, _ = unpack_arrays(payload)
    except WireError:
        return None
    rid = meta.get("record_id")
    return rid if isinstance(rid, int) and not isinstance(rid, bool) and 1 <= rid < 2**63 else None


def run_ingester(config: IngestConfig, *, password: str | None = None, stop: threading.Event | None = None,
                 on_ready: Any = None) -> IngestCounters:
    """Run one ingester until `stop` is set (or the process is signalled); return its counters."""
    ingester = ExperienceIngester(config, password=password).start()
    stop = stop or threading.Event()
    try:
        if on_ready is not None:
            on_ready(ingester)
        while not stop.wait(0.5):
            if ingester.link.gave_up:
                raise EdgeConfigError(f"strata edge ingest: the broker {config.broker} refused the connection "
                                      f"({ingester.link.last_error}); check --username and --password-file")
    finally:
        ingester.close()
    return ingester.counters
