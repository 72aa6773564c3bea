"""A small reader (and writer) for the protobuf wire format, just enough of ONNX for the numpy executor.

The device tier cannot import ``onnx`` or ``protobuf``, so this module decodes the few ONNX messages a
policy uses straight from the wire format: ModelProto -> GraphProto -> NodeProto, AttributeProto,
TensorProto (``raw_data`` and the typed ``*_data`` fields, packed or not) and ValueInfoProto. It builds
only plain Python values and numpy arrays of numeric dtypes; anything malformed raises `ModelError`.
Field numbers follow onnx/onnx.proto3 (ONNX IR version 10).

The writer half (`encode_*`) re-emits messages field by field; `device._quantize` uses it to replace
initializers while keeping every other byte of the model as it was.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

from device._bundle_errors import ModelError, UnsupportedOperatorError

# Wire types.
VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5

# TensorProto.DataType -> numpy dtype (little-endian). STRING (8), BFLOAT16 (16) and newer float types
# are not numeric types numpy has, so a tensor of those is refused.
DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype("<f4"), 2: np.dtype("u1"), 3: np.dtype("i1"), 4: np.dtype("<u2"), 5: np.dtype("<i2"),
    6: np.dtype("<i4"), 7: np.dtype("<i8"), 9: np.dtype("?"), 10: np.dtype("<f2"), 11: np.dtype("<f8"),
    12: np.dtype("<u4"), 13: np.dtype("<u8"),
}
DTYPE_CODES: dict[str, int] = {dt.name: code for code, dt in DTYPES.items()}
# The element types numpy has no exact dtype for, by name, for the refusals.
OTHER_TYPES: dict[int, str] = {0: "UNDEFINED", 8: "STRING", 14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16",
                               17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ",
                               21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1", 24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2"}


def type_name(code: int) -> str:
    """An ONNX element type code's name: ``float32`` for the numeric ones, ``BFLOAT16`` etc. for the others."""
    return DTYPES[code].name if code in DTYPES else OTHER_TYPES.get(code, f"type code {code}")
MAX_TENSOR_ELEMENTS = 1 << 26

Field: TypeAlias = tuple[int, int, Any]  # (field number, wire type, int | bytes)


def _err(msg: str) -> ModelError:
    return ModelError(f"NumpyExecutor: malformed ONNX model: {msg}")


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode one varint at `pos`; return ``(value, next position)``."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise _err(f"truncated varint at byte {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _err(f"varint longer than 10 bytes at byte {pos}")


def iter_fields(buf: bytes, start: int = 0, end: int | None = None) -> Iterator[Field]:
    """Yield ``(field number, wire type, value)`` for each field; value is an int (varint) or bytes."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _err(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = read_varint(buf, pos, end)
            yield number, wire, value
        elif wire == LEN:
            n, pos = read_varint(buf, pos, end)
            if pos + n > end:
                raise _err(f"field {number} length {n} runs past the end of its message")
            yield number, wire, buf[pos : pos + n]
            pos += n
        elif wire in (FIXED32, FIXED64):
            n = 4 if wire == FIXED32 else 8
            if pos + n > end:
                raise _err(f"truncated fixed-width field {number}")
            yield number, wire, buf[pos : pos + n]
            pos += n
        else:
            raise _err(f"unsupported wire type {wire} (groups) for field {number}")


def _signed64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _varints(wire: int, value: Any, number: int) -> list[int]:
    """A repeated integer field's values: one unpacked varint or a packed run."""
    if wire == VARINT:
        return [_signed64(value)]
    if wire == LEN:
        out = []
        pos = 0
        while pos < len(value):
            v, pos = read_varint(value, pos, len(value))
            out.append(_signed64(v))
        return out
    raise _err(f"integer field {number} has wire type {wire}")


def _fixed(wire: int, value: Any, number: int, fmt: str) -> list[float]:
    """A repeated float/double field's values: one fixed-width value or a packed run."""
    size = struct.calcsize(fmt)
    if (wire == FIXED32 and size == 4) or (wire == FIXED64 and size == 8) or wire == LEN:
        if len(value) % size:
            raise _err(f"packed field {number} has {len(value)} bytes, not a multiple of {size}")
        return list(struct.unpack(f"<{len(value) // size}{fmt}", value))
    raise _err(f"float field {number} has wire type {wire}")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, bytes):
        raise _err(f"{what} is not a length-delimited string")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _err(f"{what} is not utf-8") from exc


