"""A disk-backed outbox for telemetry and experience: SQLite in WAL mode, deleted only after PUBACK.

Pipeline: `put` stores a record in one transaction and gives it the next record id (ids only grow, also
across restarts: SQLite ``AUTOINCREMENT``), and the payload is built from that id, so the receiver can count
loss and duplication. `pump` publishes the oldest records that are not in flight while the link is up;
`ack` (the link's PUBACK callback) deletes a record. A record is never deleted before its PUBACK, so a kill -9
or a broker outage loses nothing: after a restart every record still on disk is sent again. (That re-send is
the one way a record can arrive twice, when the process died between the broker's PUBACK and the delete;
receivers drop repeats by ``(node, record_id)``.)

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
from collections.abc import Callable
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

    def __post_init__(self) -> None:
        if self.max_records < 1 or self.max_bytes < 1 or self.max_in_flight < 1:
            raise EdgeConfigError(f"OutboxConfig: max_records={self.max_records}, max_bytes={self.max_bytes} and "
                                  f"max_in_flight={self.max_in_flight} must all be >= 1")
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

    def close(self) -> None:
        """Close the database (records stay on disk)."""
        with self._lock:
            self._apply_acks()
            self._db.close()

    def put(self, topic: str, build: Callable[[int], bytes]) -> int | None:
        """Store a record whose payload is ``build(record_id)``; return its id, or None if refused (full)."""
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
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._count, self._bytes = self._recount()
                raise
            self._count, self._bytes = count + 1, size + len(payload)
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
            room = self.config.max_in_flight - len(self._in_flight)
            if room <= 0:
                return 0
            busy = tuple(self._sent_ids)
            rows = self._db.execute(
                "SELECT id, topic, payload FROM records ORDER BY id LIMIT ?", (min(room, limit) + len(busy),)
            ).fetchall()
            sent = 0
            for record_id, topic, payload in rows:
                if record_id in self._sent_ids:
                    continue
                if sent >= min(room, limit):
                    break
                result = link.publish(topic, bytes(payload))
                if not result.accepted:
                    break
                self._in_flight[result.mid] = record_id
                self._sizes[record_id] = len(payload)
                self._sent_ids.add(record_id)
                sent += 1
            return sent

    def ack(self, mid: int) -> None:
        """The broker acknowledged publish `mid`: its record is deleted at the next outbox call.

        Runs on the link thread inside paho's callback, where paho holds its own message lock; taking the
        outbox lock here could deadlock with a `pump` that waits in paho's publish, so the mid is queued.
        """
        self._acks.append(mid)

    def _apply_acks(self) -> None:
        while self._acks:
            record_id = self._in_flight.pop(self._acks.popleft(), None)
            if record_id is not None:
                self._sent_ids.discard(record_id)
                if self._db.execute("DELETE FROM records WHERE id = ?", (record_id,)).rowcount:
                    self._count -= 1
                    self._bytes -= self._sizes.pop(record_id, 0)

    def stats(self) -> OutboxStats:
        """Pending, in-flight and dropped counts and the bytes held."""
        with self._lock:
            self._apply_acks()
            count, size = self._count, self._bytes
            (dropped,) = self._db.execute("SELECT value FROM counters WHERE name = 'dropped'").fetchone()
            return OutboxStats(pending=int(count), in_flight=len(self._in_flight), dropped=int(dropped),
                               bytes=int(size))
