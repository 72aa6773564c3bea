"""The SQLite outbox: ids, delete only after PUBACK, survival across reopen, capacity and overflow policies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edge import EdgeConfigError, Outbox, OutboxConfig, PublishResult, PublishState


class Link:
    """The two members of a link the outbox uses; records what was published (a test double of the broker)."""

    def __init__(self) -> None:
        self.connected = True
        self.sent: list[tuple[int, str, bytes]] = []
        self.full = False

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> PublishResult:
        if self.full:
            return PublishResult(PublishState.QUEUE_FULL, 0)
        mid = len(self.sent) + 1
        self.sent.append((mid, topic, payload))
        return PublishResult(PublishState.SENT, mid)


def test_records_are_deleted_only_after_their_puback(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    ids = [box.put("t", lambda rid: f"record {rid}".encode()) for _ in range(3)]
    assert ids == [1, 2, 3]
    link = Link()
    assert box.pump(link) == 3
    assert [p for _, _, p in link.sent] == [b"record 1", b"record 2", b"record 3"]
    assert box.pump(link) == 0  # in flight: not sent twice
    box.ack(2)
    assert box.stats().pending == 2 and box.stats().in_flight == 2
    box.close()
    # a restart before the PUBACKs: the un-acked records are still there and go out again
    again = Outbox(tmp_path / "o.sqlite")
    link2 = Link()
    assert again.pump(link2) == 2
    assert [p for _, _, p in link2.sent] == [b"record 1", b"record 3"]
    # ids keep growing after a restart (no reuse, so receivers can deduplicate)
    assert again.put("t", lambda rid: b"x") == 4


def test_nothing_is_sent_while_disconnected_or_when_the_queue_is_full(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.put("t", lambda rid: b"a")
    link = Link()
    link.connected = False
    assert box.pump(link) == 0
    link.connected, link.full = True, True
    assert box.pump(link) == 0
    assert box.stats().pending == 1 and box.stats().in_flight == 0


def test_drop_oldest_makes_room_and_counts(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", OutboxConfig(max_records=3))
    for _ in range(5):
        box.put("t", lambda rid: str(rid).encode())
    link = Link()
    box.pump(link)
    assert [p for _, _, p in link.sent] == [b"3", b"4", b"5"]
    assert box.stats().dropped == 2


def test_drop_newest_refuses_and_counts(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", OutboxConfig(max_records=2, overflow="drop_newest"))
    assert [box.put("t", lambda rid: b"x") for _ in range(3)] == [1, 2, None]
    assert box.stats().dropped == 1
    box.close()
    assert Outbox(tmp_path / "o.sqlite").stats().dropped == 1  # the count is kept on disk


def test_in_flight_records_are_never_dropped(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", OutboxConfig(max_records=2))
    box.put("t", lambda rid: b"1")
    box.put("t", lambda rid: b"2")
    link = Link()
    box.pump(link)  # both in flight
    box.put("t", lambda rid: b"3")
    box.ack(1)
    box.ack(2)
    assert box.stats().pending == 1


def test_bad_config_names_the_fix() -> None:
    with pytest.raises(EdgeConfigError, match=re.escape("overflow='wrap'; use 'drop_oldest' or 'drop_newest'")):
        OutboxConfig(overflow="wrap")  # type: ignore[arg-type]


def test_totals_kept_in_memory_match_the_database(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", OutboxConfig(max_records=50))
    link = Link()
    for i in range(120):
        box.put("t", lambda rid, i=i: bytes(i))  # type: ignore[misc]
        if i % 7 == 0:
            box.pump(link, limit=3)
        if i % 5 == 0 and link.sent:
            box.ack(link.sent[len(link.sent) // 2][0])
    stats = box.stats()
    box.close()
    again = Outbox(tmp_path / "o.sqlite")
    assert (again.stats().pending, again.stats().bytes) == (stats.pending, stats.bytes)
