"""The MQTT contract: topics, payload encodings, validation of malformed payloads, chunking."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest

from device import RolloutBatch
from edge import (
    Announcement,
    Chunk,
    ChunkAssembler,
    Control,
    EdgeConfigError,
    Experience,
    FleetTopics,
    NodeStatus,
    PayloadError,
    Telemetry,
    split_bundle,
)
from edge._topics import AWS_MAX_PAYLOAD, CHUNK_BYTES, MAX_SINGLE_BUNDLE


def test_topics_are_exact_and_namespaced() -> None:
    t = FleetTopics("plant-7")
    assert t.announce == "strata/plant-7/announce"
    assert t.policy_latest("cartpole") == "strata/plant-7/policies/cartpole/latest"
    assert t.policy_chunk("cartpole", 3) == "strata/plant-7/policies/cartpole/chunks/3"
    assert t.node("n1", "telemetry") == "strata/plant-7/nodes/n1/telemetry"
    assert t.parse_node_topic("strata/plant-7/nodes/n1/status") == ("n1", "status")
    assert t.parse_node_topic("strata/other/nodes/n1/status") is None


@pytest.mark.parametrize("bad", ["", "a/b", "a+", "#", "x" * 65, "-lead"])
def test_bad_segments_raise_naming_the_fix(bad: str) -> None:
    with pytest.raises(EdgeConfigError, match=re.escape(f"fleet {bad!r} cannot be an MQTT topic segment")):
        FleetTopics(bad)


def test_json_messages_round_trip() -> None:
    status = NodeStatus(node="n1", online=True, policy="cartpole", version=3, updated_at=1.5, outbox_pending=2)
    assert NodeStatus.decode("t", status.encode()) == status
    tel = Telemetry(record_id=7, node="n1", sent_at=2.0, policy="cartpole", version=3, policy_age_s=1.0, steps=10,
                    episodes=1, episode_returns=(9.0,), episode_lengths=(9,), latency_p50_us=4.0,
                    latency_p99_us=9.5, decisions_by_version={"3": 10})
    assert Telemetry.decode("t", tel.encode()) == tel
    ctl = Control(command="status", issued_at=3.0)
    assert Control.decode("t", ctl.encode()) == ctl


@pytest.mark.parametrize(("payload", "problem"), [
    (b"\xff\xfe", "status is not valid JSON"),
    (b"[1, 2]", "status must be a JSON object, got list"),
    (b'{"kind": "telemetry"}', "expected kind 'status', got 'telemetry'"),
    (b'{"kind": "status", "node": "n1", "updated_at": 1}', "field 'online' is missing"),
    (b'{"kind": "status", "node": "n1", "online": "yes", "updated_at": 1}', "field 'online' must be"),
    (b'{"kind": "status", "node": 5, "online": true, "updated_at": 1}', "field 'node' must be"),
    (b"{" + b" " * 70_000 + b"}", "exceeds the 65536-byte limit"),
])
def test_malformed_payloads_name_topic_and_problem(payload: bytes, problem: str) -> None:
    with pytest.raises(PayloadError, match=re.escape("payload on 'strata/f/nodes/n1/status' refused: ")) as info:
        NodeStatus.decode("strata/f/nodes/n1/status", payload)
    assert problem in info.value.problem


def test_control_refuses_unknown_command() -> None:
    with pytest.raises(PayloadError, match=re.escape("command 'reboot' is not one of ['status', 'resync']")):
        Control.decode("c", json.dumps({"kind": "control", "command": "reboot", "issued_at": 0}).encode())


def test_announcement_checks_chunk_count() -> None:
    ann = Announcement(policy="p", version=1, sha256="0" * 64, size=300_000, chunks=2, bundle_id="x")
    with pytest.raises(PayloadError, match=re.escape("chunks=2 does not fit size=300000")):
        Announcement.decode("t", ann.encode())


def test_small_bundles_travel_whole_and_large_ones_in_chunks_under_the_aws_limit() -> None:
    ann, chunks = split_bundle(b"x" * MAX_SINGLE_BUNDLE, policy="p", version=1, published_at=0.0)
    assert ann.chunks == 0 and chunks == []
    data = np.random.default_rng(0).integers(0, 255, 3 * CHUNK_BYTES + 5, dtype=np.uint8).tobytes()
    ann, chunks = split_bundle(data, policy="p", version=2, published_at=0.0)
    assert ann.chunks == len(chunks) == 4
    assert all(len(c.encode()) <= AWS_MAX_PAYLOAD for c in chunks)
    assert Announcement.decode("t", ann.encode()) == ann


def test_assembler_out_of_order_duplicates_and_resume() -> None:
    data = bytes(range(256)) * 1500
    ann, chunks = split_bundle(data, policy="p", version=2, published_at=0.0)
    asm = ChunkAssembler()
    asm.expect(ann)
    wire = [Chunk.decode("t", c.encode()) for c in chunks]
    assert asm.add("t", wire[2]) is None
    assert asm.add("t", wire[2]) is None  # a repeat (redelivery) is harmless
    asm.expect(ann)  # the announcement again after a reconnect: partial work is kept
    assert asm.missing("p") == [0, 1, 3]
    assert asm.add("t", wire[0]) is None and asm.add("t", wire[3]) is None
    assert asm.add("t", wire[1]) == data
    assert asm.missing("p") == []


def test_assembler_ignores_stale_chunks_and_bounds_memory_and_time() -> None:
    now = [0.0]
    asm = ChunkAssembler(max_bytes=500_000, timeout_s=5.0, clock=lambda: now[0])
    old_ann, old_chunks = split_bundle(b"a" * 200_000, policy="p", version=1, published_at=0.0)
    new_ann, _ = split_bundle(b"b" * 200_000, policy="p", version=2, published_at=0.0)
    asm.expect(new_ann)
    assert asm.add("t", old_chunks[0]) is None  # an older retained chunk: other bundle id
    assert asm.missing("p") == [0, 1, 2]
    now[0] = 6.0
    assert asm.expire() == [new_ann]
    big, _ = split_bundle(b"c" * 600_000, policy="q", version=1, published_at=0.0)
    with pytest.raises(EdgeConfigError, match=re.escape("does not fit the 500000-byte reassembly bound")):
        asm.expect(big)
    del old_ann


def test_assembler_refuses_a_bundle_whose_digest_does_not_match() -> None:
    data = b"z" * 250_000
    ann, chunks = split_bundle(data, policy="p", version=1, published_at=0.0)
    forged = Announcement(policy="p", version=1, sha256=hashlib.sha256(b"other").hexdigest(), size=ann.size,
                          chunks=ann.chunks, bundle_id=ann.bundle_id)
    asm = ChunkAssembler()
    asm.expect(forged)
    bad = [Chunk(policy="p", bundle_id=c.bundle_id, index=c.index, total=c.total, sha256=forged.sha256,
                 size=c.size, data=c.data) for c in chunks]
    assert asm.add("t", bad[0]) is None and asm.add("t", bad[1]) is None
    with pytest.raises(PayloadError, match=re.escape("does not match its sha256")):
        asm.add("t", bad[2])


def test_chunk_decode_refuses_garbage() -> None:
    with pytest.raises(PayloadError, match=re.escape("chunk is not a raw-buffer message")):
        Chunk.decode("t", b"not a chunk")


def test_experience_round_trips_a_rollout_batch() -> None:
    t = 5
    batch = RolloutBatch(source="edge:n1", obs=np.zeros((t, 1, 4), np.float32), actions=np.ones((t, 1), np.int64),
                         rewards=np.ones((t, 1), np.float32), terminations=np.zeros((t, 1), bool),
                         truncations=np.zeros((t, 1), bool), final_obs=np.zeros((t, 1, 4), np.float32),
                         next_obs=np.zeros((1, 4), np.float32), policy_version=np.full((t, 1), 3, np.int64),
                         worker=np.zeros(1, np.int64), seq=np.arange(t, dtype=np.int64)[:, None])
    got = Experience.decode("t", Experience(record_id=9, node="n1", batch=batch).encode())
    assert got.record_id == 9 and got.node == "n1"
    np.testing.assert_array_equal(got.batch.policy_version, batch.policy_version)
