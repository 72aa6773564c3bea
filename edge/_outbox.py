"""A disk-backed outbox for telemetry and experience: SQLite in WAL mode, deleted only after PUBACK.

Pipeline: `put` stores a record in one transaction and gives it the next record id (ids only grow, also
across restarts: SQLite ``AUTOINCREMENT``), and the payload is built from that id, so the receiver can count
loss and duplication. `pump` publishes the oldest records that are not in flight while the link is up;
`ack` (the link's PUBACK callback) deletes a record. A record is never deleted before its PUBACK, so a kill -9
or a broker outage loses nothing: after a restart every record still on disk is sent again. (That re-send is
the one way a record can arrive twice, when the process died between the broker's PUBACK and the delete;
receivers drop repeats by ``(node, record_id)``.)

End-to-end receipts: a record `put` with ``receipt=True`` (experience for the learner) is not deleted at its PUBACK
but when its consumer says it has stored it (`confirm`, fed by the learner's `edge._topics.Receipt`): a broker
that crashes after acknowledging a message and before delivering it (Mosquitto persists to disk only now and
then), or drops it from a full queue, cannot lose it. A record whose receipt has not come `receipt_timeout_s` after
its PUBACK is sent again, the wait doubling with every attempt up to `receipt_max_s`; the consumer drops repeats.

Capacity and overflow: at most `OutboxConfig.max_records` records and `max_bytes` payload bytes. When a new
record does not fit, ``overflow="drop_oldest"`` (default) deletes the oldest records not in flight to make
room, and ``"drop_newest"`` refuses the new record; either way the drop is counted in ``dropped``, which is
kept on disk and reported in every telemetry record and status message. A process crash cannot lose committed
records (WAL with ``synchronous=NORMAL``); a power loss can lose the last commits unless ``synchronous_full``.
"""

from __future__ import annotations

import collections
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from edge._errors import EdgeConfigError
from edge._mqtt import PublishResult

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS receipts (id INTEGER PRIMARY KEY);
INSERT OR IGNORE INTO counters VALUES ('dropped', 0);
"""


@dataclass(frozen=True, kw_only=True)
class OutboxConfig:
    """Capacity and durability of the outbox."""

    max_records: int = 100_000
    """Records kept on disk at most."""
    max_bytes: int = 256 * 1024 * 1024
    """Payload bytes kept on disk at most."""
    overflow: Literal["drop_oldest", "drop_newest"] = "drop_oldest"
    """When full: delete the oldest unsent records, or refuse the new one. Drops are counted and reported."""
    max_in_flight: int = 100
    """Records published and awaiting PUBACK at once."""
    synchronous_full: bool = False
    """fsync every commit (survives power loss, slower); the default survives process crashes."""
    receipt_timeout_s: float = 10.0
    """Seconds after its PUBACK that a record put with ``receipt=True`` waits for its receipt before it is sent
    again (the wait doubles with every attempt)."""
    receipt_max_s: float = 300.0
    """Longest wait for a receipt between two sends of one record."""

    def __post_init__(self) -> None:
        if self.max_records < 1 or self.max_bytes < 1 or self.max_in_flight < 1:
            raise EdgeConfigError(f"OutboxConfig: max_records={self.max_records}, max_bytes={self.max_bytes} and "
                                  f"max_in_flight={self.max_in_flight} must all be >= 1")
        if not 0 < self.receipt_timeout_s <= self.receipt_max_s:
            raise EdgeConfigError(f"OutboxConfig: receipt_timeout_s={self.receipt_timeout_s} must be > 0 and at most "
                                  f"receipt_max_s={self.receipt_max_s}")
        if self.overflow not in ("drop_oldest", "drop_newest"):
            raise EdgeConfigError(f"OutboxConfig: overflow={self.overflow!r}; use 'drop_oldest' or 'drop_newest'")


class Publisher(Protocol):
    """What the outbox needs of a link (an `edge._mqtt.MqttLink`)."""

    @property
    def connected(self) -> bool:
        """Whether publishing now can succeed."""
        ...

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> PublishResult:
        """Publish at QoS 1."""
        ...


@dataclass(frozen=True)
class OutboxStats:
    """Counts for telemetry and status."""

    pending: int
    in_flight: int
    dropped: int
    bytes: int
    awaiting_receipt: int = 0
    """Records acknowledged by the broker and waiting for their consumer's receipt (part of `pending`)."""
    resent: int = 0
    """Sends of records whose receipt did not come in time (since this process opened the outbox)."""