def _message(wire: int, value: Any, what: str) -> bytes:
    if wire != LEN:
        raise _err(f"{what} is not an embedded message (wire type {wire})")
    return bytes(value)


def parse_tensor(buf: bytes) -> tuple[str, np.ndarray]:
    """Decode a TensorProto into ``(name, array)``."""
    dims: list[int] = []
    data_type = 0
    name = ""
    raw: bytes | None = None
    typed: list[Any] = []
    external = False
    for number, wire, value in iter_fields(buf):
        if number == 1:
            dims += _varints(wire, value, number)
        elif number == 2:
            data_type = _varints(wire, value, number)[-1]
        elif number == 4:
            typed += _fixed(wire, value, number, "f")
        elif number in (5, 7, 11):
            typed += _varints(wire, value, number)
        elif number == 8:
            name = _text(value, "tensor name")
        elif number == 9:
            raw = _message(wire, value, "raw_data")
        elif number == 10:
            typed += _fixed(wire, value, number, "d")
        elif number == 14:
            external = _varints(wire, value, number)[-1] == 1
        elif number == 6:
            data_type = 8  # string_data: a STRING tensor, refused below by its type
        elif number == 13:
            raise _err(f"tensor {name!r} uses external data, which the device executor cannot load")
    if external:
        raise _err(f"tensor {name!r} keeps its data in an external file; export with external_data=False")
    dtype = DTYPES.get(data_type)
    if dtype is None:
        raise UnsupportedOperatorError(
            f"NumpyExecutor: tensor {name!r} has element type {type_name(data_type)}, which numpy cannot represent "
            f"exactly; the device executor runs {sorted(DTYPE_CODES)}")
    if any(d < 0 for d in dims):
        raise _err(f"tensor {name!r} has negative dims {dims}")
    count = 1
    for d in dims:
        count *= d
        if count > MAX_TENSOR_ELEMENTS:
            raise _err(f"tensor {name!r} with dims {dims} exceeds {MAX_TENSOR_ELEMENTS} elements")
    if raw is not None:
        if len(raw) != count * dtype.itemsize:
            raise _err(f"tensor {name!r} raw_data has {len(raw)} bytes, dims {dims} of {dtype} need "
                       f"{count * dtype.itemsize}")
        arr = np.frombuffer(raw, dtype=dtype).copy()
    else:
        if len(typed) != count:
            raise _err(f"tensor {name!r} holds {len(typed)} values, dims {dims} need {count}")
        if data_type == 10:  # float16 travels as its 16-bit pattern in int32_data
            arr = np.array(typed, dtype=np.int64).astype(np.uint16).view(np.float16)
        elif data_type == 13:
            arr = np.array([v & ((1 << 64) - 1) for v in typed], dtype=np.uint64)
        else:
            try:
                arr = np.array(typed).astype(dtype)
            except (OverflowError, ValueError) as exc:
                raise _err(f"tensor {name!r} values do not fit {dtype}") from exc
    return name, arr.astype(dtype.newbyteorder("="), copy=False).reshape(dims)


# AttributeProto.AttributeType values.
ATTR_FLOAT, ATTR_INT, ATTR_STRING, ATTR_TENSOR, ATTR_GRAPH = 1, 2, 3, 4, 5
ATTR_FLOATS, ATTR_INTS, ATTR_STRINGS = 6, 7, 8


