"""The rollout-batch contract: what every experience source hands the learner.

A `RolloutBatch` is time-major: ``T`` steps of ``N`` env streams. Every transition is identified by
``(source, worker[n], seq[t, n])`` so that loss and duplication are countable across sources,
switches and retries: a stream (one env slot of one worker) numbers its transitions 0, 1, 2, ...

Arrays (``*S`` = observation shape, ``*A`` = action shape):

    obs            [T, N, *S]   observation the action was taken in
    actions        [T, N, *A]
    rewards        [T, N]       float32
    terminations   [T, N]       bool: the MDP ended (no bootstrap)
    truncations    [T, N]       bool: a time limit ended the episode (bootstrap from final_obs)
    final_obs      [T, N, *S]   the real last observation where terminations|truncations, else zeros
    next_obs       [N, *S]      the observation after the last step, to bootstrap the tail
    policy_version [T, N]       int64: the policy version that chose the action
    worker         [N]          int64 stream ids
    seq            [T, N]       int64 per-stream sequence numbers
    logprobs, values [T, N]     float32, present where the algorithm needs them (PPO): the learner's log-prob of
                                each action and its value estimate, computed with the weights the update starts from
    behaviour_logprobs [T, N]   float32, present for off-policy experience (the edge fleet): the log-prob of each
                                action under the policy that acted, for importance weights (V-trace)

Batches travel as raw buffers through `device._wire`; nothing is pickled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from device._wire import WireError, pack_arrays, unpack_arrays

_REQUIRED = ("obs", "actions", "rewards", "terminations", "truncations", "final_obs", "next_obs",
             "policy_version", "worker", "seq")
_OPTIONAL = ("logprobs", "values", "behaviour_logprobs")


@dataclass(frozen=True, eq=False)
class RolloutBatch:
    """``T`` steps of ``N`` env streams from one experience source (see the module docstring)."""

    source: str
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    final_obs: np.ndarray
    next_obs: np.ndarray
    policy_version: np.ndarray
    worker: np.ndarray
    seq: np.ndarray
    logprobs: np.ndarray | None = None
    values: np.ndarray | None = None
    behaviour_logprobs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.rewards.ndim != 2:
            raise ValueError(f"RolloutBatch: rewards must be [T, N], got shape {self.rewards.shape}")
        t, n = self.rewards.shape
        for name in ("terminations", "truncations", "policy_version", "seq", *_OPTIONAL):
            arr = getattr(self, name)
            if arr is not None and arr.shape != (t, n):
                raise ValueError(f"RolloutBatch: {name} must have shape {(t, n)} like rewards, got {arr.shape}")
        for name in ("obs", "actions", "final_obs"):
            if getattr(self, name).shape[:2] != (t, n):
                raise ValueError(f"RolloutBatch: {name} must start with [T, N] = {(t, n)}, "
                                 f"got {getattr(self, name).shape}")
        if self.worker.shape != (n,) or self.next_obs.shape[:1] != (n,):
            raise ValueError(f"RolloutBatch: worker and next_obs must have N={n} rows, got "
                             f"{self.worker.shape} and {self.next_obs.shape}")

    @property
    def num_steps(self) -> int:
        """``T``, the number of time steps."""
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        """``N``, the number of env streams."""
        return int(self.rewards.shape[1])

    @property
    def size(self) -> int:
        """Number of transitions, ``T * N``."""
        return int(self.rewards.size)

    def transition_ids(self) -> Iterator[tuple[str, int, int]]:
        """Yield ``(source, worker, seq)`` for every transition."""
        workers = np.broadcast_to(self.worker, self.seq.shape)
        for w, s in zip(workers.ravel().tolist(), self.seq.ravel().tolist(), strict=True):
            yield (self.source, w, s)

    def to_bytes(self) -> bytes:
        """Encode as a raw-buffer message (`device._wire`)."""
        arrays = {name: getattr(self, name) for name in _REQUIRED}
        arrays.update({name: getattr(self, name) for name in _OPTIONAL if getattr(self, name) is not None})
        return pack_arrays({"kind": "rollout_batch", "source": self.source}, arrays)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> RolloutBatch:
        """Decode a message made by `to_bytes`; raise `WireError` when it is not a rollout batch."""
        meta, arrays = unpack_arrays(data)
        if meta.get("kind") != "rollout_batch" or not isinstance(meta.get("source"), str):
            raise WireError(f"RolloutBatch.from_bytes: message kind {meta.get('kind')!r} is not 'rollout_batch'")
        missing = [n for n in _REQUIRED if n not in arrays]
        if missing:
            raise WireError(f"RolloutBatch.from_bytes: missing arrays {missing}")
        try:
            return cls(source=meta["source"], **{n: arrays[n] for n in (*_REQUIRED, *_OPTIONAL) if n in arrays})
        except ValueError as exc:
            raise WireError(f"RolloutBatch.from_bytes: {exc}") from exc

    @staticmethod
    def concat_envs(batches: list[RolloutBatch], *, source: str | None = None) -> RolloutBatch:
        """Join batches with the same ``T`` side by side along the env axis."""
        if not batches:
            raise ValueError("RolloutBatch.concat_envs: need at least one batch")
        fields: dict[str, np.ndarray | None] = {}
        for f in dataclasses.fields(RolloutBatch):
            if f.name == "source":
                continue
            parts = [getattr(b, f.name) for b in batches]
            if any(p is None for p in parts):
                fields[f.name] = None
                continue
            axis = 0 if f.name in ("worker", "next_obs") else 1
            fields[f.name] = np.concatenate(parts, axis=axis)
        return RolloutBatch(source=source or batches[0].source, **fields)  # type: ignore[arg-type]
