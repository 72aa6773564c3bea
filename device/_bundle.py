r"""The policy bundle: ONNX model bytes, a manifest and an Ed25519 signature, in one binary file.

File layout (integers little-endian; nothing may follow the model)::

    offset  size  field
    0       4     magic b"STRB"
    4       1     format version, 1
    5       1     signature scheme: 0 = unsigned, 1 = Ed25519
    6       16    key id: 16 lowercase hex ASCII characters (16 zero bytes when unsigned)
    22      2     u16 signature length S (64 for Ed25519, 0 when unsigned)
    24      S     signature
    24+S    4     u32 manifest length M
    28+S    M     manifest: canonical JSON (sorted keys, no spaces, ASCII, no NaN), utf-8
    28+S+M  4     u32 model length K
    32+S+M  K     model: ONNX ModelProto bytes

The signature is Ed25519 over ``b"strata-bundle-v1\x00" + manifest`` (the prefix separates bundle
signatures from anything else the key might sign). The manifest holds the model's sha256, so the
signature covers the model too. Parsing refuses a manifest that is not in canonical form, so
``Bundle.from_bytes(data).to_bytes() == data`` for every accepted file.

Verification (`Verifier.verify`) runs in this order and stops at the first refusal: parse ->
signed? -> key trusted? -> signature valid? -> model digest matches? -> not expired? -> tier ->
version newer than the highest accepted before. `Verifier.accept` records the version, persisted
atomically to a JSON state file so anti-rollback survives restarts. Nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import platform
import re
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeAlias

from device._atomic import write_atomic
from device._bundle_errors import (
    BundleFormatError,
    ExpiredBundleError,
    RollbackError,
    TamperedBundleError,
    UnknownKeyError,
    UnsignedBundleError,
    VerifierStateError,
    WrongTierError,
)
from device._keys import SigningKey, TrustStore
from device._names import IDENTIFIER_FORM, is_identifier, shown

MAGIC = b"STRB"
FORMAT_VERSION = 1
SCHEME_NONE = 0
SCHEME_ED25519 = 1
SIGNATURE_CONTEXT = b"strata-bundle-v1\x00"
MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 256 * 1024
MAX_MODEL_BYTES = 64 * 1024 * 1024

_HEAD = struct.Struct("<4sBB16sH")
_U32 = struct.Struct("<I")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BOX_DTYPES = frozenset({"float16", "float32", "float64", "int8", "int16", "int32", "int64",
                         "uint8", "uint16", "uint32", "uint64", "bool"})

TargetTier: TypeAlias = Literal["edge", "device", "any"]
TARGET_TIERS: tuple[str, ...] = ("edge", "device", "any")
VERIFIER_TIERS: tuple[str, ...] = ("edge", "device", "any")
JSONDict: TypeAlias = dict[str, Any]


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no spaces, ASCII only, NaN and infinities refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _fail(msg: str) -> BundleFormatError:
    return BundleFormatError(f"Manifest: {msg}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)  # type: ignore[arg-type]


def _check_space(field: str, space: object) -> None:
    """Validate the JSON form of a Box or Discrete space."""
    if not isinstance(space, dict):
        raise _fail(f"{field} must be an object like {{'type': 'Discrete', 'n': 2}}, got {space!r}")
    kind = space.get("type")
    if kind == "Discrete":
        n = space.get("n")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise _fail(f"{field}: Discrete needs an int n >= 1, got {n!r}")
        if "start" in space and not _is_int(space["start"]):
            raise _fail(f"{field}: Discrete start must be an int, got {space['start']!r}")
    elif kind == "Box":
        shape = space.get("shape")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise _fail(f"{field}: Box shape must be a list of ints >= 0, got {shape!r}")
        if space.get("dtype") not in _BOX_DTYPES:
            raise _fail(f"{field}: Box dtype must be one of {sorted(_BOX_DTYPES)}, got {space.get('dtype')!r}")
        size = math.prod(shape)
        for bound in ("low", "high"):
            values = space.get(bound)
            if isinstance(values, str | int | float) and not isinstance(values, bool):
                values = [values]  # one bound for every element (large spaces: image frames); checked below
            elif not isinstance(values, list) or len(values) != size:
                raise _fail(f"{field}: Box {bound} must be a flat list of {size} numbers (or one number for "
                            f"all), got {str(values)[:80]}")
            if not all(_is_num(v) or v in ("inf", "-inf") for v in values):
                raise _fail(f"{field}: Box {bound} holds a value that is not a finite number, 'inf' or '-inf'")
    else:
        raise _fail(f"{field} type must be 'Box' or 'Discrete', got {kind!r}")


def _bound(value: float) -> float | str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def space_to_json(space: Any) -> JSONDict:
    """The manifest JSON form of a gymnasium-like Box or Discrete space (duck-typed, no gymnasium import).

    Args:
        space: An object with ``n`` (Discrete) or ``shape``, ``dtype``, ``low`` and ``high`` (Box).
    """
    if hasattr(space, "n") and not hasattr(space, "low"):
        out: JSONDict = {"type": "Discrete", "n": int(space.n)}
        start = int(getattr(space, "start", 0))
        if start:
            out["start"] = start
        return out
    if hasattr(space, "low") and hasattr(space, "high"):
        import numpy as np

        low = np.asarray(space.low, dtype=np.float64).ravel()
        high = np.asarray(space.high, dtype=np.float64).ravel()
        out = {"type": "Box", "shape": [int(d) for d in space.shape], "dtype": str(np.dtype(space.dtype))}
        for name, values in (("low", low), ("high", high)):
            # A large space with one bound for every element (image frames: 0 and 255) writes it once, so a
            # manifest stays small; small spaces keep the flat list.
            uniform = values.size > 64 and bool(np.all(values == values[0]))
            out[name] = _bound(float(values[0])) if uniform else [_bound(v) for v in values.tolist()]
        return out
    raise BundleFormatError(f"space_to_json: {space!r} is neither a Box (low/high) nor a Discrete (n) space")


def space_bounds(space: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(low, high)`` float64 numpy arrays of the manifest's Box space, shaped like the space."""
    import numpy as np

    if space.get("type") != "Box":
        raise BundleFormatError(f"space_bounds: needs a Box space, got type {space.get('type')!r}")
    shape = tuple(space["shape"])

    def bound(values: Any) -> Any:
        if not isinstance(values, list):  # one bound for all elements
            return np.full(shape, float(values), dtype=np.float64)
        return np.array([float(v) for v in values], dtype=np.float64).reshape(shape)

    return bound(space["low"]), bound(space["high"])


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a bundle says about its model; the signed part of a bundle.

    Spaces use the JSON form ``{"type": "Box", "shape": [4], "dtype": "float32", "low": [...],
    "high": [...]}`` (flat lists, infinities as the strings ``"inf"``/``"-inf"``) or
    ``{"type": "Discrete", "n": 2}``.
    """

    policy: str
    """Policy name: letters, digits, ``._-``, at most 128 characters; used in cache file names."""
    version: int
    """Monotonically increasing version, >= 1."""
    parent_version: int | None
    """The version this one was trained from, or None for the first."""
    model_sha256: str
    """Lowercase hex sha256 of the ONNX model bytes."""
    observation_space: JSONDict
    """The observation space, JSON form."""
    action_space: JSONDict
    """The action space, JSON form."""
    preprocessing: JSONDict
    """Preprocessing facts (e.g. observation normalisation statistics); normalisation runs inside the graph."""
    created_at: float
    """Creation time, unix seconds."""
    expires_at: float | None
    """Unix seconds after which consumers refuse the bundle, or None for no expiry."""
    target_tier: TargetTier
    """Which tier may run it: ``"edge"``, ``"device"`` or ``"any"``."""
    producer: dict[str, str]
    """Versions of what produced it (strata, python, torch, onnx, ...)."""
    input_name: str = "obs"
    """Name of the graph's observation input."""
    output_names: tuple[str, ...] = ("action",)
    """Names of the graph's outputs, ``"action"`` first."""

    def __post_init__(self) -> None:
        if not is_identifier(self.policy):  # a topic segment and a file name: the one identifier rule
            raise _fail(f"policy must match the identifier rule, {IDENTIFIER_FORM} (a plain name like "
                        f"'cartpole'); got {shown(self.policy)}")
        if not _is_int(self.version) or self.version < 1:
            raise _fail(f"version must be an int >= 1, got {self.version!r}")
        pv = self.parent_version
        if pv is not None and (not _is_int(pv) or not 1 <= pv < self.version):
            raise _fail(f"parent_version must be None or an int in [1, version={self.version}), got {pv!r}")
        if not isinstance(self.model_sha256, str) or not _SHA256.fullmatch(self.model_sha256):
            raise _fail(f"model_sha256 must be 64 lowercase hex characters, got {self.model_sha256!r}")
        _check_space("observation_space", self.observation_space)
        _check_space("action_space", self.action_space)
        if not isinstance(self.preprocessing, dict):
            raise _fail(f"preprocessing must be an object, got {self.preprocessing!r}")
        if not _is_num(self.created_at) or not isinstance(self.created_at, float):
            raise _fail(f"created_at must be a finite float (unix seconds), got {self.created_at!r}")
        ea = self.expires_at
        if ea is not None and (not isinstance(ea, float) or not math.isfinite(ea)):
            raise _fail(f"expires_at must be None or a finite float (unix seconds), got {ea!r}")
        if self.target_tier not in TARGET_TIERS:
            raise _fail(f"target_tier must be one of {list(TARGET_TIERS)}, got {self.target_tier!r}")
        if not isinstance(self.producer, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.producer.items()
        ):
            raise _fail(f"producer must map names to version strings, got {self.producer!r}")
        if not isinstance(self.input_name, str) or not self.input_name:
            raise _fail(f"input_name must be a non-empty string, got {self.input_name!r}")
        names = self.output_names
        if not isinstance(names, tuple) or not names or not all(isinstance(n, str) and n for n in names):
            raise _fail(f"output_names must be a non-empty tuple of names, got {names!r}")

    def to_json_dict(self) -> JSONDict:
        """The manifest as a JSON object (with a ``"format"`` field)."""
        out = dataclasses.asdict(self)
        out["output_names"] = list(self.output_names)
        out["format"] = MANIFEST_FORMAT
        return out

    def to_bytes(self) -> bytes:
        """The canonical JSON bytes that are signed and stored."""
        try:
            return canonical_json(self.to_json_dict())
        except (TypeError, ValueError) as exc:
            raise _fail(f"preprocessing or a space holds a value JSON cannot carry ({exc})") from exc

    @classmethod
    def from_json_dict(cls, obj: object) -> Manifest:
        """Validate and build a manifest from its JSON object; raise `BundleFormatError` when malformed."""
        if not isinstance(obj, dict):
            raise _fail(f"must be a JSON object, got {type(obj).__name__}")
        if obj.get("format") != MANIFEST_FORMAT:
            raise _fail(f"format {obj.get('format')!r} is not supported (this build reads {MANIFEST_FORMAT})")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(obj) - {*names, "format"})
        missing = sorted(set(names) - set(obj))
        if unknown or missing:
            raise _fail(f"unknown fields {unknown} / missing fields {missing}")
        values = {name: obj[name] for name in names}
        if isinstance(values["output_names"], list):
            values["output_names"] = tuple(values["output_names"])
        return cls(**values)

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse canonical manifest bytes; refuse non-canonical ones so bytes round-trip exactly."""
        try:
            obj = json.loads(data.decode("ascii"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise _fail(f"is not ASCII JSON ({type(exc).__name__}: {exc})") from exc
        manifest = cls.from_json_dict(obj)
        if manifest.to_bytes() != data:
            raise _fail("is not in canonical form (sorted keys, no spaces, floats for times)")
        return manifest


@dataclass(frozen=True)
class Bundle:
    """A manifest, the model it describes and the signature over the manifest (see the module docstring)."""

    manifest: Manifest
    model: bytes
    key_id: str
    """The signing key's id, or ``""`` when unsigned."""
    signature: bytes
    """The 64-byte Ed25519 signature, or ``b""`` when unsigned."""

    def __post_init__(self) -> None:
        if not isinstance(self.manifest, Manifest) or not isinstance(self.model, bytes):
            raise BundleFormatError("Bundle: manifest must be a Manifest and model bytes")
        unsigned = self.key_id == "" and self.signature == b""
        signed = isinstance(self.key_id, str) and bool(_HEX16.fullmatch(self.key_id)) and isinstance(
            self.signature, bytes) and len(self.signature) == 64
        if not (unsigned or signed):
            raise BundleFormatError(f"Bundle: key_id must be 16 lowercase hex characters with a 64-byte signature "
                                    f"(or both empty when unsigned), got key_id={self.key_id!r} and "
                                    f"{len(self.signature)} signature bytes")
        if len(self.model) > MAX_MODEL_BYTES:
            raise BundleFormatError(f"Bundle: model of {len(self.model)} bytes exceeds {MAX_MODEL_BYTES}")

    @property
    def signed(self) -> bool:
        """Whether the bundle carries a signature."""
        return bool(self.signature)

    @property
    def policy(self) -> str:
        """Shortcut for ``manifest.policy``."""
        return self.manifest.policy

    @property
    def version(self) -> int:
        """Shortcut for ``manifest.version``."""
        return self.manifest.version

    def signed_message(self) -> bytes:
        """The exact bytes the signature covers."""
        return SIGNATURE_CONTEXT + self.manifest.to_bytes()

    def to_bytes(self) -> bytes:
        """Encode in the strata bundle file format."""
        manifest = self.manifest.to_bytes()
        scheme = SCHEME_ED25519 if self.signed else SCHEME_NONE
        key = self.key_id.encode("ascii") if self.signed else bytes(16)
        return b"".join([
            _HEAD.pack(MAGIC, FORMAT_VERSION, scheme, key, len(self.signature)), self.signature,
            _U32.pack(len(manifest)), manifest, _U32.pack(len(self.model)), self.model,
        ])

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Bundle:
        """Parse a bundle file (no verification); raise `BundleFormatError` when malformed."""
        buf = bytes(data)
        if len(buf) < _HEAD.size:
            raise BundleFormatError(f"Bundle.from_bytes: {len(buf)} bytes is too short for a bundle header")
        magic, version, scheme, key, sig_len = _HEAD.unpack_from(buf)
        if magic != MAGIC:
            raise BundleFormatError(f"Bundle.from_bytes: bad magic {magic!r}, expected {MAGIC!r} "
                                    "(is this a strata bundle?)")
        if version != FORMAT_VERSION:
            raise BundleFormatError(f"Bundle.from_bytes: format version {version} is not supported "
                                    f"(this build reads {FORMAT_VERSION})")
        if scheme == SCHEME_NONE:
            if key != bytes(16) or sig_len != 0:
                raise BundleFormatError("Bundle.from_bytes: unsigned bundle carries a key id or signature")
            key_id = ""
        elif scheme == SCHEME_ED25519:
            key_id = key.decode("latin-1")
            if not _HEX16.fullmatch(key_id) or sig_len != 64:
                raise BundleFormatError(f"Bundle.from_bytes: Ed25519 bundle needs a hex key id and a 64-byte "
                                        f"signature, got key id {key!r} and {sig_len} bytes")
        else:
            raise BundleFormatError(f"Bundle.from_bytes: unknown signature scheme {scheme} (0 unsigned, 1 Ed25519)")
        pos = _HEAD.size
        signature = buf[pos : pos + sig_len]
        pos += sig_len
        manifest_bytes, pos = _section(buf, pos, "manifest", MAX_MANIFEST_BYTES)
        model, pos = _section(buf, pos, "model", MAX_MODEL_BYTES)
        if pos != len(buf):
            raise BundleFormatError(f"Bundle.from_bytes: {len(buf) - pos} unexpected bytes after the model")
        return cls(Manifest.from_bytes(manifest_bytes), model, key_id, signature)