def parse_attribute(buf: bytes) -> tuple[str, Any]:
    """Decode an AttributeProto into ``(name, value)``: float, int, str, ndarray or a list of those."""
    name = ""
    kind = 0
    scalars: dict[int, Any] = {}
    floats: list[float] = []
    ints: list[int] = []
    strings: list[str] = []
    for number, wire, value in iter_fields(buf):
        if number == 1:
            name = _text(value, "attribute name")
        elif number == 20:
            kind = _varints(wire, value, number)[-1]
        elif number == 2:
            scalars[2] = _fixed(wire, value, number, "f")[-1]
        elif number == 3:
            scalars[3] = _varints(wire, value, number)[-1]
        elif number == 4:
            scalars[4] = _message(wire, value, "string attribute")
        elif number == 5:
            scalars[5] = parse_tensor(_message(wire, value, "tensor attribute"))[1]
        elif number == 7:
            floats += _fixed(wire, value, number, "f")
        elif number == 8:
            ints += _varints(wire, value, number)
        elif number == 9:
            strings.append(_text(value, "strings attribute"))
        elif number in (6, 10, 11, 21, 22, 23):
            kind = kind or -number
    if kind == 0:  # producers older than IR 3 may leave the type out: infer it from the field that is set
        kind = (ATTR_TENSOR if 5 in scalars else ATTR_FLOATS if floats else ATTR_INTS if ints else
                ATTR_STRINGS if strings else ATTR_FLOAT if 2 in scalars else ATTR_INT if 3 in scalars else
                ATTR_STRING if 4 in scalars else 0)
    if kind == ATTR_FLOAT:
        return name, float(scalars.get(2, 0.0))
    if kind == ATTR_INT:
        return name, int(scalars.get(3, 0))
    if kind == ATTR_STRING:
        raw = scalars.get(4, b"")
        return name, raw.decode("utf-8", errors="replace")
    if kind == ATTR_TENSOR and 5 in scalars:
        return name, scalars[5]
    if kind == ATTR_FLOATS:
        return name, floats
    if kind == ATTR_INTS:
        return name, ints
    if kind == ATTR_STRINGS:
        return name, strings
    raise ModelError(f"NumpyExecutor: attribute {name!r} has type {kind}, which the device executor does not "
                     "support (graph, sparse-tensor and type attributes are refused)")


@dataclass
class Node:
    """One NodeProto."""

    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    name: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class ValueInfo:
    """One ValueInfoProto: a graph input or output with its element type and shape (None/str = dynamic)."""

    name: str
    elem_type: int = 0
    shape: list[int | str | None] | None = None


@dataclass
class Graph:
    """The parts of a GraphProto the executor uses."""

    nodes: list[Node]
    initializers: dict[str, np.ndarray]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]


@dataclass
class Model:
    """The parts of a ModelProto the executor uses."""

    ir_version: int
    opsets: dict[str, int]
    graph: Graph


def parse_node(buf: bytes) -> Node:
    """Decode a NodeProto."""
    node = Node(op_type="", domain="", inputs=[], outputs=[])
    for number, wire, value in iter_fields(buf):
        if number == 1:
            node.inputs.append(_text(value, "node input"))
        elif number == 2:
            node.outputs.append(_text(value, "node output"))
        elif number == 3:
            node.name = _text(value, "node name")
        elif number == 4:
            node.op_type = _text(value, "op_type")
        elif number == 7:
            node.domain = _text(value, "node domain")
        elif number == 5:
            key, attr = parse_attribute(_message(wire, value, "attribute"))
            node.attrs[key] = attr
    if not node.op_type:
        raise _err(f"node {node.name!r} has no op_type")
    return node


def _parse_shape(buf: bytes) -> list[int | str | None]:
    dims: list[int | str | None] = []
    for number, wire, value in iter_fields(buf):
        if number != 1:
            continue
        dim: int | str | None = None
        for n2, w2, v2 in iter_fields(_message(wire, value, "dimension")):
            if n2 == 1:
                dim = _varints(w2, v2, n2)[-1]
            elif n2 == 2:
                dim = _text(v2, "dim_param")
        dims.append(dim)
    return dims


def parse_value_info(buf: bytes) -> ValueInfo:
    """Decode a ValueInfoProto (tensor types only; other types keep ``elem_type`` 0)."""
    info = ValueInfo(name="")
    for number, wire, value in iter_fields(buf):
        if number == 1:
            info.name = _text(value, "value name")
        elif number == 2:
            for n2, w2, v2 in iter_fields(_message(wire, value, "type")):
                if n2 != 1:  # only tensor_type
                    continue
                for n3, w3, v3 in iter_fields(_message(w2, v2, "tensor type")):
                    if n3 == 1:
                        info.elem_type = _varints(w3, v3, n3)[-1]
                    elif n3 == 2:
                        info.shape = _parse_shape(_message(w3, v3, "shape"))
    return info


