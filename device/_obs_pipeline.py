"""The observation pipeline every tier makes its envs with: the env, its lossy codec round trip, frame stacking.

    make_env(env_id, pipeline)     gymnasium.make(env_id)
                                   -> CodecRoundTrip   (lossy codecs only: each frame encoded and decoded once, so
                                                        the policy sees what the wire and the edge will show it)
                                   -> FrameStackObservation(k)   (frame_stack > 1: observations [k, *frame])

The learner's envs (sync, co-located workers), the env services, the rollout functions and the edge's simulators
all build envs here, from the `ObsPipeline` a run records (in its config, in every function event and env
service, and in its bundles' manifest ``preprocessing``), so a policy meets the same observations in every mode
and at the edge. gymnasium is imported on first use; strata's own envs (``strata/PixelCartPole-v1``, a CartPole
seen through a small camera: quick image observations with an env-state codec) are registered here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from device._deps import require
from device._errors import ConfigError
from device._obs_codec import ObsCodec

MAX_FRAME_STACK = 64
#: strata's own env ids, registered with gymnasium on first use of `make_env`.
STRATA_ENVS = ("strata/PixelCartPole-v1",)


@dataclass(frozen=True, kw_only=True)
class ObsPipeline:
    """What happens to an env's observations before a policy sees them."""

    frame_stack: int = 1
    """Observations stacked per step (1: none); a stack of k frames has shape [k, *frame]."""
    obs_codec: str = "raw"
    """Observation codec spec (``raw``, ``png``, ``webp``, ``webp:90``, ``jxl``, ``jxl:90``); a lossy one is
    applied once to every frame where the observation is made."""

    def __post_init__(self) -> None:
        if isinstance(self.frame_stack, bool) or not isinstance(self.frame_stack, int) or not (
                1 <= self.frame_stack <= MAX_FRAME_STACK):
            raise ConfigError(f"ObsPipeline: frame_stack {self.frame_stack!r:.80} must be an integer in "
                              f"[1, {MAX_FRAME_STACK}]")
        ObsCodec.parse(self.obs_codec)

    @property
    def codec(self) -> ObsCodec:
        """The observation codec."""
        return ObsCodec.parse(self.obs_codec)

    @classmethod
    def from_config(cls, config: Any) -> ObsPipeline:
        """From a learner config's ``frame_stack``, ``obs_codec`` and ``obs_quality`` fields (absent: defaults)."""
        codec = ObsCodec.from_flags(getattr(config, "obs_codec", "raw"), int(getattr(config, "obs_quality", 0)))
        return cls(frame_stack=int(getattr(config, "frame_stack", 1)), obs_codec=codec.spec)

    def to_json(self) -> dict[str, Any]:
        """The manifest / event form."""
        return {"frame_stack": self.frame_stack, "obs_codec": self.obs_codec}

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | None) -> ObsPipeline:
        """Read `to_json` output (missing keys: defaults, so bundles and events from before images still read)."""
        value = value or {}
        return cls(frame_stack=int(value.get("frame_stack", 1)), obs_codec=str(value.get("obs_codec", "raw")))

    @property
    def identity(self) -> bool:
        """Nothing is stacked and no lossy codec applies: envs are made as gymnasium makes them."""
        return self.frame_stack == 1 and not self.codec.lossy


def register_envs() -> None:
    """Register strata's own env ids with gymnasium (idempotent)."""
    gym = require("gymnasium", extra="edge", purpose="making environments")

    if STRATA_ENVS[0] not in gym.registry:
        gym.register(STRATA_ENVS[0], entry_point="device._obs_wrappers:pixel_cartpole", max_episode_steps=500)


def make_env(env_id: str, pipeline: ObsPipeline | None = None, **kwargs: Any) -> Any:
    """``gymnasium.make(env_id, **kwargs)`` wrapped by `pipeline` (see the module docstring)."""
    gym = require("gymnasium", extra="edge", purpose="making environments")

    register_envs()
    env = gym.make(env_id, **kwargs)
    pipeline = pipeline or ObsPipeline()
    if pipeline.identity:
        return env
    from device._obs_wrappers import wrap

    return wrap(env, pipeline.frame_stack, pipeline.codec)


def env_maker(env_id: str, pipeline: ObsPipeline | None = None, **kwargs: Any) -> Any:
    """A picklable zero-argument factory of `make_env(env_id, pipeline, **kwargs)` (for worker processes)."""
    import functools

    return functools.partial(make_env, env_id, pipeline, **kwargs)
