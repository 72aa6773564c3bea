"""Generated single-operator ONNX graphs for every operator `device.NumpyExecutor` claims, onnxruntime as the oracle.

`make_case(op, draw)` builds one small graph around `op`: random shapes, attributes, broadcasting, each input a
graph input (run time) or an initializer, the op first, in the middle, last or alone in the graph, and float inputs
sprinkled with NaN, +-inf and signed zeros. `draw` is a `Draw`: hypothesis drives it in the tests
(`HypothesisDraw`, so failures shrink), a seeded numpy generator in the op-fuzz benchmark (`RngDraw`).
`check(case)` runs the case in both and returns ``"match"``, ``"refused: <reason>"`` (the executor refused the
graph at load, `UnsupportedOperatorError`), ``"invalid"`` (onnxruntime itself rejects it: the generator's problem,
not the executor's) or raises `Mismatch`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from device import ModelError, NumpyExecutor, UnsupportedOperatorError

T = TypeVar("T")
F32, F64, F16, I64, I32, I8, U8, BOOL = (np.dtype(t) for t in ("float32", "float64", "float16", "int64", "int32",
                                                               "int8", "uint8", "bool"))
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, np.nan])


class Draw:
    """Where a case's choices come from."""

    rng: np.random.Generator

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, options: Sequence[T]) -> T:
        return options[self.integer(0, len(options) - 1)]

    def boolean(self) -> bool:
        return self.integer(0, 1) == 1


