"""fp16 and int8 weight storage: rewrite a policy's ONNX model so its weight matrices take fewer bytes.

The rewritten model is still a standard ONNX model that onnxruntime runs unchanged:

- ``"fp16"``: each float32 weight matrix ``W`` becomes a float16 initializer ``W::fp16`` and a
  ``Cast(to=FLOAT)`` node that produces ``W``;
- ``"int8"``: each becomes an int8 initializer ``W::int8`` plus per-output-channel float32 scales and
  a ``DequantizeLinear`` node that produces ``W`` (symmetric, zero point 0; per-tensor below opset 13).

Only initializers of two or more dimensions are rewritten (biases and normalisation statistics stay
float32, as in onnxruntime's dynamic quantisation). `NumpyExecutor` folds the Cast/DequantizeLinear
nodes at load, so weights are dequantized once and inference runs in float32: the saving is bytes on
the wire and on flash, not time. The accuracy cost is measured by `quantization_error`.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import numpy as np

from device._bundle_errors import ModelError
from device._onnx_proto import (
    LEN,
    encode_field,
    encode_fields,
    encode_node,
    encode_tensor,
    iter_fields,
    parse_model,
    parse_tensor,
    parse_value_info,
)

WeightStorage: TypeAlias = Literal["fp32", "fp16", "int8"]
WEIGHT_STORAGES: tuple[str, ...] = ("fp32", "fp16", "int8")


def _channel_axis(name: str, nodes: list[Any], ndim: int) -> int:
    """The output-channel axis of weight `name`: 0 for Gemm with transB=1, else the last axis."""
    for node in nodes:
        if node.op_type == "Gemm" and len(node.inputs) > 1 and node.inputs[1] == name:
            return 0 if int(node.attrs.get("transB", 0)) else 1
        if node.op_type == "MatMul" and len(node.inputs) > 1 and node.inputs[1] == name:
            return ndim - 1
    return 0


def smallest_storage(model: bytes, weights: WeightStorage) -> tuple[bytes, WeightStorage, str | None]:
    """`model` stored as `weights` when that is smaller than fp32, else as fp32; with a note when not as asked.

    Quantised storage adds a Cast or DequantizeLinear node and (int8) per-channel scales per weight matrix, so
    for a micro policy of a few hundred weights it can take more bytes than fp32 (a 1x16 CartPole student:
    int8 1,783 B, fp16 1,549 B, fp32 1,561 B). Asked for int8, fp16 is tried next when int8 is not smaller.

    Returns:
        ``(model bytes, storage used, note)``; the note says what was asked, its size and what was used instead,
        None when the asked storage was used.
    """
    plain = bytes(model)
    if weights == "fp32":
        return plain, "fp32", None
    sizes: dict[str, int] = {"fp32": len(plain)}
    for candidate in (weights, "fp16") if weights == "int8" else (weights,):
        stored = quantize_model(plain, candidate)
        sizes[candidate] = len(stored)
        if len(stored) < len(plain):
            note = None if candidate == weights else (
                f"{weights} weights make the model {sizes[weights]:,} B, not smaller than fp32's {len(plain):,} B; "
                f"stored as {candidate} ({len(stored):,} B) instead")
            return stored, candidate, note
    tried = ", ".join(f"{k} {v:,} B" for k, v in sizes.items() if k != "fp32")
    return plain, "fp32", (f"{weights} weights do not make this model smaller ({tried} vs fp32 {len(plain):,} B); "
                           "stored as fp32")


def quantize_model(model: bytes, weights: WeightStorage) -> bytes:
    """Return `model` with its float32 weight matrices stored as float16 or int8 (see the module docstring).

    Args:
        model: ONNX ModelProto bytes.
        weights: ``"fp16"``, ``"int8"``, or ``"fp32"`` (returns `model` unchanged).

    Raises:
        ModelError: the bytes are not an ONNX model, or int8 is asked of a model older than opset 10.
    """
    if weights not in WEIGHT_STORAGES:
        raise ModelError(f"quantize_model: weights must be one of {list(WEIGHT_STORAGES)}, got {weights!r}")
    if weights == "fp32":
        return bytes(model)
    parsed = parse_model(model)
    opset = parsed.opsets.get("", parsed.opsets.get("ai.onnx", 1))
    if weights == "int8" and opset < 10:
        raise ModelError(f"quantize_model: int8 storage needs DequantizeLinear (opset >= 10), the model is opset "
                         f"{opset}; re-export with opset_version=17")
    nodes = parsed.graph.nodes
    model_fields = list(iter_fields(bytes(model)))
    graph_fields = next(list(iter_fields(v)) for n, w, v in model_fields if n == 7 and w == LEN)

    new_nodes: list[bytes] = []
    new_inits: list[bytes] = []
    kept: list[tuple[int, int, Any]] = []
    quantized: set[str] = set()
    for number, wire, value in graph_fields:
        if number != 5:
            kept.append((number, wire, value))
            continue
        name, arr = parse_tensor(value)
        if arr.dtype != np.float32 or arr.ndim < 2 or arr.size == 0:
            kept.append((number, wire, value))
            continue
        quantized.add(name)
        if weights == "fp16":
            new_inits.append(encode_tensor(f"{name}::fp16", arr.astype(np.float16)))
            new_nodes.append(encode_node("Cast", [f"{name}::fp16"], [name], name=f"{name}::dequantize",
                                         int_attrs={"to": 1}))
            continue
        axis = _channel_axis(name, nodes, arr.ndim) if opset >= 13 else None
        if axis is None:
            scale = np.array(max(float(np.abs(arr).max()), 1e-12) / 127.0, dtype=np.float32)
            q = np.clip(np.rint(arr / scale), -127, 127).astype(np.int8)
            zero = np.array(0, dtype=np.int8)
            attrs: dict[str, int] = {}
        else:
            reduce_axes = tuple(i for i in range(arr.ndim) if i != axis)
            amax = np.maximum(np.abs(arr).max(axis=reduce_axes), 1e-12)
            scale = (amax / 127.0).astype(np.float32)
            shape = [1] * arr.ndim
            shape[axis] = -1
            q = np.clip(np.rint(arr / scale.reshape(shape)), -127, 127).astype(np.int8)
            zero = np.zeros(scale.shape, dtype=np.int8)
            attrs = {"axis": axis}
        new_inits += [encode_tensor(f"{name}::int8", q), encode_tensor(f"{name}::scale", scale),
                      encode_tensor(f"{name}::zero", zero)]
        new_nodes.append(encode_node("DequantizeLinear", [f"{name}::int8", f"{name}::scale", f"{name}::zero"],
                                     [name], name=f"{name}::dequantize", int_attrs=attrs))
    # A quantized initializer that is also listed as a graph input (IR < 4 style) would clash with the
    # node that now produces it: drop it from the inputs.
    kept = [(n, w, v) for n, w, v in kept if not (n == 11 and parse_value_info(v).name in quantized)]
    # The new nodes go first so the graph stays topologically sorted.
    graph = b"".join([encode_field(1, LEN, n) for n in new_nodes] + [encode_fields(kept)]
                     + [encode_field(5, LEN, t) for t in new_inits])
    out = [(n, w, graph if n == 7 else v) for n, w, v in model_fields]
    return encode_fields(out)


def quantization_error(model: bytes, quantized: bytes, obs: np.ndarray, *, output: str = "logits") -> dict[str, float]:
    """Accuracy cost of `quantized` against `model` on a batch of observations, both run by `NumpyExecutor`.

    Returns:
        ``{"max_abs_error": ..., "argmax_agreement": ...}``: the largest absolute difference of `output`
        (``"logits"`` for Discrete policies, ``"action"`` for Box) and the fraction of rows whose argmax agrees.
    """
    from device._executor import NumpyExecutor

    ref = NumpyExecutor(model).run({"obs": obs})[output]
    got = NumpyExecutor(quantized).run({"obs": obs})[output]
    agree = float(np.mean(ref.argmax(-1) == got.argmax(-1))) if ref.ndim >= 2 else 1.0
    return {"max_abs_error": float(np.abs(ref.astype(np.float64) - got).max()), "argmax_agreement": agree}
