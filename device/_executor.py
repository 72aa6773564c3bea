"""`NumpyExecutor`: runs a policy's ONNX graph with numpy alone, for devices without onnxruntime.

Load pipeline (all the work happens once, in the constructor):

1. parse the ModelProto with strata's own wire-format reader (`device._onnx_proto`); refuse every
   operator the executor does not implement, by name, before anything runs;
2. walk the nodes in graph order, tracking each value's rank and dtype where they are known, and fold
   every node whose inputs are all constants (initializers, ``Constant``, ``Cast``/``DequantizeLinear``
   of quantized weights, shape arithmetic on static shapes) into a constant;
3. emit one straight-line Python function for the remaining nodes, with weights pre-transposed, scales
   pre-applied and per-node attributes resolved, and compile it. Each node's lines are kept as a `_Stmt`
   with the closure names they read (what its builder bound plus its constant inputs), so the plan's
   closure is the union of those sets: the generated text is never parsed back.

NaN and inf follow onnxruntime where its answer is defined (Relu, Max/Min, Clip keep NaN; Clip without
bounds maps +-inf to the float range, as onnxruntime's default bounds do). ArgMax/ArgMin/ReduceMax/
ReduceMin of a slice holding NaN are not defined by onnxruntime (its result depends on where the NaN falls
in its SIMD lanes: ArgMax of arange(8) is 4 with x[4] = NaN and 7 with x[3] = NaN), so here NaN propagates
as in numpy and torch: the reduction is NaN, the arg-reduction the index of the first NaN. Element types
numpy cannot represent exactly (bfloat16, float8, int4, string), Dropout in training mode and blocked
DequantizeLinear are refused at load with the op and the reason.

Why generated code: a policy of a dozen tiny numpy calls spends as much time dispatching between nodes
as computing, and one flat function whose locals are the graph's values removes that dispatch (the
goal is single-observation latency close to onnxruntime's). The generated source contains only
identifiers strata makes up (``v3``, ``k7``) and integers it formats itself; tensor names, attribute
strings and weights never enter it: constants and helpers are bound as closure variables. The source
is kept in ``NumpyExecutor.source`` for inspection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from device._bundle_errors import ModelError, UnsupportedOperatorError
from device._onnx_proto import DTYPE_CODES, DTYPES, MAX_TENSOR_ELEMENTS, Model, Node, parse_model, type_name

Array = np.ndarray
F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)


@dataclass
class _Val:
    """A graph value during planning: its code name, constant value (if folded) and what is known of it."""

    code: str
    const: Array | None = None
    rank: int | None = None
    dtype: np.dtype[Any] | None = None


@dataclass
class _Ctx:
    """What an operator builder sees: the node, its inputs (None for an omitted optional one), the opset."""

    node: Node
    ins: list[_Val | None]
    outs: list[str]
    opset: int
    binder: Callable[[Any], str]
    bound: list[str] = field(default_factory=list)
    """The closure names this node's builder bound: what its generated lines may read besides its inputs."""
    out_rank: list[int | None] = field(default_factory=list)
    out_dtype: list[np.dtype[Any] | None] = field(default_factory=list)
    alias: _Val | None = None
    """Set by a builder whose (single) output is its input unchanged: no code is emitted for it."""

    def attr(self, name: str, default: Any) -> Any:
        return self.node.attrs.get(name, default)

    def bind(self, obj: Any) -> str:
        """Bind `obj` as a closure variable of the generated function; return its code name."""
        name = self.binder(obj)
        self.bound.append(name)
        return name

    def inp(self, i: int) -> _Val:
        v = self.ins[i] if i < len(self.ins) else None
        if v is None:
            raise UnsupportedOperatorError(f"NumpyExecutor: {self.node.op_type} node {self.node.name!r} is missing "
                                           f"its required input {i}")
        return v

    def opt(self, i: int) -> _Val | None:
        return self.ins[i] if i < len(self.ins) else None

    def const_input(self, i: int, what: str) -> Array | None:
        """The constant value of optional input `i`, None when omitted; refuse a runtime-computed one."""
        v = self.opt(i)
        if v is None:
            return None
        if v.const is None:
            raise UnsupportedOperatorError(f"NumpyExecutor: {self.node.op_type} node {self.node.name!r} computes "
                                           f"its {what} at run time; the device executor needs it constant")
        return v.const

    def same(self, v: _Val) -> None:
        self.out_rank = [v.rank]
        self.out_dtype = [v.dtype]

    def refuse(self, what: str) -> UnsupportedOperatorError:
        return UnsupportedOperatorError(f"NumpyExecutor: {self.node.op_type} node {self.node.name!r}: {what} "
                                        "is not supported by the device executor")


#: Operators of convolutional networks: a graph holding one is refused with its size, not only its operator list.
_CONV_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool"})

Builder = Callable[[_Ctx], list[str]]
_OPS: dict[str, Builder] = {}


def _op(*names: str) -> Callable[[Builder], Builder]:
    def register(fn: Builder) -> Builder:
        for name in names:
            _OPS[name] = fn
        return fn
    return register


def supported_operators() -> tuple[str, ...]:
    """The ONNX operators (default domain) the numpy executor implements, sorted."""
    return tuple(sorted(_OPS))


def _norm_axis(axis: int, rank: int | None, ctx: _Ctx) -> int:
    if axis >= 0:
        return axis
    if rank is None:
        raise ctx.refuse(f"negative axis {axis} on an input of unknown rank")
    return axis + rank


def _lift(ctx: _Ctx, v: _Val, rank: int | None) -> str:
    """A constant operand reshaped to `rank` dims (numpy broadcasting at equal shapes is much faster)."""
    if v.const is not None and rank is not None and v.const.ndim < rank:
        return ctx.bind(np.ascontiguousarray(v.const.reshape((1,) * (rank - v.const.ndim) + v.const.shape)))
    return v.code


def _max_rank(vals: Sequence[_Val]) -> int | None:
    ranks = [v.rank for v in vals]
    return None if any(r is None for r in ranks) else max(r for r in ranks if r is not None)


