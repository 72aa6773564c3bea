"""`export_c`: dependency-free C99 source for a micro policy (static const weights, no malloc, libm only).

Pipeline: parse the bundle's ONNX model with strata's own reader (`device._onnx_proto`); walk the nodes in
graph order, folding every node whose inputs are all constants (``Constant``, and the ``Cast`` /
``DequantizeLinear`` that fp16/int8 weight storage adds) into a constant; emit one C statement block per
remaining node on fixed-size stack arrays (the batch axis is dropped: the C policy decides one observation
per call). Supported: the graphs strata's exporters emit for dense MLPs — Gemm, MatMul, Add/Sub/Mul/Div,
Max/Min, Tanh, Relu, Sigmoid, Clip, ArgMax, Identity, Flatten — and any other operator is refused by name
with `UnsupportedOperatorError`.

The generated API (``strata_policy.h``)::

    int32_t strata_policy_act(const float *obs, float *out);

Discrete policies return the action index and, when `out` is not NULL, write the ``logits`` output
(``STRATA_POLICY_OUT_DIM`` floats). Box policies write the ``action`` output to `out` and return 0.
Constants are written with nine significant digits, which round-trips every float32 exactly.

Non-finite observations are refused: ``strata_policy_act`` returns ``STRATA_POLICY_NONFINITE`` (-1) and leaves
`out` untouched when any observation value is NaN or +-inf. onnxruntime's answer there is not a specification
(its ArgMax of a row holding NaN depends on where the NaN falls in its SIMD lanes, see `device._executor`), so
the C policy cannot follow it; the caller decides what a broken sensor means (strata's Python device refuses
it the same way and holds its last action, see `device._device_run`). Inside the graph NaN follows onnxruntime:
Relu, Max/Min and Clip keep NaN (no ``fmaxf``/``fminf``, which drop it), and Clip without a bound clamps to the
float range as onnxruntime's default bounds do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device._atomic import write_atomic
from device._bundle_errors import ModelError, UnsupportedOperatorError
from device._onnx_proto import DTYPES, parse_model

SUPPORTED_OPS = ("Add", "ArgMax", "Cast", "Clip", "Constant", "DequantizeLinear", "Div", "Flatten", "Gemm",
                 "Identity", "MatMul", "Max", "Min", "Mul", "Relu", "Sigmoid", "Sub", "Tanh")
_BINARY = {"Add": "{a} + {b}", "Sub": "{a} - {b}", "Mul": "{a} * {b}", "Div": "{a} / {b}",
           "Max": "strata_max({a}, {b})", "Min": "strata_min({a}, {b})"}
_NUMPY_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Max": np.maximum,
                 "Min": np.minimum}
_UNARY = {"Tanh": "tanhf({x})", "Relu": "(({x} > 0.0f || {x} != {x}) ? {x} : 0.0f)",
          "Sigmoid": "1.0f / (1.0f + expf(-{x}))"}
# NaN-keeping max/min/clip (onnxruntime's semantics; C's fmaxf/fminf return the other operand for NaN).
_HELPERS = {
    "strata_max": "static float strata_max(float a, float b) { return (a != a || a > b) ? a : b; }",
    "strata_min": "static float strata_min(float a, float b) { return (a != a || a < b) ? a : b; }",
    "strata_clip": "static float strata_clip(float x, float lo, float hi) { return x != x ? x : (x < lo ? lo : "
                   "(x > hi ? hi : x)); }",
}
_HELPER_OF = {"Max": "strata_max", "Min": "strata_min", "Clip": "strata_clip"}
_FLT_MAX = float(np.finfo(np.float32).max)


@dataclass
class _Vec:
    """A runtime value: a C array of `n` floats (or one int32 for an ArgMax result)."""

    code: str
    n: int
    is_int: bool = False


@dataclass(frozen=True)
class CPolicy:
    """Generated C source of one policy."""

    header: str
    source: str
    obs_dim: int
    out_dim: int
    discrete: bool
    num_weights: int
    """Float constants in the source (weights, biases, normalisation statistics)."""


def _float_literal(x: float) -> str:
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    text = format(float(np.float32(x)), ".9g")
    if "e" not in text and "." not in text and "n" not in text:
        text += ".0"
    return text + "f"


def _refuse(op: str, name: str, why: str = "") -> UnsupportedOperatorError:
    detail = f" ({why})" if why else ""
    return UnsupportedOperatorError(
        f"strata device export-c: operator {op!r} (node {name!r}) is not supported{detail}; the C exporter "
        f"handles dense MLP policies built from {', '.join(SUPPORTED_OPS)}")


class _Emitter:
    def __init__(self) -> None:
        self.consts: list[str] = []
        self.body: list[str] = []
        self.count = 0
        self.num_weights = 0
        self.helpers: set[str] = set()
        """The `_HELPERS` the body calls (an unused static function would warn under -Wall)."""

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const_array(self, arr: np.ndarray) -> str:
        arr = np.asarray(arr, dtype=np.float32)
        name = self.name("k")
        self.num_weights += arr.size
        if arr.ndim == 2:
            rows = ",\n    ".join("{" + ", ".join(_float_literal(v) for v in row) + "}" for row in arr.tolist())
            self.consts.append(f"static const float {name}[{arr.shape[0]}][{arr.shape[1]}] = {{\n    {rows}\n}};")
        else:
            flat = ", ".join(_float_literal(v) for v in arr.reshape(-1).tolist())
            self.consts.append(f"static const float {name}[{arr.size}] = {{{flat}}};")
        return name

    def vec(self, n: int) -> _Vec:
        v = _Vec(self.name("v"), n)
        self.body.append(f"    float {v.code}[{n}];")
        return v


def _operand(em: _Emitter, value: np.ndarray | _Vec, n: int, op: str, node: str) -> str:
    """C expression of element ``i`` of `value` broadcast to length `n`."""
    if isinstance(value, _Vec):
        if value.is_int:
            raise _refuse(op, node, "integer operand")
        if value.n == n:
            return f"{value.code}[i]"
        if value.n == 1:
            return f"{value.code}[0]"
        raise _refuse(op, node, f"operands of lengths {value.n} and {n} do not broadcast")
    flat = np.asarray(value, dtype=np.float32)
    if flat.ndim > 2 or (flat.ndim == 2 and flat.shape[0] != 1):
        raise _refuse(op, node, f"constant of shape {list(flat.shape)} is not a per-feature vector")
    flat = flat.reshape(-1)
    if flat.size == 1:
        return _float_literal(float(flat[0]))
    if flat.size != n:
        raise _refuse(op, node, f"constant of {flat.size} elements does not broadcast to {n}")
    return f"{em.const_array(flat)}[i]"


def _dequantize(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, axis: int) -> np.ndarray:
    shape = [1] * q.ndim
    if scale.ndim == 1 and scale.size > 1:  # per-channel along `axis`
        shape[axis] = -1
    zero_point = np.zeros(1, np.float32) if zero is None else zero.astype(np.float32)
    x = q.astype(np.float32) - zero_point.reshape(shape if zero_point.size > 1 else [1] * q.ndim)
    return (x * scale.astype(np.float32).reshape(shape if scale.size > 1 else [1] * q.ndim)).astype(np.float32)


def generate_c(model: bytes, *, discrete: bool | None = None) -> CPolicy:
    """Translate a policy's ONNX model into C99 (see the module docstring).

    Args:
        model: ONNX ModelProto bytes following strata's graph contract (input ``"obs"`` ``[batch, d]``).
        discrete: Whether the policy is Discrete (outputs ``action`` and ``logits``); None infers it from
            the outputs.

    Raises:
        UnsupportedOperatorError: The graph uses an operator (or a shape) outside the supported set.
        ModelError: The model is malformed or does not follow the contract.
    """
    parsed = parse_model(model)
    graph = parsed.graph
    env: dict[str, np.ndarray | _Vec] = dict(graph.initializers)
    inputs = [i for i in graph.inputs if i.name not in graph.initializers]
    if [i.name for i in inputs] != ["obs"] or inputs[0].shape is None or len(inputs[0].shape) != 2 \
            or not isinstance(inputs[0].shape[1], int):
        raise ModelError(f"strata device export-c: the model must have one input 'obs' of shape [batch, d], got "
                         f"{[(i.name, i.shape) for i in inputs]}")
    obs_dim = int(inputs[0].shape[1])
    env["obs"] = _Vec("obs", obs_dim)
    em = _Emitter()
    for node in graph.nodes:
        op, nm = node.op_type, node.name or node.outputs[0]
        if node.domain not in ("", "ai.onnx") or op not in SUPPORTED_OPS:
            raise _refuse(op, nm)
        ins: list[np.ndarray | _Vec | None] = []
        for name in node.inputs:
            if not name:
                ins.append(None)
            elif name in env:
                ins.append(env[name])
            else:
                raise ModelError(f"strata device export-c: node {nm!r} reads {name!r}, which nothing produces")
        out = node.outputs[0]
        runtime = [v for v in ins if isinstance(v, _Vec)]
        if op == "Constant":
            value = node.attrs.get("value", node.attrs.get("value_float", node.attrs.get("value_floats")))
            if value is None:
                raise _refuse(op, nm, "only 'value' / 'value_float(s)' constants")
            env[out] = np.asarray(value)
            continue
        if not runtime:  # constant folding
            consts = [v for v in ins if v is not None]
            if op == "Cast":
                env[out] = np.asarray(consts[0]).astype(DTYPES[int(node.attrs["to"])])
            elif op == "DequantizeLinear":
                zero = ins[2] if len(ins) > 2 else None
                env[out] = _dequantize(np.asarray(consts[0]), np.asarray(ins[1]),
                                       None if zero is None else np.asarray(zero), int(node.attrs.get("axis", 1)))
            elif op == "Identity":
                env[out] = np.asarray(consts[0])
            elif op in _NUMPY_BINARY:
                env[out] = _NUMPY_BINARY[op](np.asarray(consts[0]), np.asarray(consts[1]))
            else:
                raise _refuse(op, nm, "on constant inputs")
            continue
        x = runtime[0]
        if op in ("Identity", "Flatten") or (op == "Cast" and DTYPES.get(int(node.attrs.get("to", 0))) == np.float32
                                            and not x.is_int):
            if op == "Flatten" and int(node.attrs.get("axis", 1)) != 1:
                raise _refuse(op, nm, "only axis=1")
            env[out] = x
            continue
        if op == "Cast":
            raise _refuse(op, nm, "runtime casts other than to float32")
        if x.is_int:
            raise _refuse(op, nm, "integer input")
        if op in ("Gemm", "MatMul"):
            if ins[0] is not x or not isinstance(ins[1], np.ndarray):
                raise _refuse(op, nm, "only activations times a constant weight matrix")
            w = np.asarray(ins[1], dtype=np.float32)
            if w.ndim != 2:
                raise _refuse(op, nm, f"weight of shape {list(w.shape)}")
            if op == "Gemm":
                if int(node.attrs.get("transA", 0)):
                    raise _refuse(op, nm, "transA=1")
                w = w.T if int(node.attrs.get("transB", 0)) else w
                w = w * np.float32(node.attrs.get("alpha", 1.0))
            if w.shape[0] != x.n:
                raise ModelError(f"strata device export-c: node {nm!r} multiplies {x.n} features by a "
                                 f"{list(w.shape)} weight")
            m = int(w.shape[1])
            bias = None
            if op == "Gemm" and len(ins) > 2 and ins[2] is not None:
                if not isinstance(ins[2], np.ndarray):
                    raise _refuse(op, nm, "runtime bias")
                c = (np.asarray(ins[2], dtype=np.float32) * np.float32(node.attrs.get("beta", 1.0))).reshape(-1)
                if c.size not in (1, m):
                    raise _refuse(op, nm, f"bias of {c.size} elements for {m} outputs")
                bias = np.broadcast_to(c, (m,))
            kw = em.const_array(w.T.copy())  # [m][n]: each output's weights contiguous
            v = em.vec(m)
            init = f"{em.const_array(bias)}[j]" if bias is not None else "0.0f"
            em.body += [f"    for (int j = 0; j < {m}; ++j) {{",
                        f"        float acc = {init};",
                        f"        for (int i = 0; i < {x.n}; ++i) acc += {kw}[j][i] * {x.code}[i];",
                        f"        {v.code}[j] = acc;", "    }"]
            env[out] = v
        elif op in _BINARY:
            if len(ins) != 2 or ins[0] is None or ins[1] is None:
                raise _refuse(op, nm, "only two inputs")
            n = max(a.n if isinstance(a, _Vec) else int(np.asarray(a).size) for a in ins)
            if not isinstance(ins[0], _Vec) and not isinstance(ins[1], _Vec):
                raise _refuse(op, nm)
            a, b = (_operand(em, v, n, op, nm) for v in ins)  # type: ignore[arg-type]
            if op in _HELPER_OF:
                em.helpers.add(_HELPER_OF[op])
            v = em.vec(n)
            em.body.append(f"    for (int i = 0; i < {n}; ++i) {v.code}[i] = {_BINARY[op].format(a=a, b=b)};")
            env[out] = v
        elif op in _UNARY:
            v = em.vec(x.n)
            em.body.append(f"    for (int i = 0; i < {x.n}; ++i) {v.code}[i] = "
                           f"{_UNARY[op].format(x=f'{x.code}[i]')};")
            env[out] = v
        elif op == "Clip":
            lo: Any = node.attrs.get("min", -_FLT_MAX)
            hi: Any = node.attrs.get("max", _FLT_MAX)
            for idx, default in ((1, lo), (2, hi)):
                bound = ins[idx] if len(ins) > idx else None
                if isinstance(bound, _Vec):
                    raise _refuse(op, nm, "runtime bounds")
                value = default if bound is None else float(np.asarray(bound).reshape(-1)[0])
                lo, hi = (value, hi) if idx == 1 else (lo, value)
            v = em.vec(x.n)
            em.helpers.add("strata_clip")
            em.body.append(f"    for (int i = 0; i < {x.n}; ++i) {v.code}[i] = strata_clip({x.code}[i], "
                           f"{_float_literal(lo)}, {_float_literal(hi)});")
            env[out] = v
        elif op == "ArgMax":
            if int(node.attrs.get("axis", 0)) not in (1, -1) or int(node.attrs.get("select_last_index", 0)):
                raise _refuse(op, nm, "only axis=1 (or -1) without select_last_index")
            v = _Vec(em.name("a"), 1, is_int=True)
            em.body += [f"    int32_t {v.code} = 0;",
                        f"    for (int i = 1; i < {x.n}; ++i) if ({x.code}[i] > {x.code}[{v.code}]) {v.code} = i;"]
            env[out] = v
        else:  # pragma: no cover - every supported op is handled above
            raise _refuse(op, nm)
    outs = {o.name: env.get(o.name) for o in graph.outputs}
    if discrete is None:
        discrete = "logits" in outs
    action = outs.get("action")
    if not isinstance(action, _Vec):
        raise ModelError("strata device export-c: the graph has no runtime output 'action'")
    if discrete:
        logits = outs.get("logits")
        if not action.is_int or not isinstance(logits, _Vec):
            raise ModelError("strata device export-c: a Discrete policy needs an integer 'action' (ArgMax) and "
                             "an output 'logits'")
        out_vec, ret = logits, action.code
    else:
        if action.is_int:
            raise ModelError("strata device export-c: a Box policy's 'action' must be float")
        out_vec, ret = action, "0"
    body = "\n".join(em.body)
    copy = f"    if (out) for (int i = 0; i < {out_vec.n}; ++i) out[i] = {out_vec.code}[i];"
    header = (
        "/* Generated by `strata device export-c`: a micro policy in dependency-free C99. */\n"
        "#ifndef STRATA_POLICY_H\n#define STRATA_POLICY_H\n\n#include <stdint.h>\n\n"
        f"#define STRATA_POLICY_OBS_DIM {obs_dim}\n"
        f"#define STRATA_POLICY_OUT_DIM {out_vec.n}\n"
        f"#define STRATA_POLICY_DISCRETE {1 if discrete else 0}\n"
        "#define STRATA_POLICY_NONFINITE (-1)\n\n"
        "/* Decide one observation (STRATA_POLICY_OBS_DIM floats, raw: normalisation is inside).\n"
        " * Discrete: returns the action index; writes the logits to `out` unless it is NULL.\n"
        " * Box: writes the clipped action (STRATA_POLICY_OUT_DIM floats) to `out`; returns 0.\n"
        " * A NaN or infinite observation value is refused: returns STRATA_POLICY_NONFINITE, `out` untouched.\n"
        " * No allocation, no global state: safe to call from any context. */\n"
        "int32_t strata_policy_act(const float *obs, float *out);\n\n#endif\n")
    source = (
        "/* Generated by `strata device export-c` from a strata policy bundle. Do not edit. */\n"
        "#include <math.h>\n#include <stdint.h>\n\n#include \"strata_policy.h\"\n\n"
        + "\n".join(em.consts) + "\n\n" + "".join(_HELPERS[h] + "\n" for h in sorted(em.helpers))
        + "\nint32_t strata_policy_act(const float *obs, float *out) {\n"
        + f"    for (int i = 0; i < {obs_dim}; ++i) if (!isfinite(obs[i])) return STRATA_POLICY_NONFINITE;\n"
        + body + "\n" + copy + f"\n    return {ret};\n}}\n")
    return CPolicy(header=header, source=source, obs_dim=obs_dim, out_dim=out_vec.n, discrete=discrete,
                   num_weights=em.num_weights)


HARNESS = r"""/* Test and timing harness for strata_policy.c (not needed on the device).
 * Reads observations (STRATA_POLICY_OBS_DIM floats each, "nan" and "inf" allowed) from stdin and prints, per
 * observation, the returned action and the STRATA_POLICY_OUT_DIM floats of `out`, or "-1 refused" for an
 * observation the policy refuses (non-finite). Input that is not a number, or ends inside an observation, is an
 * error: a message on stderr and exit status 2. With `--bench N` it instead times N calls on the first
 * observation and prints the mean nanoseconds per call. */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "strata_policy.h"

