"""Pickle-free encoding of the co-located pool's info channel: env infos and worker error records.

Infos are small, nested Python values. They travel as `device.pack_arrays` messages: numeric and
bool numpy arrays as raw buffers, everything else as a tagged JSON tree, so decoding never builds
an object the encoder did not describe. Supported: None, bool, int, float, str, numeric numpy scalars
and arrays, object arrays of supported values (gymnasium's ``final_obs``), lists, tuples and dicts with
supported keys. Anything else is refused with a message that names its type.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from cloud._errors import InfoEncodingError
from device import pack_arrays, unpack_arrays

_SCALAR_DTYPE = re.compile(r"[<>|=]?[biuf][1248]")


def encode_info(value: Any) -> bytes:
    """Encode `value` (see the module docstring for what is supported)."""
    arrays: dict[str, np.ndarray] = {}

    def enc(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):  # NaN and infinities are not JSON: sent by name
            return {"__f__": str(float(x))}
        if x is None or isinstance(x, bool | str | int | float):
            return x
        if isinstance(x, np.ndarray):
            if x.dtype == object:
                return {"__o__": [enc(v) for v in x.ravel()], "shape": list(x.shape)}
            if x.dtype.kind not in "biuf":
                raise InfoEncodingError(f"SharedMemoryVectorEnv: an info array has dtype {x.dtype}; only numbers, "
                                        "bools and object arrays of supported values cross the worker boundary")
            name = f"a{len(arrays)}"
            arrays[name] = x
            return {"__a__": name}
        if isinstance(x, np.generic):
            if x.dtype.kind not in "biuf":
                raise InfoEncodingError(f"SharedMemoryVectorEnv: an info holds a numpy {x.dtype} scalar; "
                                        "only numeric and bool scalars cross the worker boundary")
            return {"__s__": x.dtype.str, "v": enc(x.item())}
        if isinstance(x, tuple):
            return {"__t__": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            return {"__d__": [[enc(k), enc(v)] for k, v in x.items()]}
        raise InfoEncodingError(f"SharedMemoryVectorEnv: an env's info holds a {type(x).__name__}; infos cross the "
                                "worker boundary without pickle, so use numbers, strings, numpy arrays, lists, tuples "
                                "and dicts")

    return pack_arrays({"tree": enc(value)}, arrays)


def decode_info(data: bytes | bytearray | memoryview) -> Any:
    """Decode a message made by `encode_info`; arrays are copies (the buffer is reused for the next step)."""
    meta, arrays = unpack_arrays(data)

    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "__a__" in x:
            return np.array(arrays[x["__a__"]])
        if "__s__" in x:
            if not isinstance(x["__s__"], str) or not _SCALAR_DTYPE.fullmatch(x["__s__"]):
                raise InfoEncodingError(f"SharedMemoryVectorEnv: bad scalar dtype {x['__s__']!r} on the info channel")
            return np.dtype(x["__s__"]).type(_number(x["v"]))
        if "__f__" in x:
            return _number(x)
        if "__t__" in x:
            return tuple(dec(v) for v in x["__t__"])
        if "__d__" in x:
            return {_hashable(dec(k)): dec(v) for k, v in x["__d__"]}
        if "__o__" in x:
            out = np.empty(len(x["__o__"]), dtype=object)
            for i, v in enumerate(x["__o__"]):
                out[i] = dec(v)
            return out.reshape(x["shape"])
        raise InfoEncodingError(f"SharedMemoryVectorEnv: unknown node {sorted(x)} on the info channel")

    return dec(meta["tree"])


def _number(x: Any) -> Any:
    """A scalar's value: itself, or a non-finite float sent by name (``{"__f__": "nan"}``)."""
    if isinstance(x, dict) and "__f__" in x:
        if x["__f__"] not in ("nan", "inf", "-inf"):
            raise InfoEncodingError(f"SharedMemoryVectorEnv: bad float {str(x['__f__'])[:20]!r} on the info channel")
        return float(x["__f__"])
    return x


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key