# --- elementwise ---------------------------------------------------------------------------------------

_BINARY = {"Add": "np.add", "Sub": "np.subtract", "Mul": "np.multiply", "Equal": "np.equal",
           "Greater": "np.greater", "Less": "np.less", "GreaterOrEqual": "np.greater_equal",
           "LessOrEqual": "np.less_equal", "And": "np.logical_and", "Or": "np.logical_or", "Xor": "np.logical_xor"}


@_op(*_BINARY)
def _binary(ctx: _Ctx) -> list[str]:
    a, b = ctx.inp(0), ctx.inp(1)
    rank = _max_rank([a, b])
    fn = _BINARY[ctx.node.op_type]
    ctx.out_rank = [rank]
    ctx.out_dtype = [np.dtype(bool) if ctx.node.op_type not in ("Add", "Sub", "Mul") else a.dtype]
    return [f"{ctx.outs[0]} = {fn}({_lift(ctx, a, rank)}, {_lift(ctx, b, rank)})"]


def _div(a: Array, b: Array) -> Array:
    if a.dtype.kind in "iu":  # ONNX integer division truncates toward zero
        quotient: Array = np.trunc(np.true_divide(a, b)).astype(a.dtype)
        return quotient
    out: Array = np.divide(a, b)
    return out


@_op("Div")
def _div_op(ctx: _Ctx) -> list[str]:
    a, b = ctx.inp(0), ctx.inp(1)
    rank = _max_rank([a, b])
    ctx.out_rank, ctx.out_dtype = [rank], [a.dtype]
    fn = "np.divide" if a.dtype is not None and a.dtype.kind == "f" else ctx.bind(_div)
    return [f"{ctx.outs[0]} = {fn}({_lift(ctx, a, rank)}, {_lift(ctx, b, rank)})"]


@_op("Pow")
def _pow(ctx: _Ctx) -> list[str]:
    a, b = ctx.inp(0), ctx.inp(1)
    ctx.same(a)
    power = ctx.bind(lambda x, y: np.power(x, y).astype(x.dtype, copy=False))
    return [f"{ctx.outs[0]} = {power}({a.code}, {b.code})"]


@_op("Max", "Min", "Sum", "Mean")
def _variadic(ctx: _Ctx) -> list[str]:
    vals = [v for v in ctx.ins if v is not None]
    if not vals:
        raise ctx.refuse("no inputs")
    rank = _max_rank(vals)
    ctx.out_rank, ctx.out_dtype = [rank], [vals[0].dtype]
    fn = {"Max": "np.maximum", "Min": "np.minimum", "Sum": "np.add", "Mean": "np.add"}[ctx.node.op_type]
    expr = _lift(ctx, vals[0], rank)
    for v in vals[1:]:
        expr = f"{fn}({expr}, {_lift(ctx, v, rank)})"
    if ctx.node.op_type == "Mean":
        expr = f"np.divide({expr}, {ctx.bind(np.asarray(len(vals), dtype=vals[0].dtype or F32))})"
    elif len(vals) == 1:
        expr = f"{expr}.copy()"
    return [f"{ctx.outs[0]} = {expr}"]


def _sigmoid(x: Array) -> Array:
    # tanh form: no overflow warning for large |x| and within 1e-7 of the logistic function
    t = np.tanh(np.multiply(x, x.dtype.type(0.5)))
    t += 1
    t *= 0.5
    out: Array = t
    return out


def _softplus(x: Array) -> Array:
    out: Array = np.logaddexp(x, x.dtype.type(0))
    return out


_UNARY: dict[str, str | Callable[[Array], Array]] = {
    "Tanh": "np.tanh", "Exp": "np.exp", "Log": "np.log", "Sqrt": "np.sqrt", "Neg": "np.negative",
    "Abs": "np.absolute", "Reciprocal": "np.reciprocal", "Floor": "np.floor", "Ceil": "np.ceil",
    "Round": "np.rint", "Sign": "np.sign", "Not": "np.logical_not", "Sin": "np.sin", "Cos": "np.cos",
    "Sigmoid": _sigmoid, "Softplus": _softplus,
}


