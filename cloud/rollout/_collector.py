"""`RolloutCollector`: steps a vector env with the acting policy and cuts `device.RolloutBatch`es from it.

The policy is anything with the `ActingPolicy` methods (`cloud.learners` networks are); the collector stamps each
transition with the policy version that acted and a (source, worker, sequence) id, and reports the episodes that
ended as `Episode` records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from device import RolloutBatch

if TYPE_CHECKING:
    import gymnasium
    import torch


class ActingPolicy(Protocol):
    """What the collector needs of a policy network (`cloud.learners.Agent` is one)."""

    sde: bool
    sde_sample_freq: int

    def reset_noise(self, streams: int) -> None: ...

    def sample_action(self, x: torch.Tensor) -> torch.Tensor: ...

    def evaluate_actions(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def get_value(self, x: torch.Tensor) -> torch.Tensor: ...


class Normalizer(Protocol):
    """Maps raw observations to what the policy sees (`cloud.learners.ObsNormalizer` is one)."""

    def __call__(self, x: np.ndarray) -> np.ndarray: ...


def evaluate(agent: Any, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log_prob, entropy, value)``: one pass where the agent shares an encoder (`CnnAgent.evaluate`), else two."""
    shared = getattr(agent, "evaluate", None)
    if shared is not None:
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = shared(x, action)
        return out
    logprob, entropy = agent.evaluate_actions(x, action)
    return logprob, entropy, agent.get_value(x)


@dataclass(frozen=True)
class Episode:
    """One finished training episode."""

    global_step: int
    """Env steps taken by the whole learner when it ended."""
    episodic_return: float
    episodic_length: int


class RolloutCollector:
    """Steps a same-step-autoreset vector env with the current policy and returns `RolloutBatch`es.

    Keeps the envs' current observations, each stream's running episode return and length, and
    per-stream transition sequence numbers across calls.
    """

    def __init__(self, envs: gymnasium.vector.VectorEnv[Any, Any, Any], *, num_steps: int, source: str = "sync",
                 seq_start: int = 0) -> None:
        import gymnasium

        self.envs = envs
        self.num_steps = num_steps
        self.source = source
        self.num_envs = envs.num_envs
        action_space = envs.single_action_space
        self.discrete = isinstance(action_space, gymnasium.spaces.Discrete)
        self.action_low = None if self.discrete else getattr(action_space, "low", None)
        self.action_high = None if self.discrete else getattr(action_space, "high", None)
        self.next_obs, _ = envs.reset()
        self.worker = np.arange(self.num_envs, dtype=np.int64)
        self.next_seq = np.full(self.num_envs, seq_start, dtype=np.int64)
        self.episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)

    def collect(self, agent: ActingPolicy, normalizer: Normalizer, *, policy_version: int,
                global_step: int) -> tuple[RolloutBatch, list[Episode]]:
        """Run `agent` for ``num_steps`` steps; return the batch and the episodes that ended in it."""
        import torch

        t, n = self.num_steps, self.num_envs
        obs_shape = self.next_obs.shape[1:]
        # Image frames stay uint8 (a quarter of float32's memory; the CNN scales them), everything else float32.
        dtype = np.uint8 if self.next_obs.dtype == np.uint8 and len(obs_shape) >= 2 else np.float32
        obs = np.zeros((t, n, *obs_shape), dtype=dtype)
        final_obs = np.zeros((t, n, *obs_shape), dtype=dtype)
        actions: np.ndarray | None = None
        rewards = np.zeros((t, n), dtype=np.float32)
        terminations = np.zeros((t, n), dtype=bool)
        truncations = np.zeros((t, n), dtype=bool)
        episodes: list[Episode] = []
        for step in range(t):
            if agent.sde and (step == 0 or (agent.sde_sample_freq > 0 and step % agent.sde_sample_freq == 0)):
                agent.reset_noise(n)
            obs[step] = self.next_obs
            with torch.inference_mode():
                action = agent.sample_action(torch.from_numpy(normalizer(self.next_obs))).numpy()
            if actions is None:
                actions = np.zeros((t, *action.shape), dtype=action.dtype)
            actions[step] = action
            # A Box policy's Gaussian sample may leave the bounds: the env gets it clipped, the
            # learner keeps the raw sample so its log-prob stays exact.
            env_action = action if self.discrete else np.clip(action, self.action_low, self.action_high)
            self.next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            rewards[step], terminations[step], truncations[step] = reward, terminated, truncated
            self.episode_return += reward
            self.episode_length += 1
            done = np.logical_or(terminated, truncated)
            if done.any():
                for i in np.flatnonzero(done):
                    final_obs[step, i] = info["final_obs"][i]
                    episodes.append(Episode(global_step + (step + 1) * n, float(self.episode_return[i]),
                                            int(self.episode_length[i])))
                self.episode_return[done] = 0.0
                self.episode_length[done] = 0
        assert actions is not None
        # Log-probs and values of the acting policy, in one batched pass: the weights did not change
        # during the rollout, so this equals computing them step by step, at a fraction of the cost.
        with torch.inference_mode():
            b_obs = torch.from_numpy(normalizer(obs.reshape(t * n, *obs_shape)))
            logprobs, _, values = evaluate(agent, b_obs, torch.from_numpy(actions.reshape(t * n, *actions.shape[2:])))
        seq = self.next_seq + np.arange(t, dtype=np.int64)[:, None]
        self.next_seq = self.next_seq + t
        batch = RolloutBatch(
            source=self.source, obs=obs, actions=actions, rewards=rewards, terminations=terminations,
            truncations=truncations, final_obs=final_obs, next_obs=np.asarray(self.next_obs, dtype=dtype).copy(),
            policy_version=np.full((t, n), policy_version, dtype=np.int64), worker=self.worker.copy(), seq=seq,
            logprobs=logprobs.numpy().reshape(t, n), values=values.numpy().reshape(t, n),
        )
        return batch, episodes