class RngDraw(Draw):
    """Choices from a seeded numpy generator (the benchmark)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))


class HypothesisDraw(Draw):
    """Choices drawn by hypothesis (`st.data()`), so a failing case shrinks; array values from a drawn seed."""

    def __init__(self, data: Any) -> None:
        from hypothesis import strategies as st

        self._data, self._st = data, st
        self.rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="values seed"))

    def integer(self, lo: int, hi: int) -> int:
        return int(self._data.draw(self._st.integers(lo, hi)))


@dataclass
class In:
    """One operator input: its value and whether it must be a graph input ("run"), an initializer ("const"), or
    either ("any", drawn)."""

    value: np.ndarray
    mode: str = "any"


@dataclass
class Spec:
    """What an operator generator returns."""

    inputs: list[In | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 17
    outputs: int = 1


@dataclass
class Case:
    op: str
    model: bytes
    feeds: dict[str, np.ndarray]
    desc: str
    spec: Spec


class Mismatch(AssertionError):
    """The executor's output differs from onnxruntime's."""


# --- values --------------------------------------------------------------------------------------------


def shape(d: Draw, rank_lo: int = 1, rank_hi: int = 4, dim_hi: int = 4) -> tuple[int, ...]:
    return tuple(d.integer(1, dim_hi) for _ in range(d.integer(rank_lo, rank_hi)))


def floats(d: Draw, shp: Sequence[int], dtype: np.dtype[Any] = F32, *, specials: bool = True,
           scale: float = 3.0) -> np.ndarray:
    x = d.rng.normal(size=tuple(shp)) * scale
    if d.rng.random() < 0.3:  # ties and exact integers
        x = np.round(x)
    if specials and x.size and d.rng.random() < 0.4:
        mask = d.rng.random(x.shape) < 0.25
        x = np.where(mask, d.rng.choice(SPECIALS, size=x.shape), x)
    return np.asarray(x, dtype=dtype)


def ints(d: Draw, shp: Sequence[int], dtype: np.dtype[Any] = I64, lo: int = -5, hi: int = 5) -> np.ndarray:
    return d.rng.integers(lo, hi + 1, size=tuple(shp)).astype(dtype)


def bools(d: Draw, shp: Sequence[int]) -> np.ndarray:
    return d.rng.random(tuple(shp)) < 0.5


def values(d: Draw, shp: Sequence[int], dtype: np.dtype[Any]) -> np.ndarray:
    if dtype.kind == "f":
        return floats(d, shp, dtype)
    if dtype.kind == "b":
        return bools(d, shp)
    return ints(d, shp, dtype, 0 if dtype.kind == "u" else -5, 5)


def broadcast_shapes(d: Draw, n: int) -> list[tuple[int, ...]]:
    """`n` shapes that broadcast together: suffixes of one shape, some dims set to 1."""
    out = shape(d, 0, 4)
    shapes = []
    for _ in range(n):
        suffix = out[len(out) - d.integer(0, len(out)):] if out else ()
        shapes.append(tuple(1 if d.integer(0, 3) == 0 else s for s in suffix))
    return shapes


# --- operator generators ------------------------------------------------------------------------------

GENERATORS: dict[str, Callable[[Draw], Spec]] = {}


def gen(*ops: str) -> Callable[[Callable[[Draw, str], Spec]], Callable[[Draw, str], Spec]]:
    def register(fn: Callable[[Draw, str], Spec]) -> Callable[[Draw, str], Spec]:
        for op in ops:
            GENERATORS[op] = lambda d, op=op: fn(d, op)  # type: ignore[misc]
        return fn
    return register


ACTIVATION_ATTRS = {"LeakyRelu": ("alpha",), "Elu": ("alpha",), "Selu": ("alpha", "gamma"),
                    "HardSigmoid": ("alpha", "beta")}


@gen("Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sin", "Cos", "Sigmoid", "Softplus",
     "Relu", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish")
def _unary_float(d: Draw, op: str) -> Spec:
    attrs = {name: d.choice([0.01, 0.2, 1.0, 1.5, -0.3, 2.5]) for name in ACTIVATION_ATTRS.get(op, ())
             if d.boolean()}
    dtype = d.choice([F32, F32, F32, F64]) if op in ("Tanh", "Exp", "Log", "Sqrt", "Floor", "Ceil", "Round",
                                                      "Sigmoid", "Relu", "Reciprocal") else F32
    return Spec([In(floats(d, shape(d), dtype))], attrs, opset=d.choice([14, 17]))


@gen("Neg", "Abs", "Sign")
def _unary_signed(d: Draw, op: str) -> Spec:
    dtype = d.choice([F32, F64, I64, I32, I8])
    return Spec([In(values(d, shape(d), dtype))])


@gen("Not")
def _not(d: Draw, op: str) -> Spec:
    return Spec([In(bools(d, shape(d)))])


@gen("Add", "Sub", "Mul", "Div")
def _arith(d: Draw, op: str) -> Spec:
    dtype = d.choice([F32, F32, F64, I64, I32])
    a, b = (values(d, s, dtype) for s in broadcast_shapes(d, 2))
    if op == "Div" and dtype.kind == "i":
        b = np.where(b == 0, 1, b).astype(dtype)  # integer division by zero is undefined in onnxruntime
    return Spec([In(a), In(b)], opset=d.choice([13, 14]))


@gen("Pow")
def _pow(d: Draw, op: str) -> Spec:
    sa, sb = broadcast_shapes(d, 2)
    b = floats(d, sb, scale=1.5) if d.boolean() else ints(d, sb, d.choice([I64, I32]), -3, 3)
    return Spec([In(floats(d, sa)), In(b)], opset=15)


@gen("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual")
def _compare(d: Draw, op: str) -> Spec:
    dtype = d.choice([F32, I64, I32] + ([BOOL] if op == "Equal" else []))
    sa, sb = broadcast_shapes(d, 2)
    a = np.round(values(d, sa, dtype) / 2).astype(dtype) if dtype.kind == "f" else values(d, sa, dtype)
    return Spec([In(a), In(values(d, sb, dtype))], opset=d.choice([13, 16]))


@gen("And", "Or", "Xor")
def _logical(d: Draw, op: str) -> Spec:
    return Spec([In(bools(d, s)) for s in broadcast_shapes(d, 2)], opset=7)


@gen("Max", "Min", "Sum", "Mean")
def _variadic(d: Draw, op: str) -> Spec:
    dtype = d.choice([F32, F32, I64]) if op in ("Max", "Min") else F32
    return Spec([In(values(d, s, dtype)) for s in broadcast_shapes(d, d.integer(1, 3))], opset=13)


@gen("Clip")
def _clip(d: Draw, op: str) -> Spec:
    opset = d.choice([7, 10, 11, 13])
    dtype = d.choice([F32, F32, I64]) if opset >= 13 else F32
    x = values(d, shape(d), dtype)
    lo, hi = d.choice([None, -1.0, 0.0, -2.5, 1.0]), d.choice([None, 1.0, 0.5, 3.0, -1.0])
    if opset < 11:
        return Spec([In(x)], {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}, opset=opset)
    bound = [None if v is None else In(np.array(v, dtype=dtype) if dtype.kind == "f" else np.array(int(v), dtype))
             for v in (lo, hi)]
    return Spec([In(x), *bound], opset=opset)


@gen("Gemm")
def _gemm(d: Draw, op: str) -> Spec:
    m, k, n = d.integer(1, 4), d.integer(1, 5), d.integer(1, 4)
    ta, tb = d.integer(0, 1), d.integer(0, 1)
    a = floats(d, (k, m) if ta else (m, k))
    b = floats(d, (n, k) if tb else (k, n), specials=d.integer(0, 3) == 0)
    attrs: dict[str, Any] = {"transA": ta, "transB": tb}
    for name in ("alpha", "beta"):
        if d.boolean():
            attrs[name] = d.choice([1.0, 0.5, -2.0, 0.0, 3.0])
    c_shape = d.choice([None, (n,), (1, n), (m, n), (m, 1), (), (1,)])
    c = None if c_shape is None else In(floats(d, c_shape, specials=False))
    return Spec([In(a), In(b), c], attrs, opset=d.choice([11, 13]))


@gen("MatMul")
def _matmul(d: Draw, op: str) -> Spec:
    m, k, n = d.integer(1, 4), d.integer(1, 5), d.integer(1, 4)
    batch = shape(d, 0, 2, 3)
    ba = batch[len(batch) - d.integer(0, len(batch)):]
    bb = tuple(1 if d.integer(0, 3) == 0 else s for s in batch[len(batch) - d.integer(0, len(batch)):])
    sa = (k,) if d.integer(0, 4) == 0 else (*ba, m, k)
    sb = (k,) if d.integer(0, 4) == 0 else (*bb, k, n)
    return Spec([In(floats(d, sa)), In(floats(d, sb, specials=d.boolean()))], opset=13)


@gen("Softmax", "LogSoftmax")
def _softmax(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d))
    attrs = {"axis": d.integer(-x.ndim, x.ndim - 1)} if d.boolean() else {}
    return Spec([In(x)], attrs, opset=d.choice([11, 13]))


@gen("ArgMax", "ArgMin")
def _argmax(d: Draw, op: str) -> Spec:
    shp = list(shape(d))
    if d.boolean():
        shp[d.integer(0, len(shp) - 1)] = d.integer(5, 24)  # rows long enough for vectorised loops
    x = floats(d, shp) if d.boolean() else np.round(floats(d, shp, scale=1.0))
    attrs: dict[str, Any] = {}
    if d.boolean():
        attrs["axis"] = d.integer(-x.ndim, x.ndim - 1)
    if d.boolean():
        attrs["keepdims"] = d.integer(0, 1)
    if d.boolean():
        attrs["select_last_index"] = d.integer(0, 1)
    return Spec([In(x)], attrs, opset=13)


@gen("ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ReduceProd")
def _reduce(d: Draw, op: str) -> Spec:
    opset = d.choice([13, 18])
    shp = list(shape(d))
    if d.boolean():
        shp[d.integer(0, len(shp) - 1)] = d.integer(5, 24)
    dtype = d.choice([F32, F32, I64]) if op in ("ReduceMax", "ReduceMin", "ReduceSum") else F32
    x = floats(d, shp, scale=1.0 if op == "ReduceProd" else 3.0) if dtype == F32 else ints(d, shp)
    axes = None if d.integer(0, 3) == 0 else sorted({d.integer(-x.ndim, x.ndim - 1) % x.ndim
                                                     for _ in range(d.integer(0, x.ndim))})
    axes = None if axes is None else [a - x.ndim if d.boolean() else a for a in axes]
    attrs: dict[str, Any] = {}
    if d.boolean():
        attrs["keepdims"] = d.integer(0, 1)
    from_input = opset >= 18 or op == "ReduceSum"
    if from_input and d.integer(0, 3) == 0:
        attrs["noop_with_empty_axes"] = d.integer(0, 1)
    if not from_input:
        if axes:
            attrs["axes"] = axes
        return Spec([In(x)], attrs, opset=opset)
    return Spec([In(x), None if axes is None else In(np.array(axes, I64), "const")], attrs, opset=opset)


@gen("LayerNormalization")
def _layer_norm(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d, 1, 4), specials=d.integer(0, 3) == 0)
    axis = d.integer(-x.ndim, x.ndim - 1)
    tail = x.shape[axis % x.ndim:]
    attrs: dict[str, Any] = {"axis": axis}
    if d.boolean():
        attrs["epsilon"] = d.choice([1e-5, 1e-3, 0.1])
    bias = In(floats(d, tail, specials=False)) if d.boolean() else None
    return Spec([In(x), In(floats(d, tail, specials=False)), bias], attrs, opset=17)


@gen("BatchNormalization")
def _batch_norm(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d, 2, 4))
    c = x.shape[1]
    params = [floats(d, (c,), specials=False), floats(d, (c,), specials=False), floats(d, (c,), specials=False),
              np.abs(floats(d, (c,), specials=False)) + 0.1]
    attrs: dict[str, Any] = {}
    if d.boolean():
        attrs["epsilon"] = d.choice([1e-5, 1e-3, 0.1])
    training = d.integer(0, 5) == 0
    if training:
        attrs["training_mode"] = 1
    modes = ["any" if d.integer(0, 5) == 0 else "const" for _ in params]
    return Spec([In(x), *(In(p, m) for p, m in zip(params, modes, strict=True))], attrs, opset=15,
                outputs=3 if training else 1)


@gen("Reshape")
def _reshape(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d))
    dims = list(x.shape)
    d.rng.shuffle(dims)
    target = [int(v) for v in dims] if d.boolean() else [int(np.prod(dims))]
    if len(target) > 1 and d.boolean():
        target = [target[0] * target[1], *target[2:]]
    if d.boolean():
        target[d.integer(0, len(target) - 1)] = -1
    elif target and target[0] == x.shape[0] and d.boolean():
        target[0] = 0
    attrs = {"allowzero": 0} if d.boolean() else {}
    return Spec([In(x, "run" if d.boolean() else "any"), In(np.array(target, I64))], attrs, opset=14)


@gen("Flatten")
def _flatten(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d))
    return Spec([In(x)], {"axis": d.integer(-x.ndim, x.ndim)} if d.boolean() else {}, opset=13)


@gen("Identity")
def _identity(d: Draw, op: str) -> Spec:
    return Spec([In(values(d, shape(d), d.choice([F32, I64, BOOL])))], opset=16)


@gen("Dropout")
def _dropout(d: Draw, op: str) -> Spec:
    opset = d.choice([12, 13])
    x = floats(d, shape(d))
    ratio = In(np.array(d.choice([0.0, 0.5]), F32), "const") if d.boolean() else None
    training = In(np.array(d.integer(0, 4) == 0), "const") if d.boolean() else None
    return Spec([In(x), ratio, training], opset=opset, outputs=d.integer(1, 2))


@gen("Concat")
def _concat(d: Draw, op: str) -> Spec:
    base = list(shape(d))
    axis = d.integer(-len(base), len(base) - 1)
    parts = []
    for _ in range(d.integer(1, 3)):
        s = list(base)
        s[axis] = d.integer(1, 3)
        parts.append(In(floats(d, s)))
    return Spec(parts, {"axis": axis}, opset=13)  # type: ignore[arg-type]


@gen("Shape")
def _shape(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d))
    attrs = {k: d.integer(-5, 5) for k in ("start", "end") if d.boolean()}
    return Spec([In(x, "run")], attrs, opset=15)


@gen("Size")
def _size(d: Draw, op: str) -> Spec:
    return Spec([In(floats(d, shape(d)), "run")], opset=13)


@gen("Gather")
def _gather(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d, 1, 3))
    axis = d.integer(-x.ndim, x.ndim - 1)
    n = x.shape[axis]
    idx = d.rng.integers(-n, n, size=shape(d, 0, 2, 3)).astype(d.choice([I64, I32]))
    return Spec([In(x), In(idx)], {"axis": axis} if axis or d.boolean() else {}, opset=13)


@gen("Unsqueeze")
def _unsqueeze(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d, 0, 3))
    k = d.integer(1, 2)
    out_rank = x.ndim + k
    axes = [int(a) for a in d.rng.choice(out_rank, size=k, replace=False)]
    axes = [a - out_rank if d.boolean() else a for a in axes]
    if d.boolean():
        return Spec([In(x)], {"axes": axes}, opset=11)
    return Spec([In(x), In(np.array(axes, I64), "const")], opset=13)


@gen("Squeeze")
def _squeeze(d: Draw, op: str) -> Spec:
    shp = [1 if d.boolean() else s for s in shape(d)]
    x = floats(d, shp)
    ones = [i for i, s in enumerate(shp) if s == 1]
    axes = None if not ones or d.integer(0, 3) == 0 else [i - len(shp) if d.boolean() else i for i in ones
                                                          if d.boolean()] or ones[:1]
    if d.boolean():
        return Spec([In(x)], {} if axes is None else {"axes": axes}, opset=11)
    return Spec([In(x), None if axes is None else In(np.array(axes, I64), "const")], opset=13)


@gen("Transpose")
def _transpose(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d))
    attrs = {"perm": [int(p) for p in d.rng.permutation(x.ndim)]} if d.boolean() else {}
    return Spec([In(x)], attrs, opset=13)


@gen("Slice")
def _slice(d: Draw, op: str) -> Spec:
    x = floats(d, shape(d, 1, 3, 6))
    axes = sorted({d.integer(0, x.ndim - 1) for _ in range(d.integer(1, x.ndim))})
    starts = [d.choice([0, 1, -1, -2, 2, -100, 100]) for _ in axes]
    ends = [d.choice([0, 1, -1, 3, 100, -100, 2**62]) for _ in axes]
    if d.integer(0, 4) == 0:
        attrs = {"starts": starts, "ends": ends}
        if d.boolean():
            attrs["axes"] = axes
        return Spec([In(x)], attrs, opset=9)
    steps = [d.choice([1, 1, 2, -1, -2]) for _ in axes]
    signed_axes = [a - x.ndim if d.boolean() else a for a in axes]
    axes_in = In(np.array(signed_axes, I64)) if d.boolean() or steps != [1] * len(axes) else None
    steps_in = In(np.array(steps, I64)) if steps != [1] * len(axes) or d.boolean() else None
    if axes_in is None and steps_in is not None:
        axes_in = In(np.array(signed_axes, I64))
    if axes_in is None and axes != list(range(len(axes))):
        axes_in = In(np.array(signed_axes, I64))
    return Spec([In(x), In(np.array(starts, I64)), In(np.array(ends, I64)), axes_in, steps_in], opset=13)


@gen("Expand")
def _expand(d: Draw, op: str) -> Spec:
    sx, st = broadcast_shapes(d, 2)
    x = floats(d, sx)
    target = list(st)
    return Spec([In(x), In(np.array(target, I64))], opset=13)


@gen("Where")
def _where(d: Draw, op: str) -> Spec:
    sc, sa, sb = broadcast_shapes(d, 3)
    dtype = d.choice([F32, I64])
    return Spec([In(bools(d, sc)), In(values(d, sa, dtype)), In(values(d, sb, dtype))], opset=16)


CAST_CODES = {F32: TP.FLOAT, F64: TP.DOUBLE, F16: TP.FLOAT16, I64: TP.INT64, I32: TP.INT32, I8: TP.INT8,
              U8: TP.UINT8, BOOL: TP.BOOL}


@gen("Cast")
def _cast(d: Draw, op: str) -> Spec:
    src, dst = d.choice(list(CAST_CODES)), d.choice(list(CAST_CODES))
    shp = shape(d)
    if src.kind == "f" and dst.kind in "iub":  # float -> int of NaN, inf or out-of-range values is undefined
        x = np.round(floats(d, shp, src, specials=False, scale=2.0))
        x = np.abs(x) if dst.kind == "u" else x
    else:
        x = values(d, shp, src)
        if dst.kind == "u":
            x = np.abs(x)
    return Spec([In(x.astype(src))], {"to": CAST_CODES[dst]}, opset=13)


@gen("Constant")
def _constant(d: Draw, op: str) -> Spec:
    form = d.choice(["value", "value_float", "value_floats", "value_int", "value_ints"])
    value: Any
    if form == "value":
        value = numpy_helper.from_array(values(d, shape(d, 0, 3), d.choice([F32, I64, BOOL])))
    elif form == "value_float":
        value = float(d.choice([1.5, -2.0, 0.0]))
    elif form == "value_floats":
        value = [float(v) for v in floats(d, (d.integer(1, 4),), specials=False)]
    elif form == "value_int":
        value = d.integer(-5, 5)
    else:
        value = [int(v) for v in ints(d, (d.integer(1, 4),))]
    return Spec([], {form: value}, opset=13)


@gen("ConstantOfShape")
def _constant_of_shape(d: Draw, op: str) -> Spec:
    shp = np.array(shape(d, 0, 3), I64)
    attrs = {}
    if d.boolean():
        attrs["value"] = numpy_helper.from_array(values(d, (1,), d.choice([F32, I64, I32, BOOL])))
    return Spec([In(shp)], attrs, opset=9)


@gen("Range")
def _range(d: Draw, op: str) -> Spec:
    dtype = d.choice([F32, I64, I32])
    start, limit = d.integer(-5, 5), d.integer(-5, 5)
    delta = d.choice([1, 2, -1, -3]) if dtype.kind == "i" else d.choice([0.5, 1.0, -0.75, 2.0])
    return Spec([In(np.array(v, dtype)) for v in (start, limit, delta)], opset=11)


@gen("DequantizeLinear")
def _dequantize(d: Draw, op: str) -> Spec:
    opset = d.choice([13, 19, 21])
    qtype = d.choice([I8, U8, I32])
    x = ints(d, shape(d, 1, 3), qtype, 0 if qtype == U8 else -100, 100)
    axis = d.integer(-x.ndim, x.ndim - 1)
    attrs: dict[str, Any] = {} if axis == 1 and d.boolean() else {"axis": axis}
    per_axis = d.boolean()
    n = x.shape[axis] if per_axis else 1
    scale = (np.abs(floats(d, (n,), specials=False)) + 0.01).reshape(() if not per_axis else (n,))
    zero: In | None = None
    if qtype != I32 and d.boolean():
        zero = In(ints(d, scale.shape, qtype, 0 if qtype == U8 else -5, 5), "const")
    if opset >= 21 and d.integer(0, 3) == 0 and x.shape[axis] > 1:
        attrs["axis"], attrs["block_size"] = axis, 2  # blocked quantisation: the executor refuses it
        blocks = -(-x.shape[axis] // 2)
        bshape = list(x.shape)
        bshape[axis % x.ndim] = blocks
        scale = np.abs(floats(d, bshape, specials=False)) + 0.01
        zero = None
    return Spec([In(x), In(scale.astype(F32), "const"), zero], attrs, opset=opset)


# --- assembling a graph ---------------------------------------------------------------------------------


def _pre(name: str, dtype: np.dtype[Any], out: str) -> Any:
    """A node that passes `name` through unchanged (NaN, inf, -0 included) so the op reads a computed value."""
    return helper.make_node("Cast", [name], [out], to=helper.np_dtype_to_tensor_dtype(dtype))


def _post(name: str, out: str) -> Any:
    """A node that reads the op's output (Cast to double: every type has it)."""
    return helper.make_node("Cast", [name], [out], to=TP.DOUBLE)