def _section(buf: bytes, pos: int, what: str, limit: int) -> tuple[bytes, int]:
    if pos + 4 > len(buf):
        raise BundleFormatError(f"Bundle.from_bytes: truncated before the {what} length at byte {pos}")
    (n,) = _U32.unpack_from(buf, pos)
    pos += 4
    if n > limit or pos + n > len(buf):
        raise BundleFormatError(f"Bundle.from_bytes: {what} length {n} does not fit "
                                f"({len(buf) - pos} bytes left, limit {limit})")
    return buf[pos : pos + n], pos + n


def _as_json(field: str, value: Mapping[str, Any]) -> JSONDict:
    """`value` as the JSON object it will be after a round trip (tuples become lists, numpy scalars refused)."""
    try:
        obj = json.loads(canonical_json(dict(value)))
    except (TypeError, ValueError) as exc:
        raise BundleFormatError(f"build_bundle: {field} holds a value JSON cannot carry ({exc}); use plain "
                                "lists, floats, ints and strings (no NaN)") from exc
    assert isinstance(obj, dict)
    return obj


def default_producer() -> dict[str, str]:
    """Producer versions every bundle records: strata and python."""
    from importlib import metadata

    try:
        strata = metadata.version("strata")
    except metadata.PackageNotFoundError:
        strata = "unknown"
    return {"strata": strata, "python": platform.python_version()}


