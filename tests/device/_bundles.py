"""Shared helpers for the device tests: keys and small bundles built with the public API."""

from __future__ import annotations

from typing import Any

from device import Bundle, SigningKey, build_bundle

OBS_SPACE = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf", -1.0, "-inf", -2.5],
             "high": ["inf", 1.0, "inf", 2.5]}
ACT_SPACE = {"type": "Discrete", "n": 2}
NOW = 1_790_000_000.0


def make_bundle(key: SigningKey | None, *, model: bytes = b"\x08\x07fake-onnx-model", version: int = 1,
                **kwargs: Any) -> Bundle:
    args: dict[str, Any] = {
        "policy": "cartpole", "version": version, "parent_version": version - 1 or None,
        "observation_space": OBS_SPACE, "action_space": ACT_SPACE,
        "preprocessing": {"obs_norm": {"in_graph": True, "clip": 10.0}},
        "signing_key": key, "output_names": ("action", "logits"), "clock": lambda: NOW,
    }
    args.update(kwargs)
    return build_bundle(model, **args)