def parse_graph(buf: bytes) -> Graph:
    """Decode a GraphProto."""
    graph = Graph(nodes=[], initializers={}, inputs=[], outputs=[])
    for number, wire, value in iter_fields(buf):
        if number == 1:
            graph.nodes.append(parse_node(_message(wire, value, "node")))
        elif number == 5:
            name, arr = parse_tensor(_message(wire, value, "initializer"))
            graph.initializers[name] = arr
        elif number == 11:
            graph.inputs.append(parse_value_info(_message(wire, value, "graph input")))
        elif number == 12:
            graph.outputs.append(parse_value_info(_message(wire, value, "graph output")))
        elif number == 15:
            raise _err("sparse initializers are not supported by the device executor")
    return graph


def parse_model(data: bytes) -> Model:
    """Decode a ModelProto; raise `ModelError` when the bytes are not one."""
    data = bytes(data)
    ir_version = 0
    opsets: dict[str, int] = {}
    graph: Graph | None = None
    for number, wire, value in iter_fields(data):
        if number == 1:
            ir_version = _varints(wire, value, number)[-1]
        elif number == 8:
            domain, version = "", 1
            for n2, w2, v2 in iter_fields(_message(wire, value, "opset_import")):
                if n2 == 1:
                    domain = _text(v2, "opset domain")
                elif n2 == 2:
                    version = _varints(w2, v2, n2)[-1]
            opsets[domain] = version
        elif number == 7:
            graph = parse_graph(_message(wire, value, "graph"))
    if graph is None:
        raise _err("no graph (is this an ONNX ModelProto?)")
    if not graph.outputs:
        raise _err("the graph has no outputs")
    return Model(ir_version=ir_version, opsets=opsets, graph=graph)


# --- writer -----------------------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Encode a non-negative or int64 value as a varint (negative values as 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_field(number: int, wire: int, value: int | bytes) -> bytes:
    """Encode one field; `value` is an int for varints, else the raw (or message) bytes."""
    key = encode_varint(number << 3 | wire)
    if wire == VARINT:
        assert isinstance(value, int)
        return key + encode_varint(value)
    assert isinstance(value, bytes)
    if wire == LEN:
        return key + encode_varint(len(value)) + value
    return key + value


def encode_fields(fields: Sequence[Field]) -> bytes:
    """Encode fields as produced by `iter_fields` (round-trips a message byte for byte when canonical)."""
    return b"".join(encode_field(n, w, v) for n, w, v in fields)


def encode_tensor(name: str, array: np.ndarray) -> bytes:
    """Encode a TensorProto with ``raw_data``."""
    a = np.ascontiguousarray(array)
    code = DTYPE_CODES.get(a.dtype.name)
    if code is None:
        raise ModelError(f"encode_tensor: dtype {a.dtype} of {name!r} has no ONNX tensor type")
    parts = [encode_field(1, VARINT, int(d)) for d in a.shape]
    parts += [encode_field(2, VARINT, code), encode_field(8, LEN, name.encode()),
              encode_field(9, LEN, a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())]
    return b"".join(parts)


def encode_node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], *, name: str = "",
                int_attrs: dict[str, int] | None = None) -> bytes:
    """Encode a NodeProto of the default domain with integer attributes."""
    parts = [encode_field(1, LEN, i.encode()) for i in inputs]
    parts += [encode_field(2, LEN, o.encode()) for o in outputs]
    if name:
        parts.append(encode_field(3, LEN, name.encode()))
    parts.append(encode_field(4, LEN, op_type.encode()))
    for key, value in (int_attrs or {}).items():
        attr = encode_field(1, LEN, key.encode()) + encode_field(3, VARINT, value) + encode_field(20, VARINT, ATTR_INT)
        parts.append(encode_field(5, LEN, attr))
    return b"".join(parts)