def build_bundle(
    model: bytes,
    *,
    policy: str,
    version: int,
    parent_version: int | None,
    observation_space: Mapping[str, Any],
    action_space: Mapping[str, Any],
    preprocessing: Mapping[str, Any] | None = None,
    signing_key: SigningKey | None,
    target_tier: TargetTier = "any",
    ttl_s: float | None = None,
    producer: Mapping[str, str] | None = None,
    input_name: str = "obs",
    output_names: Sequence[str] = ("action",),
    clock: Callable[[], float] = time.time,
) -> Bundle:
    """Describe, hash and sign `model` as a bundle.

    Args:
        model: ONNX ModelProto bytes.
        policy: Policy name.
        version: Version, >= 1, newer than every version published before.
        parent_version: The version it was trained from, or None.
        observation_space: Observation space in JSON form (see `Manifest`, `space_to_json`).
        action_space: Action space in JSON form.
        preprocessing: Preprocessing facts, JSON-serialisable.
        signing_key: Key to sign with; None builds an unsigned bundle (every verifier refuses it).
        target_tier: ``"edge"``, ``"device"`` or ``"any"``.
        ttl_s: Seconds until expiry, or None for none.
        producer: Versions of what produced the model; strata's and python's are added when missing.
        input_name: Graph input name.
        output_names: Graph output names, ``"action"`` first.
        clock: Source of the creation time.
    """
    if ttl_s is not None and not (math.isfinite(ttl_s) and ttl_s > 0):
        raise BundleFormatError(f"build_bundle: ttl_s must be a positive number of seconds or None, got {ttl_s!r}")
    now = float(clock())
    manifest = Manifest(
        policy=policy, version=version, parent_version=parent_version,
        model_sha256=hashlib.sha256(model).hexdigest(),
        observation_space=_as_json("observation_space", observation_space),
        action_space=_as_json("action_space", action_space),
        preprocessing=_as_json("preprocessing", preprocessing or {}), created_at=now,
        expires_at=None if ttl_s is None else now + float(ttl_s), target_tier=target_tier,
        producer={**default_producer(), **dict(producer or {})},
        input_name=input_name, output_names=tuple(output_names),
    )
    if signing_key is None:
        return Bundle(manifest, bytes(model), "", b"")
    signature = signing_key.sign(SIGNATURE_CONTEXT + manifest.to_bytes())
    return Bundle(manifest, bytes(model), signing_key.key_id, signature)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Verifier:
    """The one verification path every bundle consumer uses (see the module docstring for the order).

    Args:
        trust: Public keys whose signatures are accepted.
        tier: The consumer's tier, ``"edge"`` or ``"device"``; ``"any"`` skips the tier check (inspection).
        state_path: JSON file persisting the highest accepted version per policy; None keeps it in memory.
        clock: Current unix time, for expiry.
    """

    def __init__(self, *, trust: TrustStore, tier: str, state_path: Path | str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if tier not in VERIFIER_TIERS:
            raise WrongTierError(f"Verifier: tier must be one of {list(VERIFIER_TIERS)}, got {tier!r}")
        self.trust = trust
        self.tier = tier
        self.state_path = None if state_path is None else Path(state_path)
        self._clock = clock
        self._lock = threading.Lock()
        self._highest: dict[str, int] = self._load_state()

    def verify(self, data: bytes | bytearray | memoryview | Bundle, *, allow_current: bool = False) -> Bundle:
        """Return the bundle if every check passes, else raise the `BundleError` subclass naming the reason.

        Args:
            data: Bundle file bytes, or a parsed `Bundle`.
            allow_current: Also pass a version equal to the highest accepted (reloading the policy already
                in use after a restart); a lower version is still refused.
        """
        bundle = data if isinstance(data, Bundle) else Bundle.from_bytes(data)
        m = bundle.manifest
        what = f"bundle {m.policy!r} v{m.version}"
        if not bundle.signed:
            raise UnsignedBundleError(f"Verifier.verify: {what} is unsigned; "
                                      "sign it with a trusted key (build_bundle(..., signing_key=...))")
        key = self.trust.get(bundle.key_id)
        if key is None:
            raise UnknownKeyError(f"Verifier.verify: {what} is signed by key {bundle.key_id}, which is not in the "
                                  f"trust store (trusted: {list(self.trust.key_ids)}); add its public key to trust")
        if not key.verify(bundle.signature, bundle.signed_message()):
            raise TamperedBundleError(f"Verifier.verify: the signature of {what} does not match its manifest "
                                      f"(manifest or signature was altered after signing by key {bundle.key_id})")
        digest = hashlib.sha256(bundle.model).hexdigest()
        if digest != m.model_sha256:
            raise TamperedBundleError(f"Verifier.verify: the model of {what} has sha256 {digest} but the signed "
                                      f"manifest says {m.model_sha256} (model was altered)")
        now = self._clock()
        if m.expires_at is not None and now >= m.expires_at:
            raise ExpiredBundleError(f"Verifier.verify: {what} expired at {_iso(m.expires_at)} (now {_iso(now)}); "
                                     "publish a fresh bundle")
        if self.tier != "any" and m.target_tier not in ("any", self.tier):
            raise WrongTierError(f"Verifier.verify: {what} targets tier {m.target_tier!r}, "
                                 f"but this verifier is for tier {self.tier!r}")
        highest = self.highest_accepted(m.policy)
        if m.version < highest or (m.version == highest and not allow_current):
            raise RollbackError(f"Verifier.verify: {what} is not newer than the highest accepted version "
                                f"{highest} of {m.policy!r} (rollback refused)")
        return bundle

    def accept(self, bundle: Bundle) -> None:
        """Record `bundle`'s version as the highest accepted for its policy (persisted when state_path is set).

        Raises:
            RollbackError: a higher version was accepted before (accepting the same version again is a no-op).
        """
        m = bundle.manifest
        with self._lock:
            highest = self._highest.get(m.policy, 0)
            if m.version < highest:
                raise RollbackError(f"Verifier.accept: bundle {m.policy!r} v{m.version} is older than the highest "
                                    f"accepted version {highest} (rollback refused)")
            if m.version == highest:
                return
            updated = {**self._highest, m.policy: m.version}
            self._save_state(updated)
            self._highest = updated

    def highest_accepted(self, policy: str) -> int:
        """The highest version accepted for `policy`, 0 when none."""
        return self._highest.get(policy, 0)

    def _load_state(self) -> dict[str, int]:
        path = self.state_path
        if path is None or not path.exists():
            return {}
        try:
            obj = json.loads(path.read_text())
            highest = obj["highest_accepted"]
            if obj.get("format") != 1 or not isinstance(highest, dict) or not all(
                isinstance(k, str) and _is_int(v) and v >= 1 for k, v in highest.items()
            ):
                raise ValueError("unexpected shape")
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            # Fail closed: forgetting the state would reopen every rollback.
            raise VerifierStateError(f"Verifier: state file {path} is unreadable ({exc}); restore it or, if the "
                                     "device was reset on purpose, delete it") from exc
        return dict(highest)

    def _save_state(self, highest: Mapping[str, int]) -> None:
        path = self.state_path
        if path is None:
            return
        data = json.dumps({"format": 1, "highest_accepted": dict(sorted(highest.items()))}, indent=1).encode()
        try:
            write_atomic(path, data)
        except OSError as exc:
            raise VerifierStateError(f"Verifier.accept: cannot write state file {path}: {exc}") from exc
