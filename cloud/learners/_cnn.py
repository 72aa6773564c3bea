"""Convolutional networks for image observations: the Nature-CNN encoder and PPO's CNN agent (SAC's use it too).

`PixelEncoder` is the network of Mnih et al. (2015) as SB3's ``NatureCNN`` and CleanRL's Atari PPO use it:
Conv 32x8x8/4, Conv 64x4x4/2, Conv 64x3x3/1 (ReLU), Linear to 512 (ReLU). It takes observations as the env makes
them, uint8 frames ``[B, *obs_shape]`` (``[H, W]``, ``[H, W, C]`` or a stack ``[k, H, W, C]``), scales them to
[0, 1] and puts the stacked frames' channels side by side, all inside the graph, so the exported policy reads raw
pixels (as float32 values 0-255) and nothing about scaling travels in the manifest.

`CnnAgent` is PPO's actor-critic on one shared encoder (CleanRL's Atari agent), with `cloud.learners.Agent`'s
interface; `make_agent` picks it or the MLP for an observation space (``PPOConfig.network``). SAC's pixel networks
(`cloud.learners._sac_networks.PixelCritic`, `build_actor`) put the same encoder in front of its MLPs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from device import ConfigError, frame_shape, is_image

FEATURES = 512
"""Width of the encoder's output (the Nature CNN's fully connected layer)."""


def _init(layer: nn.Module, std: float) -> nn.Module:
    assert isinstance(layer, nn.Conv2d | nn.Linear)
    nn.init.orthogonal_(layer.weight, std)
    assert layer.bias is not None
    nn.init.constant_(layer.bias, 0.0)
    return layer


class PixelEncoder(nn.Module):
    """uint8 frames ``[B, *obs_shape]`` -> features ``[B, 512]`` (see the module docstring)."""

    def __init__(self, obs_shape: tuple[int, ...], *, features: int = FEATURES) -> None:
        super().__init__()
        frame = frame_shape(tuple(obs_shape))
        self.obs_shape = tuple(obs_shape)
        self.height, self.width = frame[0], frame[1]
        self.channels = frame[2] if len(frame) == 3 else 1
        self.frames = math.prod(obs_shape) // math.prod(frame)
        gain = math.sqrt(2)
        self.convs = nn.Sequential(
            _init(nn.Conv2d(self.frames * self.channels, 32, 8, stride=4), gain), nn.ReLU(),
            _init(nn.Conv2d(32, 64, 4, stride=2), gain), nn.ReLU(),
            _init(nn.Conv2d(64, 64, 3, stride=1), gain), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = int(self.convs(torch.zeros(1, self.frames * self.channels, self.height, self.width)).shape[1])
        self.fc = _init(nn.Linear(flat, features), gain)
        self.features = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(torch.float32) * (1.0 / 255.0)
        x = x.reshape(-1, self.frames, self.height, self.width, self.channels)
        x = x.permute(0, 1, 4, 2, 3).reshape(-1, self.frames * self.channels, self.height, self.width)
        out: torch.Tensor = torch.relu(self.fc(self.convs(x)))
        return out


class CnnAgent(nn.Module):
    """PPO's actor and critic heads on one `PixelEncoder`, for a Discrete or a Box action (`Agent`'s interface)."""

    def __init__(self, *, obs_shape: tuple[int, ...], action_dim: int, discrete: bool,
                 init_log_std: float = 0.0) -> None:
        super().__init__()
        self.discrete = discrete
        self.sde = False
        self.sde_sample_freq = -1
        self.encoder = PixelEncoder(obs_shape)
        self.actor_head = _init(nn.Linear(self.encoder.features, action_dim), 0.01)
        self.critic_head = _init(nn.Linear(self.encoder.features, 1), 1.0)
        self.actor_logstd = nn.Parameter(torch.full((0,) if discrete else (action_dim,), float(init_log_std)))

    @property
    def actor(self) -> nn.Module:
        """``obs -> logits`` (Discrete) or the Gaussian mean (Box): what the exporter puts in the graph."""
        return nn.Sequential(self.encoder, self.actor_head)

    def reset_noise(self, streams: int) -> None:
        """No state-dependent exploration for CNN policies (refused at configuration)."""

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        """``V(x)``, ``[batch]``."""
        return self.critic_head(self.encoder(x)).squeeze(-1)  # type: ignore[no-any-return]

    def sample_action(self, x: torch.Tensor) -> torch.Tensor:
        """One action per row of `x` (Gumbel-max for Discrete, a Gaussian draw for Box)."""
        out = self.actor_head(self.encoder(x))
        if self.discrete:
            return (out - torch.log(-torch.log(torch.rand_like(out)))).argmax(dim=-1)  # type: ignore[no-any-return]
        return out + self.actor_logstd.exp() * torch.randn_like(out)  # type: ignore[no-any-return]

    def greedy_action(self, x: torch.Tensor) -> torch.Tensor:
        """Argmax of the logits, or the Gaussian mean."""
        out = self.actor_head(self.encoder(x))
        return out.argmax(dim=-1) if self.discrete else out  # type: ignore[no-any-return]

    def evaluate_actions(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log_prob, entropy)`` of `action` at `x`."""
        logprob, entropy, _ = self.evaluate(x, action)
        return logprob, entropy

    def evaluate(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_prob, entropy, value)`` from one pass of the shared encoder (what the PPO update needs)."""
        features = self.encoder(x)
        out = self.actor_head(features)
        value = self.critic_head(features).squeeze(-1)
        if self.discrete:
            log_probs = torch.log_softmax(out, dim=-1)
            logprob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            return logprob, -(log_probs.exp() * log_probs).sum(-1), value
        log_std = self.actor_logstd.expand_as(out)
        var = torch.exp(2.0 * log_std)
        logprob = (-((action - out) ** 2) / (2.0 * var) - log_std - 0.5 * math.log(2.0 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2.0 * math.pi) + log_std).sum(-1)
        return logprob, entropy, value


def uses_cnn(network: str, obs_shape: tuple[int, ...], obs_dtype: Any, *, caller: str = "PPOConfig") -> bool:
    """Whether `network` (``auto``, ``mlp``, ``cnn``) means a CNN for these observations; refuse a mismatch."""
    image = is_image(tuple(obs_shape), obs_dtype)
    if network == "cnn" and not image:
        raise ConfigError(f"{caller}: network 'cnn' needs image observations (uint8, [H, W, C] or a frame stack); "
                          f"this env observes {np.dtype(obs_dtype)}{list(obs_shape)}; use --network auto or mlp")
    if network == "mlp" and image:
        raise ConfigError(f"{caller}: network 'mlp' cannot read image observations {list(obs_shape)}; use "
                          "--network auto or cnn")
    return image


def make_agent(obs_shape: tuple[int, ...], obs_dtype: Any, *, action_dim: int, discrete: bool, config: Any) -> Any:
    """PPO's agent for these observations: `CnnAgent` for images, `cloud.learners.Agent` (MLP) otherwise."""
    from cloud.learners._agent import Agent

    if uses_cnn(getattr(config, "network", "auto"), obs_shape, obs_dtype):
        if config.use_sde:
            raise ConfigError("PPOConfig: --use-sde is not supported with the CNN policy of image observations; "
                              "drop --use-sde")
        return CnnAgent(obs_shape=tuple(obs_shape), action_dim=action_dim, discrete=discrete,
                        init_log_std=config.init_log_std)
    return Agent(obs_dim=int(np.prod(obs_shape)), action_dim=action_dim, discrete=discrete,
                 hidden_sizes=config.hidden_sizes, init_log_std=config.init_log_std, sde=config.use_sde,
                 sde_sample_freq=config.sde_sample_freq, ortho_init=config.ortho_init)
