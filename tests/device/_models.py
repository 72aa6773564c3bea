"""Reference ONNX policies for the device tests, exported by torch as strata's exporter does."""

from __future__ import annotations

import io
import warnings

import numpy as np


def export(module: object, example: object, output_names: list[str]) -> bytes:
    """``torch.onnx.export(..., dynamo=False, opset_version=17)`` with a dynamic batch axis, as bytes."""
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated in torch 2.13; strata's exporter uses it on purpose (one file,
        # 50 ms), see MEASURED.md.
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, buf, dynamo=False, opset_version=17, input_names=["obs"],  # type: ignore[arg-type]
                          output_names=output_names,
                          dynamic_axes={"obs": {0: "batch"}, **{n: {0: "batch"} for n in output_names}})
    return buf.getvalue()


def mlp_policy(*, obs_shape: tuple[int, ...] = (4,), n_actions: int | None = 2, act_dim: int = 1,
               hidden: tuple[int, ...] = (64, 64), activation: str = "tanh", seed: int = 0,
               normalise: bool = True, flatten_with_view: bool = False) -> bytes:
    """A random MLP policy: normalisation + clip, then argmax/logits (Discrete) or tanh-squashed mean (Box)."""
    import torch

    torch.manual_seed(seed)
    obs_dim = int(np.prod(obs_shape))
    act = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "elu": torch.nn.ELU, "silu": torch.nn.SiLU}[activation]
    layers: list[torch.nn.Module] = []
    width = obs_dim
    for h in hidden:
        layers += [torch.nn.Linear(width, h), act()]
        width = h
    out_dim = n_actions if n_actions is not None else act_dim
    layers.append(torch.nn.Linear(width, out_dim))

    class Policy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*layers)
            self.register_buffer("mean", torch.randn(obs_shape))
            self.register_buffer("var", torch.rand(obs_shape) + 0.1)
            self.register_buffer("low", -torch.rand(act_dim) - 0.5)
            self.register_buffer("high", torch.rand(act_dim) + 0.5)

        def forward(self, obs: torch.Tensor) -> object:
            x = obs
            if normalise:
                x = torch.clamp((x - self.mean) / torch.sqrt(self.var + 1e-8), -5.0, 5.0)
            x = x.view(x.shape[0], -1) if flatten_with_view else x.flatten(1)
            out = self.net(x)
            if n_actions is not None:
                return torch.argmax(out, dim=-1), out
            mean = torch.tanh(out)
            scaled = self.low + (mean + 1.0) * 0.5 * (self.high - self.low)
            return torch.clamp(scaled, self.low, self.high)

    names = ["action", "logits"] if n_actions is not None else ["action"]
    return export(Policy().eval(), (torch.zeros(1, *obs_shape),), names)