def make_case(op: str, d: Draw) -> Case:
    """One random graph around `op` (see the module docstring)."""
    spec = GENERATORS[op](d)
    while spec.inputs and spec.inputs[-1] is None:
        spec.inputs.pop()
    graph_inputs: list[Any] = []
    inits: list[Any] = []
    feeds: dict[str, np.ndarray] = {}
    nodes: list[Any] = []
    op_inputs: list[str] = []
    modes = []
    position = d.choice(["alone", "first", "middle", "last"])
    for i, item in enumerate(spec.inputs):
        if item is None:
            op_inputs.append("")
            modes.append("-")
            continue
        name = f"in{i}"
        runtime = item.mode == "run" or (item.mode == "any" and d.integer(0, 2) > 0)
        value = np.array(item.value)  # (np.ascontiguousarray would make a scalar 1-D)
        modes.append("run" if runtime else "init")
        if runtime:
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                                              list(value.shape)))
            feeds[name] = value
            if i == 0 and position in ("middle", "last"):
                nodes.append(_pre(name, value.dtype, f"{name}_pre"))
                name = f"{name}_pre"
        else:
            inits.append(numpy_helper.from_array(value, name))
        op_inputs.append(name)
    outs = [f"out{j}" for j in range(spec.outputs)]
    nodes.append(helper.make_node(op, op_inputs, outs, **spec.attrs))
    graph_outputs = list(outs)
    if position in ("first", "middle"):
        nodes.append(_post(outs[0], "post"))
        graph_outputs[0] = "post"
    if not feeds:  # the executor needs a run-time input: a pass-through one
        graph_inputs.append(helper.make_tensor_value_info("dummy", TP.FLOAT, [2]))
        feeds["dummy"] = np.array([1.0, -2.0], np.float32)
        nodes.append(helper.make_node("Neg", ["dummy"], ["dummy_out"]))
        graph_outputs.append("dummy_out")
    graph = helper.make_graph(nodes, "case", graph_inputs, [helper.make_empty_tensor_value_info(n)
                                                             for n in graph_outputs], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", spec.opset)])
    model.ir_version = 10
    shapes = [None if it is None else f"{it.value.dtype}{list(it.value.shape)}" for it in spec.inputs]
    desc = (f"{op} opset {spec.opset} {position} inputs={shapes} modes={modes} attrs={_attr_text(spec.attrs)} "
            f"outputs={spec.outputs}")
    return Case(op, model.SerializeToString(), feeds, desc, spec)


def _attr_text(attrs: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v if not isinstance(v, onnx.TensorProto) else numpy_helper.to_array(v)!r}"
                           for k, v in sorted(attrs.items())) + "}"


