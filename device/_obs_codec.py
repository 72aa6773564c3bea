"""Observation codecs: image frames compressed with a maintained imaging library, and the frame table on the wire.

A codec is chosen per run (`ObsCodec`, spec strings ``raw``, ``png``, ``webp``, ``webp:90``, ``jxl``, ``jxl:90``):

    raw     arrays travel as they are (`device._wire`); nothing is decoded
    png     lossless (Pillow's zlib-based PNG; the baseline the figures compare with)
    webp    WebP, lossless; ``webp:Q`` lossy at quality Q (1-100)
    jxl     JPEG-XL through the pillow-jxl-plugin wheel, lossless; ``jxl:Q`` lossy

Pillow (and the JPEG-XL plugin) are imported on first use, with an install hint when missing, so the device
tier keeps running without them. Frames are found in an observation's trailing axes: ``[..., H, W, C]`` with C in
(1, 3, 4) is a sequence of ``H x W`` images of C channels (a frame stack ``[k, H, W, C]`` is k images), any other
uint8 array of two or more axes is a sequence of ``H x W`` grey planes.

Lossy codecs change pixels once, where an observation is made (`FrameCodec.roundtrip`, the observation
pipeline's codec wrapper in `device._obs_pipeline`): the policy acts on, learns from and is deployed with the
decoded frame. The wire then carries exactly the frames a host holds: `FrameCodec.blob` returns the lossy bytes
the round trip made for a frame (kept in an LRU), and a frame it never made (evicted, or raw) travels as lossless
PNG, so a decoded batch always equals what was encoded, bit for bit.

`encode_frames` / `decode_frames` turn named uint8 arrays into a frame table, the form a rollout batch carries
its observations in (`device.RolloutBatch.to_bytes`): every distinct frame is encoded once (a stack of k frames
repeats k - 1 of the previous step's, ``final_obs`` and ``next_obs`` repeat ``obs``), each array becomes an int32
index ``[..., frames]`` into the table, and the blobs are concatenated with their sizes. Decoding refuses a blob
that is not PNG/WebP/JPEG-XL or not of the declared frame shape before Pillow decodes its pixels.
"""

from __future__ import annotations

import hashlib
import io
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from device._errors import ConfigError, MissingDependencyError
from device._wire import WireError

#: Codec names, in the order `--obs-codec` lists them.
CODECS = ("raw", "png", "webp", "jxl")
#: Codecs that take a quality (lossy when one is given).
LOSSY_CAPABLE = ("webp", "jxl")
#: Formats a decoder opens; anything else in a frame blob is refused.
_FORMATS = {"png": "PNG", "webp": "WEBP", "jxl": "JXL"}
#: Largest number of decoded bytes one frame table may expand to (a guard against a hostile index).
MAX_DECODED_BYTES = 4 << 30
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


