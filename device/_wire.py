"""Raw-buffer encoding of named numpy arrays plus a JSON header; never pickle.

Layout (little-endian):

    b"STRW" | u8 format version | u32 header length | header JSON (utf-8) | array bytes ...

The header holds the caller's metadata under ``"meta"`` and, per array, its dtype, shape and byte
offset into the data section. Only plain numeric and bool dtypes are accepted, so decoding can never
construct Python objects. Decoding copies nothing: arrays are read-only views of the input buffer.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from device._errors import StrataError

MAGIC = b"STRW"
VERSION = 1
_PREFIX = struct.Struct("<4sBI")
_ALLOWED_KINDS = frozenset("biuf")  # bool, signed, unsigned, float: no objects, strings or voids
MAX_HEADER_BYTES = 1 << 20
MAX_NDIM = 32
MAX_ARRAYS = 256
# np.dtype() parses arbitrary strings (even Python literals); only ever hand it these.
_DTYPE_RE = re.compile(r"[<>|=]?[biuf][1248]")


class WireError(StrataError, ValueError):
    """A buffer is not a valid strata array message."""


def pack_arrays(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """Encode `arrays` and the JSON-serialisable `meta` into one bytes object."""
    specs = {}
    chunks = []
    offset = 0
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.dtype.kind not in _ALLOWED_KINDS:
            raise WireError(f"pack_arrays: array {name!r} has dtype {a.dtype}; only bool/int/uint/float travel")
        le = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        a = a.astype(le, copy=False)
        specs[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "offset": offset}
        data = a.tobytes()
        chunks.append(data)
        offset += len(data)
    try:  # NaN and Infinity are not JSON: a header that other parsers refuse is never written
        header = json.dumps({"meta": dict(meta), "arrays": specs}, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as exc:
        raise WireError(f"pack_arrays: meta must be plain JSON without NaN or Infinity: {exc}") from None
    return b"".join([_PREFIX.pack(MAGIC, VERSION, len(header)), header, *chunks])


def unpack_arrays(data: bytes | bytearray | memoryview) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Decode a buffer made by `pack_arrays` into ``(meta, arrays)``; raise `WireError` if malformed."""
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise WireError(f"unpack_arrays: {len(view)} bytes is shorter than the {_PREFIX.size}-byte prefix")
    magic, version, hlen = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise WireError(f"unpack_arrays: bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise WireError(f"unpack_arrays: format version {version} is not supported (this build reads {VERSION})")
    if hlen > MAX_HEADER_BYTES or _PREFIX.size + hlen > len(view):
        raise WireError(f"unpack_arrays: header length {hlen} does not fit in {len(view)} bytes")
    try:
        header = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + hlen]), parse_constant=_refuse_constant)
        meta = header["meta"]
        specs = header["arrays"]
        if not isinstance(meta, dict) or not isinstance(specs, dict):
            raise TypeError("meta and arrays must be objects")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise WireError(f"unpack_arrays: header is not valid JSON of the expected shape: {exc}") from None
    if len(specs) > MAX_ARRAYS:
        raise WireError(f"unpack_arrays: {len(specs)} arrays exceed the limit of {MAX_ARRAYS}")
    body = view[_PREFIX.size + hlen :]
    arrays: dict[str, np.ndarray] = {}
    for name, spec in specs.items():
        try:
            if not isinstance(spec["dtype"], str) or not _DTYPE_RE.fullmatch(spec["dtype"]):
                raise ValueError(f"dtype {spec['dtype']!r} is not a plain numeric dtype string")
            dtype = np.dtype(spec["dtype"])
            raw_shape, offset = spec["shape"], spec["offset"]
            if not isinstance(raw_shape, list) or len(raw_shape) > MAX_NDIM or not all(
                    _is_index(d) for d in raw_shape) or not _is_index(offset):
                raise ValueError(f"shape must be a list of at most {MAX_NDIM} ints >= 0 and offset an int >= 0")
            shape = tuple(raw_shape)
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"unpack_arrays: array {name!r} has a malformed spec {str(spec)[:200]}: {exc}") from None
        if dtype.kind not in _ALLOWED_KINDS:
            raise WireError(f"unpack_arrays: array {name!r} has a refused dtype {dtype}")
        nbytes = dtype.itemsize * math.prod(shape)  # Python ints: a huge shape cannot overflow into a small size
        if offset + nbytes > len(body):
            raise WireError(f"unpack_arrays: array {name!r} needs bytes up to {offset + nbytes}, have {len(body)}")
        try:
            arrays[name] = np.frombuffer(body, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset).reshape(
                shape
            )
        except ValueError as exc:  # a zero-size array with a dimension numpy cannot index
            raise WireError(f"unpack_arrays: array {name!r} has a shape numpy refuses {shape}: {exc}") from None
    return meta, arrays


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62