# --- the oracle -----------------------------------------------------------------------------------------

TOLERANCE: dict[str, tuple[float, float]] = {"Pow": (1e-4, 1e-5), "Exp": (1e-5, 1e-5), "ReduceProd": (1e-5, 1e-5)}


def ort_run(case: Case) -> list[np.ndarray] | None:
    """onnxruntime's outputs, or None when onnxruntime rejects the graph (an invalid case)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(case.model, options, providers=["CPUExecutionProvider"])
        return list(session.run(None, case.feeds))
    except Exception:
        return None


def refusal_reason(exc: UnsupportedOperatorError) -> str:
    """A refusal's reason without tensor and node names or the list of supported types, so reasons group."""
    text = str(exc).replace("NumpyExecutor: ", "")
    text = text.split("; the device executor runs")[0].split(" is not supported by the device executor")[0]
    return re.sub(r"'[^']*'", "X", text)[:140]


# onnxruntime's ArgMax/ArgMin/ReduceMax/ReduceMin of a slice holding NaN depends on where the NaN falls in its
# SIMD lanes (ArgMax of arange(8) is 4 with x[4] = NaN and 7 with x[3] = NaN; ReduceMax is then 6), so no other
# implementation can match it. The executor defines NaN there as propagating (as torch and numpy do): the
# reduction is NaN, the arg-reduction the index of the first NaN (the last with select_last_index). Slices without
# NaN must match onnxruntime exactly.
NAN_PROPAGATING = ("ArgMax", "ArgMin", "ReduceMax", "ReduceMin")


