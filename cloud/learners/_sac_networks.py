"""SAC's networks: the twin soft Q critics and the tanh-squashed Gaussian actor (with or without gSDE).

Imports torch at the top: `cloud.learners._sac` imports this module only inside the functions that build
networks, so the CLI can show `SACConfig` without torch.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import nn

LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0
SDE_CLIP_MEAN = 2.0
"""With gSDE the pre-squash mean is clipped to +-this (SB3's ``clip_mean``): tanh(2) is 0.96 of the bound."""
SDE_VARIANCE_EPS = 1e-6
"""Added to gSDE's per-action variance (SB3's epsilon), so features of zero still give a finite log-prob."""


def squashed_log_prob(normal_log_prob: torch.Tensor, x_t: torch.Tensor, action_scale: torch.Tensor) -> torch.Tensor:
    """Log-density of ``a = tanh(x) * scale + bias`` given the Gaussian's per-dimension ``log N(x)``: ``[B]``.

    The change of variables subtracts ``log(scale * (1 - tanh(x)^2))`` per dimension (with CleanRL's
    ``1e-6`` inside the log for stability).
    """
    import torch

    y_t = torch.tanh(x_t)
    return (normal_log_prob - torch.log(action_scale * (1 - y_t.pow(2)) + 1e-6)).sum(dim=-1)


class TwinQ(nn.Module):
    """Both Q networks as one stack of batched layers: one ``baddbmm`` per layer runs Q1 and Q2 together."""

    def __init__(self, *, obs_dim: int, act_dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        sizes = [obs_dim + act_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in itertools.pairwise(sizes):
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default initialisation, per head
            self.weights.append(nn.Parameter(torch.empty(2, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(2, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=-1).unsqueeze(0).expand(2, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = torch.relu(x)
        return x.squeeze(-1)  # [2, B]

class Actor(nn.Module):
    """Tanh-squashed Gaussian policy; the action bounds are buffers so export needs no extra state.

    Without gSDE the log-std is a network head (CleanRL's bounded tanh parameterisation); with it
    (`sde`), a learned ``[features, actions]`` matrix: the pre-squash noise is the last hidden
    features times ``exp(log_std) * eps`` for a standard-normal matrix ``eps`` the caller holds (SB3's
    StateDependentNoiseDistribution with ``full_std``), and the mean is clipped to +-`SDE_CLIP_MEAN`.
    """

    action_scale: torch.Tensor
    action_bias: torch.Tensor

    def __init__(self, *, obs_dim: int, act_dim: int, hidden: tuple[int, ...], low: np.ndarray, high: np.ndarray,
                 sde: bool = False, sde_log_std_init: float = -3.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        fan_in = obs_dim
        for width in hidden:
            layers += [nn.Linear(fan_in, width), nn.ReLU()]
            fan_in = width
        self.trunk = nn.Sequential(*layers)
        self.fc_mean = nn.Linear(fan_in, act_dim)
        self.sde = sde
        if sde:
            self.sde_log_std = nn.Parameter(torch.full((fan_in, act_dim), float(sde_log_std_init)))
        else:
            self.fc_logstd = nn.Linear(fan_in, act_dim)
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))

    def sde_noise_shape(self) -> tuple[int, int]:
        """Shape of the standard-normal matrix `get_action` takes as `sde_eps`."""
        return tuple(self.sde_log_std.shape)  # type: ignore[return-value]

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The pre-squash mean (what the deterministic policy squashes)."""
        mean: torch.Tensor = self.fc_mean(self.trunk(obs))
        return mean.clamp(-SDE_CLIP_MEAN, SDE_CLIP_MEAN) if self.sde else mean

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(obs)
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        return mean, log_std

    def get_action(self, obs: torch.Tensor, sde_eps: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(action, log_prob, deterministic action)`` with the reparameterisation trick.

        With gSDE, `sde_eps` is the standard-normal exploration matrix shared by the whole batch (None
        draws one); gradients reach the log-std matrix through both the noise and the variance.
        """
        if self.sde:
            features = self.trunk(obs)
            mean = self.fc_mean(features).clamp(-SDE_CLIP_MEAN, SDE_CLIP_MEAN)
            std = self.sde_log_std.exp()
            eps = torch.randn_like(std) if sde_eps is None else sde_eps
            # The noise trains the features too, as SB3's SAC runs gSDE (``learn_features=True``; its PPO
            # detaches them): the entropy term can widen exploration through the features, not only log_std.
            x_t = mean + features @ (std * eps)
            variance = features.pow(2) @ std.pow(2) + SDE_VARIANCE_EPS
            normal_log_prob = -0.5 * (x_t - mean) ** 2 / variance - 0.5 * variance.log() \
                - 0.5 * math.log(2 * math.pi)
        else:
            mean, log_std = self(obs)
            std = log_std.exp()
            x_t = mean + std * torch.randn_like(mean)
            # log N(x_t; mean, std) written out: cheaper than building a Normal distribution per step.
            normal_log_prob = -0.5 * ((x_t - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
        log_prob = squashed_log_prob(normal_log_prob, x_t, self.action_scale)
        action = torch.tanh(x_t) * self.action_scale + self.action_bias
        return action, log_prob, torch.tanh(mean) * self.action_scale + self.action_bias

class DeterministicPolicy(nn.Module):
    """What is exported: ``obs -> tanh(mean) * scale + bias`` (no observation normalisation is used)."""

    def __init__(self, actor: Actor) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.actor.mean_action(obs)) * self.actor.action_scale + self.actor.action_bias


class PixelCritic(nn.Module):
    """The twin Q networks on one Nature-CNN encoder (both heads read the same features; `TwinQ` on top)."""

    def __init__(self, *, obs_shape: tuple[int, ...], act_dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        from cloud.learners._cnn import PixelEncoder

        self.encoder = PixelEncoder(obs_shape)
        self.q = TwinQ(obs_dim=self.encoder.features, act_dim=act_dim, hidden=hidden)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.q(self.encoder(obs), action)  # type: ignore[no-any-return]


def build_actor(obs_dim: int, act_dim: int, hidden: tuple[int, ...], low: np.ndarray, high: np.ndarray, *,
                sde: bool = False, sde_log_std_init: float = -3.0,
                image_shape: tuple[int, ...] | None = None) -> Actor:
    """The actor; for image observations (`image_shape`) its trunk starts with a Nature-CNN encoder of its own."""
    if image_shape is None:
        return Actor(obs_dim=obs_dim, act_dim=act_dim, hidden=hidden, low=low, high=high, sde=sde,
                     sde_log_std_init=sde_log_std_init)
    from cloud.learners._cnn import PixelEncoder

    encoder = PixelEncoder(image_shape)
    actor = Actor(obs_dim=encoder.features, act_dim=act_dim, hidden=hidden, low=low, high=high, sde=sde,
                  sde_log_std_init=sde_log_std_init)
    actor.trunk = nn.Sequential(encoder, *actor.trunk)
    return actor


def build_networks(obs_dim: int, act_dim: int, hidden: tuple[int, ...], low: np.ndarray, high: np.ndarray, *,
                   sde: bool = False, sde_log_std_init: float = -3.0, image_shape: tuple[int, ...] | None = None
                   ) -> tuple[Actor, nn.Module, nn.Module]:
    """A fresh actor, critic and target critic (the target starts as a copy of the critic).

    For image observations (`image_shape`) the actor and the critic each have a Nature-CNN encoder (SB3's SAC
    default: no shared features extractor); the twin Q heads share the critic's.
    """
    actor = build_actor(obs_dim, act_dim, hidden, low, high, sde=sde, sde_log_std_init=sde_log_std_init,
                        image_shape=image_shape)
    qf: nn.Module
    qf_target: nn.Module
    if image_shape is None:
        qf = TwinQ(obs_dim=obs_dim, act_dim=act_dim, hidden=hidden)
        qf_target = TwinQ(obs_dim=obs_dim, act_dim=act_dim, hidden=hidden)
    else:
        qf = PixelCritic(obs_shape=image_shape, act_dim=act_dim, hidden=hidden)
        qf_target = PixelCritic(obs_shape=image_shape, act_dim=act_dim, hidden=hidden)
    qf_target.load_state_dict(qf.state_dict())
    return actor, qf, qf_target