@dataclass(frozen=True, kw_only=True)
class ObsCodec:
    """How image observations are compressed on the wire (and, when lossy, degraded once where they are made)."""

    name: str = "raw"
    """``raw``, ``png``, ``webp`` or ``jxl``."""
    quality: int | None = None
    """None: lossless; 1-100: lossy quality (``webp`` and ``jxl`` only)."""

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise ConfigError(f"ObsCodec: codec {self.name!r:.80} is not one of {list(CODECS)}; pass --obs-codec "
                              "raw, png, webp or jxl")
        if self.quality is not None:
            if isinstance(self.quality, bool) or not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
                raise ConfigError(f"ObsCodec: quality {self.quality!r:.80} must be an integer in [1, 100] (or left "
                                  "out for lossless)")
            if self.name not in LOSSY_CAPABLE:
                kind = "lossless" if self.name == "png" else "uncompressed"
                raise ConfigError(f"ObsCodec: codec {self.name!r} has no quality (it is {kind}); pass --obs-quality "
                                  "only with webp or jxl")

    @classmethod
    def parse(cls, spec: str) -> ObsCodec:
        """Read ``name`` or ``name:quality`` (``webp:90``)."""
        name, sep, quality = str(spec).partition(":")
        if not sep:
            return cls(name=name)
        if not quality.isdigit():
            raise ConfigError(f"ObsCodec: {spec!r:.80} is not NAME or NAME:QUALITY (e.g. webp:90)")
        return cls(name=name, quality=int(quality))

    @classmethod
    def from_flags(cls, name: str, quality: int) -> ObsCodec:
        """From the ``obs_codec`` / ``obs_quality`` config fields (quality 0: lossless)."""
        return cls(name=name, quality=quality or None)

    @property
    def spec(self) -> str:
        """``name`` or ``name:quality``: the form events, configs and batch headers record."""
        return self.name if self.quality is None else f"{self.name}:{self.quality}"

    @property
    def lossy(self) -> bool:
        """Whether decoding may give other pixels than were encoded."""
        return self.quality is not None

    @property
    def is_raw(self) -> bool:
        """No image compression: arrays travel as they are."""
        return self.name == "raw"

    def encode(self, frame: np.ndarray) -> bytes:
        """One frame (``[H, W]`` or ``[H, W, C]``, uint8) as this codec's bytes (``raw``: PNG is not raw; refused)."""
        if self.is_raw:
            raise ConfigError("ObsCodec.encode: the raw codec does not encode frames; pick png, webp or jxl")
        return _encode(frame, self.name, self.quality)

    def decode(self, blob: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """The frame of `shape` a blob holds (any of PNG, WebP, JPEG-XL); `WireError` if it is not that."""
        return decode_frame(blob, shape)


def _pil(name: str = "png") -> Any:
    image = _import("PIL.Image", "pillow", "images")
    if name == "jxl":
        _import("pillow_jxl", "pillow-jxl-plugin", "jxl")
    return image


def _import(module: str, package: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f"observation codecs need the {package} package, which is not installed; "
                                     f"install it with `pip install 'strata[{extra}]'`") from exc


def available_codecs() -> tuple[str, ...]:
    """The codecs this process can encode and decode (``raw`` always; the others when Pillow and plugins load)."""
    out = ["raw"]
    for name in CODECS[1:]:
        try:
            _pil(name)
        except MissingDependencyError:
            continue
        if name == "webp" and not _import("PIL.features", "pillow", "images").check("webp"):
            continue
        out.append(name)
    return tuple(out)


def frame_shape(obs_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one image frame inside an observation of `obs_shape` (see the module docstring)."""
    if len(obs_shape) >= 3 and obs_shape[-1] in _MODES:
        return tuple(obs_shape[-3:])
    if len(obs_shape) >= 2:
        return tuple(obs_shape[-2:])
    raise ConfigError(f"frame_shape: an observation of shape {obs_shape} has no image frames (needs >= 2 axes)")


def is_image(shape: tuple[int, ...], dtype: Any) -> bool:
    """Whether observations of `shape` and `dtype` are image frames (uint8 with two or more axes)."""
    return np.dtype(dtype) == np.uint8 and len(shape) >= 2


def _encode(frame: np.ndarray, name: str, quality: int | None) -> bytes:
    image_mod = _pil(name)
    a = np.ascontiguousarray(frame, dtype=np.uint8)
    channels = 1 if a.ndim == 2 else a.shape[-1]
    image = image_mod.fromarray(a.reshape(a.shape[0], a.shape[1]) if channels == 1 else a, mode=_MODES[channels])
    out = io.BytesIO()
    if name == "png":
        image.save(out, format="PNG")
    elif name == "webp":
        # Lossless: quality is the encoder's effort; `exact` keeps the colour of fully transparent pixels.
        kwargs: dict[str, Any] = {"lossless": True, "quality": 70, "method": 2, "exact": True} if quality is None \
            else {"quality": quality, "method": 2}
        image.save(out, format="WEBP", **kwargs)
    else:
        kwargs = {"lossless": True, "effort": 3} if quality is None else {"quality": quality, "effort": 3}
        image.save(out, format="JXL", **kwargs)
    return out.getvalue()


def decode_frame(blob: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
    """Decode one frame blob into a uint8 array of `shape`; `WireError` for another format or size."""
    image_mod = _pil("png")
    head = bytes(blob[:16])
    name = "png" if head.startswith(b"\x89PNG") else "webp" if head[:4] == b"RIFF" and head[8:12] == b"WEBP" \
        else "jxl" if head.startswith((b"\xff\x0a", b"\x00\x00\x00\x0cJXL ")) else None
    if name is None:
        raise WireError(f"decode_frame: a frame blob starting {head[:8]!r} is not PNG, WebP or JPEG-XL")
    if name == "jxl":
        _pil("jxl")
    height, width = shape[0], shape[1]
    channels = 1 if len(shape) == 2 else shape[2]
    try:
        with image_mod.open(io.BytesIO(bytes(blob)), formats=[_FORMATS[name]]) as image:
            if image.size != (width, height):  # read from the header: nothing is decoded for a wrong size
                raise WireError(f"decode_frame: a {name} frame of {image.size[0]}x{image.size[1]} pixels is not the "
                                f"declared {width}x{height}")
            image = image.convert(_MODES[channels])
            out = np.asarray(image, dtype=np.uint8)
    except WireError:
        raise
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow's errors for a corrupt or truncated image
        raise WireError(f"decode_frame: a {name} frame blob is corrupt: {exc}") from None
    return out.reshape(shape)


def _digest(frame: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(frame).data, digest_size=16).digest()


class FrameCodec:
    """An `ObsCodec` with the state a process keeps: the lossy blobs its round trips made (an LRU by frame digest).

    Use `frame_codec` to get the one instance per codec of a process, so the pipeline's round-trip wrappers and
    the wire encoders share it.
    """

    def __init__(self, codec: ObsCodec, *, capacity: int = 16384) -> None:
        self.codec = codec
        self.capacity = capacity
        self._blobs: OrderedDict[bytes, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.fallbacks = 0
        """Frames sent as lossless PNG because no lossy blob of theirs was at hand."""

    def roundtrip(self, frame: np.ndarray) -> np.ndarray:
        """The frame as the policy sees it: encoded and decoded once (unchanged for lossless codecs)."""
        if not self.codec.lossy:
            return frame
        blob = self.codec.encode(frame)
        seen = decode_frame(blob, tuple(frame.shape))
        self._remember(_digest(seen), blob)
        return seen

    def roundtrip_obs(self, obs: np.ndarray) -> np.ndarray:
        """`roundtrip` applied to every frame of one observation (or a batch of them)."""
        if not self.codec.lossy:
            return obs
        shape = frame_shape(tuple(obs.shape))
        frames = np.ascontiguousarray(obs).reshape(-1, *shape)
        return np.stack([self.roundtrip(f) for f in frames]).reshape(obs.shape)

    def _remember(self, key: bytes, blob: bytes) -> None:
        with self._lock:
            self._blobs[key] = blob
            self._blobs.move_to_end(key)
            while len(self._blobs) > self.capacity:
                self._blobs.popitem(last=False)

    def blob(self, frame: np.ndarray, digest: bytes | None = None) -> bytes:
        """Bytes that decode to exactly `frame`: its cached lossy blob, else this codec's lossless encoding."""
        if self.codec.lossy:
            key = digest or _digest(frame)
            with self._lock:
                cached = self._blobs.get(key)
            if cached is not None:
                return cached
            self.fallbacks += 1
            return _encode(frame, "png", None)
        return self.codec.encode(frame)


_codecs: dict[str, FrameCodec] = {}
_codecs_lock = threading.Lock()


def frame_codec(codec: ObsCodec) -> FrameCodec:
    """The process's `FrameCodec` for `codec` (one per spec, so round trips and encoders share blobs)."""
    with _codecs_lock:
        found = _codecs.get(codec.spec)
        if found is None:
            found = _codecs[codec.spec] = FrameCodec(codec)
        return found


def encode_frames(arrays: Mapping[str, np.ndarray], codec: ObsCodec, *, obs_shape: tuple[int, ...]
                  ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A frame table of uint8 `arrays`, each ``[..., *obs_shape]`` (see the module docstring).

    Returns ``(meta, arrays)`` for `device.pack_arrays`: ``frames:sizes`` (uint32), ``frames:data`` (uint8) and,
    per input array, ``frames:index:NAME`` (int32 ``[*lead axes, frames per observation]``).
    """
    if codec.is_raw:
        raise ConfigError("encode_frames: the raw codec carries arrays as they are; do not build a frame table")
    coder = frame_codec(codec)
    names = list(arrays)
    obs_shape = tuple(obs_shape)
    shape = frame_shape(obs_shape)
    per_obs = math.prod(obs_shape) // math.prod(shape)
    table: dict[bytes, int] = {}
    frames: list[np.ndarray] = []
    blobs: list[bytes] = []
    out: dict[str, np.ndarray] = {}
    for name in names:
        a = np.ascontiguousarray(arrays[name])
        lead = a.ndim - len(obs_shape)
        if a.dtype != np.uint8 or lead < 0 or tuple(a.shape[lead:]) != obs_shape:
            raise ConfigError(f"encode_frames: array {name!r} ({a.dtype}{list(a.shape)}) is not uint8 observations "
                              f"of shape {obs_shape}")
        flat = a.reshape(-1, *shape)
        index = np.empty(flat.shape[0], dtype=np.int32)
        for i, frame in enumerate(flat):
            key = _digest(frame)
            j = table.get(key)
            if j is None or not np.array_equal(frames[j], frame):  # a digest collision gets a frame of its own
                j = len(frames)
                table[key] = j
                frames.append(frame)
                blobs.append(coder.blob(frame, key))
            index[i] = j
        out[f"frames:index:{name}"] = index.reshape(*a.shape[:lead], per_obs)
    sizes = np.array([len(b) for b in blobs], dtype=np.uint32)
    out["frames:sizes"] = sizes
    out["frames:data"] = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    meta = {"codec": codec.spec, "frame_shape": list(shape), "obs_shape": list(obs_shape), "arrays": names}
    return meta, out


def decode_frames(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Invert `encode_frames`: the named uint8 arrays (writable); `WireError` when anything does not fit."""
    try:
        ObsCodec.parse(str(meta.get("codec")))
        shape = tuple(int(d) for d in meta["frame_shape"])
        obs_shape = tuple(int(d) for d in meta["obs_shape"])
        names = [str(n) for n in meta["arrays"]]
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        raise WireError(f"decode_frames: the frame table header is malformed: {exc}") from None
    if len(shape) not in (2, 3) or any(d < 1 for d in shape) or (len(shape) == 3 and shape[2] not in _MODES):
        raise WireError(f"decode_frames: frame shape {shape} is not [H, W] or [H, W, 1|3|4]")
    if len(obs_shape) < 2 or frame_shape(obs_shape) != shape:
        raise WireError(f"decode_frames: observation shape {obs_shape} does not hold frames of {shape}")
    sizes, data = arrays.get("frames:sizes"), arrays.get("frames:data")
    if sizes is None or data is None or sizes.dtype != np.uint32 or data.dtype != np.uint8 or sizes.ndim != 1:
        raise WireError("decode_frames: the frame table needs uint32 'frames:sizes' and uint8 'frames:data'")
    ends = np.cumsum(sizes.astype(np.int64))
    if ends.size and int(ends[-1]) != data.size:
        raise WireError(f"decode_frames: frame sizes add up to {int(ends[-1])} bytes, the data holds {data.size}")
    per_obs = math.prod(obs_shape) // math.prod(shape)
    indices = {}
    total = 0
    for name in names:
        index = arrays.get(f"frames:index:{name}")
        if index is None or index.dtype != np.int32 or index.ndim < 1 or index.shape[-1] != per_obs:
            raise WireError(f"decode_frames: array {name!r} has no int32 index of {per_obs} frames per observation")
        if index.size and (int(index.min()) < 0 or int(index.max()) >= sizes.size):
            raise WireError(f"decode_frames: array {name!r} indexes frames outside the table of {sizes.size}")
        total += index.size * math.prod(shape)
        indices[name] = index
    if total > MAX_DECODED_BYTES:
        raise WireError(f"decode_frames: the table expands to {total} bytes, over {MAX_DECODED_BYTES}")
    view = np.ascontiguousarray(data).data  # uint8, one dimension: a byte view, no copy
    starts = ends - sizes.astype(np.int64)
    decoded = [decode_frame(view[int(s):int(e)], shape) for s, e in zip(starts, ends, strict=True)]
    table = np.stack(decoded) if decoded else np.zeros((0, *shape), np.uint8)
    return {name: table[index.reshape(-1)].reshape(*index.shape[:-1], *obs_shape) for name, index in indices.items()}