def _nan_reference(case: Case, want: np.ndarray) -> tuple[np.ndarray, bool]:
    """`want` with the slices that hold NaN replaced by the NaN-propagating answer; whether any did."""
    spec = case.spec
    x = spec.inputs[0].value if spec.inputs and spec.inputs[0] is not None else None
    if x is None or x.dtype.kind != "f" or not np.isnan(x).any():
        return want, False
    keepdims = bool(spec.attrs.get("keepdims", 1))
    isnan = np.isnan(x)
    if case.op in ("ArgMax", "ArgMin"):
        axis = int(spec.attrs.get("axis", 0))
        nan_slices = isnan.any(axis=axis, keepdims=keepdims)
        if spec.attrs.get("select_last_index", 0):
            ref = x.shape[axis] - 1 - np.argmax(np.flip(isnan, axis), axis=axis, keepdims=keepdims)
        else:
            ref = np.argmax(isnan, axis=axis, keepdims=keepdims)
    else:
        axes_in = spec.inputs[1] if len(spec.inputs) > 1 else None
        axes = spec.attrs.get("axes") if axes_in is None else [int(a) for a in axes_in.value]
        if not axes and spec.attrs.get("noop_with_empty_axes", 0):
            return want, False
        ax = None if not axes else tuple(axes)
        nan_slices = isnan.any(axis=ax, keepdims=keepdims)
        ref = np.full(nan_slices.shape, np.nan)
    if nan_slices.shape != want.shape:
        return want, False
    return np.where(nan_slices, ref, want).astype(want.dtype), bool(nan_slices.any())


