"""Every decoder of network input raises only our wire errors, within size, depth and shape limits (hypothesis)."""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device import Bundle, BundleError, RolloutBatch, WireError, pack_arrays, unpack_arrays
from edge import Announcement, Chunk, Control, Experience, NodeStatus, PayloadError, Telemetry
from edge._topics import split_bundle
from tests.edge._policies import cartpole_bundle, make_keys

TOPIC = "strata/f/nodes/n1/status"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid_payloads() -> dict[str, tuple[Callable[[str, bytes], object], bytes]]:
    ann = Announcement(policy="p", version=3, sha256="a" * 64, size=200_000, chunks=3, bundle_id="a" * 16,
                       published_at=1.0)
    _, chunks = split_bundle(b"x" * 200_000, policy="p", version=3, published_at=1.0)
    status = NodeStatus(node="n1", online=True, policy="p", version=3, updated_at=1.0, last_error=None)
    telemetry = Telemetry(record_id=1, node="n1", sent_at=1.0, policy="p", version=3, policy_age_s=1.0, steps=10,
                          episodes=1, episode_returns=(10.0,), episode_lengths=(10,), latency_p50_us=5.0,
                          latency_p99_us=9.0, decisions_by_version={"3": 10})
    batch = RolloutBatch(source="edge:n1", obs=np.zeros((2, 1, 4), np.float32), actions=np.zeros((2, 1), np.int64),
                         rewards=np.ones((2, 1), np.float32), terminations=np.zeros((2, 1), bool),
                         truncations=np.zeros((2, 1), bool), final_obs=np.zeros((2, 1, 4), np.float32),
                         next_obs=np.zeros((1, 4), np.float32), policy_version=np.full((2, 1), 3, np.int64),
                         worker=np.zeros(1, np.int64), seq=np.arange(2, dtype=np.int64)[:, None])
    return {"announcement": (Announcement.decode, ann.encode()), "chunk": (Chunk.decode, chunks[1].encode()),
            "status": (NodeStatus.decode, status.encode()), "telemetry": (Telemetry.decode, telemetry.encode()),
            "control": (Control.decode, Control(command="status", issued_at=1.0).encode()),
            "experience": (Experience.decode, Experience(record_id=1, node="n1", batch=batch).encode())}


VALID = _valid_payloads()
DECODERS = sorted(VALID)


def _only_payload_error(decode: Callable[[str, bytes], object], payload: bytes) -> None:
    with contextlib.suppress(PayloadError):
        decode(TOPIC, payload)


@pytest.mark.parametrize("kind", DECODERS)
def test_valid_payloads_round_trip(kind: str) -> None:
    decode, payload = VALID[kind]
    decode(TOPIC, payload)


@pytest.mark.parametrize("kind", DECODERS)
@FUZZ
@given(data=st.data())
def test_mutated_payloads_raise_only_payload_error(kind: str, data: st.DataObject) -> None:
    decode, payload = VALID[kind]
    buf = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "replace"]))
        at = data.draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "flip" and buf:
            buf[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del buf[at:at + data.draw(st.integers(1, 64))]
        elif op == "insert":
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        else:
            buf[at:at + 8] = data.draw(st.sampled_from([b"1e999", b"-1", b"99999999999999999999999", b"NaN", b"[[[[",
                                                        b"null", b"true", b'"x"', b"{}", b"4294967296"]))
    _only_payload_error(decode, bytes(buf))


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=4), max_leaves=20)


@pytest.mark.parametrize("kind", ["announcement", "status", "telemetry", "control"])
@FUZZ
@given(data=st.data())
def test_json_of_the_right_kind_with_any_values_raises_only_payload_error(kind: str, data: st.DataObject) -> None:
    decode, payload = VALID[kind]
    obj = json.loads(payload)
    for key in data.draw(st.lists(st.sampled_from(sorted(obj)), max_size=4)):
        obj[key] = data.draw(_JSON)
    _only_payload_error(decode, json.dumps(obj).encode())


@pytest.mark.parametrize("kind", DECODERS)
def test_30000_deep_json_is_refused_cleanly(kind: str) -> None:
    decode, _ = VALID[kind]
    for deep in (b"[" * 30_000 + b"]" * 30_000, b'{"kind":"status","x":' + b"[" * 30_000 + b"]" * 30_000 + b"}",
                 b'{"kind":"status","x":' + b"[" * 20 + b"]" * 20 + b"}"):
        with pytest.raises(PayloadError):
            decode(TOPIC, deep)
        header = deep
        with pytest.raises(PayloadError):
            decode(TOPIC, struct.pack("<4sBI", b"STRW", 1, len(header)) + header)


