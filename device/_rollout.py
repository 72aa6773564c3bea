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

Batches travel as raw buffers through `device._wire`; nothing is pickled. Image observations (uint8, two or
more axes per observation) can travel through an observation codec (`device._obs_codec`): ``obs``, ``final_obs``
and ``next_obs`` then share one frame table (each distinct frame encoded once), and the header records the codec
and its quality (``"obs_codec": "webp:90"``; ``"raw"`` when the arrays travel as they are). `from_bytes`
decodes the table, so a learner always gets plain arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from device._obs_codec import ObsCodec, decode_frames, encode_frames, is_image
from device._wire import WireError, pack_arrays, unpack_arrays

_REQUIRED = ("obs", "actions", "rewards", "terminations", "truncations", "final_obs", "next_obs",
             "policy_version", "worker", "seq")
_OPTIONAL = ("logprobs", "values", "behaviour_logprobs")
_FRAMED = ("obs", "final_obs", "next_obs")


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
    obs_codec: str = "raw"
    """The observation codec the batch travelled with (``webp:90``; ``raw``: none); set by `from_bytes`."""

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

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """The shape of one observation."""
        return tuple(self.obs.shape[2:])

    def to_bytes(self, codec: ObsCodec | None = None) -> bytes:
        """Encode as a raw-buffer message (`device._wire`); image observations through `codec` when it is not raw.

        A codec is used only where it applies (uint8 observations with two or more axes); the header records the
        one that was, so the receiver needs no configuration.
        """
        meta, arrays = self.to_parts(codec)
        return pack_arrays({"kind": "rollout_batch", **meta}, arrays)

    def to_parts(self, codec: ObsCodec | None = None) -> tuple[dict[str, object], dict[str, np.ndarray]]:
        """The header fields and arrays of `to_bytes`, for a message that carries a batch among other fields."""
        arrays = {name: getattr(self, name) for name in _REQUIRED}
        arrays.update({name: getattr(self, name) for name in _OPTIONAL if getattr(self, name) is not None})
        meta: dict[str, object] = {"source": self.source, "obs_codec": "raw"}
        if codec is not None and not codec.is_raw and is_image(self.obs_shape, self.obs.dtype):
            frames_meta, frame_arrays = encode_frames({n: arrays.pop(n) for n in _FRAMED}, codec,
                                                      obs_shape=self.obs_shape)
            meta.update(obs_codec=codec.spec, frames=frames_meta)
            arrays.update(frame_arrays)
        return meta, arrays

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> RolloutBatch:
        """Decode a message made by `to_bytes`; raise `WireError` when it is not a rollout batch."""
        meta, arrays = unpack_arrays(data)
        if meta.get("kind") != "rollout_batch":
            raise WireError(f"RolloutBatch.from_bytes: message kind {meta.get('kind')!r} is not 'rollout_batch'")
        return cls.from_parts(meta, arrays)

    @classmethod
    def from_parts(cls, meta: Mapping[str, object], arrays: Mapping[str, np.ndarray]) -> RolloutBatch:
        """Invert `to_parts` (frame tables decoded); raise `WireError` when the parts do not form a batch."""
        if not isinstance(meta.get("source"), str):
            raise WireError(f"RolloutBatch.from_parts: source {meta.get('source')!r:.80} is not a string")
        arrays = dict(arrays)
        if "frames" in meta:
            frames = meta["frames"]
            if not isinstance(frames, dict) or sorted(frames.get("arrays") or ()) != sorted(_FRAMED):
                raise WireError("RolloutBatch.from_parts: the frame table must hold obs, final_obs and next_obs")
            arrays.update(decode_frames(frames, arrays))
        missing = [n for n in _REQUIRED if n not in arrays]
        if missing:
            raise WireError(f"RolloutBatch.from_parts: missing arrays {missing}")
        try:
            return cls(source=str(meta["source"]), obs_codec=str(meta.get("obs_codec", "raw")),
                       **{n: arrays[n] for n in (*_REQUIRED, *_OPTIONAL) if n in arrays})
        except (TypeError, ValueError) as exc:
            raise WireError(f"RolloutBatch.from_parts: {exc}") from exc

    @staticmethod
    def concat_envs(batches: list[RolloutBatch], *, source: str | None = None) -> RolloutBatch:
        """Join batches with the same ``T`` side by side along the env axis."""
        if not batches:
            raise ValueError("RolloutBatch.concat_envs: need at least one batch")
        fields: dict[str, np.ndarray | None] = {}
        for f in dataclasses.fields(RolloutBatch):
            if f.name in ("source", "obs_codec"):
                continue
            parts = [getattr(b, f.name) for b in batches]
            if any(p is None for p in parts):
                fields[f.name] = None
                continue
            axis = 0 if f.name in ("worker", "next_obs") else 1
            fields[f.name] = np.concatenate(parts, axis=axis)
        return RolloutBatch(source=source or batches[0].source, obs_codec=batches[0].obs_codec,
                            **fields)  # type: ignore[arg-type]
