"""A deployed rollout function for a user's own env: it registers the env and its codec, then runs strata's handler.

What `functions/_envstate.py` tells a user to ship (run inside a local-runtime worker by the tests).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from functions import Field, FieldCodec, register_env_codec
from functions._handlers import rollout_handler

__all__ = ["ENV_ID", "Drift", "rollout_handler"]

ENV_ID = "StrataTestDrift-v0"


class Drift(gym.Env[np.ndarray, int]):
    """A user's env: a noisy walk that terminates after 45 steps (longer than one invocation's fragment)."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1e9, 1e9, (2,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.level = 0.0
        self.ticks = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.level, self.ticks = float(self.np_random.normal()), 0
        return np.array([self.level, self.ticks], np.float64), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.level += action - 0.5 + float(self.np_random.normal())
        self.ticks += 1
        return np.array([self.level, self.ticks], np.float64), self.level, self.ticks >= 45, False, {}


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=Drift, max_episode_steps=1000)
register_env_codec(Drift, FieldCodec([Field("level"), Field("ticks", dtypes=("int64",))]))