@FUZZ
@given(shape=st.lists(st.integers(-2, 2**70), min_size=0, max_size=40), offset=st.integers(-1, 2**70),
       dtype=st.sampled_from(["<f4", "<i8", "|u1", "|b1", "<f8", "O", "<U4", "V8", "float32", "<f4 "]))
def test_unpack_arrays_refuses_any_spec_it_cannot_honour(shape: list[int], offset: int, dtype: str) -> None:
    header = json.dumps({"meta": {}, "arrays": {"x": {"dtype": dtype, "shape": shape, "offset": offset}}}).encode()
    body = b"\x00" * 64
    try:
        _, arrays = unpack_arrays(struct.pack("<4sBI", b"STRW", 1, len(header)) + header + body)
    except WireError:
        return
    assert arrays["x"].nbytes <= len(body)


def test_unpack_arrays_shape_products_that_overflow_64_bits_are_wire_errors() -> None:
    for shape in ([2**32, 2**32], [2**62, 4], [3037000500, 3037000500, 2], [0, 2**64], [2**63]):
        header = json.dumps({"meta": {}, "arrays": {"x": {"dtype": "<f8", "shape": shape, "offset": 0}}}).encode()
        payload = struct.pack("<4sBI", b"STRW", 1, len(header)) + header + b"\x00" * 16
        if 0 in shape and max(shape) < 2**62:
            assert unpack_arrays(payload)[1]["x"].size == 0
        else:
            with pytest.raises(WireError):
                unpack_arrays(payload)
    header = json.dumps({"meta": {}, "arrays": {"x": {"dtype": "<f8", "shape": [1e999], "offset": 0}}}).encode()
    with pytest.raises(WireError):
        unpack_arrays(struct.pack("<4sBI", b"STRW", 1, len(header)) + header)


@FUZZ
@given(blob=st.binary(max_size=2048))
def test_random_bytes_raise_only_wire_errors(blob: bytes) -> None:
    for decode in (lambda b: unpack_arrays(b), lambda b: Bundle.from_bytes(b)):
        with contextlib.suppress(WireError, BundleError):
            decode(blob)
    for kind in DECODERS:
        _only_payload_error(VALID[kind][0], blob)
        _only_payload_error(VALID[kind][0], b"STRW\x01" + blob)


@pytest.fixture(scope="module")
def bundle_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    key, _ = make_keys(Path(tmp_path_factory.mktemp("keys")))
    return cartpole_bundle(key, 1).to_bytes()


@FUZZ
@given(data=st.data())
def test_mutated_bundles_raise_only_bundle_errors(bundle_bytes: bytes, data: st.DataObject) -> None:
    buf = bytearray(bundle_bytes)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(buf) - 1))
        if data.draw(st.booleans()):
            buf[at] ^= data.draw(st.integers(1, 255))
        else:
            del buf[at:at + data.draw(st.integers(1, 32))]
    with contextlib.suppress(BundleError):
        Bundle.from_bytes(bytes(buf))


def test_pack_arrays_round_trip_still_works() -> None:
    meta, arrays = unpack_arrays(pack_arrays({"a": 1}, {"x": np.arange(6, dtype=np.int32).reshape(2, 3)}))
    assert meta == {"a": 1} and arrays["x"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_integers_beyond_64_bits_are_refused() -> None:
    decode, payload = VALID["telemetry"]
    for key, value in (("sent_at", 10**400), ("episode_returns", [10**400]), ("record_id", 2**64),
                       ("decisions_by_version", {"3": 2**70}), ("episode_lengths", [-(2**64)])):
        obj = json.loads(payload)
        obj[key] = value
        with pytest.raises(PayloadError):
            decode(TOPIC, json.dumps(obj).encode())


@pytest.mark.parametrize("kind", ["request", "reply"])
@FUZZ
@given(data=st.data())
def test_device_escalations_the_gateway_decodes_raise_only_device_payload_errors(kind: str,
                                                                               data: st.DataObject) -> None:
    from device._device_topics import DevicePayloadError, EscalationReply, EscalationRequest

    cls = EscalationRequest if kind == "request" else EscalationReply
    base = (EscalationRequest(id="a1", obs=[0.0, 1.0, 2.0, 3.0], budget_ms=5.0) if kind == "request"
            else EscalationReply(id="a1", action=[1.0], error=None)).encode()
    obj = json.loads(base)
    for key in data.draw(st.lists(st.sampled_from(sorted(obj)), max_size=3)):
        obj[key] = data.draw(_JSON | st.just(10**400) | st.just([[[[[[[[[[0]]]]]]]]]]))
    payloads = [json.dumps(obj).encode(), data.draw(st.binary(max_size=256)), b"[" * 30_000 + b"]" * 30_000]
    for payload in payloads:
        with contextlib.suppress(DevicePayloadError):
            cls.decode("strata/f/devices/n1/d1/request", payload)