def check(case: Case) -> str:
    """Compare the executor with onnxruntime on `case` (see the module docstring)."""
    want = ort_run(case)
    if want is None:
        return "invalid"
    nan_defined = False
    if case.op in NAN_PROPAGATING:
        want[0], nan_defined = _nan_reference(case, want[0])
    try:
        with np.errstate(all="ignore"):
            executor = NumpyExecutor(case.model)
    except UnsupportedOperatorError as exc:
        return "refused: " + refusal_reason(exc)
    except ModelError as exc:
        raise Mismatch(f"{case.desc}: the executor failed to load a graph onnxruntime runs: {exc}") from exc
    with np.errstate(all="ignore"):
        try:
            got = list(executor.run(case.feeds).values())
        except ModelError as exc:
            raise Mismatch(f"{case.desc}: the executor failed at run time: {exc}") from exc
    rtol, atol = TOLERANCE.get(case.op, (1e-5, 1e-5))
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        g = np.asarray(g)
        if g.dtype != w.dtype or g.shape != w.shape:
            raise Mismatch(f"{case.desc}: output {j} is {g.dtype}{list(g.shape)}, onnxruntime "
                           f"{w.dtype}{list(w.shape)}")
        if w.dtype.kind == "f":
            close = np.isclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
            same_inf = np.isinf(g) == np.isinf(w)
            ok = bool(np.all(close & same_inf))
        else:
            ok = bool(np.array_equal(g, w))
        if not ok:
            raise Mismatch(f"{case.desc}: output {j} differs from onnxruntime\nfeeds={case.feeds}\n"
                           f"got={g!r}\nwant={w!r}")
    return "match (NaN slices: propagated)" if nan_defined else "match"


