"""The MQTT contract of strata: every topic, every payload, how each is encoded and validated.

Topics (all under ``strata/{fleet}/``; QoS 1 everywhere; MQTT 3.1.1 features only):

    announce                              retained JSON `Announcement`: the latest bundle published to the fleet
    policies/{policy}/latest              retained: the bundle bytes (<= 100 KB), or, for a larger bundle,
                                          the JSON `Announcement` with ``chunks > 0`` that says where its chunks are
    policies/{policy}/chunks/{index}      retained `Chunk` (raw-buffer message, ``device.pack_arrays``)
    nodes/{node}/status                   retained JSON `NodeStatus`; also the node's last will (``online: false``)
    nodes/{node}/telemetry                JSON `Telemetry`, one record of the node's outbox (``record_id``)
    nodes/{node}/experience               raw-buffer `Experience`, one outbox record of edge-collected transitions
    nodes/{node}/receipt                  JSON `Receipt`: the learner stored these experience records
    nodes/{node}/control                  JSON `Control` for one node
    control                               JSON `Control` for the whole fleet

The patterns, and which client publishes or subscribes to each, live in ``device._mqtt_access`` (the IoT
policy of a node is derived from the same table).

Every topic a node must read is exact, never a wildcard, because AWS IoT Core sends no retained messages to
wildcard subscriptions. Payloads are JSON for small control messages and raw bytes for binary ones; nothing is
ever pickled. AWS IoT Core caps a payload at 128 KB, so a bundle over `MAX_SINGLE_BUNDLE` (100 KB) travels in
`CHUNK_BYTES` chunks, each naming the bundle id, its index, the total and the bundle's sha256; `ChunkAssembler`
puts them back together within a memory and a time bound, and keeps partial work across reconnects.

Incoming payloads are validated here: a bad one raises `PayloadError` naming the topic and the problem, which
the receiver logs before dropping the message.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from device import (
    MqttTopicName,
    ObsCodec,
    RolloutBatch,
    WireError,
    is_image,
    mqtt_topic,
    pack_arrays,
    unpack_arrays,
)
from device._mqtt_access import MQTT_PREFIX as PREFIX
from device._names import IDENTIFIER_FORM, is_identifier, shown
from device._obs_codec import decode_frames, encode_frames
from edge._errors import EdgeConfigError, PayloadError

QOS = 1
AWS_MAX_PAYLOAD = 128 * 1024
"""AWS IoT Core's payload limit; nothing strata publishes is larger."""
MAX_SINGLE_BUNDLE = 100 * 1024
"""Bundles up to this size travel in one message; larger ones in chunks."""
CHUNK_BYTES = 96 * 1024
"""Bundle bytes per chunk; with its header a chunk stays under `AWS_MAX_PAYLOAD`."""
MAX_JSON_PAYLOAD = 64 * 1024
"""Control, status, telemetry and announcement messages are refused above this size."""
MAX_CHUNKS = 1024
MAX_JSON_DEPTH = 8
"""Nesting depth of objects and lists a JSON payload may have (strata's own payloads need 2)."""
MAX_INT = 2**63 - 1
"""Integers in payloads are 64-bit: a bigger one is refused (float() of a 400-digit integer overflows)."""

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
NodeTopicKind = Literal["status", "telemetry", "experience", "receipt", "control"]
_NODE_KINDS: tuple[NodeTopicKind, ...] = ("status", "telemetry", "experience", "receipt", "control")
_NODE_TOPICS: dict[NodeTopicKind, MqttTopicName] = {"status": "node_status", "telemetry": "node_telemetry",
                                                 "experience": "node_experience", "receipt": "node_receipt",
                                                 "control": "node_control"}
ControlCommand = Literal["status", "resync"]
CONTROL_COMMANDS: tuple[ControlCommand, ...] = ("status", "resync")


def check_segment(value: str, what: str) -> str:
    """Return `value` if it follows the identifier rule (`device.identifier`); raise `EdgeConfigError`.

    Fleet, node and policy names are topic segments and path components, so they follow the one rule.
    """
    if not is_identifier(value):
        raise EdgeConfigError(f"{what} {shown(value)} cannot be an MQTT topic segment: use {IDENTIFIER_FORM} "
                              "(no '/', '+', '#')")
    return value


