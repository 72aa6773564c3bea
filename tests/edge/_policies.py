"""Tiny ONNX policies for CartPole built with onnx.helper, signed as bundles with the public device API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from device import Bundle, SigningKey, build_bundle, generate_keypair, load_signing_key

OBS_SPACE = {"type": "Box", "shape": [4], "dtype": "float32",
             "low": [-4.800000190734863, "-inf", -0.41887903213500977, "-inf"],
             "high": [4.800000190734863, "inf", 0.41887903213500977, "inf"]}
ACT_SPACE = {"type": "Discrete", "n": 2}


def cartpole_model(*, weights: np.ndarray | None = None, obs_dim: int = 4, nan: bool = False,
                   pad_bytes: int = 0) -> bytes:
    """A linear policy ``logits = obs @ W``, ``action = argmax``: by default a pole-angle controller (~500 return).

    `nan` makes the logits NaN; `obs_dim` != 4 makes the graph's input shape wrong for CartPole;
    `pad_bytes` adds an unused initializer so the model is large (chunking).
    """
    import onnx
    from onnx import TensorProto, helper

    if weights is None:
        weights = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=np.float32)[:obs_dim]
        if obs_dim > 4:
            weights = np.zeros((obs_dim, 2), np.float32)
    if nan:
        weights = np.full_like(weights, np.nan)
    inits = [helper.make_tensor("W", TensorProto.FLOAT, list(weights.shape), weights.ravel().tolist())]
    nodes = [helper.make_node("MatMul", ["obs", "W"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["action"], axis=1, keepdims=0)]
    if pad_bytes:
        pad = np.random.default_rng(0).integers(0, 255, pad_bytes, dtype=np.uint8)
        inits.append(helper.make_tensor("pad", TensorProto.UINT8, [pad_bytes], pad.tobytes(), raw=True))
    graph = helper.make_graph(
        nodes, "policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def make_keys(tmp: Path) -> tuple[SigningKey, Path]:
    key_path, pub_path = generate_keypair(tmp, name="fleet")
    return load_signing_key(key_path), pub_path


def cartpole_bundle(key: SigningKey | None, version: int, *, model: bytes | None = None, policy: str = "cartpole",
                    **kwargs: Any) -> Bundle:
    args: dict[str, Any] = {"policy": policy, "version": version, "parent_version": version - 1 or None,
                            "observation_space": OBS_SPACE, "action_space": ACT_SPACE, "signing_key": key,
                            "target_tier": "edge", "output_names": ("action", "logits")}
    args.update(kwargs)
    return build_bundle(model if model is not None else cartpole_model(), **args)
