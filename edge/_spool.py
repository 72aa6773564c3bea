"""The learner's experience spool: records the ingesters stored and the learner has not yet learned from.

One SQLite file (WAL) in the run dir, ``edge/spool.sqlite``, written by every experience ingester of the run
(`edge._ingest`, one process each) and read by the learner's ``edge`` source (`cloud.rollout._edge`):

    records   (node, record_id) primary key: a record delivered twice (a broker redelivery, a node sending again
              for want of a receipt) is stored once and counted as a duplicate on the wire; ``version`` is the
              newest policy version that acted in it; ``consumed`` is the policy version whose update learned
              from it (NULL: not yet)
    counters  received, stored, duplicates on the wire, refused (malformed or not fitting the learner's spaces)

An ingester commits a batch of records (``synchronous=FULL``: it tells the nodes they may delete them) before it
acknowledges them to the broker and receipts them to the nodes. The learner marks what an update consumed with
that update's version; a resumed learner clears the marks past its checkpoint (`reset_after`) so those records
are learned from again, and deletes what a checkpoint on disk covers (`collect_garbage`). Exactly-once into the
learner is the learner's business (its record ids are in its checkpoint); the spool never loses a stored record.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge._errors import EdgeConfigError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    node TEXT NOT NULL,
    record_id INTEGER NOT NULL,
    payload BLOB NOT NULL,
    received REAL NOT NULL,
    version INTEGER NOT NULL,
    consumed INTEGER,
    PRIMARY KEY (node, record_id)
);
CREATE INDEX IF NOT EXISTS records_pending ON records (consumed, version);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""

COUNTERS = ("received", "stored", "duplicates_wire", "refused")
"""The spool's counters: messages received by the ingesters, records stored, repeats dropped, records refused."""


@dataclass(frozen=True)
class SpooledRecord:
    """One stored record (``seq`` is its SQLite rowid, its arrival number)."""

    seq: int
    node: str
    record_id: int
    payload: bytes
    received: float
    version: int


class ExperienceSpool:
    """The spool file (see the module docstring); thread-safe within a process, shared between processes.

    Args:
        path: The SQLite file (its folder is created).
        durable: ``synchronous=FULL``: a stored record survives a power loss (an ingester receipts it to the node,
            which then deletes its copy); False survives process crashes only.
        busy_timeout_s: How long a writer waits for another process's transaction.
    """

    def __init__(self, path: Path, *, durable: bool = True, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                       timeout=busy_timeout_s)
        except (OSError, sqlite3.Error) as exc:
            raise EdgeConfigError(f"the experience spool {str(path)[:80]!r} cannot be opened: {exc}; pass a "
                                  "writable file (RUN_DIR/edge/spool.sqlite)") from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._db.executescript(_SCHEMA)  # IF NOT EXISTS: several processes may open it at once
            self._db.executemany("INSERT OR IGNORE INTO counters VALUES (?, 0)", [(c,) for c in COUNTERS])
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise EdgeConfigError(f"the experience spool {str(path)[:80]!r} is not a spool ({exc}); pass "
                                  "RUN_DIR/edge/spool.sqlite or a new file") from None
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()

    # -- the ingesters' side --------------------------------------------------------------------------------

    def store(self, records: Sequence[tuple[str, int, int, bytes]], *, refused: int = 0,
              received: float | None = None) -> list[bool]:
        """Store ``(node, record_id, version, payload)`` records in one transaction; return which were new.

        `refused` counts records the caller refused in the same batch (they are not stored).
        """
        now = time.time() if received is None else received
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                new = [self._db.execute("INSERT OR IGNORE INTO records (node, record_id, version, payload, received) "
                                        "VALUES (?, ?, ?, ?, ?)", (node, rid, version, payload, now)).rowcount == 1
                       for node, rid, version, payload in records]
                stored = sum(new)
                self._add({"received": len(records) + refused, "stored": stored,
                           "duplicates_wire": len(records) - stored, "refused": refused})
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return new

    def _add(self, deltas: dict[str, int]) -> None:
        self._db.executemany("UPDATE counters SET value = value + ? WHERE name = ?",
                             [(v, k) for k, v in deltas.items() if v])

    # -- the learner's side ---------------------------------------------------------------------------------

    def pending(self, *, skip: int = 0, limit: int = 1024) -> list[SpooledRecord]:
        """Records not yet consumed, freshest policy first (then in arrival order), past the first `skip` of them.

        Freshest first: when the fleet sends more than the learner takes, what waits is the older experience,
        which the learner's staleness window then refuses, rather than the whole queue aging together.
        """
        with self._lock:
            rows = self._db.execute("SELECT rowid, node, record_id, payload, received, version FROM records WHERE "
                                    "consumed IS NULL ORDER BY version DESC, rowid LIMIT ? OFFSET ?",
                                    (limit, skip)).fetchall()
        return [SpooledRecord(int(r[0]), str(r[1]), int(r[2]), bytes(r[3]), float(r[4]), int(r[5])) for r in rows]

    def stale(self, *, below_version: int) -> list[tuple[str, int]]:
        """Keys of unconsumed records whose newest acting version is below `below_version`."""
        with self._lock:
            rows = self._db.execute("SELECT node, record_id FROM records WHERE consumed IS NULL AND version < ?",
                                    (below_version,)).fetchall()
        return [(str(n), int(r)) for n, r in rows]

    def mark_consumed(self, keys: Iterable[tuple[str, int]], version: int) -> None:
        """The update that makes policy `version` learned from (or refused) these records."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("UPDATE records SET consumed = ? WHERE node = ? AND record_id = ?",
                                 [(version, node, rid) for node, rid in keys])
            self._db.execute("COMMIT")

    def delete(self, keys: Iterable[tuple[str, int]]) -> None:
        """Delete these records (repeats of records the learner consumed long ago)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("DELETE FROM records WHERE node = ? AND record_id = ?", list(keys))
            self._db.execute("COMMIT")

    def reset_after(self, version: int) -> int:
        """Forget the consumption marks of updates past `version` (lost with a crash); return how many records."""
        with self._lock:
            return int(self._db.execute("UPDATE records SET consumed = NULL WHERE consumed > ?", (version,)).rowcount)

    def collect_garbage(self, upto_version: int) -> int:
        """Delete the records consumed by updates up to `upto_version` (a checkpoint on disk covers them)."""
        with self._lock:
            return int(self._db.execute("DELETE FROM records WHERE consumed <= ?", (upto_version,)).rowcount)

    def counters(self) -> dict[str, int]:
        """The spool's counters (`COUNTERS`) and ``pending``: stored records not yet consumed."""
        with self._lock:
            values = {str(k): int(v) for k, v in self._db.execute("SELECT name, value FROM counters")}
            (pending,) = self._db.execute("SELECT COUNT(*) FROM records WHERE consumed IS NULL").fetchone()
        return {**values, "pending": int(pending)}
