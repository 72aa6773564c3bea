"""Edge-collected experience: what the learner asks of the fleet, how a node acts for it, and its records.

The learner asks through the bundle it signs: an ``edge``-mode run puts `EXPERIENCE_KEY` into the manifest's
``producer`` map, a JSON `ExperienceRequest` (how to choose actions, steps per record, Gaussian noise for Box
actions). A node that collects experience (``--experience-steps N``, N > 0) follows the request of the policy it
acts with, or its own settings when the policy asks nothing:

    sample    Discrete: the action is drawn from the softmax of the bundle's ``logits`` output; Box: the
              bundle's action plus N(0, noise_std) noise, clipped to the bounds. The log-probability of the action
              under that behaviour policy travels with it (`RolloutBatch.behaviour_logprobs`), so the learner can
              weigh stale experience (truncated importance weights, V-trace).
    greedy    the bundle's deterministic action (no log-probability: the behaviour policy is a point mass)

`ExperienceRecorder` gathers one record (``T`` steps of the node's simulator, with the real last observation of
each episode that ended, the episode's return and length where it ended, and the policy version of every step)
and turns it into an `edge._topics.Experience` payload of at most 128 KB (AWS IoT Core's limit). `Budget` holds a
node to its bandwidth (bytes/s) and CPU (recorded steps/s) budget for experience: over budget, the node keeps
acting for its own task but records nothing until the budget refills, and the skipped steps are counted.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from device import Bundle, ObsCodec, RolloutBatch
from edge._errors import EdgeConfigError
from edge._topics import AWS_MAX_PAYLOAD, Experience

EXPERIENCE_KEY = "strata.experience"
"""Manifest ``producer`` key under which a learner signs its `ExperienceRequest`."""

MAX_RECORD_STEPS = 4096


@dataclass(frozen=True, kw_only=True)
class ExperienceRequest:
    """How the learner wants the fleet to act while collecting experience for it."""

    actions: Literal["sample", "greedy"] = "sample"
    """``sample``: draw from the policy's distribution (on-policy data, with log-probs); ``greedy``: its action."""
    steps: int = 32
    """Steps of one env stream per record."""
    noise_std: float = 0.1
    """Box actions with ``sample``: standard deviation of the Gaussian noise, in action units."""

    def __post_init__(self) -> None:
        if self.actions not in ("sample", "greedy"):
            raise EdgeConfigError(f"ExperienceRequest.actions {self.actions!r} is not 'sample' or 'greedy'")
        if not 1 <= self.steps <= MAX_RECORD_STEPS:
            raise EdgeConfigError(f"ExperienceRequest.steps {self.steps} must lie in 1..{MAX_RECORD_STEPS}")
        if not (math.isfinite(self.noise_std) and self.noise_std > 0):
            raise EdgeConfigError(f"ExperienceRequest.noise_std {self.noise_std} must be a finite number > 0")

    def to_producer(self) -> dict[str, str]:
        """The manifest ``producer`` entry that carries this request."""
        return {EXPERIENCE_KEY: json.dumps({"actions": self.actions, "steps": self.steps,
                                            "noise_std": self.noise_std}, allow_nan=False)}

    @classmethod
    def from_bundle(cls, bundle: Bundle) -> ExperienceRequest | None:
        """The request a bundle carries, or None (no request, or one this node cannot read: it says why)."""
        text = bundle.manifest.producer.get(EXPERIENCE_KEY)
        if text is None:
            return None
        try:
            obj = json.loads(text[:4096])
            return cls(actions=obj["actions"], steps=int(obj["steps"]), noise_std=float(obj["noise_std"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise EdgeConfigError(f"the bundle's experience request {text[:80]!r} is not readable: {exc}") from None


class Budget:
    """A token bucket per limit: `allow(cost)` says whether a record of `cost` may start now; 0 is unlimited.

    Args:
        bytes_per_s: Experience bytes a node may send per second (its bandwidth budget).
        steps_per_s: Steps a node may record per second (its CPU budget for experience).
        clock: Monotonic seconds.
    """

    def __init__(self, *, bytes_per_s: float = 0.0, steps_per_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._rates = (float(bytes_per_s), float(steps_per_s))
        self._clock = clock
        self._last = clock()
        # A bucket holds one second of budget, so a node that was idle does not burst for longer.
        self._level = list(self._rates)

    def _refill(self) -> None:
        now = self._clock()
        elapsed, self._last = now - self._last, now
        self._level = [min(rate, level + rate * elapsed) for rate, level in zip(self._rates, self._level, strict=True)]

    def allow(self, *, record_bytes: int, steps: int) -> bool:
        """Whether a record of about `record_bytes` and `steps` fits the budget now."""
        self._refill()
        costs = (record_bytes, steps)
        return all(rate <= 0 or level >= min(cost, rate) for rate, level, cost in zip(self._rates, self._level, costs,
                                                                                    strict=True))

    def spend(self, *, record_bytes: int, steps: int) -> None:
        """Take a finished record's cost from the buckets (they may go negative: the next record waits longer)."""
        self._refill()
        self._level = [level - cost if rate > 0 else level for rate, level, cost in
                       zip(self._rates, self._level, (record_bytes, steps), strict=True)]


def act_for_experience(policy: Any, obs: np.ndarray, request: ExperienceRequest, rng: np.random.Generator
                       ) -> tuple[Any, float | None]:
    """The action `policy` (an `edge._policy.OnnxPolicy`) takes in `obs` under `request`, and its log-probability.

    The log-probability is None for greedy actions, and for a Discrete bundle without a ``logits`` output.
    """
    if request.actions == "greedy":
        return policy.act(obs), None
    if policy.discrete:
        logits = policy.logits(obs)
        if logits is None:
            return policy.act(obs), None
        z = logits.astype(np.float64) - logits.max()
        logp = z - math.log(float(np.exp(z).sum()))
        index = min(int(np.searchsorted(np.cumsum(np.exp(logp)), rng.random() * np.exp(logp).sum())), logp.size - 1)
        return index, float(logp[index])
    mean = np.asarray(policy.act(obs), dtype=np.float64)
    low, high = policy.action_bounds
    noisy = np.clip(mean + request.noise_std * rng.standard_normal(mean.shape), low, high)
    z = (noisy - mean) / request.noise_std
    logp = float(np.sum(-0.5 * z * z - math.log(request.noise_std) - 0.5 * math.log(2 * math.pi)))
    return noisy.astype(np.float32), logp


class ExperienceRecorder:
    """One record in the making (see the module docstring): `add` steps, then `record` when `full`.

    Args:
        node: The node id.
        steps: Steps per record.
        codec: The observation codec image observations travel through (the node's pipeline codec).
    """

    def __init__(self, node: str, steps: int, codec: ObsCodec | None = None) -> None:
        if not 1 <= steps <= MAX_RECORD_STEPS:
            raise EdgeConfigError(f"experience records of {steps} steps: use 1..{MAX_RECORD_STEPS}")
        self.node = node
        self.steps = steps
        self.codec = codec
        self._rows: dict[str, list[Any]] = {k: [] for k in ("obs", "actions", "rewards", "terminations", "truncations",
                                                           "final_obs", "policy_version", "logp", "ep_return",
                                                           "ep_length")}

    def __len__(self) -> int:
        return len(self._rows["obs"])

    @property
    def full(self) -> bool:
        """Whether the record has its steps."""
        return len(self) >= self.steps

    def add(self, *, obs: np.ndarray, action: Any, reward: float, terminated: bool, truncated: bool,
            final_obs: np.ndarray | None, version: int, logp: float | None, episode: tuple[float, int] | None) -> None:
        """One step: the observation acted in, its action, what followed, (return, length) where an episode ended."""
        r = self._rows
        r["obs"].append(obs)
        r["actions"].append(action)
        r["rewards"].append(reward)
        r["terminations"].append(terminated)
        r["truncations"].append(truncated)
        r["final_obs"].append(final_obs if final_obs is not None else np.zeros_like(obs))
        r["policy_version"].append(version)
        r["logp"].append(logp)
        r["ep_return"].append(episode[0] if episode else 0.0)
        r["ep_length"].append(episode[1] if episode else 0)

    def record(self, next_obs: np.ndarray) -> Callable[[int], bytes]:
        """The finished record as ``build(record_id) -> payload`` (for `edge._outbox.Outbox.put`); resets."""
        r, t = self._rows, len(self)
        actions = np.asarray(r["actions"])
        logp = None if any(v is None for v in r["logp"]) else np.asarray(r["logp"], np.float32)[:, None]
        batch = RolloutBatch(
            source="edge", obs=np.stack(r["obs"])[:, None], actions=actions.reshape(t, 1, *actions.shape[1:]),
            rewards=np.asarray(r["rewards"], np.float32)[:, None],
            terminations=np.asarray(r["terminations"], bool)[:, None],
            truncations=np.asarray(r["truncations"], bool)[:, None], final_obs=np.stack(r["final_obs"])[:, None],
            next_obs=np.asarray(next_obs)[None], policy_version=np.asarray(r["policy_version"], np.int64)[:, None],
            worker=np.zeros(1, np.int64), seq=np.arange(t, dtype=np.int64)[:, None], behaviour_logprobs=logp)
        ep_return = np.asarray(r["ep_return"], np.float32)[:, None]
        ep_length = np.asarray(r["ep_length"], np.int64)[:, None]
        self._rows = {k: [] for k in self._rows}
        node, codec = self.node, self.codec
        return lambda record_id: Experience(record_id=record_id, node=node, batch=batch, episode_return=ep_return,
                                            episode_length=ep_length, codec=codec).encode()


def record_bytes(obs_shape: tuple[int, ...], obs_itemsize: int, act_shape: tuple[int, ...], steps: int) -> int:
    """About the payload size of a record of `steps` steps (its final observations not counted)."""
    per_step = (int(np.prod(obs_shape)) * obs_itemsize + max(8, int(np.prod(act_shape)) * 4) + 4 + 2 + 8 + 4 + 4 + 8)
    return 512 + steps * per_step + int(np.prod(obs_shape)) * obs_itemsize


def fits_payload(obs_shape: tuple[int, ...], obs_itemsize: int, act_shape: tuple[int, ...], steps: int) -> bool:
    """Whether a record of `steps` steps fits AWS IoT Core's payload limit with room for a few final observations."""
    return record_bytes(obs_shape, obs_itemsize, act_shape, steps) + 4 * int(np.prod(obs_shape)) * obs_itemsize \
        <= AWS_MAX_PAYLOAD