class Outbox:
    """The SQLite outbox of one node (see the module docstring). Thread-safe."""

    def __init__(self, path: Path, config: OutboxConfig | None = None, *,
                 clock: Callable[[], float] = time.time, first_id: int = 1) -> None:
        self.path = Path(path)
        self.config = config or OutboxConfig()
        self._clock = clock
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._open(first_id)
        except BaseException:
            self._db.close()
            raise

    def _open(self, first_id: int) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if self.config.synchronous_full else 'NORMAL'}")
        self._db.executescript(_SCHEMA)
        if first_id > 1:  # a new outbox replacing a lost one: ids must not repeat the receiver's (node, record_id)
            self._db.execute("INSERT INTO sqlite_sequence (name, seq) SELECT 'records', ? WHERE NOT EXISTS "
                             "(SELECT 1 FROM sqlite_sequence WHERE name = 'records')", (first_id - 1,))
        self._in_flight: dict[int, int] = {}  # paho mid -> record id
        self._sizes: dict[int, int] = {}  # record id -> payload bytes, for records in flight
        # Totals kept in memory, so put/stats stay O(1) however large a backlog an outage leaves.
        count, size = self._db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM records").fetchone()
        self._count, self._bytes = int(count), int(size)
        self._sent_ids: set[int] = set()
        self._acks: collections.deque[int] = collections.deque()
        # Receipts: records that wait for one (ids), those acknowledged by the broker and waiting (id -> (time of
        # the PUBACK, attempts)), and receipts that came in on the link thread, applied at the next call.
        self._needs_receipt: set[int] = {int(r) for (r,) in self._db.execute("SELECT id FROM receipts")}
        self._awaiting: dict[int, float] = {}
        self._attempts: dict[int, int] = {}  # record id -> sends acknowledged by the broker so far
        self._confirmed: collections.deque[int] = collections.deque()
        self._early: set[int] = set()  # confirmed while sent again and in flight: deleted at that PUBACK
        self._resent = 0
        self._scan_from = 0  # every record below this id is sent (see `pump`)

    def close(self) -> None:
        """Close the database (records stay on disk)."""
        with self._lock:
            self._apply_acks()
            self._db.close()

    def put(self, topic: str, build: Callable[[int], bytes], *, receipt: bool = False) -> int | None:
        """Store a record whose payload is ``build(record_id)``; return its id, or None if refused (full).

        With `receipt`, the record stays after its PUBACK until `confirm` names it (see the module docstring).
        """
        with self._lock:
            self._apply_acks()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                count, size = self._count, self._bytes
                if count >= self.config.max_records or size >= self.config.max_bytes:
                    if self.config.overflow == "drop_newest":
                        self._count_drops(1)
                        self._db.execute("COMMIT")
                        return None
                    count, size = self._drop_oldest(count, size)
                cur = self._db.execute("INSERT INTO records (topic, payload, created) VALUES (?, ?, ?)",
                                       (topic, b"", self._clock()))
                record_id = int(cur.lastrowid or 0)
                payload = build(record_id)
                self._db.execute("UPDATE records SET payload = ? WHERE id = ?", (payload, record_id))
                if receipt:
                    self._db.execute("INSERT INTO receipts (id) VALUES (?)", (record_id,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._count, self._bytes = self._recount()
                raise
            self._count, self._bytes = count + 1, size + len(payload)
            if receipt:
                self._needs_receipt.add(record_id)
            return record_id

    def _recount(self) -> tuple[int, int]:
        count, size = self._db.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM records").fetchone()
        return int(count), int(size)

    def _drop_oldest(self, count: int, size: int) -> tuple[int, int]:
        excess = max(count - self.config.max_records + 1, 1)
        busy = set(self._in_flight.values())
        victims: list[int] = []
        for record_id, nbytes in self._db.execute("SELECT id, LENGTH(payload) FROM records ORDER BY id"):
            if len(victims) >= excess and size < self.config.max_bytes:
                break  # the cursor is lazy: only the oldest rows are read
            if record_id in busy:
                continue
            victims.append(record_id)
            size -= nbytes
        self._db.executemany("DELETE FROM records WHERE id = ?", [(v,) for v in victims])
        self._forget_receipts(victims)
        self._sent_ids.difference_update(victims)
        self._count_drops(len(victims))
        return count - len(victims), size

    def _count_drops(self, n: int) -> None:
        self._db.execute("UPDATE counters SET value = value + ? WHERE name = 'dropped'", (n,))

    def pump(self, link: Publisher, *, limit: int = 1000) -> int:
        """Publish up to `limit` pending records (oldest first) while the link is up; return how many."""
        if not link.connected:
            return 0
        with self._lock:
            self._apply_acks()
            self._resend_overdue()
            room = min(self.config.max_in_flight - len(self._in_flight), limit)
            if room <= 0 or self._count <= len(self._sent_ids):  # nothing unsent (a backlog may await receipts)
                return 0
            # Every record below `_scan_from` is sent (in flight or awaiting its receipt): a backlog of records
            # awaiting receipts is not walked again on every pump. The cursor is lazy; payloads are read only
            # for the records picked.
            picked: list[tuple[int, str]] = []
            for record_id, topic in self._db.execute("SELECT id, topic FROM records WHERE id >= ? ORDER BY id",
                                                     (self._scan_from,)):
                if record_id in self._sent_ids:
                    continue
                picked.append((record_id, topic))
                if len(picked) >= room:
                    break
            sent = 0
            for record_id, topic in picked:
                (payload,) = self._db.execute("SELECT payload FROM records WHERE id = ?", (record_id,)).fetchone()
                result = link.publish(topic, bytes(payload))
                if not result.accepted:
                    self._scan_from = record_id
                    return sent
                self._in_flight[result.mid] = record_id
                self._sizes[record_id] = len(payload)
                self._sent_ids.add(record_id)
                sent += 1
            if picked:
                self._scan_from = picked[-1][0] + 1
            return sent

    def ack(self, mid: int) -> None:
        """The broker acknowledged publish `mid`: its record is deleted at the next outbox call.

        Runs on the link thread inside paho's callback, where paho holds its own message lock; taking the
        outbox lock here could deadlock with a `pump` that waits in paho's publish, so the mid is queued.
        """
        self._acks.append(mid)

    def confirm(self, record_ids: Iterable[int]) -> None:
        """The consumer stored these records (a receipt): they are deleted at the next outbox call.

        Runs on the link thread, like `ack`, so the ids are queued.
        """
        self._confirmed.extend(int(r) for r in record_ids)

    def _apply_acks(self) -> None:
        while self._acks:
            record_id = self._in_flight.pop(self._acks.popleft(), None)
            if record_id is None:
                continue
            if record_id in self._needs_receipt and record_id not in self._early:
                # Acknowledged by the broker, not yet stored by the consumer: wait for the receipt, unsent.
                self._attempts[record_id] = self._attempts.get(record_id, 0) + 1
                self._awaiting[record_id] = self._clock()
                continue
            self._forget_receipts([record_id])
            self._sent_ids.discard(record_id)
            self._delete(record_id)
        if self._confirmed:
            in_flight = set(self._in_flight.values())
            while self._confirmed:
                record_id = self._confirmed.popleft()
                if record_id not in self._needs_receipt:
                    continue  # unknown here, or confirmed already
                if record_id in in_flight:  # sent again meanwhile: deleted at that PUBACK
                    self._early.add(record_id)
                    continue
                self._forget_receipts([record_id])
                self._sent_ids.discard(record_id)
                self._delete(record_id)

    def _delete(self, record_id: int) -> None:
        if self._db.execute("DELETE FROM records WHERE id = ?", (record_id,)).rowcount:
            self._count -= 1
            self._bytes -= self._sizes.pop(record_id, 0)

    def _forget_receipts(self, record_ids: list[int]) -> None:
        gone = [r for r in record_ids if r in self._needs_receipt]
        if gone:
            self._db.executemany("DELETE FROM receipts WHERE id = ?", [(r,) for r in gone])
            for r in gone:
                self._needs_receipt.discard(r)
                self._awaiting.pop(r, None)
                self._attempts.pop(r, None)
                self._early.discard(r)

    def _resend_overdue(self) -> None:
        """Records whose receipt is overdue become sendable again (the wait doubles with every attempt)."""
        if not self._awaiting:
            return
        now = self._clock()
        cfg = self.config
        for record_id, acked_at in list(self._awaiting.items()):
            attempts = self._attempts.get(record_id, 1)
            wait = min(cfg.receipt_timeout_s * 2 ** min(attempts - 1, 30), cfg.receipt_max_s)
            if now - acked_at >= wait:
                del self._awaiting[record_id]
                self._sent_ids.discard(record_id)
                self._scan_from = min(self._scan_from, record_id)
                self._resent += 1

    def stats(self) -> OutboxStats:
        """Pending, in-flight and dropped counts and the bytes held."""
        with self._lock:
            self._apply_acks()
            count, size = self._count, self._bytes
            (dropped,) = self._db.execute("SELECT value FROM counters WHERE name = 'dropped'").fetchone()
            return OutboxStats(pending=int(count), in_flight=len(self._in_flight), dropped=int(dropped),
                               bytes=int(size), awaiting_receipt=len(self._awaiting), resent=self._resent)
