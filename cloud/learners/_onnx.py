"""Policy networks to verified ONNX: the graph the exporter traces, the export and its check against torch.

`build_policy_graph` wraps a PPO actor in `PolicyGraph`, which puts observation normalisation
(``clip((obs - mean) * inv_std)``) and action post-processing (argmax for Discrete, the mean clipped to the bounds
for Box) inside the graph (SAC's deterministic actor has its own, `cloud.learners._sac`); `export_onnx` writes it
with fixed names (input ``"obs"``, outputs ``"action"`` and, for Discrete, ``"logits"``) and a dynamic batch axis;
`verify_onnx` checks it with ``onnx.checker`` and against torch in onnxruntime at batch sizes 1 and 3. Signing
and bundles are the run's business (`cloud.runs._export`).
"""

from __future__ import annotations

import io
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from cloud._errors import CloudError
from device import require, space_bounds

if TYPE_CHECKING:
    import torch

    from cloud.learners._agent import Agent

OPSET = 17
"""ONNX opset of exported policies; every op in them (Gemm, Tanh, Sub, Mul, Clip, Max, Min, ArgMax) has it."""

TOLERANCE = 1e-5
"""Largest absolute difference allowed between torch and onnxruntime outputs."""


class ExportError(CloudError):
    """An exported graph failed its checks (onnx.checker, or torch and onnxruntime disagree)."""


def build_policy_graph(agent: Agent, *, normalizer_state: dict[str, Any], action_space: dict[str, Any]) -> Any:
    """Return the `torch.nn.Module` that the exporter traces: raw observations in, final actions out."""
    import torch
    from torch import nn

    class PolicyGraph(nn.Module):
        """``obs -> (action[, logits])``: normalisation, actor, deterministic post-processing."""

        obs_mean: torch.Tensor
        obs_inv_std: torch.Tensor
        action_low: torch.Tensor
        action_high: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.actor = agent.actor
            self.discrete = action_space["type"] == "Discrete"
            self.normalize = bool(normalizer_state["enabled"])
            self.obs_clip = float(normalizer_state["clip"])
            mean = normalizer_state["mean"].numpy()
            inv_std = 1.0 / np.sqrt(normalizer_state["var"].numpy() + float(normalizer_state["epsilon"]))
            # float32 constants computed exactly as cloud.learners._agent.ObsNormalizer does at training time.
            self.register_buffer("obs_mean", torch.from_numpy(mean.astype(np.float32)))
            self.register_buffer("obs_inv_std", torch.from_numpy(inv_std.astype(np.float32)))
            if not self.discrete:
                low, high = space_bounds(action_space)
                self.register_buffer("action_low", torch.from_numpy(low.astype(np.float32)))
                self.register_buffer("action_high", torch.from_numpy(high.astype(np.float32)))

        def forward(self, obs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            x = obs
            if self.normalize:
                x = torch.clamp((x - self.obs_mean) * self.obs_inv_std, -self.obs_clip, self.obs_clip)
            out: torch.Tensor = self.actor(x)
            if self.discrete:
                return out.argmax(dim=-1), out
            # Per-dimension bounds: maximum/minimum export as ONNX Max/Min (Clip needs scalar bounds).
            return torch.minimum(torch.maximum(out, self.action_low), self.action_high)

    return PolicyGraph().eval()


def output_names(action_space: dict[str, Any]) -> tuple[str, ...]:
    """The graph's output names for an action space: ``("action", "logits")`` or ``("action",)``."""
    return ("action", "logits") if action_space["type"] == "Discrete" else ("action",)


def export_onnx(graph: Any, *, obs_shape: tuple[int, ...], action_space: dict[str, Any]) -> bytes:
    """Export `graph` (from `build_policy_graph`) to ONNX ModelProto bytes with a dynamic batch axis."""
    import torch

    names = output_names(action_space)
    buffer = io.BytesIO()
    # The TorchScript exporter (dynamo=False) is the path pinned for torch 2.13: it needs nothing
    # beyond torch, takes ~0.05 s and writes one self-contained opset-17 file. The default dynamo
    # exporter needs onnxscript, takes ~2.4 s and writes external data files (MEASURED.md).
    # torch 2.13 marks the TorchScript path deprecated; we silence exactly those warnings here
    # (pytest turns warnings into errors) and will move when the dynamo path fits the contract.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning,
                                message=r".*(legacy TorchScript-based ONNX export|feature will be removed).*")
        torch.onnx.export(
            # The TorchScript exporter writes to file objects too; its annotation names only paths.
            graph, (torch.zeros((1, *obs_shape), dtype=torch.float32),), buffer,  # type: ignore[arg-type]
            dynamo=False, opset_version=OPSET, input_names=["obs"], output_names=list(names),
            dynamic_axes={name: {0: "batch"} for name in ("obs", *names)},
        )
    return buffer.getvalue()


def verify_onnx(model: bytes, graph: Any, *, obs_space: dict[str, Any], action_space: dict[str, Any],
                batch_sizes: tuple[int, ...] = (1, 3), seed: int = 0) -> dict[str, float]:
    """Check `model` with ``onnx.checker`` and against `graph` in onnxruntime; return the largest differences.

    Raises:
        ExportError: The checker refuses the model, names differ from the contract, or an output
            differs from torch by more than `TOLERANCE` (a discrete action must match exactly).
    """
    import torch

    onnx = require("onnx", extra="cloud", purpose="checking exported policies")
    ort = require("onnxruntime", extra="cloud", purpose="checking exported policies")
    try:
        onnx.checker.check_model(onnx.load_from_string(model))
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"verify_onnx: onnx.checker refused the exported policy: {exc}") from exc
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = output_names(action_space)
    got_in = [i.name for i in session.get_inputs()]
    got_out = [o.name for o in session.get_outputs()]
    if got_in != ["obs"] or got_out != list(names):
        raise ExportError(f"verify_onnx: graph has inputs {got_in} and outputs {got_out}; "
                          f"the policy contract needs ['obs'] and {list(names)}")
    rng = np.random.default_rng(seed)
    low, high = space_bounds(obs_space)
    shape = tuple(obs_space["shape"])
    worst: dict[str, float] = dict.fromkeys(names, 0.0)
    for batch in batch_sizes:
        # Observations on the scale the env produces, inside its bounds where they are finite (pixels: 0-255).
        if obs_space.get("dtype") == "uint8":
            obs = rng.integers(0, 256, size=(batch, *shape)).astype(np.float32)
        else:
            obs = np.clip(rng.normal(size=(batch, *shape)) * 2.0, low, high).astype(np.float32)
        with torch.no_grad():
            expected = graph(torch.from_numpy(obs))
        expected_list = [t.numpy() for t in expected] if isinstance(expected, tuple) else [expected.numpy()]
        got = session.run(list(names), {"obs": obs})
        for name, want, have in zip(names, expected_list, got, strict=True):
            if want.shape != have.shape:
                raise ExportError(f"verify_onnx: output {name!r} at batch {batch} has shape {have.shape} in "
                                  f"onnxruntime but {want.shape} in torch")
            diff = float(np.max(np.abs(want.astype(np.float64) - have.astype(np.float64)))) if want.size else 0.0
            worst[name] = max(worst[name], diff)
            limit = 0.0 if np.issubdtype(want.dtype, np.integer) else TOLERANCE
            if diff > limit:
                raise ExportError(f"verify_onnx: output {name!r} at batch {batch} differs from torch by {diff:.3g} "
                                  f"(allowed {limit}); the exported graph does not compute the policy")
    return worst
