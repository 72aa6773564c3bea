"""Byte codecs shared by the env service and the parameter server: compression, weight hashes, deltas.

Compression (`compress` / `decompress`) wraps a raw-buffer message (`device.pack_arrays`) for large
observations: ``"zlib"`` always, ``"lz4"`` when the lz4 package is installed, ``""`` for none.

Weights are ``name -> numpy array`` (float32 for policies). `weights_sha256` hashes them canonically
(sorted names, dtype, shape, bytes). A delta turns the weights a client holds (``base``) into the
target weights, one entry per tensor, each in the smallest of these forms:

    same     unchanged: nothing travels
    dense    the whole new tensor
    sparse   int32 flat indices + the new values where the bits changed
    xor      zlib of (new bits XOR base bits), byte-shuffled (all first bytes, then all second bytes, ...):
             small SGD steps leave sign, exponent and high mantissa bits alone, so the high bytes of the
             XOR are mostly zero and compress well; lossless
    q8       lossy: int8 of (new - base) / scale plus the float32 scale (quantised delta)

`encode_delta` / `apply_delta` are pure and deterministic: the parameter server computes the
client's result with the same code, so the hash of a lossy rebuild is known on both sides.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from device import WireError, pack_arrays, unpack_arrays
from functions._errors import FunctionsError

Weights = dict[str, np.ndarray]

CODECS = ("", "zlib", "lz4")
_ZLIB_LEVEL = 1  # level 1 gets most of the gain on float data at a fraction of level 6's time


class CodecError(FunctionsError, ValueError):
    """A compressed payload or a weight delta cannot be decoded or does not fit the weights held."""


def _lz4() -> Any:
    try:
        import lz4.frame  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    return lz4.frame


def available_codecs() -> tuple[str, ...]:
    """The compression codecs this process can use (``"lz4"`` only when lz4 is installed)."""
    return ("", "zlib", "lz4") if _lz4() is not None else ("", "zlib")


def compress(data: bytes, codec: str) -> bytes:
    """Compress `data` with `codec` (``""`` returns it unchanged)."""
    if codec == "":
        return data
    if codec == "zlib":
        return zlib.compress(data, _ZLIB_LEVEL)
    if codec == "lz4":
        lz4 = _lz4()
        if lz4 is None:
            raise CodecError("compress: codec 'lz4' needs the lz4 package; pip install lz4, or use codec='zlib'")
        return bytes(lz4.compress(data))
    raise CodecError(f"compress: unknown codec {codec!r}; use one of {available_codecs()}")


def decompress(data: bytes, codec: str, raw_size: int) -> bytes:
    """Invert `compress`; check that the result has `raw_size` bytes."""
    if codec == "":
        out = data
    elif codec == "zlib":
        try:
            obj = zlib.decompressobj()
            out = obj.decompress(data, raw_size + 1)
        except zlib.error as exc:
            raise CodecError(f"decompress: zlib payload is corrupt: {exc}") from exc
    elif codec == "lz4":
        lz4 = _lz4()
        if lz4 is None:
            raise CodecError("decompress: payload uses codec 'lz4' but lz4 is not installed; pip install lz4")
        out = bytes(lz4.decompress(data))
    else:
        raise CodecError(f"decompress: unknown codec {codec!r}; use one of {available_codecs()}")
    if len(out) != raw_size:
        raise CodecError(f"decompress: {codec or 'raw'} payload decoded to {len(out)} bytes, expected {raw_size}")
    return out


def weights_sha256(weights: Mapping[str, np.ndarray]) -> str:
    """Canonical sha256 of named arrays: sorted names, each with dtype, shape and raw bytes."""
    h = hashlib.sha256()
    for name in sorted(weights):
        a = np.ascontiguousarray(weights[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def encode_weights(weights: Mapping[str, np.ndarray]) -> bytes:
    """A full snapshot as one raw-buffer message."""
    return pack_arrays({"kind": "weights"}, dict(weights))


def decode_weights(data: bytes) -> Weights:
    """Invert `encode_weights`; arrays are writable copies."""
    meta, arrays = unpack_arrays(data)
    if meta.get("kind") != "weights":
        raise CodecError(f"decode_weights: message kind {meta.get('kind')!r} is not 'weights'")
    return {name: np.array(a) for name, a in arrays.items()}


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"<u{a.dtype.itemsize}")) if a.dtype.kind == "f" else a


def _shuffle(a: np.ndarray) -> bytes:
    """Group byte j of every element together (as blosc's shuffle filter does) so equal high bytes form runs."""
    return np.ascontiguousarray(a).view(np.uint8).reshape(-1, a.dtype.itemsize).T.tobytes()


def _unshuffle(raw: bytes, dtype: np.dtype[Any]) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    return np.frombuffer(raw, dtype=np.uint8).reshape(size, -1).T.copy().view(dtype).ravel()


def quantize_delta(new: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """int8 quantisation of ``new - base`` with one float32 scale per tensor."""
    diff = new.astype(np.float32) - base.astype(np.float32)
    peak = float(np.max(np.abs(diff))) if diff.size else 0.0
    scale = np.float32(peak / 127.0 if peak > 0 else 1.0)
    q = np.clip(np.rint(diff / scale), -127, 127).astype(np.int8)
    return q, scale


def _dequantize(base: np.ndarray, q: np.ndarray, scale: np.floating[Any]) -> np.ndarray:
    return (base.astype(np.float32) + q.astype(np.float32) * np.float32(scale)).astype(base.dtype)


def encode_delta(target: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray], *, lossy: bool = False) -> bytes:
    """Encode `target` relative to `base` (same names, shapes and dtypes) as one raw-buffer message.

    Lossless forms are picked per tensor by size; with ``lossy=True`` every changed float tensor
    travels as ``q8`` instead. Raise `CodecError` when the two do not have the same layout.
    """
    if set(target) != set(base):
        raise CodecError(f"encode_delta: tensor names differ: target has {sorted(target)}, base has {sorted(base)}")
    kinds: dict[str, str] = {}
    arrays: dict[str, np.ndarray] = {}
    for name in sorted(target):
        new, old = np.ascontiguousarray(target[name]), np.ascontiguousarray(base[name])
        if new.shape != old.shape or new.dtype != old.dtype:
            raise CodecError(f"encode_delta: tensor {name!r} is {new.dtype}{list(new.shape)} in target but "
                             f"{old.dtype}{list(old.shape)} in base; send a full snapshot instead")
        changed = np.flatnonzero(_bits(new) != _bits(old))
        if changed.size == 0:
            kinds[name] = "same"
            continue
        if lossy and new.dtype.kind == "f":
            q, scale = quantize_delta(new, old)
            kinds[name] = "q8"
            arrays[f"{name}:q"] = q
            arrays[f"{name}:scale"] = np.array([scale], dtype=np.float32)
            continue
        candidates: dict[str, int] = {"dense": new.nbytes, "sparse": changed.size * (4 + new.dtype.itemsize)}
        xor = zlib.compress(_shuffle(_bits(new) ^ _bits(old)), _ZLIB_LEVEL) if new.dtype.kind in "fiu" else b""
        if xor:
            candidates["xor"] = len(xor)
        kind = min(candidates, key=lambda k: candidates[k])
        kinds[name] = kind
        if kind == "dense":
            arrays[name] = new
        elif kind == "sparse":
            arrays[f"{name}:idx"] = changed.astype(np.int32)
            arrays[f"{name}:val"] = new.ravel()[changed]
        else:
            arrays[f"{name}:xor"] = np.frombuffer(xor, dtype=np.uint8)
    return pack_arrays({"kind": "delta", "tensors": kinds}, arrays)


def apply_delta(base: Mapping[str, np.ndarray], delta: bytes) -> Weights:
    """Rebuild the target weights from `base` and a message made by `encode_delta`."""
    try:
        meta, arrays = unpack_arrays(delta)
    except WireError as exc:
        raise CodecError(f"apply_delta: {exc}") from exc
    kinds = meta.get("tensors")
    if meta.get("kind") != "delta" or not isinstance(kinds, dict):
        raise CodecError(f"apply_delta: message kind {meta.get('kind')!r} is not 'delta'")
    if set(kinds) != set(base):
        raise CodecError(f"apply_delta: delta covers {sorted(kinds)} but the client holds {sorted(base)}; "
                         "pull a full snapshot (since_version=0)")
    out: Weights = {}
    try:
        for name, kind in kinds.items():
            old = np.ascontiguousarray(base[name])
            if kind == "same":
                out[name] = np.array(old)
            elif kind == "dense":
                out[name] = np.array(arrays[name]).reshape(old.shape).astype(old.dtype, copy=False)
            elif kind == "sparse":
                new = np.array(old).ravel()
                new[arrays[f"{name}:idx"]] = arrays[f"{name}:val"]
                out[name] = new.reshape(old.shape)
            elif kind == "xor":
                raw = zlib.decompress(arrays[f"{name}:xor"].tobytes())
                bits = _unshuffle(raw, _bits(old).dtype).reshape(old.shape) ^ _bits(old)
                out[name] = bits.view(old.dtype).copy()
            elif kind == "q8":
                out[name] = _dequantize(old, arrays[f"{name}:q"].reshape(old.shape), arrays[f"{name}:scale"][0])
            else:
                raise CodecError(f"apply_delta: tensor {name!r} has unknown delta kind {kind!r}")
    except (KeyError, ValueError, zlib.error) as exc:
        raise CodecError(f"apply_delta: delta for the tensors {sorted(kinds)} is malformed: {exc}") from exc
    return out


def encode_bytes(msg_cls: Any, raw: bytes, *, compress_above: int = 65536, codec: str | None = None) -> Any:
    """Wrap a packed buffer in a ``Tensors`` message of either proto (`codec` None: compress above a size)."""
    if codec is None:
        codec = available_codecs()[-1] if len(raw) > compress_above else ""
    return msg_cls(data=compress(raw, codec), codec=codec, raw_size=len(raw))


def decode_bytes(msg: Any) -> bytes:
    """The raw buffer inside a ``Tensors`` message."""
    return decompress(bytes(msg.data), str(msg.codec), int(msg.raw_size))