@dataclass(frozen=True)
class FleetTopics:
    """Every topic of one fleet; the only place topic strings are built."""

    fleet: str

    def __post_init__(self) -> None:
        check_segment(self.fleet, "fleet")

    @property
    def root(self) -> str:
        """``strata/{fleet}``."""
        return f"{PREFIX}/{self.fleet}"

    @property
    def announce(self) -> str:
        """Retained latest announcement of the fleet."""
        return mqtt_topic(self.fleet, "announce")

    @property
    def control(self) -> str:
        """Fleet-wide control."""
        return mqtt_topic(self.fleet, "control")

    def policy_latest(self, policy: str) -> str:
        """Retained latest bundle (or chunked announcement) of one policy."""
        return mqtt_topic(self.fleet, "policy_latest", policy=check_segment(policy, "policy"))

    def policy_chunk(self, policy: str, index: int) -> str:
        """Retained chunk `index` of the latest chunked bundle of one policy."""
        if not 0 <= index < MAX_CHUNKS:
            raise EdgeConfigError(f"policy_chunk: index {index} is outside 0..{MAX_CHUNKS - 1}")
        return mqtt_topic(self.fleet, "policy_chunk", policy=check_segment(policy, "policy"), index=index)

    def node(self, node: str, kind: NodeTopicKind) -> str:
        """``nodes/{node}/{kind}`` for kind in status, telemetry, experience, receipt, control."""
        if kind not in _NODE_KINDS:
            raise EdgeConfigError(f"node topic kind {kind!r} is not one of {list(_NODE_KINDS)}")
        return mqtt_topic(self.fleet, _NODE_TOPICS[kind], node=check_segment(node, "node id"))

    def all_nodes(self, kind: NodeTopicKind) -> str:
        """Wildcard over every node's `kind` topic (for the cloud side; retained messages need Mosquitto)."""
        if kind not in _NODE_KINDS:
            raise EdgeConfigError(f"node topic kind {kind!r} is not one of {list(_NODE_KINDS)}")
        return mqtt_topic(self.fleet, _NODE_TOPICS[kind], node="+")

    def parse_node_topic(self, topic: str) -> tuple[str, NodeTopicKind] | None:
        """``(node, kind)`` for a node topic of this fleet, else None."""
        parts = topic.split("/")
        if len(parts) == 5 and parts[:3] == [PREFIX, self.fleet, "nodes"] and parts[4] in _NODE_KINDS:
            kind: NodeTopicKind = parts[4]
            return parts[3], kind
        return None


# ---------------------------------------------------------------------------------------------- JSON helpers