int main(int argc, char **argv) {
    float obs[STRATA_POLICY_OBS_DIM], out[STRATA_POLICY_OUT_DIM];
    long bench = (argc == 3 && strcmp(argv[1], "--bench") == 0) ? atol(argv[2]) : 0;
    for (long row = 0;; ++row) {
        for (int i = 0; i < STRATA_POLICY_OBS_DIM; ++i) {
            int got = scanf("%f", &obs[i]);
            if (got == EOF && i == 0 && row > 0) return 0;
            if (got != 1) {
                fprintf(stderr, "strata_policy_main: observation %ld, value %d: %s; expected %d numbers per "
                        "observation\n", row + 1, i + 1, got == EOF ? "input ended" : "not a number",
                        STRATA_POLICY_OBS_DIM);
                return 2;
            }
        }
        if (bench > 0) {
            struct timespec t0, t1;
            volatile int32_t sink = 0;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (long k = 0; k < bench; ++k) {
                obs[0] += 1e-7f;
                sink += strata_policy_act(obs, out);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
            printf("%.3f %d\n", ns / (double)bench, (int)sink);
            return 0;
        }
        int32_t a = strata_policy_act(obs, out);
        if (a == STRATA_POLICY_NONFINITE) {
            printf("-1 refused\n");
            continue;
        }
        printf("%d", (int)a);
        for (int i = 0; i < STRATA_POLICY_OUT_DIM; ++i) printf(" %.9g", out[i]);
        printf("\n");
    }
}
"""


def _write_atomic(path: Path, text: str) -> None:
    write_atomic(path, text, durable=False)


def export_c(model: bytes, out_dir: Path, *, discrete: bool | None = None) -> tuple[CPolicy, list[Path]]:
    """Write ``strata_policy.h``, ``strata_policy.c`` and the test harness ``strata_policy_main.c`` to `out_dir`.

    Returns:
        The generated policy and the paths written.
    """
    policy = generate_c(model, discrete=discrete)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "strata_policy.h", out_dir / "strata_policy.c", out_dir / "strata_policy_main.c"]
    for path, text in zip(paths, (policy.header, policy.source, HARNESS), strict=True):
        _write_atomic(path, text)
    return policy, paths
