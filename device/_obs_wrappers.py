"""The gymnasium wrappers of the observation pipeline (imports gymnasium; loaded by `device._obs_pipeline`).

`CodecRoundTrip` passes every frame of an observation through a lossy codec once (`device._obs_codec.FrameCodec`,
which keeps the blobs it made for the wire); `pixel_cartpole` is the entry point of ``strata/PixelCartPole-v1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from device._deps import require
from device._obs_codec import ObsCodec, frame_codec

# The device tier lists no third-party packages but numpy, cryptography and paho; gymnasium comes in through
# `require` (the `[edge]` and `[functions]` extras install it), and only where envs are made.
gym: Any = require("gymnasium", extra="edge", purpose="the observation pipeline")
CartPoleEnv: Any = require("gymnasium.envs.classic_control.cartpole", extra="edge").CartPoleEnv

PIXEL_SIZE = 40
"""Height and width of ``strata/PixelCartPole-v1`` frames (the Nature CNN needs at least 36)."""


class CodecRoundTrip(gym.ObservationWrapper):  # type: ignore[misc]
    """Observations as they come out of a lossy codec: each frame encoded and decoded once."""

    def __init__(self, env: Any, codec: ObsCodec) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, codec=codec.spec)
        super().__init__(env)
        self.codec_spec = codec.spec
        self._coder = frame_codec(codec)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The decoded frames."""
        return self._coder.roundtrip_obs(np.asarray(observation))


def wrap(env: Any, frame_stack: int, codec: ObsCodec) -> Any:
    """`env` with the pipeline's wrappers (round trip inside, frame stack outside)."""
    if codec.lossy:
        space = env.observation_space
        if not (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) >= 2):
            shown = f"{space.dtype}{list(space.shape)}" if isinstance(space, gym.spaces.Box) else f"{space!s:.80}"
            raise gym.error.Error(f"a lossy observation codec ({codec.spec}) needs image observations (uint8, two or "
                                  f"more axes); this env observes {shown}; drop --obs-quality")
        env = CodecRoundTrip(env, codec)
    if frame_stack > 1:
        env = gym.wrappers.FrameStackObservation(env, frame_stack)
    return env


class PixelCartPole(gym.ObservationWrapper):  # type: ignore[misc]
    """CartPole through a small RGB camera: the cart, the pole and the track drawn with numpy (no pygame)."""

    def __init__(self, env: Any, size: int = PIXEL_SIZE) -> None:
        super().__init__(env)
        self.size = size
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        grid = np.arange(size, dtype=np.float32)
        self._ys, self._xs = np.meshgrid(grid, grid, indexing="ij")

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """Draw the state: cart position and pole angle are what the picture shows."""
        x, _, theta, _ = (float(v) for v in observation)
        s = self.size
        frame = np.full((s, s, 3), 255, np.uint8)
        frame[int(0.75 * s):, :] = (90, 90, 90)  # the track
        cx = (x / 2.4 * 0.4 + 0.5) * s
        cy = 0.7 * s
        cart = (np.abs(self._xs - cx) <= 0.1 * s) & (np.abs(self._ys - cy) <= 0.05 * s)
        frame[cart] = (30, 30, 200)
        # the pole: points within 1 pixel of the segment from the cart's top along the angle
        length = 0.5 * s
        tx, ty = np.sin(theta), -np.cos(theta)
        px, py = self._xs - cx, self._ys - (cy - 0.05 * s)
        along = np.clip(px * tx + py * ty, 0.0, length)
        pole = (px - along * tx) ** 2 + (py - along * ty) ** 2 <= 1.2
        frame[pole] = (200, 120, 40)
        return frame


def pixel_cartpole(size: int = PIXEL_SIZE, render_mode: str | None = None) -> Any:
    """Entry point of ``strata/PixelCartPole-v1``."""
    return PixelCartPole(CartPoleEnv(render_mode=render_mode), size=size)
