"""PPO's networks and observation normaliser: a separate actor and critic MLP, as in CleanRL.

The actor outputs Categorical logits for a Discrete action space, or the mean of a diagonal
Gaussian for a Box action space: with a learned, state-independent log standard deviation, or with gSDE
(``PPOConfig.use_sde``) noise that is the actor's last hidden features times a matrix held between draws.
`ObsNormalizer` keeps running mean and variance of raw observations; the learner freezes it
during a rollout, so policy version ``v`` is the pair (network weights, normaliser statistics) and
the exported graph computes exactly what acted. `RewardScaler` (``PPOConfig.normalize_reward``) scales the
rewards the update sees by the running std of the discounted return; it never reaches the exported graph.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from device import ConfigError

if TYPE_CHECKING:
    from cloud.learners._ppo_config import PPOConfig
    from device import RolloutBatch


def _layer(in_features: int, out_features: int, *, std: float | None) -> nn.Linear:
    """A linear layer: orthogonal weights of gain `std`, zero bias (PPO detail #2); torch's default if `std` is None."""
    layer = nn.Linear(in_features, out_features)
    if std is not None:
        nn.init.orthogonal_(layer.weight, std)
        nn.init.constant_(layer.bias, 0.0)
    return layer


def _mlp(in_features: int, hidden_sizes: Sequence[int], out_features: int, *, out_std: float,
         ortho: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = in_features
    for hidden in hidden_sizes:
        layers += [_layer(width, hidden, std=math.sqrt(2) if ortho else None), nn.Tanh()]
        width = hidden
    layers.append(_layer(width, out_features, std=out_std if ortho else None))
    return nn.Sequential(*layers)


def _tanh_mlp(linears: Sequence[nn.Linear], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What `_mlp`'s Sequential computes, as ``(last hidden features, output)``."""
    *hidden, head = linears
    for layer in hidden:
        x = torch.tanh(F.linear(x, layer.weight, layer.bias))
    return x, F.linear(x, head.weight, head.bias)


class Agent(nn.Module):
    """Actor and critic for a flat Box observation and a Discrete (``discrete=True``) or Box action."""

    def __init__(self, *, obs_dim: int, action_dim: int, discrete: bool, hidden_sizes: Sequence[int],
                 init_log_std: float = 0.0, sde: bool = False, sde_sample_freq: int = -1,
                 ortho_init: bool = True) -> None:
        super().__init__()
        if sde and discrete:
            raise ValueError("Agent: state-dependent exploration (sde) needs a Box action space")
        self.discrete = discrete
        self.sde = sde
        self.sde_sample_freq = sde_sample_freq
        """Steps between gSDE noise draws in a rollout (-1: once per rollout); the rollout collector reads it."""
        self.critic = _mlp(obs_dim, hidden_sizes, 1, out_std=1.0, ortho=ortho_init)
        self.actor = _mlp(obs_dim, hidden_sizes, action_dim, out_std=0.01, ortho=ortho_init)
        # The same Linear modules, walked with torch's functional ops: on batches this small, nn.Sequential's
        # per-module call overhead was half the cost of a forward pass. (A tuple, so nothing is registered twice.)
        self._actor_linears = tuple(m for m in self.actor if isinstance(m, nn.Linear))
        self._critic_linears = tuple(m for m in self.critic if isinstance(m, nn.Linear))
        # A Discrete agent keeps an empty log-std so every agent has the same state-dict keys. With gSDE the
        # log-std is a matrix, one entry per (last hidden feature, action dimension).
        shape = (0,) if discrete else (hidden_sizes[-1], action_dim) if sde else (action_dim,)
        self.actor_logstd = nn.Parameter(torch.full(shape, float(init_log_std)))
        self._noise: torch.Tensor | None = None
        """gSDE's exploration matrices, one ``[features, actions]`` per env stream (see `reset_noise`)."""

    def reset_noise(self, streams: int) -> None:
        """Draw new gSDE exploration matrices for `streams` env streams (no-op without gSDE).

        Generalised state-dependent exploration (Raffin et al., 2021; SB3's ``use_sde``): the action noise is
        ``features(s) @ E`` with ``E ~ N(0, exp(log_std)^2)`` held fixed between resets, so exploration is smooth
        in time and shaped by the state, where independent Gaussian noise per step averages itself out.
        """
        if self.sde:
            with torch.no_grad():
                std = self.actor_logstd.exp()
                self._noise = torch.randn((streams, *std.shape)) * std

    def _features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's last hidden features and its output (the mean or the logits)."""
        return _tanh_mlp(self._actor_linears, x)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``V(x)`` with shape ``[batch]``."""
        return _tanh_mlp(self._critic_linears, x)[1].squeeze(-1)

    def sample_action(self, x: torch.Tensor) -> torch.Tensor:
        """Draw one action per row of `x` from the current policy (no log-prob: the learner recomputes it in batch).

        Discrete actions use the Gumbel-max trick, which samples the same distribution as
        ``Categorical(logits).sample()`` without building a distribution object on every env step.
        """
        if self.sde:
            features, mean = self._features(x)
            if self._noise is None or self._noise.shape[0] != x.shape[0]:
                self.reset_noise(x.shape[0])
            assert self._noise is not None
            return mean + torch.einsum("bf,bfa->ba", features, self._noise)
        out = self._features(x)[1]
        if self.discrete:
            gumbel = -torch.log(-torch.log(torch.rand_like(out)))
            return (out + gumbel).argmax(dim=-1)
        return out + self.actor_logstd.exp() * torch.randn_like(out)

    def greedy_action(self, x: torch.Tensor) -> torch.Tensor:
        """The deterministic action the exported graph computes: argmax of the logits, or the Gaussian mean.

        (Box means are clipped to the action bounds by the caller -- the env wrapper or the exported graph.)
        """
        out = self._features(x)[1]
        return out.argmax(dim=-1) if self.discrete else out

    def evaluate_actions(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(log_prob, entropy)`` of `action` under the policy at `x`, each ``[batch]``.

        With gSDE the action's variance is ``features(s)^2 @ exp(log_std)^2`` (the features detached, as in SB3:
        the exploration scale is learned through log_std only).
        """
        if self.discrete:
            logits = self._features(x)[1]
            log_probs = torch.log_softmax(logits, dim=-1)
            logprob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            return logprob, entropy
        if self.sde:
            features, out = self._features(x)
            var = (features.detach() ** 2) @ torch.exp(2.0 * self.actor_logstd) + 1e-6
            log_std = 0.5 * torch.log(var)
        else:
            out = self._features(x)[1]
            log_std = self.actor_logstd.expand_as(out)
            var = torch.exp(2.0 * log_std)
        logprob = (-((action - out) ** 2) / (2.0 * var) - log_std - 0.5 * math.log(2.0 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2.0 * math.pi) + log_std).sum(-1)
        return logprob, entropy


class ObsNormalizer:
    """Running mean and variance of observations (parallel Welford update), applied as ``clip((x - mean) / std)``."""

    def __init__(self, shape: Sequence[int], *, clip: float, enabled: bool = True, epsilon: float = 1e-8) -> None:
        self.enabled = enabled
        self.clip = float(clip)
        self.epsilon = float(epsilon)
        self.mean = np.zeros(tuple(shape), dtype=np.float64)
        self.var = np.ones(tuple(shape), dtype=np.float64)
        self.count = 0.0

    def update(self, x: np.ndarray) -> None:
        """Fold a batch ``[..., *shape]`` of raw observations into the statistics."""
        if not self.enabled:
            return
        batch = x.reshape(-1, *self.mean.shape).astype(np.float64)
        self.update_moments(batch.mean(axis=0), batch.var(axis=0), float(batch.shape[0]))

    def update_moments(self, batch_mean: np.ndarray, batch_var: np.ndarray, batch_count: float) -> None:
        """Fold a batch given by its mean, (population) variance and size into the statistics.

        Learners that see only other processes' summaries (hybrid units) merge them through here, in a
        fixed order, so every copy of the normaliser ends up with the same statistics.
        """
        batch_count = float(batch_count)  # a numpy scalar in the state would fail weights-only loading
        if not self.enabled or batch_count <= 0:
            return
        if self.count == 0.0:
            self.mean = np.array(batch_mean, dtype=np.float64)
            self.var = np.array(batch_var, dtype=np.float64)
            self.count = float(batch_count)
            return
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean = np.asarray(self.mean + delta * batch_count / total, dtype=np.float64)  # 0-d stays an array
        self.var = np.asarray(m2 / total, dtype=np.float64)
        self.count = total

    def scale(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(mean, 1 / std)`` as float32, the constants the exported graph uses."""
        inv_std = 1.0 / np.sqrt(self.var + self.epsilon)
        return self.mean.astype(np.float32), inv_std.astype(np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Return `x` normalised and clipped, as float32 (unchanged but cast when disabled).

        uint8 image frames stay uint8 when disabled: the CNN scales them in its graph, and a float copy of a batch
        of frames is 4x the size.
        """
        if not self.enabled:
            return x if x.dtype == np.uint8 and x.ndim >= 3 else np.asarray(x, dtype=np.float32)
        mean, inv_std = self.scale()
        normalized: np.ndarray = np.clip((np.asarray(x, dtype=np.float32) - mean) * inv_std, -self.clip, self.clip)
        return normalized

    def state_dict(self) -> dict[str, object]:
        """Return the statistics as plain tensors and floats (safe for ``torch.load(weights_only=True)``)."""
        return {"mean": torch.from_numpy(self.mean.copy()), "var": torch.from_numpy(self.var.copy()),
                "count": self.count, "clip": self.clip, "epsilon": self.epsilon, "enabled": self.enabled}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore statistics saved by `state_dict`."""
        mean, var = state["mean"], state["var"]
        assert isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor)
        self.mean, self.var = mean.numpy().astype(np.float64), var.numpy().astype(np.float64)
        self.count = float(state["count"])  # type: ignore[arg-type]
        self.clip, self.epsilon = float(state["clip"]), float(state["epsilon"])  # type: ignore[arg-type]
        self.enabled = bool(state["enabled"])


class RewardScaler:
    """Scales rewards by the running standard deviation of the discounted return, as SB3's VecNormalize does.

    Each env stream (keyed by the batch's ``worker`` id, so a switch between sources keeps it) carries its
    discounted return ``G = gamma * G + r``, reset where an episode ends; the variance of those returns is kept
    by an `ObsNormalizer` of shape ``()`` and rewards become ``clip(r / sqrt(var + eps), +-clip)``. Scaling keeps
    the sign and the optimum and leaves episode returns (what "solved" is judged on) untouched: only the critic's
    targets and the advantages see scaled rewards. Tasks whose returns reach the hundreds or thousands
    (Pendulum, MountainCar) otherwise give the critic targets it cannot fit before the actor has moved on.
    """

    def __init__(self, *, gamma: float, clip: float, enabled: bool = True, epsilon: float = 1e-8) -> None:
        self.gamma = float(gamma)
        self.enabled = enabled
        self.stats = ObsNormalizer((), clip=clip, epsilon=epsilon)
        self.running: dict[int, float] = {}

    def discounted_returns(self, rewards: np.ndarray, dones: np.ndarray, workers: np.ndarray) -> np.ndarray:
        """Advance each stream's discounted return over ``rewards[T, N]`` and return them, ``[T, N]``."""
        out = np.empty(rewards.shape, dtype=np.float64)
        current = np.array([self.running.get(int(w), 0.0) for w in workers], dtype=np.float64)
        for t in range(rewards.shape[0]):
            current = current * self.gamma + rewards[t]
            out[t] = current
            current = np.where(dones[t], 0.0, current)
        self.running = {int(w): float(g) for w, g in zip(workers, current, strict=True)}
        return out

    def scale(self, rewards: np.ndarray) -> np.ndarray:
        """Return `rewards` divided by the current return std and clipped, as float32."""
        inv_std = 1.0 / np.sqrt(float(self.stats.var) + self.stats.epsilon)
        scaled: np.ndarray = np.clip(rewards * inv_std, -self.stats.clip, self.stats.clip).astype(np.float32)
        return scaled

    def fit_scale(self, batch: RolloutBatch) -> RolloutBatch:
        """Fold `batch`'s discounted returns into the statistics; return the batch with scaled rewards.

        Unchanged when disabled. Data-parallel learners fold every replica's moments instead (see `cloud.hybrid`).
        """
        if not self.enabled:
            return batch
        returns = self.discounted_returns(batch.rewards, np.logical_or(batch.terminations, batch.truncations),
                                          batch.worker)
        self.stats.update(returns)
        return dataclasses.replace(batch, rewards=self.scale(batch.rewards))

    def state_dict(self) -> dict[str, object]:
        """The return statistics; gamma and enabled come from the config.

        A resumed run starts fresh episodes, so the streams' running returns start at zero again.
        """
        return {"stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self.stats.load_state_dict(state["stats"])
        self.running = {}


def check_action_space(config: PPOConfig, action_space: Any) -> None:
    """Refuse settings the env's action space cannot take (gSDE needs Box actions), before anything starts."""
    import gymnasium as gym

    if config.use_sde and isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"PPOConfig: use_sde (state-dependent exploration) needs a Box action space, not "
                          f"{action_space}; drop --use-sde")