def _encode_json(obj: Mapping[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_JSON_PAYLOAD:
        raise EdgeConfigError(f"JSON payload of {len(data)} bytes exceeds the {MAX_JSON_PAYLOAD}-byte limit")
    return data


def _decode_json(topic: str, payload: bytes, kind: str) -> dict[str, Any]:
    if len(payload) > MAX_JSON_PAYLOAD:
        raise PayloadError(topic, f"{len(payload)} bytes exceeds the {MAX_JSON_PAYLOAD}-byte limit for {kind}")
    try:
        obj = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError(topic, f"{kind} is not valid JSON ({exc})") from None
    except RecursionError:
        raise PayloadError(topic, f"{kind} nests deeper than {MAX_JSON_DEPTH} levels") from None
    if json_depth(obj) > MAX_JSON_DEPTH:
        raise PayloadError(topic, f"{kind} nests deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(obj, dict):
        raise PayloadError(topic, f"{kind} must be a JSON object, got {type(obj).__name__}")
    if obj.get("kind") != kind:
        raise PayloadError(topic, f"expected kind {kind!r}, got {obj.get('kind')!r}")
    return obj


def json_depth(obj: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, ``[]`` is 1), computed without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            depth += 1
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:  # deeper ones are refused anyway: stop walking
                stack.extend((v, depth) for v in value if isinstance(v, dict | list))
    return deepest


def _field(topic: str, obj: Mapping[str, Any], name: str, types: type | tuple[type, ...], *,
           optional: bool = False) -> Any:
    if name not in obj or obj[name] is None:
        if optional:
            return None
        raise PayloadError(topic, f"field {name!r} is missing")
    value = obj[name]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise PayloadError(topic, f"field {name!r} must be {types}, got a bool")
    if not isinstance(value, types):
        raise PayloadError(topic, f"field {name!r} must be {types}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise PayloadError(topic, f"field {name!r} must be finite, got {value}")
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value <= MAX_INT:
        raise PayloadError(topic, f"field {name!r} must fit in 64 bits, got {value}")
    return value


# ---------------------------------------------------------------------------------------------- announcements

@dataclass(frozen=True, kw_only=True)
class Announcement:
    """A bundle was published: which policy and version, its sha256 and size, and how it travels."""

    policy: str
    """Policy name."""
    version: int
    """Bundle version."""
    sha256: str
    """sha256 hex of the whole bundle bytes (``Bundle.to_bytes()``)."""
    size: int
    """Bundle size in bytes."""
    chunks: int = 0
    """0: the bundle is the payload of ``policies/{policy}/latest``; else the number of chunks."""
    bundle_id: str = ""
    """Id that every chunk of this bundle carries (first 16 hex of sha256)."""
    published_at: float = 0.0
    """Unix time of publishing."""

    def encode(self) -> bytes:
        """JSON payload."""
        return _encode_json({"kind": "announcement", **asdict(self)})

    @classmethod
    def decode(cls, topic: str, payload: bytes) -> Announcement:
        """Parse and validate; raise `PayloadError`."""
        obj = _decode_json(topic, payload, "announcement")
        ann = cls(
            policy=_field(topic, obj, "policy", str), version=_field(topic, obj, "version", int),
            sha256=_field(topic, obj, "sha256", str), size=_field(topic, obj, "size", int),
            chunks=_field(topic, obj, "chunks", int), bundle_id=_field(topic, obj, "bundle_id", str),
            published_at=float(_field(topic, obj, "published_at", (int, float))),
        )
        if not is_identifier(ann.policy):
            raise PayloadError(topic, f"policy name {ann.policy!r} is not a valid topic segment")
        if ann.version < 1 or ann.size < 1 or not _SHA256.match(ann.sha256):
            raise PayloadError(topic, f"version {ann.version}, size {ann.size} or sha256 {ann.sha256!r} is invalid")
        if not 0 <= ann.chunks <= MAX_CHUNKS or (ann.chunks and ann.chunks != math.ceil(ann.size / CHUNK_BYTES)):
            raise PayloadError(topic, f"chunks={ann.chunks} does not fit size={ann.size} "
                                      f"at {CHUNK_BYTES} bytes per chunk")
        return ann


def is_json_payload(payload: bytes) -> bool:
    """Whether a ``latest`` payload is a JSON announcement (chunked bundle) rather than bundle bytes."""
    return payload[:1] == b"{"


# ---------------------------------------------------------------------------------------------- chunks

@dataclass(frozen=True, kw_only=True)
class Chunk:
    """One piece of a bundle too large for one message."""

    policy: str
    bundle_id: str
    index: int
    total: int
    sha256: str
    size: int
    data: bytes

    def encode(self) -> bytes:
        """Raw-buffer payload: header in the JSON meta, bytes as a uint8 array."""
        meta = {"kind": "chunk", "policy": self.policy, "bundle_id": self.bundle_id, "index": self.index,
                "total": self.total, "sha256": self.sha256, "size": self.size}
        return pack_arrays(meta, {"data": np.frombuffer(self.data, dtype=np.uint8)})

    @classmethod
    def decode(cls, topic: str, payload: bytes) -> Chunk:
        """Parse and validate; raise `PayloadError`."""
        if len(payload) > AWS_MAX_PAYLOAD:
            raise PayloadError(topic, f"chunk of {len(payload)} bytes exceeds {AWS_MAX_PAYLOAD}")
        try:
            meta, arrays = unpack_arrays(payload)
        except WireError as exc:
            raise PayloadError(topic, f"chunk is not a raw-buffer message: {exc}") from None
        if meta.get("kind") != "chunk" or "data" not in arrays:
            raise PayloadError(topic, f"expected kind 'chunk' with a data array, got {meta.get('kind')!r}")
        data = arrays["data"]
        if data.dtype != np.uint8 or data.ndim != 1:
            raise PayloadError(topic, f"chunk data must be 1-D uint8, got {data.dtype} {data.shape}")
        chunk = cls(policy=_field(topic, meta, "policy", str), bundle_id=_field(topic, meta, "bundle_id", str),
                    index=_field(topic, meta, "index", int), total=_field(topic, meta, "total", int),
                    sha256=_field(topic, meta, "sha256", str), size=_field(topic, meta, "size", int),
                    data=data.tobytes())
        if not (0 <= chunk.index < chunk.total <= MAX_CHUNKS) or not _SHA256.match(chunk.sha256):
            raise PayloadError(topic, f"chunk index {chunk.index} of total {chunk.total} or sha256 is invalid")
        return chunk


def bundle_id(data: bytes) -> str:
    """Id of a bundle's bytes: the first 16 hex characters of their sha256."""
    return hashlib.sha256(data).hexdigest()[:16]


def split_bundle(data: bytes, *, policy: str, version: int, published_at: float) -> tuple[Announcement, list[Chunk]]:
    """Cut bundle bytes into chunks when they exceed `MAX_SINGLE_BUNDLE`; return the announcement and chunks."""
    sha = hashlib.sha256(data).hexdigest()
    total = 0 if len(data) <= MAX_SINGLE_BUNDLE else math.ceil(len(data) / CHUNK_BYTES)
    if total > MAX_CHUNKS:
        raise EdgeConfigError(f"split_bundle: {len(data)} bytes needs {total} chunks, more than {MAX_CHUNKS}")
    ann = Announcement(policy=policy, version=version, sha256=sha, size=len(data), chunks=total,
                       bundle_id=sha[:16], published_at=published_at)
    chunks = [Chunk(policy=policy, bundle_id=ann.bundle_id, index=i, total=total, sha256=sha, size=len(data),
                    data=data[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES]) for i in range(total)]
    return ann, chunks


@dataclass
class _Assembly:
    announcement: Announcement
    started: float
    parts: dict[int, bytes] = field(default_factory=dict)


class ChunkAssembler:
    """Reassembles chunked bundles, bounded in memory (`max_bytes` over all partial bundles) and time.

    Partial bundles survive reconnects (the retained chunks are delivered again and already-held ones are
    skipped), so a transfer resumes where it stopped; a bundle not complete within `timeout_s` of its
    announcement is dropped. A newer announcement of the same policy replaces an older partial one.
    """

    def __init__(self, *, max_bytes: int = 16 * 1024 * 1024, timeout_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._clock = clock
        self._by_policy: dict[str, _Assembly] = {}

    def expect(self, ann: Announcement) -> None:
        """Start (or keep) collecting the chunks of `ann`; raise `EdgeConfigError` when it cannot fit."""
        if ann.chunks == 0:
            raise EdgeConfigError(f"ChunkAssembler.expect: announcement of {ann.policy} v{ann.version} is not chunked")
        current = self._by_policy.get(ann.policy)
        if current is not None and current.announcement.bundle_id == ann.bundle_id:
            return
        self._by_policy.pop(ann.policy, None)
        self.expire()
        held = sum(len(p) for a in self._by_policy.values() for p in a.parts.values())
        if ann.size + held > self.max_bytes:
            raise EdgeConfigError(f"ChunkAssembler: bundle {ann.policy} v{ann.version} of {ann.size} bytes does not "
                                  f"fit the {self.max_bytes}-byte reassembly bound ({held} bytes held)")
        self._by_policy[ann.policy] = _Assembly(ann, self._clock())

    def missing(self, policy: str) -> list[int]:
        """Indices still missing for the bundle being assembled for `policy`."""
        a = self._by_policy.get(policy)
        return [] if a is None else [i for i in range(a.announcement.chunks) if i not in a.parts]

    def expire(self) -> list[Announcement]:
        """Drop assemblies older than `timeout_s`; return their announcements."""
        now = self._clock()
        dropped = [p for p, a in self._by_policy.items() if now - a.started > self.timeout_s]
        return [self._by_policy.pop(p).announcement for p in dropped]

    def add(self, topic: str, chunk: Chunk) -> bytes | None:
        """Take one chunk; return the whole bundle when it is complete and its sha256 matches, else None.

        Chunks of another bundle than the one expected (an older retained chunk) are ignored. A complete
        bundle whose sha256 does not match raises `PayloadError` and the assembly is dropped.
        """
        a = self._by_policy.get(chunk.policy)
        if a is None or chunk.bundle_id != a.announcement.bundle_id:
            return None
        ann = a.announcement
        if chunk.total != ann.chunks or chunk.sha256 != ann.sha256 or chunk.size != ann.size:
            raise PayloadError(topic, f"chunk header (total={chunk.total}, size={chunk.size}) disagrees with the "
                                      f"announcement (chunks={ann.chunks}, size={ann.size})")
        expected = min(CHUNK_BYTES, ann.size - chunk.index * CHUNK_BYTES)
        if len(chunk.data) != expected:
            raise PayloadError(topic, f"chunk {chunk.index} has {len(chunk.data)} bytes, expected {expected}")
        a.parts[chunk.index] = chunk.data
        if len(a.parts) < ann.chunks:
            return None
        del self._by_policy[chunk.policy]
        data = b"".join(a.parts[i] for i in range(ann.chunks))
        if hashlib.sha256(data).hexdigest() != ann.sha256:
            raise PayloadError(topic, f"reassembled bundle {ann.policy} v{ann.version} does not match its sha256")
        return data


# ---------------------------------------------------------------------------------------------- node messages

@dataclass(frozen=True, kw_only=True)
class NodeStatus:
    """A node's presence and running policy; retained, and its ``online: false`` form is the last will."""

    node: str
    online: bool
    policy: str | None = None
    version: int | None = None
    updated_at: float = 0.0
    last_error: str | None = None
    outbox_pending: int = 0
    outbox_dropped: int = 0
    steps: int = 0
    """Simulator steps since the agent started (the latest telemetry, kept here because status is retained)."""
    episodes: int = 0
    mean_return: float | None = None
    """Mean return of the episodes in the latest telemetry record."""
    latency_p99_us: float | None = None
    last_record_id: int | None = None
    cache_repairs: str | None = None
    """What the node's policy cache found damaged since it started and how it fell back (kept after a later
    successful update clears `last_error`)."""

    def encode(self) -> bytes:
        """JSON payload."""
        return _encode_json({"kind": "status", **asdict(self)})

    @classmethod
    def decode(cls, topic: str, payload: bytes) -> NodeStatus:
        """Parse and validate; raise `PayloadError`."""
        obj = _decode_json(topic, payload, "status")
        return cls(node=_field(topic, obj, "node", str), online=_field(topic, obj, "online", bool),
                   policy=_field(topic, obj, "policy", str, optional=True),
                   version=_field(topic, obj, "version", int, optional=True),
                   updated_at=float(_field(topic, obj, "updated_at", (int, float))),
                   last_error=_field(topic, obj, "last_error", str, optional=True),
                   outbox_pending=_field(topic, obj, "outbox_pending", int, optional=True) or 0,
                   outbox_dropped=_field(topic, obj, "outbox_dropped", int, optional=True) or 0,
                   steps=_field(topic, obj, "steps", int, optional=True) or 0,
                   episodes=_field(topic, obj, "episodes", int, optional=True) or 0,
                   mean_return=_opt_float(topic, obj, "mean_return"),
                   latency_p99_us=_opt_float(topic, obj, "latency_p99_us"),
                   last_record_id=_field(topic, obj, "last_record_id", int, optional=True),
                   cache_repairs=_field(topic, obj, "cache_repairs", str, optional=True))


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and -MAX_INT <= x <= MAX_INT


def _is_number(x: object) -> bool:
    return _is_int(x) or (isinstance(x, float) and math.isfinite(x))


def _opt_float(topic: str, obj: Mapping[str, Any], name: str) -> float | None:
    value = _field(topic, obj, name, (int, float), optional=True)
    return None if value is None else float(value)


@dataclass(frozen=True, kw_only=True)
class Telemetry:
    """One telemetry record of a node: what its simulators did since the previous record."""

    record_id: int
    node: str
    sent_at: float
    policy: str | None
    version: int | None
    policy_age_s: float | None
    steps: int
    episodes: int
    episode_returns: tuple[float, ...]
    episode_lengths: tuple[int, ...]
    latency_p50_us: float | None
    latency_p99_us: float | None
    decisions_by_version: dict[str, int]
    outbox_pending: int = 0
    outbox_dropped: int = 0

    def encode(self) -> bytes:
        """JSON payload."""
        obj = asdict(self)
        obj["episode_returns"] = list(self.episode_returns)
        obj["episode_lengths"] = list(self.episode_lengths)
        return _encode_json({"kind": "telemetry", **obj})

    @classmethod
    def decode(cls, topic: str, payload: bytes) -> Telemetry:
        """Parse and validate; raise `PayloadError`."""
        obj = _decode_json(topic, payload, "telemetry")
        returns = _field(topic, obj, "episode_returns", list)
        lengths = _field(topic, obj, "episode_lengths", list)
        by_version = _field(topic, obj, "decisions_by_version", dict)
        if not all(_is_number(r) for r in returns) or not all(_is_int(n) for n in lengths):
            raise PayloadError(topic, "episode_returns must be finite numbers and episode_lengths 64-bit integers")
        if not all(_is_int(v) for v in by_version.values()):
            raise PayloadError(topic, "decisions_by_version values must be integers")
        age = _field(topic, obj, "policy_age_s", (int, float), optional=True)
        p50 = _field(topic, obj, "latency_p50_us", (int, float), optional=True)
        p99 = _field(topic, obj, "latency_p99_us", (int, float), optional=True)
        return cls(record_id=_field(topic, obj, "record_id", int), node=_field(topic, obj, "node", str),
                   sent_at=float(_field(topic, obj, "sent_at", (int, float))),
                   policy=_field(topic, obj, "policy", str, optional=True),
                   version=_field(topic, obj, "version", int, optional=True),
                   policy_age_s=None if age is None else float(age), steps=_field(topic, obj, "steps", int),
                   episodes=_field(topic, obj, "episodes", int),
                   episode_returns=tuple(float(r) for r in returns), episode_lengths=tuple(lengths),
                   latency_p50_us=None if p50 is None else float(p50),
                   latency_p99_us=None if p99 is None else float(p99),
                   decisions_by_version={str(k): int(v) for k, v in by_version.items()},
                   outbox_pending=_field(topic, obj, "outbox_pending", int, optional=True) or 0,
                   outbox_dropped=_field(topic, obj, "outbox_dropped", int, optional=True) or 0)


EXPERIENCE_ARRAYS = ("obs", "actions", "rewards", "terminations", "truncations", "next_obs", "policy_version")
"""Arrays every experience record carries (time-major ``[T, N, ...]``; ``next_obs`` is ``[N, ...]``)."""
EXPERIENCE_OPTIONAL = ("final_rows", "final_obs", "behaviour_logprobs", "episode_return", "episode_length")
_FRAMED = ("obs", "next_obs", "final_obs")
"""The arrays of image observations an experience record's frame table may hold."""
"""Arrays a record may carry: the real last observations of the episodes that ended (``final_obs[D, ...]`` at the
flat step indices ``final_rows[D]``, ``t * N + n``: sparse, because most steps have none), the behaviour
policy's log-prob of each action, and where an episode ended its return and length (else 0)."""
MAX_RECORD_ENVS = 64
"""Env streams one experience record may carry."""


@dataclass(frozen=True, kw_only=True)
class ExperienceSpec:
    """What the learner accepts: its spaces (manifest JSON form) and the largest record it takes."""

    observation_space: dict[str, Any]
    action_space: dict[str, Any]
    max_steps: int = 4096
    """Steps per env stream in one record at most."""


@dataclass(frozen=True, kw_only=True)
class Experience:
    """One outbox record of edge-collected transitions for the learner: a `device.RolloutBatch` plus ids.

    The transitions' ids are not sent: a decoded record's batch is named ``source = edge:{node}:{record_id}``,
    ``worker = 0..N-1``, ``seq = 0..T-1``, so every transition of a fleet has an id that no node can forge or repeat
    (record ids only grow, see `edge._outbox`). The batch's own source, worker and seq are ignored by `encode`.

    Args:
        record_id: The node's outbox record id (>= 1).
        node: The node that collected it.
        batch: The transitions; ``behaviour_logprobs`` when the node sampled its actions.
        episode_return: ``[T, N]`` float32: where an episode ended, its return (undiscounted), else 0.
        episode_length: ``[T, N]`` int64: where an episode ended, its length in steps, else 0.
    """

    record_id: int
    node: str
    batch: RolloutBatch
    episode_return: np.ndarray | None = None
    episode_length: np.ndarray | None = None
    codec: ObsCodec | None = None
    """Observation codec of image observations (the node's pipeline codec): ``obs``, ``next_obs`` and
    ``final_obs`` then travel as one frame table (`device._obs_codec`); None or raw: arrays as they are."""

    def encode(self) -> bytes:
        """Raw-buffer payload: the batch's arrays (image frames as a frame table), with node and record id."""
        b = self.batch
        arrays = {name: getattr(b, name) for name in EXPERIENCE_ARRAYS}
        done = np.logical_or(b.terminations, b.truncations).reshape(-1)
        rows = np.flatnonzero(done).astype(np.int64)
        if rows.size:
            arrays["final_rows"] = rows
            arrays["final_obs"] = b.final_obs.reshape(-1, *b.final_obs.shape[2:])[rows]
        if b.behaviour_logprobs is not None:
            arrays["behaviour_logprobs"] = b.behaviour_logprobs
        if self.episode_return is not None:
            arrays["episode_return"] = self.episode_return
        if self.episode_length is not None:
            arrays["episode_length"] = self.episode_length
        meta: dict[str, Any] = {"kind": "experience", "record_id": self.record_id, "node": self.node}
        if self.codec is not None and not self.codec.is_raw and is_image(b.obs_shape, b.obs.dtype):
            framed = {name: arrays.pop(name) for name in _FRAMED if name in arrays}
            meta["frames"], frame_arrays = encode_frames(framed, self.codec, obs_shape=b.obs_shape)
            meta["obs_codec"] = self.codec.spec
            arrays.update(frame_arrays)
        data = pack_arrays(meta, arrays)
        if len(data) > AWS_MAX_PAYLOAD:
            hint = "" if self.codec is not None and not self.codec.is_raw else \
                " or compress image observations (--obs-codec webp)"
            raise EdgeConfigError(f"Experience.encode: {len(data)} bytes exceeds {AWS_MAX_PAYLOAD}; "
                                  f"collect fewer steps per record (--experience-steps){hint}")
        return data

    @property
    def source(self) -> str:
        """``edge:{node}:{record_id}``, the source of the record's transitions."""
        return f"edge:{self.node}:{self.record_id}"

    @classmethod
    def decode(cls, topic: str, payload: bytes, *, spec: ExperienceSpec | None = None,
               node: str | None = None) -> Experience:
        """Parse and validate; raise `PayloadError`.

        Args:
            topic: Where it came from (for messages).
            payload: The message.
            spec: The learner's spaces and limits: when given, every array must fit them (shapes, dtypes, finite
                numbers, actions inside the action space, behaviour log-probs of a probability).
            node: The node the topic (and so the broker's ACL or the IoT policy) says sent it: the record must name
                the same node.
        """
        if len(payload) > AWS_MAX_PAYLOAD:
            raise PayloadError(topic, f"experience of {len(payload)} bytes exceeds {AWS_MAX_PAYLOAD}")
        try:
            meta, arrays = unpack_arrays(payload)
        except WireError as exc:
            raise PayloadError(topic, f"experience is not a raw-buffer message: {exc}") from None
        if meta.get("kind") != "experience":
            raise PayloadError(topic, f"expected kind 'experience', got {meta.get('kind')!r}")
        if "frames" in meta:
            frames = meta["frames"]
            names = frames.get("arrays") if isinstance(frames, dict) else None
            if not isinstance(names, list) or not {"obs", "next_obs"} <= set(names) <= set(_FRAMED):
                raise PayloadError(topic, "the experience frame table must hold obs, next_obs and final_obs only")
            try:
                decoded = decode_frames(frames, arrays)
            except WireError as exc:
                raise PayloadError(topic, f"experience frames: {exc}") from None
            arrays = {k: v for k, v in arrays.items() if not k.startswith("frames:")} | decoded
        record_id = _field(topic, meta, "record_id", int)
        sender = _field(topic, meta, "node", str)
        if record_id < 1:
            raise PayloadError(topic, f"record_id {record_id} must be >= 1")
        if not is_identifier(sender):
            raise PayloadError(topic, f"node {shown(sender)} is not a valid node id")
        if node is not None and sender != node:
            raise PayloadError(topic, f"the record names node {sender!r} but arrived on the topic of node {node!r}; "
                                      "a node may only send its own experience")
        unknown = sorted(set(arrays) - set(EXPERIENCE_ARRAYS) - set(EXPERIENCE_OPTIONAL))
        missing = [name for name in EXPERIENCE_ARRAYS if name not in arrays]
        if unknown or missing:
            raise PayloadError(topic, f"experience arrays: missing {missing}, unknown {unknown[:5]}")
        rewards = arrays["rewards"]
        if rewards.ndim != 2 or not 1 <= rewards.shape[1] <= MAX_RECORD_ENVS or rewards.shape[0] < 1:
            raise PayloadError(topic, f"rewards must be [T >= 1, 1 <= N <= {MAX_RECORD_ENVS}], got {rewards.shape}")
        t, n = rewards.shape
        obs = arrays["obs"]
        final_obs = np.zeros_like(obs)
        if ("final_rows" in arrays) != ("final_obs" in arrays):
            raise PayloadError(topic, "final_rows and final_obs come together")
        if "final_rows" in arrays:
            rows, finals = arrays["final_rows"], arrays["final_obs"]
            if (rows.dtype.kind not in "iu" or rows.ndim != 1 or finals.shape != (rows.size, *obs.shape[2:])
                    or finals.dtype != obs.dtype or (rows.size and not (rows.min() >= 0 and rows.max() < t * n))
                    or np.unique(rows).size != rows.size):
                raise PayloadError(topic, "final_rows must be distinct step indices below T * N and final_obs one "
                                          "observation per row")
            flat = final_obs.reshape(t * n, *obs.shape[2:])
            flat[rows.astype(np.int64)] = finals
        try:
            batch = RolloutBatch(
                source=f"edge:{sender}:{record_id}", obs=obs, actions=arrays["actions"], rewards=rewards,
                terminations=arrays["terminations"], truncations=arrays["truncations"], final_obs=final_obs,
                next_obs=arrays["next_obs"], policy_version=arrays["policy_version"],
                worker=np.arange(n, dtype=np.int64), seq=np.repeat(np.arange(t, dtype=np.int64)[:, None], n, axis=1),
                behaviour_logprobs=arrays.get("behaviour_logprobs"), obs_codec=str(meta.get("obs_codec", "raw")))
        except (TypeError, ValueError) as exc:
            raise PayloadError(topic, f"experience arrays do not form a RolloutBatch: {exc}") from None
        episode_return, episode_length = arrays.get("episode_return"), arrays.get("episode_length")
        for name, arr in (("episode_return", episode_return), ("episode_length", episode_length)):
            if arr is not None and arr.shape != (t, n):
                raise PayloadError(topic, f"{name} must be [T, N] = {(t, n)}, got {arr.shape}")
        record = cls(record_id=record_id, node=sender, batch=batch, episode_return=episode_return,
                     episode_length=episode_length)
        if spec is not None:
            record.check(topic, spec)
        return record

    def check(self, topic: str, spec: ExperienceSpec) -> None:
        """Raise `PayloadError` unless every array fits the learner's `spec` (see `decode`)."""
        b = self.batch
        t, n = b.num_steps, b.num_envs
        if t > spec.max_steps:
            raise PayloadError(topic, f"a record of {t} steps exceeds the learner's limit of {spec.max_steps}")
        obs_space, act_space = spec.observation_space, spec.action_space
        if obs_space.get("type") != "Box":
            raise PayloadError(topic, f"the learner's observation space {obs_space.get('type')!r} is not a Box")
        shape = tuple(obs_space["shape"])
        dtype = np.dtype(str(obs_space.get("dtype", "float32")))
        for name in ("obs", "final_obs", "next_obs"):
            arr = getattr(b, name)
            want = (n, *shape) if name == "next_obs" else (t, n, *shape)
            if arr.shape != want or arr.dtype != dtype:
                raise PayloadError(topic, f"{name} must be {dtype} {list(want)}, got {arr.dtype} {list(arr.shape)}")
            if dtype.kind == "f" and not np.isfinite(arr).all():
                raise PayloadError(topic, f"{name} holds NaN or infinite values")
        if act_space.get("type") == "Discrete":
            start = int(act_space.get("start", 0))
            if b.actions.shape != (t, n) or b.actions.dtype.kind not in "iu":
                raise PayloadError(topic, f"actions must be integers [T, N] = {[t, n]}, got {b.actions.dtype} "
                                          f"{list(b.actions.shape)}")
            if b.actions.size and (b.actions.min() < start or b.actions.max() >= start + int(act_space["n"])):
                raise PayloadError(topic, f"actions must lie in {start}..{start + int(act_space['n']) - 1}")
        else:
            want = (t, n, *act_space["shape"])
            if b.actions.shape != want or b.actions.dtype.kind != "f" or not np.isfinite(b.actions).all():
                raise PayloadError(topic, f"actions must be finite floats {list(want)}, got {b.actions.dtype} "
                                          f"{list(b.actions.shape)}")
        checks: list[tuple[str, np.ndarray | None, str]] = [
            ("rewards", b.rewards, "f"), ("terminations", b.terminations, "b"), ("truncations", b.truncations, "b"),
            ("policy_version", b.policy_version, "iu"), ("behaviour_logprobs", b.behaviour_logprobs, "f"),
            ("episode_return", self.episode_return, "f"), ("episode_length", self.episode_length, "iu")]
        for name, arr, kinds in checks:
            if arr is None:
                continue
            if arr.dtype.kind not in kinds:
                raise PayloadError(topic, f"{name} has dtype {arr.dtype}")
            if kinds == "f" and not np.isfinite(arr).all():
                raise PayloadError(topic, f"{name} holds NaN or infinite values")
        if b.policy_version.size and b.policy_version.min() < 1:
            raise PayloadError(topic, "policy_version must be >= 1 (bundle versions count from 1)")
        logp = b.behaviour_logprobs
        if logp is not None and act_space.get("type") == "Discrete" and logp.size and logp.max() > 1e-4:
            raise PayloadError(topic, "behaviour_logprobs of a Discrete policy must be <= 0 (log of a probability)")
        if self.episode_length is not None and self.episode_length.size and self.episode_length.min() < 0:
            raise PayloadError(topic, "episode_length must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Receipt:
    """The learner's receipt of experience records: they are stored (or were refused), so the node may delete them.

    A node keeps each experience record in its outbox until a receipt names it (`edge._outbox`): what makes a
    record survive a broker that crashes between acknowledging and delivering it. Receipts are idempotent: a
    record received twice is receipted twice.
    """

    node: str
    record_ids: tuple[int, ...]
    """Records stored by the learner's spool (or already consumed)."""
    refused: dict[str, str] = field(default_factory=dict)
    """Record id (as text) -> why the learner refused it; the node deletes it too and reports the reason."""

    MAX_IDS = 4096

    def encode(self) -> bytes:
        """JSON payload."""
        return _encode_json({"kind": "receipt", "node": self.node, "record_ids": list(self.record_ids),
                             "refused": {k: v[:200] for k, v in self.refused.items()}})

    @classmethod
    def decode(cls, topic: str, payload: bytes) -> Receipt:
        """Parse and validate; raise `PayloadError`."""
        obj = _decode_json(topic, payload, "receipt")
        ids = _field(topic, obj, "record_ids", list)
        refused = _field(topic, obj, "refused", dict, optional=True) or {}
        if len(ids) + len(refused) > cls.MAX_IDS or not all(_is_int(i) and i >= 1 for i in ids):
            raise PayloadError(topic, f"record_ids must be at most {cls.MAX_IDS} integers >= 1")
        if not all(k.isdigit() and isinstance(v, str) for k, v in refused.items()):
            raise PayloadError(topic, "refused must map record ids to reasons")
        return cls(node=_field(topic, obj, "node", str), record_ids=tuple(int(i) for i in ids),
                   refused={str(k): str(v) for k, v in refused.items()})


@dataclass(frozen=True, kw_only=True)
class Control:
    """A command to one node or the whole fleet: ``status`` (publish status now) or ``resync`` (fetch latest)."""

    command: ControlCommand
    issued_at: float = 0.0

    def encode(self) -> bytes:
        """JSON payload."""
        return _encode_json({"kind": "control", **asdict(self)})

    @classmethod
    def decode(cls, topic: str, payload: bytes) -> Control:
        """Parse and validate; raise `PayloadError`."""
        obj = _decode_json(topic, payload, "control")
        command = _field(topic, obj, "command", str)
        if command not in CONTROL_COMMANDS:
            raise PayloadError(topic, f"command {command!r} is not one of {list(CONTROL_COMMANDS)}")
        return cls(command=command, issued_at=float(_field(topic, obj, "issued_at", (int, float))))