@_op(*_UNARY)
def _unary(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    ctx.same(a)
    fn = _UNARY[ctx.node.op_type]
    name = fn if isinstance(fn, str) else ctx.bind(fn)
    return [f"{ctx.outs[0]} = {name}({a.code})"]


@_op("Relu")
def _relu(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    ctx.same(a)
    zero = ctx.bind(np.zeros((), dtype=a.dtype or F32))
    return [f"{ctx.outs[0]} = np.maximum({a.code}, {zero})"]


@_op("LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish")
def _activation(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    ctx.same(a)
    op = ctx.node.op_type
    alpha = float(ctx.attr("alpha", {"LeakyRelu": 0.01, "Elu": 1.0, "Selu": 1.67326319217681884765625,
                                     "HardSigmoid": 0.2, "HardSwish": 1 / 6}[op]))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    beta = float(ctx.attr("beta", 0.5))

    def run(x: Array) -> Array:
        t = x.dtype.type
        out: Array
        if op == "LeakyRelu":
            out = np.where(x >= 0, x, x * t(alpha))
        elif op == "Elu":
            out = np.where(x >= 0, x, t(alpha) * np.expm1(np.minimum(x, t(0))))
        elif op == "Selu":
            out = t(gamma) * np.where(x > 0, x, t(alpha) * np.expm1(np.minimum(x, t(0))))
        elif op == "HardSigmoid":
            out = np.clip(x * t(alpha) + t(beta), t(0), t(1))
        else:  # HardSwish
            out = x * np.clip(x * t(alpha) + t(0.5), t(0), t(1))
        return out

    return [f"{ctx.outs[0]} = {ctx.bind(run)}({a.code})"]


def _clip_ufunc() -> Callable[..., Array]:
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    clip = getattr(getattr(core, "umath", None), "clip", None)
    if isinstance(clip, np.ufunc):
        return clip
    return lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi)  # pragma: no cover - numpy without the ufunc


_CLIP_UFUNC = _clip_ufunc()


def _bounds(dtype: np.dtype[Any]) -> tuple[Any, Any]:
    """Onnxruntime's Clip defaults: the type's lowest and highest finite values (so Clip maps +-inf to them)."""
    info: Any = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    return dtype.type(info.min), dtype.type(info.max)


@_op("Clip")
def _clip(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    ctx.same(a)
    dtype = a.dtype or F32
    if dtype.kind not in "fiu":
        raise ctx.refuse(f"Clip of {dtype}")
    low, high = _bounds(dtype)
    if ctx.opset < 11:
        lo: Any = ctx.node.attrs.get("min")
        hi: Any = ctx.node.attrs.get("max")
    else:
        lo_v, hi_v = ctx.opt(1), ctx.opt(2)
        if (lo_v is not None and lo_v.const is None) or (hi_v is not None and hi_v.const is None):
            lo_c = lo_v.code if lo_v is not None else ctx.bind(low)
            hi_c = hi_v.code if hi_v is not None else ctx.bind(high)
            clip = ctx.bind(lambda x, lo, hi: _CLIP_UFUNC(x, lo, hi).astype(x.dtype, copy=False))
            return [f"{ctx.outs[0]} = {clip}({a.code}, {lo_c}, {hi_c})"]
        lo = None if lo_v is None else lo_v.const.reshape(())  # type: ignore[union-attr]
        hi = None if hi_v is None else hi_v.const.reshape(())  # type: ignore[union-attr]
    lo_s = ctx.bind(low if lo is None else dtype.type(lo))
    hi_s = ctx.bind(high if hi is None else dtype.type(hi))
    # np.clip's Python wrapper costs ~2 us per call; the ufunc it wraps costs ~0.6 us.
    return [f"{ctx.outs[0]} = {ctx.bind(_CLIP_UFUNC)}({a.code}, {lo_s}, {hi_s})"]


# --- linear algebra ------------------------------------------------------------------------------------


def _dot(ctx: _Ctx, x: str, x_rank: int | None, w: Array) -> str:
    """``x @ w`` for a constant 2-D `w`: np.dot, except when the inner dimension is 1.

    There numpy computes an outer product through BLAS with each weight as the scale, and OpenBLAS skips a zero
    scale, so NaN * 0 gave 0 (onnxruntime: NaN). The elementwise product keeps NaN; adding +0 turns its -0 into
    the +0 a sum that starts at 0 gives, as onnxruntime's GEMM does (1 / the result is then +inf there too).
    """
    k = ctx.bind(np.ascontiguousarray(w))
    if w.shape[0] == 1:
        if x_rank is not None and x_rank >= 2:
            return f"np.add(np.multiply({x}, {k}), {ctx.bind(w.dtype.type(0))})"
        return f"np.matmul({x}, {k})"
    return f"np.dot({x}, {k})"


@_op("Gemm")
def _gemm(ctx: _Ctx) -> list[str]:
    a, b, c = ctx.inp(0), ctx.inp(1), ctx.opt(2)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    trans_a, trans_b = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))
    ctx.out_rank, ctx.out_dtype = [2], [a.dtype]
    x = f"{a.code}.T" if trans_a else a.code
    if b.const is not None:
        w = b.const.T if trans_b else b.const
        if alpha != 1.0:
            w = w * w.dtype.type(alpha)
        lines = [f"{ctx.outs[0]} = {_dot(ctx, x, 2, w)}"]
    else:
        w_code = f"{b.code}.T" if trans_b else b.code
        scale = f" * {ctx.bind(np.float32(alpha))}" if alpha != 1.0 else ""
        lines = [f"{ctx.outs[0]} = np.matmul({x}, {w_code}){scale}"]  # not np.dot: see `_dot`
    if c is not None and beta != 0.0:
        if c.const is not None:
            bias = c.const * c.const.dtype.type(beta) if beta != 1.0 else c.const
            bias = bias.reshape((1,) * (2 - bias.ndim) + bias.shape) if bias.ndim < 2 else bias
            lines.append(f"np.add({ctx.outs[0]}, {ctx.bind(np.ascontiguousarray(bias))}, out={ctx.outs[0]})")
        else:
            scaled = f"{c.code} * {ctx.bind(np.float32(beta))}" if beta != 1.0 else c.code
            lines.append(f"{ctx.outs[0]} = {ctx.outs[0]} + {scaled}")
    return lines


@_op("MatMul")
def _matmul(ctx: _Ctx) -> list[str]:
    a, b = ctx.inp(0), ctx.inp(1)
    ctx.out_dtype = [a.dtype]
    ctx.out_rank = [max(a.rank, b.rank) if a.rank is not None and b.rank is not None and min(a.rank, b.rank) >= 2
                    else None]
    if b.const is not None and b.const.ndim == 2 and a.rank is not None and a.rank >= 1:
        # np.dot equals matmul when the right operand is 2-D, and is cheaper to dispatch.
        return [f"{ctx.outs[0]} = {_dot(ctx, a.code, a.rank, b.const)}"]
    return [f"{ctx.outs[0]} = np.matmul({a.code}, {b.code})"]


# --- reductions and normalisations ---------------------------------------------------------------------


def _softmax_fn(log: bool, axis: int, legacy: bool) -> Callable[[Array], Array]:
    def run(x: Array) -> Array:
        shape = x.shape
        if legacy:  # opset < 13: coerce to 2-D at `axis`, normalise each row
            ax = axis + x.ndim if axis < 0 else axis
            x = x.reshape(math.prod(shape[:ax]), -1)
            ax = 1
        else:
            ax = axis
        z = x - x.max(axis=ax, keepdims=True)
        out: Array
        if log:
            out = z - np.log(np.exp(z).sum(axis=ax, keepdims=True))
        else:
            e = np.exp(z)
            out = e / e.sum(axis=ax, keepdims=True)
        return out.reshape(shape)
    return run


@_op("Softmax", "LogSoftmax")
def _softmax(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    ctx.same(a)
    legacy = ctx.opset < 13
    axis = int(ctx.attr("axis", 1 if legacy else -1))
    fn = _softmax_fn(ctx.node.op_type == "LogSoftmax", axis, legacy)
    return [f"{ctx.outs[0]} = {ctx.bind(fn)}({a.code})"]


@_op("ArgMax", "ArgMin")
def _argmax(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    axis = int(ctx.attr("axis", 0))
    keepdims = int(ctx.attr("keepdims", 1))
    last = int(ctx.attr("select_last_index", 0))
    ctx.out_dtype = [I64]
    ctx.out_rank = [None if a.rank is None else a.rank - (0 if keepdims else 1)]
    method = "argmax" if ctx.node.op_type == "ArgMax" else "argmin"
    if last:
        ax = _norm_axis(axis, a.rank, ctx)
        flip = ctx.bind(lambda x: (x.shape[ax] - 1 - np.flip(x, ax).argmax(ax, keepdims=bool(keepdims)))
                        if method == "argmax" else
                        (x.shape[ax] - 1 - np.flip(x, ax).argmin(ax, keepdims=bool(keepdims))))
        return [f"{ctx.outs[0]} = {flip}({a.code}).astype(np.int64, copy=False)"]
    kd = ", keepdims=True" if keepdims else ""
    # ndarray.argmax is ~5x cheaper to call than np.argmax; indices are intp, int64 on 64-bit platforms.
    return [f"{ctx.outs[0]} = {a.code}.{method}({int(axis)}{kd}).astype(np.int64, copy=False)"]


_REDUCE: dict[str, Callable[..., Any]] = {
    "ReduceMax": np.max, "ReduceMin": np.min, "ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceProd": np.prod}


@_op(*_REDUCE)
def _reduce(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    op = ctx.node.op_type
    axes_from_input = ctx.opset >= (13 if op == "ReduceSum" else 18)
    if axes_from_input:
        const = ctx.const_input(1, "axes")
        axes = None if const is None else [int(v) for v in const.ravel()]
    else:
        axes = ctx.node.attrs.get("axes")
    keepdims = bool(int(ctx.attr("keepdims", 1)))
    if not axes:
        if int(ctx.attr("noop_with_empty_axes", 0)):
            ctx.same(a)
            return [f"{ctx.outs[0]} = {a.code}"]
        axes = None
    fn = _REDUCE[op]
    ax: tuple[int, ...] | None = None if axes is None else tuple(int(v) for v in axes)

    def run(x: Array) -> Array:
        if x.size == 0 and op in ("ReduceMax", "ReduceMin"):  # onnxruntime: the type's lowest / highest value
            low, high = _bounds(x.dtype) if x.dtype.kind in "fiu" else (False, True)
            empty = (-np.inf if op == "ReduceMax" else np.inf) if x.dtype.kind == "f" else (
                low if op == "ReduceMax" else high)
            return np.asarray(fn(x, axis=ax, keepdims=keepdims, initial=empty)).astype(x.dtype, copy=False)
        return np.asarray(fn(x, axis=ax, keepdims=keepdims)).astype(x.dtype, copy=False)

    ctx.out_dtype = [a.dtype]
    ctx.out_rank = [a.rank if keepdims else (None if a.rank is None or ax is None else a.rank - len(ax))]
    return [f"{ctx.outs[0]} = {ctx.bind(run)}({a.code})"]


@_op("LayerNormalization")
def _layer_norm(ctx: _Ctx) -> list[str]:
    a, scale, bias = ctx.inp(0), ctx.inp(1), ctx.opt(2)
    axis = int(ctx.attr("axis", -1))
    eps = float(ctx.attr("epsilon", 1e-5))
    if len(ctx.outs) > 1:
        raise ctx.refuse("the mean and inv_std_dev outputs")
    ctx.same(a)

    def run(x: Array, s: Array, b: Array | None) -> Array:
        ax = tuple(range(axis % x.ndim, x.ndim))
        mean = x.mean(axis=ax, keepdims=True)
        d = x - mean
        var = (d * d).mean(axis=ax, keepdims=True)
        y = d / np.sqrt(var + x.dtype.type(eps)) * s
        out: Array = y if b is None else y + b
        return out

    return [f"{ctx.outs[0]} = {ctx.bind(run)}({a.code}, {scale.code}, {bias.code if bias else 'None'})"]


@_op("BatchNormalization")
def _batch_norm(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    if int(ctx.attr("training_mode", 0)) or len(ctx.outs) > 1:
        raise ctx.refuse("training mode")
    params = [ctx.inp(i) for i in range(1, 5)]
    eps = float(ctx.attr("epsilon", 1e-5))
    ctx.same(a)
    if any(p.const is None for p in params):  # parameters computed at run time: normalise per call

        def run(x: Array, s: Array, b: Array, m: Array, v: Array) -> Array:
            shape = (1, -1) + (1,) * (x.ndim - 2)
            t = x.dtype.type
            out: Array = ((x - m.reshape(shape)) / np.sqrt(v.reshape(shape) + t(eps)) * s.reshape(shape)
                          + b.reshape(shape))
            return out

        return [f"{ctx.outs[0]} = {ctx.bind(run)}({a.code}, {', '.join(p.code for p in params)})"]
    s, b, m, v = (p.const for p in params if p.const is not None)
    mul = (s / np.sqrt(v + eps)).astype(s.dtype)
    add = (b - m * mul).astype(s.dtype)
    rank = a.rank or 2
    shape = (1, -1) + (1,) * (rank - 2)
    return [f"{ctx.outs[0]} = {ctx.bind(mul.reshape(shape))} * {a.code} + {ctx.bind(add.reshape(shape))}"]


# --- shapes --------------------------------------------------------------------------------------------


def _reshape_fn(allowzero: bool) -> Callable[[Array, Array], Array]:
    def run(x: Array, shape: Array) -> Array:
        dims = [int(d) for d in shape.ravel()]
        if not allowzero:
            dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        return x.reshape(dims)
    return run


@_op("Reshape")
def _reshape(ctx: _Ctx) -> list[str]:
    a, shape = ctx.inp(0), ctx.inp(1)
    ctx.out_dtype = [a.dtype]
    allowzero = bool(int(ctx.attr("allowzero", 0)))
    if shape.const is not None:
        dims = [int(d) for d in shape.const.ravel()]
        ctx.out_rank = [len(dims)]
        if not allowzero and 0 in dims:
            zeros = [i for i, d in enumerate(dims) if d == 0]
            if zeros == list(range(len(zeros))):  # leading zeros: copy the leading (batch) dims
                lead = " + ".join(f"({a.code}.shape[{i}],)" for i in zeros)
                return [f"{ctx.outs[0]} = {a.code}.reshape({lead} + {tuple(dims[len(zeros):])!r})"]
            return [f"{ctx.outs[0]} = {ctx.bind(_reshape_fn(False))}({a.code}, {shape.code})"]
        return [f"{ctx.outs[0]} = {a.code}.reshape({tuple(dims)!r})"]
    return [f"{ctx.outs[0]} = {ctx.bind(_reshape_fn(allowzero))}({a.code}, {shape.code})"]


@_op("Flatten")
def _flatten(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    axis = int(ctx.attr("axis", 1))
    ctx.out_rank, ctx.out_dtype = [2], [a.dtype]
    if axis == 1 and a.rank == 2:  # already [batch, features]
        ctx.alias = a
        return []
    if axis == 1:
        return [f"{ctx.outs[0]} = {a.code}.reshape({a.code}.shape[0], -1)"]
    fn = ctx.bind(lambda x: x.reshape(math.prod(x.shape[: axis % (x.ndim or 1) if axis < 0 else axis]), -1))
    return [f"{ctx.outs[0]} = {fn}({a.code})"]


@_op("Identity", "Dropout")
def _identity(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    ctx.same(a)
    if ctx.node.op_type == "Dropout" and ctx.opset >= 12:
        training = ctx.opt(2)
        if training is not None and (training.const is None or bool(training.const.reshape(-1)[0])):
            # In training mode Dropout draws a random mask: no two runtimes agree, so nothing to match.
            raise ctx.refuse("training_mode=True (a random mask)" if training.const is not None
                             else "training_mode computed at run time (it may switch on a random mask)")
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:  # Dropout's mask: all kept at inference
        return [f"{ctx.outs[0]} = {a.code}", f"{ctx.outs[1]} = np.ones({a.code}.shape, dtype=bool)"]
    ctx.alias = a
    return []


@_op("Concat")
def _concat(ctx: _Ctx) -> list[str]:
    vals = [v for v in ctx.ins if v is not None]
    axis = int(ctx.attr("axis", 0))
    ctx.out_rank, ctx.out_dtype = [_max_rank(vals)], [vals[0].dtype if vals else None]
    return [f"{ctx.outs[0]} = np.concatenate(({''.join(v.code + ', ' for v in vals)}), axis={axis})"]


@_op("Shape")
def _shape(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    start, end = ctx.node.attrs.get("start", 0), ctx.node.attrs.get("end")
    ctx.out_rank, ctx.out_dtype = [1], [I64]
    sl = f"[{int(start)}:{'' if end is None else int(end)}]"
    return [f"{ctx.outs[0]} = np.array({a.code}.shape{sl}, dtype=np.int64)"]


@_op("Size")
def _size(ctx: _Ctx) -> list[str]:
    ctx.out_rank, ctx.out_dtype = [0], [I64]
    return [f"{ctx.outs[0]} = np.array({ctx.inp(0).code}.size, dtype=np.int64)"]


@_op("Gather")
def _gather(ctx: _Ctx) -> list[str]:
    a, idx = ctx.inp(0), ctx.inp(1)
    axis = int(ctx.attr("axis", 0))
    ctx.out_dtype = [a.dtype]
    ctx.out_rank = [None if a.rank is None or idx.rank is None else a.rank - 1 + idx.rank]
    return [f"{ctx.outs[0]} = np.take({a.code}, {idx.code}, axis={axis})"]


def _axes(ctx: _Ctx, input_from: int) -> list[int] | None:
    if ctx.opset >= input_from:
        const = ctx.const_input(1, "axes")
        return None if const is None else [int(v) for v in const.ravel()]
    axes = ctx.node.attrs.get("axes")
    return None if axes is None else [int(v) for v in axes]


@_op("Unsqueeze")
def _unsqueeze(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    axes = _axes(ctx, 13)
    if not axes:
        raise ctx.refuse("missing axes")
    ctx.out_dtype = [a.dtype]
    ctx.out_rank = [None if a.rank is None else a.rank + len(axes)]
    fn = ctx.bind(lambda x: np.expand_dims(x, tuple(ax % (x.ndim + len(axes)) for ax in axes)))
    return [f"{ctx.outs[0]} = {fn}({a.code})"]


@_op("Squeeze")
def _squeeze(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    axes = _axes(ctx, 13)
    ctx.out_dtype = [a.dtype]
    ctx.out_rank = [None if a.rank is None or axes is None else a.rank - len(axes)]
    ax = None if axes is None else tuple(axes)
    return [f"{ctx.outs[0]} = {ctx.bind(lambda x: np.squeeze(x, axis=ax))}({a.code})"]


@_op("Transpose")
def _transpose(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    perm = ctx.node.attrs.get("perm")
    ctx.same(a)
    axes = "" if perm is None else repr(tuple(int(p) for p in perm))
    return [f"{ctx.outs[0]} = np.transpose({a.code}{', ' + axes if axes else ''})"]


def _onnx_slice(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice's clamping (negative indices count from the end, then clamp to the axis) as a Python slice."""
    if step == 0:
        raise ValueError("Slice step 0")
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


def _slice_fn(ctx: _Ctx) -> Callable[..., Array]:
    if ctx.opset < 10:
        starts, ends = ctx.node.attrs.get("starts", []), ctx.node.attrs.get("ends", [])
        axes_attr = ctx.node.attrs.get("axes")

        def legacy(x: Array) -> Array:
            axes = axes_attr if axes_attr is not None else list(range(len(starts)))
            index = [slice(None)] * x.ndim
            for s, e, ax in zip(starts, ends, axes, strict=False):
                index[ax] = slice(int(s), int(e))
            return x[tuple(index)]
        return legacy

    def run(x: Array, starts: Array, ends: Array, axes: Array | None = None, steps: Array | None = None) -> Array:
        st = [int(v) for v in starts.ravel()]
        en = [int(v) for v in ends.ravel()]
        ax = list(range(len(st))) if axes is None else [int(v) for v in axes.ravel()]
        sp = [1] * len(st) if steps is None else [int(v) for v in steps.ravel()]
        index = [slice(None)] * x.ndim
        for s, e, a, p in zip(st, en, ax, sp, strict=True):
            index[a] = _onnx_slice(s, e, p, x.shape[a])
        return x[tuple(index)]
    return run


@_op("Slice")
def _slice(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    ctx.same(a)
    fn = ctx.bind(_slice_fn(ctx))
    args = ", ".join(v.code if v is not None else "None" for v in ctx.ins)
    return [f"{ctx.outs[0]} = {fn}({args})"]


def _dims(shape: Array) -> list[int]:
    """A shape tensor as a list, refusing shapes no policy needs (a malformed model must not exhaust memory)."""
    dims = [int(d) for d in shape.ravel()]
    if any(d < 0 for d in dims) or math.prod(dims) > MAX_TENSOR_ELEMENTS:
        raise ModelError(f"NumpyExecutor: shape {dims} is negative or exceeds {MAX_TENSOR_ELEMENTS} elements")
    return dims


@_op("Expand")
def _expand(ctx: _Ctx) -> list[str]:
    a, shape = ctx.inp(0), ctx.inp(1)
    ctx.out_dtype = [a.dtype]
    fn = ctx.bind(lambda x, s: x * np.ones(_dims(s), dtype=x.dtype))
    return [f"{ctx.outs[0]} = {fn}({a.code}, {shape.code})"]


@_op("Where")
def _where(ctx: _Ctx) -> list[str]:
    c, a, b = ctx.inp(0), ctx.inp(1), ctx.inp(2)
    ctx.out_dtype, ctx.out_rank = [a.dtype], [_max_rank([c, a, b])]
    return [f"{ctx.outs[0]} = np.where({c.code}, {a.code}, {b.code})"]


@_op("Cast")
def _cast(ctx: _Ctx) -> list[str]:
    a = ctx.inp(0)
    to = DTYPES.get(int(ctx.attr("to", 0)))
    if to is None:
        raise ctx.refuse(f"Cast to element type {type_name(int(ctx.attr('to', 0)))}")
    ctx.out_rank, ctx.out_dtype = [a.rank], [to]
    return [f"{ctx.outs[0]} = {a.code}.astype({ctx.bind(to.newbyteorder('='))})"]


@_op("Constant")
def _constant(ctx: _Ctx) -> list[str]:
    attrs = ctx.node.attrs
    if "value" in attrs and isinstance(attrs["value"], np.ndarray):
        value = attrs["value"]
    elif "value_float" in attrs:
        value = np.array(attrs["value_float"], dtype=np.float32)
    elif "value_floats" in attrs:
        value = np.array(attrs["value_floats"], dtype=np.float32)
    elif "value_int" in attrs:
        value = np.array(attrs["value_int"], dtype=np.int64)
    elif "value_ints" in attrs:
        value = np.array(attrs["value_ints"], dtype=np.int64)
    else:
        raise ctx.refuse(f"attributes {sorted(attrs)}")
    return [f"{ctx.outs[0]} = {ctx.bind(value)}"]


@_op("ConstantOfShape")
def _constant_of_shape(ctx: _Ctx) -> list[str]:
    value = ctx.node.attrs.get("value")
    fill = np.zeros((1,), np.float32) if value is None else value
    fn = ctx.bind(lambda s: np.full(_dims(s), fill.ravel()[0], dtype=fill.dtype))
    ctx.out_dtype = [fill.dtype]
    return [f"{ctx.outs[0]} = {fn}({ctx.inp(0).code})"]


@_op("Range")
def _range(ctx: _Ctx) -> list[str]:
    s, lim, d = ctx.inp(0), ctx.inp(1), ctx.inp(2)
    ctx.out_rank, ctx.out_dtype = [1], [s.dtype]
    def run(a: Array, b: Array, c: Array) -> Array:
        if c == 0 or abs(float(b) - float(a)) / abs(float(c)) > MAX_TENSOR_ELEMENTS:
            raise ModelError(f"NumpyExecutor: Range({a}, {b}, {c}) is empty-stepped or too long")
        out: Array = np.arange(a.item(), b.item(), c.item(), dtype=a.dtype)
        return out

    fn = ctx.bind(run)
    return [f"{ctx.outs[0]} = {fn}({s.code}, {lim.code}, {d.code})"]


@_op("DequantizeLinear")
def _dequantize(ctx: _Ctx) -> list[str]:
    x, scale, zero = ctx.inp(0), ctx.inp(1), ctx.opt(2)
    axis = int(ctx.attr("axis", 1))
    if int(ctx.attr("block_size", 0)):
        raise ctx.refuse(f"blocked quantisation (block_size={ctx.attr('block_size', 0)})")
    out_type = int(ctx.attr("output_dtype", 0))
    if out_type and DTYPES.get(out_type) != scale.dtype:
        raise ctx.refuse(f"output_dtype {type_name(out_type)} other than the scale's type")
    if x.dtype is not None and x.dtype.kind not in "iu":
        raise ctx.refuse(f"quantized input of type {x.dtype}")
    if scale.dtype is not None and scale.dtype.kind != "f":
        raise ctx.refuse(f"scale of type {scale.dtype}")
    ctx.out_rank, ctx.out_dtype = [x.rank], [scale.dtype or F32]

    def run(q: Array, s: Array, z: Array | None) -> Array:
        if s.ndim == 1 and s.size > 1:  # per-axis
            shape = [1] * q.ndim
            shape[axis % q.ndim] = -1
            s = s.reshape(shape)
            z = None if z is None else z.reshape(shape)
        centred = q.astype(np.int32) - (0 if z is None else z.astype(np.int32))
        out: Array = (centred.astype(s.dtype) * s).astype(s.dtype)
        return out

    return [f"{ctx.outs[0]} = {ctx.bind(run)}({x.code}, {scale.code}, {zero.code if zero else 'None'})"]


# --- the executor --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stmt:
    """The generated lines of one node and every closure name they read (known when built, never parsed back)."""

    lines: tuple[str, ...]
    uses: frozenset[str]


def _closure(stmts: list[_Stmt], results: list[_Val]) -> list[str]:
    """The closure names the plan reads, in binding order: its statements' and its constant results'."""
    used = set().union(*(s.uses for s in stmts), (v.code for v in results if v.const is not None))
    return sorted(used, key=lambda name: int(name[1:]))


def _render(params: list[str], stmts: list[_Stmt], results: list[_Val], closure: list[str], act_index: int) -> str:
    """The plan's source: ``_make(np, *closure)`` returning ``_run`` (all outputs) and ``_act`` (one)."""
    body = "".join(f"        {line}\n" for s in stmts for line in s.lines) or "        pass\n"
    outs = [f"{v.code}.copy()" if v.const is not None else v.code for v in results]
    args = ", ".join(params)
    return (f"def _make({', '.join(['np', *closure])}):\n"
            f"    def _run({args}):\n{body}        return ({''.join(o + ', ' for o in outs)})\n"
            f"    def _act({args}):\n{body}        return {outs[act_index]}\n"
            "    return _run, _act\n")


class NumpyExecutor:
    """Run an ONNX policy graph with numpy alone (see the module docstring).

    Args:
        model: ONNX ModelProto bytes, e.g. ``bundle.model``.

    Raises:
        UnsupportedOperatorError: the graph uses an operator (or operator form) this executor lacks,
            named in the message; raised at construction, before anything runs.
        ModelError: the bytes are not an ONNX model the executor can load.
    """

    def __init__(self, model: bytes) -> None:
        parsed = parse_model(model)
        self._check_operators(parsed)
        opset = parsed.opsets.get("", parsed.opsets.get("ai.onnx", 1))
        graph = parsed.graph
        inits = graph.initializers
        inputs = [vi for vi in graph.inputs if vi.name not in inits]
        if not inputs:
            raise UnsupportedOperatorError("NumpyExecutor: the graph has no runtime inputs; a policy reads an "
                                           "observation")
        self.input_names: tuple[str, ...] = tuple(vi.name for vi in inputs)
        """Graph input names, in order."""
        self.output_names: tuple[str, ...] = tuple(vi.name for vi in graph.outputs)
        """Graph output names, in order."""
        for vi in [*inputs, *graph.outputs]:
            if vi.elem_type not in DTYPES and (vi in inputs or vi.elem_type != 0):  # an output may leave it open
                raise UnsupportedOperatorError(
                    f"NumpyExecutor: graph {'input' if vi in inputs else 'output'} {vi.name!r} has element type "
                    f"{type_name(vi.elem_type)}, which numpy cannot compute exactly; the device executor runs "
                    f"{sorted(DTYPE_CODES)}")
        self._input_dtypes = [DTYPES[vi.elem_type].newbyteorder("=") for vi in inputs]
        self._input_tails: list[tuple[int, ...] | None] = [
            tuple(d for d in vi.shape[1:] if isinstance(d, int))
            if vi.shape and all(isinstance(d, int) for d in vi.shape[1:]) else None for vi in inputs]
        self._input_ranks = [None if vi.shape is None else len(vi.shape) for vi in inputs]

        namespace: dict[str, Any] = {}

        def bind(obj: Any) -> str:
            name = f"k{len(namespace)}"
            namespace[name] = obj
            return name

        values: dict[str, _Val] = {}
        for name, arr in inits.items():
            values[name] = _Val(bind(arr), arr, arr.ndim, arr.dtype)
        params = []
        for i, vi in enumerate(inputs):
            params.append(f"i{i}")
            values[vi.name] = _Val(f"i{i}", None, self._input_ranks[i], self._input_dtypes[i])

        stmts: list[_Stmt] = []
        counter = 0
        for node in graph.nodes:
            ins: list[_Val | None] = []
            for name in node.inputs:
                if not name:
                    ins.append(None)
                    continue
                if name not in values:
                    raise ModelError(f"NumpyExecutor: {node.op_type} node {node.name!r} reads {name!r}, "
                                     "which no earlier node produces (graph not topologically sorted?)")
                ins.append(values[name])
            outs = []
            for _ in node.outputs:
                outs.append(f"v{counter}")
                counter += 1
            ctx = _Ctx(node=node, ins=ins, outs=outs, opset=opset, binder=bind)
            try:
                code = _OPS[node.op_type](ctx)
            except (TypeError, ValueError, IndexError, KeyError, AttributeError, ArithmeticError) as exc:
                if isinstance(exc, ModelError):
                    raise
                raise ModelError(f"NumpyExecutor: {node.op_type} node {node.name!r} has attributes or inputs "
                                 f"the device executor cannot use: {type(exc).__name__}: {exc}") from exc
            if ctx.alias is not None:
                values[node.outputs[0]] = ctx.alias
                continue
            # What the node's lines read from the closure: names its builder bound, and constant inputs.
            stmt = _Stmt(tuple(code), frozenset(ctx.bound) | {v.code for v in ins if v is not None and
                                                              v.const is not None})
            foldable = all(v is None or v.const is not None for v in ins)
            if foldable:
                scope = {"np": np, **{name: namespace[name] for name in stmt.uses}}
                try:
                    with np.errstate(all="ignore"):  # constant NaN/inf fold as they would run, silently
                        exec("\n".join(stmt.lines), scope)  # strata-generated code: see the module docstring
                except (ValueError, TypeError, IndexError, ArithmeticError) as exc:
                    raise ModelError(f"NumpyExecutor: {node.op_type} node {node.name!r} fails on its constant "
                                     f"inputs: {exc}") from exc
            for j, (name, code_name) in enumerate(zip(node.outputs, outs, strict=True)):
                if not name:
                    continue
                if foldable:
                    arr = np.asarray(scope[code_name])
                    values[name] = _Val(bind(arr), arr, arr.ndim, arr.dtype)
                else:
                    rank = ctx.out_rank[j] if j < len(ctx.out_rank) else None
                    dtype = ctx.out_dtype[j] if j < len(ctx.out_dtype) else None
                    values[name] = _Val(code_name, None, rank, dtype)
            if not foldable:
                stmts.append(stmt)

        results: list[_Val] = []
        for vi in graph.outputs:
            if vi.name not in values:
                raise ModelError(f"NumpyExecutor: graph output {vi.name!r} is never produced")
            results.append(values[vi.name])
        act_index = self.output_names.index("action") if "action" in self.output_names else 0
        closure = _closure(stmts, results)
        self.source: str = _render(params, stmts, results, closure, act_index)
        """The generated Python source of the plan (for inspection)."""
        plan_scope: dict[str, Any] = {}
        exec(compile(self.source, "<strata NumpyExecutor plan>", "exec"), plan_scope)  # see the module docstring
        self._run, self._act = plan_scope["_make"](np, *(namespace[name] for name in closure))
        self.num_steps: int = sum(len(s.lines) for s in stmts)
        """Lines of generated code per call (after constant folding)."""
        self._single_rank = None if self._input_ranks[0] is None else self._input_ranks[0] - 1

    @classmethod
    def from_bundle(cls, bundle: Any) -> NumpyExecutor:
        """Build from a verified `device.Bundle` (its ``model`` bytes)."""
        return cls(bundle.model)

    @staticmethod
    def _check_operators(model: Model) -> None:
        unsupported = sorted({
            node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            for node in model.graph.nodes
            if node.domain not in ("", "ai.onnx") or node.op_type not in _OPS
        })
        convs = [n for n in model.graph.nodes if n.op_type in _CONV_OPS and n.domain in ("", "ai.onnx")]
        if convs:
            weights = sum(int(a.size) for a in model.graph.initializers.values())
            nbytes = sum(int(a.nbytes) for a in model.graph.initializers.values())
            ops = sorted({n.op_type for n in convs})
            raise UnsupportedOperatorError(
                f"NumpyExecutor: this is a convolutional policy ({len(convs)} {'/'.join(ops)} layers, {weights:,} "
                f"weights, {nbytes / 1e6:.1f} MB), the kind image observations need; the device tier runs small MLP "
                f"policies in numpy and has no {ops[0]} operator. Run it on the edge tier with onnxruntime (strata "
                "export --tier edge)")
        if unsupported:
            raise UnsupportedOperatorError(
                f"NumpyExecutor: unsupported ONNX operator(s) {unsupported}; the device executor implements "
                f"{list(supported_operators())}. Export the policy without them, or run it on the edge with "
                "onnxruntime")
        for domain, version in model.opsets.items():
            if domain in ("", "ai.onnx") and version < 7:
                raise UnsupportedOperatorError(f"NumpyExecutor: opset {version} is older than 7; re-export the "
                                               "policy with opset_version=17")

    def _convert(self, i: int, value: Any) -> Array:
        try:
            return np.asarray(value, dtype=self._input_dtypes[i])
        except (TypeError, ValueError) as exc:
            raise ModelError(f"NumpyExecutor: input {self.input_names[i]!r} must be numeric array-like of "
                             f"{self._input_dtypes[i]}, got {type(value).__name__}: {exc}") from exc

    def _coerce(self, i: int, value: Any) -> Array:
        x = value if type(value) is np.ndarray and value.dtype == self._input_dtypes[i] else self._convert(i, value)
        tail = self._input_tails[i]
        if tail is not None and x.shape[1:] != tail:
            raise ModelError(f"NumpyExecutor.run: input {self.input_names[i]!r} has shape {x.shape}, expected "
                             f"[batch, {', '.join(map(str, tail))}]")
        return x

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Array]:
        """Run the graph on `feeds` (``{input name: array}``); return ``{output name: array}``."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ModelError(f"NumpyExecutor.run: missing inputs {missing}; the graph takes {list(self.input_names)}")
        args = [self._coerce(i, feeds[n]) for i, n in enumerate(self.input_names)]
        try:
            outs = self._run(*args)
        except (ValueError, IndexError, TypeError) as exc:
            raise ModelError(f"NumpyExecutor.run: the graph failed on inputs of shapes "
                             f"{[a.shape for a in args]}: {exc}") from exc
        return dict(zip(self.output_names, outs, strict=True))

    def act(self, obs: Any) -> Array:
        """The ``"action"`` output for a batch ``[batch, *obs_shape]``, or for one observation ``[*obs_shape]``."""
        x = self._coerce_obs(obs)
        try:
            if x.ndim == self._single_rank:
                return self._act(x[None])[0]  # type: ignore[no-any-return]
            return self._act(x)  # type: ignore[no-any-return]
        except (ValueError, IndexError, TypeError) as exc:
            raise ModelError(f"NumpyExecutor.act: the graph failed on an observation of shape {x.shape}: "
                             f"{exc}") from exc

    def _coerce_obs(self, obs: Any) -> Array:
        if len(self.input_names) != 1:
            raise ModelError(f"NumpyExecutor.act: the graph takes {len(self.input_names)} inputs; use run()")
        x = obs if type(obs) is np.ndarray and obs.dtype == self._input_dtypes[0] else self._convert(0, obs)
        tail = self._input_tails[0]
        if tail and x.shape[-len(tail):] != tail:
            raise ModelError(f"NumpyExecutor.act: observation has shape {x.shape}, expected [batch, "
                             f"{', '.join(map(str, tail))}] or [{', '.join(map(str, tail))}]")
        return x