# --- ONNX's own node tests --------------------------------------------------------------------------------


@dataclass
class NodeTest:
    """One of ONNX's node test cases (`onnx.backend.test.case.node`) for an operator the executor claims."""

    name: str
    model: bytes
    data_sets: list[tuple[dict[str, np.ndarray], list[np.ndarray]]]
    rtol: float
    atol: float


def _array(value: Any) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def onnx_node_tests(claimed: Sequence[str]) -> list[NodeTest]:
    """ONNX's node tests whose graphs use only `claimed` operators, each also with its inputs after the first moved
    into initializers (``<name>/const``: ONNX feeds axes, shapes and scales at run time, policies carry them as
    initializers)."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases  # slow to import; only the node tests need it

    with warnings.catch_warnings():  # ONNX's case generators overflow casts on purpose (saturation tests)
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    tests = []
    for case in cases:
        graph = case.model.graph
        if not graph.node or any(n.op_type not in claimed or n.domain not in ("", "ai.onnx") for n in graph.node):
            continue
        init_names = {t.name for t in graph.initializer}
        inputs = [vi for vi in graph.input if vi.name not in init_names]
        sets = [({vi.name: _array(x) for vi, x in zip(inputs, ins, strict=False)}, [_array(y) for y in outs])
                for ins, outs in case.data_sets]
        tests.append(NodeTest(case.name, case.model.SerializeToString(), sets, case.rtol, case.atol))
        if len(inputs) > 1 and len(sets) == 1:
            model = onnx.ModelProto()
            model.CopyFrom(case.model)
            feeds = sets[0][0]
            moved = [vi.name for vi in inputs[1:]]
            keep = [vi for vi in model.graph.input if vi.name not in moved]
            del model.graph.input[:]
            model.graph.input.extend(keep)
            model.graph.initializer.extend(numpy_helper.from_array(feeds[n], n) for n in moved)
            tests.append(NodeTest(f"{case.name}/const", model.SerializeToString(),
                                  [({k: v for k, v in feeds.items() if k not in moved}, sets[0][1])],
                                  case.rtol, case.atol))
    return tests


def check_node_test(test: NodeTest) -> str:
    """Run one ONNX node test: ``"match"``, ``"refused: <reason>"``, or raise `Mismatch`."""
    try:
        with np.errstate(all="ignore"):
            executor = NumpyExecutor(test.model)
    except UnsupportedOperatorError as exc:
        return "refused: " + refusal_reason(exc)
    except ModelError as exc:
        raise Mismatch(f"{test.name}: the executor failed to load ONNX's node test: {exc}") from exc
    for feeds, expected in test.data_sets:
        with np.errstate(all="ignore"):
            try:
                got = list(executor.run(feeds).values())
            except ModelError as exc:
                raise Mismatch(f"{test.name}: the executor failed at run time: {exc}") from exc
        for j, (g, w) in enumerate(zip(got, expected, strict=True)):
            if g.dtype != w.dtype or g.shape != w.shape:
                raise Mismatch(f"{test.name}: output {j} is {g.dtype}{list(g.shape)}, expected "
                               f"{w.dtype}{list(w.shape)}")
            if w.dtype.kind == "f":
                ok = bool(np.allclose(g, w, rtol=test.rtol, atol=max(test.atol, 1e-6), equal_nan=True))
            else:
                ok = bool(np.array_equal(g, w))
            if not ok:
                raise Mismatch(f"{test.name}: output {j} differs\ngot={g!r}\nwant={w!r}")
    return "match"


# --- small graphs: chains of several operators --------------------------------------------------------------

# No Log or Sin in chains: they are ill-conditioned where chains take them (Log of values within 1e-7 of 1 after
# Tanh, Sin of 1e5 after Exp), so a last-bit difference between onnxruntime's and numpy's Tanh/Exp becomes a
# relative error of 1e-3 there. Single-op cases cover both.
CHAIN_UNARY = ("Tanh", "Relu", "Sigmoid", "Abs", "Neg", "LeakyRelu", "Elu", "HardSigmoid", "Softplus", "Floor",
               "Exp", "Sqrt")
CHAIN_BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")


def make_chain_case(d: Draw) -> Case:
    """A graph of 2-6 operators on one float input: unary ops, binary ops against an initializer (broadcast) or an
    earlier value, Clip, Softmax, MatMul/Gemm with a weight, Reshape round trips; some intermediate values are graph
    outputs too, and a reduction may end it."""
    shp = shape(d, 2, 3)
    x = floats(d, shp)
    nodes: list[Any] = []
    inits: list[Any] = []
    values_ = ["x"]
    outputs: list[str] = []
    ops: list[str] = []

    def const(arr: np.ndarray) -> str:
        name = f"c{len(inits)}"
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    cur, cur_shape = "x", tuple(shp)
    for k in range(d.integer(2, 6)):
        out = f"t{k}"
        kind = d.choice(["unary", "unary", "binary", "binary", "clip", "softmax", "dense", "reshape"])
        if kind == "unary":
            op = d.choice(CHAIN_UNARY)
            nodes.append(helper.make_node(op, [cur], [out]))
        elif kind == "binary":
            op = d.choice(CHAIN_BINARY)
            if d.boolean() and len(values_) > 1 and op != "Pow":
                other = d.choice(values_)
                other_shape = cur_shape if other != "x" else tuple(shp)
                if other_shape != cur_shape:
                    other = const(floats(d, cur_shape[len(cur_shape) - d.integer(0, len(cur_shape)):]))
            else:
                suffix = cur_shape[len(cur_shape) - d.integer(0, len(cur_shape)):]
                # finite constants: inf * a denormal differs (onnxruntime's exp flushes denormals to 0)
                other = const(floats(d, tuple(1 if d.boolean() else s for s in suffix), scale=1.5, specials=False))
            args = [cur, other] if d.boolean() or op == "Pow" else [other, cur]
            nodes.append(helper.make_node(op, args, [out]))
        elif kind == "clip":
            op = "Clip"
            nodes.append(helper.make_node(op, [cur, const(np.array(-1.5, F32)), const(np.array(2.0, F32))], [out]))
        elif kind == "softmax":
            op = "Softmax"
            nodes.append(helper.make_node(op, [cur], [out], axis=-1))
        elif kind == "dense":
            op = d.choice(["MatMul", "Gemm"]) if len(cur_shape) == 2 else "MatMul"
            n_out = d.integer(1, 5)
            w = floats(d, (cur_shape[-1], n_out), specials=False, scale=0.5)
            if op == "Gemm":
                nodes.append(helper.make_node(op, [cur, const(w), const(floats(d, (n_out,), specials=False))], [out]))
            else:
                nodes.append(helper.make_node(op, [cur, const(w)], [out]))
            cur_shape = (*cur_shape[:-1], n_out)
        else:
            op = "Reshape"
            flat = int(np.prod(cur_shape[1:]))
            mid = f"t{k}r"
            nodes.append(helper.make_node(op, [cur, const(np.array([0, flat], I64))], [mid]))
            nodes.append(helper.make_node(op, [mid, const(np.array(cur_shape, I64))], [out]))
        ops.append(op)
        cur = out
        values_.append(out)
        if d.integer(0, 3) == 0:
            outputs.append(out)
    if d.boolean():
        red = d.choice(["ReduceSum", "ReduceMean"])
        nodes.append(helper.make_node(red, [cur, const(np.array([-1], I64))], ["r"], keepdims=d.integer(0, 1)))
        ops.append(red)
        cur = "r"
    if cur not in outputs:
        outputs.append(cur)
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TP.FLOAT, list(shp))],
                              [helper.make_empty_tensor_value_info(n) for n in outputs], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    desc = f"chain {' -> '.join(ops)} on float32{list(shp)} outputs={outputs}"
    return Case("chain", model.SerializeToString(), {"x": x}, desc, Spec([In(x, "run")]))
