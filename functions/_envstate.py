"""Env-state codecs: a running gymnasium env captured as arrays + JSON scalars and restored bit-exactly.

A serverless function keeps nothing between invocations, so an episode that should outlive one
invocation travels as state: the function captures each running env at the fragment's end, the
caller sends the state with the next invocation for that stream, and any instance restores it and
steps on exactly as one process would have (same observations, rewards, RNG draws, time limit).

    capture(env) -> EnvState              walk the wrapper chain outside-in; every layer's codec captures
                                          its fields; the innermost env's ``np_random`` bit-generator state
                                          is captured for every env
    encode_env_state(state) -> bytes      `device.pack_arrays`: a JSON header + raw numeric arrays; never pickle
    decode_env_state(data, env)           unpack, then check every layer's type and every field's shape and
                                          dtype against `env`; anything else raises `device.WireError`
    restore(env, state)                   write the fields back (checks again: a hand-built state is refused too)

Codecs are found by the class of each layer (exact class first, then base classes registered with
``subclasses=True``). Built in: gymnasium's ``TimeLimit``, ``OrderEnforcing``, ``PassiveEnvChecker``;
the classic-control envs (CartPole, MountainCar, MountainCarContinuous, Pendulum, Acrobot); MuJoCo envs
(`functions._envstate_mujoco`, every ``MujocoEnv`` subclass). A user registers their own env or wrapper
with `register_env_codec`, usually as a `FieldCodec` listing the attributes that make up its state.
A layer with no codec makes the env uncapturable (`NoEnvCodecError`, and `codec_gap` names the layer);
the rollout handler then keeps today's behaviour: episodes end at the fragment length.

A codec is registered in the process that runs the function (where the env is registered with
gymnasium too), e.g. a handler module deployed with the function::

    # my_rollout.py: handler "my_rollout.rollout_handler"
    import gymnasium
    from functions import Field, FieldCodec, register_env_codec
    from functions._handlers import rollout_handler  # noqa: F401 (the handler Lambda calls)
    from my_envs import MyEnv

    gymnasium.register("MyEnv-v0", entry_point=MyEnv, max_episode_steps=1000)
    register_env_codec(MyEnv, FieldCodec([Field("pos", shape=(3,)), Field("t", dtypes=("int64",))]))

Not carried: the RNGs of the env's action and observation spaces (`space.sample()`); strata's rollout
handler draws random actions from its own generator, seeded per invocation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from device import WireError, pack_arrays, unpack_arrays
from functions._errors import NoEnvCodecError

#: Message kind of an encoded env state.
KIND = "strata.env_state"
#: Message kind of a stream carry (env state + the stream's last observation and running return).
CARRY_KIND = "strata.stream_carry"
FORMAT = 1
#: Bit generators whose state is two 128-bit integers (state, inc) plus the cached 32-bit half.
_PCG_FAMILY = ("PCG64", "PCG64DXSM")
_MASK64 = (1 << 64) - 1


class EnvStateCodec(Protocol):
    """Captures and restores the state one layer of an env (a wrapper, or the innermost env) holds."""

    def capture(self, layer: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``(meta, arrays)``: JSON scalars and numeric arrays that make up the layer's state."""
        ...

    def check(self, layer: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Raise `device.WireError` when `meta`/`arrays` do not fit `layer` (names, shapes, dtypes, config)."""
        ...

    def restore(self, layer: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Write a checked state into `layer`."""
        ...


@dataclass(frozen=True, kw_only=True)
class LayerState:
    """The state of one layer of the wrapper chain."""

    type: str
    """``module.QualName`` of the layer's class: restoring into another class is refused."""
    meta: dict[str, Any]
    """JSON scalars."""
    arrays: dict[str, np.ndarray]
    """Numeric arrays."""


@dataclass(frozen=True, kw_only=True)
class EnvState:
    """A captured env: one `LayerState` per layer, outermost wrapper first."""

    env_id: str | None
    """The env's registered id (``env.spec.id``), checked on restore."""
    layers: tuple[LayerState, ...]


# ---- fields: the usual shape of a codec ----------------------------------------------------------------------

@dataclass(frozen=True)
class Field:
    """One attribute of a layer's state.

    A value is None (only when `optional`), a Python ``bool``/``int``/``float``, a numpy scalar, a numpy
    array or a tuple/list of numbers; whichever it was comes back as the same kind, same dtype, same bits.
    """

    attr: str
    """Attribute name on the layer."""
    shape: tuple[int, ...] = ()
    """Shape of the value (``()`` for a scalar)."""
    dtypes: tuple[str, ...] = ("float64",)
    """Accepted dtypes of the value as an array (a Python float is float64, an int int64, a bool bool)."""
    optional: bool = False
    """The attribute may be None (e.g. before the first reset)."""


_CONTAINERS = ("ndarray", "scalar", "tuple", "list", "py")


def _value_to_array(value: Any) -> tuple[str, np.ndarray]:
    if isinstance(value, np.ndarray):
        return "ndarray", np.array(value)
    if isinstance(value, np.generic):
        return "scalar", np.array(value)
    if isinstance(value, bool | int | float):
        return "py", np.array(value, dtype=bool if isinstance(value, bool) else
                              np.int64 if isinstance(value, int) else np.float64)
    if isinstance(value, tuple | list):
        return type(value).__name__, np.array(value)
    raise TypeError(f"a {type(value).__name__} is not a numeric value")


def _array_to_value(container: str, a: np.ndarray) -> Any:
    a = np.array(a)  # a writable copy: decoded arrays are read-only views of the message
    if container == "ndarray":
        return a
    if container == "scalar":
        return a[()]
    if container == "py":
        return a.item()
    items = list(a)
    return tuple(items) if container == "tuple" else items


class FieldCodec:
    """A codec from a list of `Field`s: the attributes a layer's state consists of.

    Args:
        fields: The state's attributes.
        config: Attributes that are configuration, not state (e.g. ``_max_episode_steps``): captured
            as JSON scalars and required to be equal on restore, so a state never lands in an env
            made with other settings.
        after_restore: Called with the layer after the fields were written (derived caches, flags).
    """

    def __init__(self, fields: Sequence[Field] = (), *, config: Sequence[str] = (),
                 after_restore: Callable[[Any], None] | None = None) -> None:
        self.fields = tuple(fields)
        self.config = tuple(config)
        self._after_restore = after_restore

    def capture(self, layer: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """See `EnvStateCodec.capture`."""
        meta: dict[str, Any] = {"config": {name: _json_scalar(getattr(layer, name)) for name in self.config}}
        arrays: dict[str, np.ndarray] = {}
        for f in self.fields:
            value = getattr(layer, f.attr, None)
            if value is None:
                if not f.optional:
                    raise NoEnvCodecError(f"capture: {type(layer).__name__}.{f.attr} is None; capture a running "
                                          "env (after reset)")
                meta[f.attr] = None
                continue
            try:
                container, arr = _value_to_array(value)
            except TypeError as exc:
                raise NoEnvCodecError(f"capture: {type(layer).__name__}.{f.attr}: {exc}") from exc
            meta[f.attr] = container
            arrays[f.attr] = arr
        return meta, arrays

    def check(self, layer: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """See `EnvStateCodec.check`."""
        name = type(layer).__name__
        config = meta.get("config")
        if not isinstance(config, Mapping):
            raise WireError(f"env state of {name}: the config record is missing")
        for key in self.config:
            want = _json_scalar(getattr(layer, key))
            if config.get(key) != want:
                raise WireError(f"env state of {name}: {key} is {config.get(key)!r} in the state but {want!r} in "
                                "this env; continue the state in an env made with the same settings")
        expected = {f.attr for f in self.fields}
        extra = sorted(set(arrays) - expected)
        if extra:
            raise WireError(f"env state of {name}: unexpected arrays {extra}; the state was captured from another env")
        for f in self.fields:
            container = meta.get(f.attr)
            if container is None:
                if not f.optional:
                    raise WireError(f"env state of {name}: field {f.attr!r} is missing")
                if f.attr in arrays:
                    raise WireError(f"env state of {name}: field {f.attr!r} is marked None but has an array")
                continue
            if container not in _CONTAINERS:
                raise WireError(f"env state of {name}: field {f.attr!r} has an unknown container {container!r}")
            a = arrays.get(f.attr)
            if a is None:
                raise WireError(f"env state of {name}: field {f.attr!r} has no array")
            if tuple(a.shape) != f.shape:
                raise WireError(f"env state of {name}: field {f.attr!r} has shape {tuple(a.shape)}, this env needs "
                                f"{f.shape}")
            if a.dtype.name not in f.dtypes:
                raise WireError(f"env state of {name}: field {f.attr!r} has dtype {a.dtype.name}, this env needs one "
                                f"of {list(f.dtypes)}")

    def restore(self, layer: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """See `EnvStateCodec.restore`."""
        for f in self.fields:
            container = meta.get(f.attr)
            setattr(layer, f.attr, None if container is None else _array_to_value(container, arrays[f.attr]))
        if self._after_restore is not None:
            self._after_restore(layer)


def _json_scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value)
    return repr(value)


# ---- the registry --------------------------------------------------------------------------------------------

@dataclass
class _Entry:
    codec: EnvStateCodec
    subclasses: bool


_registry: dict[str, _Entry] = {}
_builtins_loaded: list[bool] = []


def class_key(cls: type) -> str:
    """The registry key of a class: ``module.QualName``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def register_env_codec(cls: type | str, codec: EnvStateCodec, *, subclasses: bool = False) -> None:
    """Register how one env or wrapper class is captured and restored.

    Args:
        cls: The class (or its ``module.QualName``); the innermost env's RNG is captured by strata itself.
        codec: An `EnvStateCodec`, usually a `FieldCodec`.
        subclasses: Use the codec for subclasses too (an exact registration of a subclass wins).

    Example::

        register_env_codec(MyEnv, FieldCodec([Field("pos", shape=(3,)), Field("t", dtypes=("int64",))]))
    """
    _load_builtins()
    _registry[cls if isinstance(cls, str) else class_key(cls)] = _Entry(codec, subclasses)


def _lookup(layer: Any) -> EnvStateCodec | None:
    _load_builtins()
    mro = type(layer).__mro__
    entry = _registry.get(class_key(mro[0]))
    if entry is not None:
        return entry.codec
    for cls in mro[1:]:
        entry = _registry.get(class_key(cls))
        if entry is not None and entry.subclasses:
            return entry.codec
    return None


def _chain(env: Any) -> list[Any]:
    layers = [env]
    while hasattr(layers[-1], "env") and layers[-1] is not getattr(layers[-1], "unwrapped", None):
        layers.append(layers[-1].env)
    return layers


def codec_gap(env: Any) -> str | None:
    """None when every layer of `env` has a codec, else the name of the first layer that has none."""
    for layer in _chain(env):
        if _lookup(layer) is None:
            return type(layer).__name__
    return None


def _env_id(env: Any) -> str | None:
    spec = getattr(env, "spec", None)
    return getattr(spec, "id", None)


# ---- the innermost env's RNG ---------------------------------------------------------------------------------

def _capture_rng(base: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    rng = getattr(base, "_np_random", None)
    seed = getattr(base, "_np_random_seed", None)
    if rng is None:
        return {"bit_generator": None, "seed": None if seed is None else str(seed)}, {}
    state = rng.bit_generator.state
    kind = state.get("bit_generator")
    if kind not in _PCG_FAMILY:
        raise NoEnvCodecError(f"capture: {type(base).__name__}.np_random uses {kind}; only {list(_PCG_FAMILY)} "
                              "bit generators (gymnasium's default) are carried")
    words = [state["state"]["state"] >> 64, state["state"]["state"] & _MASK64,
             state["state"]["inc"] >> 64, state["state"]["inc"] & _MASK64, state["uinteger"]]
    meta = {"bit_generator": kind, "has_uint32": int(state["has_uint32"]), "seed": None if seed is None else str(seed)}
    return meta, {"pcg": np.array(words, dtype=np.uint64)}


def _check_rng(name: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    kind = meta.get("bit_generator")
    seed = meta.get("seed")
    if seed is not None and not (isinstance(seed, str) and seed.lstrip("-").isdigit()):
        raise WireError(f"env state of {name}: the RNG seed {seed!r:.40} is not a decimal integer")
    if kind is None:
        if arrays:
            raise WireError(f"env state of {name}: an unseeded RNG has arrays {sorted(arrays)}")
        return
    if kind not in _PCG_FAMILY:
        raise WireError(f"env state of {name}: bit generator {kind!r} is not one of {list(_PCG_FAMILY)}")
    if meta.get("has_uint32") not in (0, 1):
        raise WireError(f"env state of {name}: has_uint32 must be 0 or 1, got {meta.get('has_uint32')!r}")
    words = arrays.get("pcg")
    if set(arrays) != {"pcg"} or words is None or words.shape != (5,) or words.dtype != np.uint64:
        raise WireError(f"env state of {name}: the RNG needs one uint64 array 'pcg' of shape (5,), got "
                        f"{ {k: (a.dtype.name, a.shape) for k, a in arrays.items()} }")


def _restore_rng(base: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    seed = meta.get("seed")
    kind = meta.get("bit_generator")
    if kind is None:
        base._np_random = None
    else:
        w = [int(x) for x in arrays["pcg"]]
        state = {"bit_generator": kind, "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
                 "has_uint32": int(meta["has_uint32"]), "uinteger": w[4]}
        rng = getattr(base, "_np_random", None)
        if rng is None or type(rng.bit_generator).__name__ != kind:
            rng = np.random.Generator(getattr(np.random, kind)())
        rng.bit_generator.state = state
        base._np_random = rng
    base._np_random_seed = None if seed is None else int(seed)


# ---- capture / encode / decode / restore ---------------------------------------------------------------------

def capture(env: Any) -> EnvState:
    """The state of a running env (every layer of its wrapper chain, and its RNG).

    Raises:
        NoEnvCodecError: a layer has no registered codec (register one with `register_env_codec`).
    """
    layers = _chain(env)
    out = []
    for i, layer in enumerate(layers):
        codec = _lookup(layer)
        if codec is None:
            raise NoEnvCodecError(f"capture: {type(layer).__name__} (in {env}) has no env-state codec; register "
                                  "one with functions.register_env_codec")
        meta, arrays = codec.capture(layer)
        if i == len(layers) - 1:
            rng_meta, rng_arrays = _capture_rng(layer)
            meta = {**meta, "np_random": rng_meta}
            arrays = {**arrays, **{f"np_random.{k}": v for k, v in rng_arrays.items()}}
        out.append(LayerState(type=class_key(type(layer)), meta=meta, arrays=arrays))
    return EnvState(env_id=_env_id(env), layers=tuple(out))


def _split(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    own = {k: v for k, v in arrays.items() if not k.startswith("np_random.")}
    rng = {k[len("np_random."):]: v for k, v in arrays.items() if k.startswith("np_random.")}
    return own, rng


def check(env: Any, state: EnvState) -> None:
    """Raise `device.WireError` unless `state` fits `env` layer by layer (types, config, shapes, dtypes)."""
    layers = _chain(env)
    want_id = _env_id(env)
    if state.env_id != want_id:
        raise WireError(f"env state: captured from env {state.env_id!r}, cannot continue in {want_id!r}")
    if len(state.layers) != len(layers):
        raise WireError(f"env state: {len(state.layers)} layers in the state, {len(layers)} in {env}; make the env "
                        "with the same wrappers")
    for i, (layer, saved) in enumerate(zip(layers, state.layers, strict=True)):
        name = type(layer).__name__
        if saved.type != class_key(type(layer)):
            raise WireError(f"env state: layer {i} is {saved.type!r} in the state but {class_key(type(layer))!r} in "
                            f"{env}; make the env with the same wrappers")
        codec = _lookup(layer)
        if codec is None:
            raise WireError(f"env state: layer {i} ({name}) has no env-state codec in this process; register the "
                            "same codec where the state is restored")
        own, rng = _split(saved.arrays)
        meta = dict(saved.meta)
        if i == len(layers) - 1:
            rng_meta = meta.pop("np_random", None)
            if not isinstance(rng_meta, Mapping):
                raise WireError(f"env state of {name}: the RNG record is missing")
            _check_rng(name, rng_meta, rng)
        elif rng:
            raise WireError(f"env state of {name}: only the innermost env carries an RNG")
        codec.check(layer, meta, own)


def restore(env: Any, state: EnvState) -> None:
    """Write `state` into `env` (made like the captured one); afterwards it steps exactly as the original.

    Raises:
        device.WireError: the state does not fit the env (see `check`).
    """
    check(env, state)
    write_checked(env, state)


def write_checked(env: Any, state: EnvState) -> None:
    """`restore` without the check, for a state `decode_env_state` / `decode_carry` checked against `env`."""
    layers = _chain(env)
    for i, (layer, saved) in enumerate(zip(layers, state.layers, strict=True)):
        codec = _lookup(layer)
        assert codec is not None  # check() refused a layer without one
        own, rng = _split(saved.arrays)
        meta = dict(saved.meta)
        if i == len(layers) - 1:
            _restore_rng(layer, meta.pop("np_random"), rng)
        codec.restore(layer, meta, own)


def _pack(kind: str, state: EnvState, extra_meta: Mapping[str, Any], extra_arrays: Mapping[str, np.ndarray]
          ) -> bytes:
    arrays = {f"{i}/{name}": a for i, layer in enumerate(state.layers) for name, a in layer.arrays.items()}
    arrays.update({f"stream/{k}": v for k, v in extra_arrays.items()})
    layers = [{"type": layer.type, "meta": layer.meta} for layer in state.layers]
    # pack_arrays sends a 0-d array as shape (1,) (np.ascontiguousarray is at least 1-d): name them
    scalars = sorted(name for name, a in arrays.items() if np.ndim(a) == 0)
    return pack_arrays({"kind": kind, "format": FORMAT, "env_id": state.env_id, "layers": layers,
                        "scalars": scalars, **extra_meta}, arrays)


def _unpack(data: bytes, kind: str) -> tuple[EnvState, dict[str, Any], dict[str, np.ndarray]]:
    meta, arrays = unpack_arrays(data)
    if meta.get("kind") != kind or meta.get("format") != FORMAT:
        raise WireError(f"decode: message kind {meta.get('kind')!r} format {meta.get('format')!r} is not {kind!r} "
                        f"format {FORMAT}")
    layers_meta = meta.get("layers")
    env_id = meta.get("env_id")
    if not isinstance(layers_meta, list) or not (env_id is None or isinstance(env_id, str)):
        raise WireError("decode: the env state header has no layer list")
    scalars = meta.get("scalars")
    if not isinstance(scalars, list) or not set(scalars) <= set(arrays):
        raise WireError("decode: the env state header's scalar list is malformed")
    for name in scalars:
        if arrays[name].shape != (1,):
            raise WireError(f"decode: scalar {name!r} has shape {arrays[name].shape}")
        arrays[name] = arrays[name].reshape(())
    per_layer: list[dict[str, np.ndarray]] = [{} for _ in layers_meta]
    extra: dict[str, np.ndarray] = {}
    for name, a in arrays.items():
        head, _, rest = name.partition("/")
        if head == "stream":
            extra[rest] = a
        elif head.isdigit() and int(head) < len(per_layer) and rest:
            per_layer[int(head)][rest] = a
        else:
            raise WireError(f"decode: array {name!r} belongs to no layer")
    layers = []
    for i, entry in enumerate(layers_meta):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("type"), str) or not isinstance(
                entry.get("meta"), Mapping):
            raise WireError(f"decode: layer {i} of the env state is malformed")
        layers.append(LayerState(type=entry["type"], meta=dict(entry["meta"]), arrays=per_layer[i]))
    return EnvState(env_id=env_id, layers=tuple(layers)), meta, extra


def encode_env_state(state: EnvState) -> bytes:
    """The wire form of `state` (a `device.pack_arrays` message)."""
    return _pack(KIND, state, {}, {})


def decode_env_state(data: bytes, env: Any) -> EnvState:
    """Read an encoded state and check it against `env`.

    Raises:
        device.WireError: the bytes are not an env state, or it does not fit `env`.
    """
    state, _, _ = _unpack(data, KIND)
    check(env, state)
    return state


#: The public names of `capture` and `restore`.
capture_env_state = capture
restore_env_state = restore


# ---- a stream's carry: what the rollout handler continues an episode from ------------------------------------

@dataclass(frozen=True, kw_only=True)
class StreamCarry:
    """A running episode of one env stream: the env's state plus what the stream itself tracks."""

    state: EnvState
    obs: np.ndarray
    """The observation the policy acts on next (the observation space's shape and dtype: uint8 frames travel as
    they are, bit-exact; the next invocation's first transition encodes them)."""
    episode_return: float = 0.0
    """Undiscounted return of the running episode so far."""
    episode_length: int = 0
    """Steps of the running episode so far."""
    extra: dict[str, Any] = field(default_factory=dict)


def obs_dtype(space: Any) -> np.dtype[Any]:
    """The dtype observations of `space` are kept in: uint8 for image frames, float32 for everything else."""
    dtype = np.dtype(getattr(space, "dtype", None) or np.float32)
    return dtype if dtype == np.uint8 and len(getattr(space, "shape", None) or ()) >= 2 else np.dtype(np.float32)


def encode_carry(carry: StreamCarry) -> bytes:
    """The wire form of a stream carry."""
    return _pack(CARRY_KIND, carry.state, {"episode_length": int(carry.episode_length)},
                 {"obs": np.asarray(carry.obs),
                  "episode_return": np.array(carry.episode_return, dtype=np.float64)})


def decode_carry(data: bytes, env: Any) -> StreamCarry:
    """Read a stream carry and check it against `env` (its state, and the observation's shape).

    Raises:
        device.WireError: the bytes are not a carry, or it does not fit `env`.
    """
    state, meta, extra = _unpack(data, CARRY_KIND)
    check(env, state)
    obs, ret, length = extra.get("obs"), extra.get("episode_return"), meta.get("episode_length")
    shape = tuple(getattr(env.observation_space, "shape", None) or ())
    dtype = obs_dtype(env.observation_space)
    if obs is None or obs.dtype != dtype or tuple(obs.shape) != shape:
        raise WireError(f"carry: the observation must be {dtype} of shape {shape}, got "
                        f"{None if obs is None else (obs.dtype.name, tuple(obs.shape))}")
    if ret is None or ret.dtype != np.float64 or ret.shape != ():
        raise WireError("carry: episode_return must be one float64")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise WireError(f"carry: episode_length must be a non-negative integer, got {length!r:.40}")
    return StreamCarry(state=state, obs=np.array(obs), episode_return=float(ret), episode_length=length)


# ---- built-in codecs -----------------------------------------------------------------------------------------

def _passive_checker_restored(layer: Any) -> None:
    # The first-step data-reuse check compares the observation/info objects of two consecutive calls;
    # those objects stay behind in the invocation that made them, so the check counts as done.
    layer._previous_data = None
    layer.checked_data_reuse = True


_FLOAT = ("float32", "float64")

#: The classic-control envs: their state arrays (dtype as the env left them; Continuous MountainCar
#: switches from float64 after reset to float32 after a step, and both are carried as they are).
CLASSIC_CONTROL: dict[str, FieldCodec] = {
    "gymnasium.envs.classic_control.cartpole.CartPoleEnv": FieldCodec(
        [Field("state", shape=(4,), dtypes=_FLOAT), Field("steps_beyond_terminated", dtypes=("int64",),
                                                          optional=True)],
        config=("_sutton_barto_reward", "kinematics_integrator")),
    "gymnasium.envs.classic_control.mountain_car.MountainCarEnv": FieldCodec(
        [Field("state", shape=(2,), dtypes=_FLOAT)], config=("goal_velocity",)),
    "gymnasium.envs.classic_control.continuous_mountain_car.Continuous_MountainCarEnv": FieldCodec(
        [Field("state", shape=(2,), dtypes=_FLOAT)], config=("goal_velocity",)),
    "gymnasium.envs.classic_control.pendulum.PendulumEnv": FieldCodec(
        [Field("state", shape=(2,), dtypes=_FLOAT), Field("last_u", dtypes=_FLOAT, optional=True)], config=("g",)),
    "gymnasium.envs.classic_control.acrobot.AcrobotEnv": FieldCodec(
        [Field("state", shape=(4,), dtypes=_FLOAT)], config=("torque_noise_max", "book_or_nips")),
}

class FrameStackCodec:
    """gymnasium's ``FrameStackObservation``: its queue of the last k observations and its padding observation."""

    def capture(self, layer: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """See `EnvStateCodec.capture`."""
        meta = {"config": {"stack_size": int(layer.stack_size), "padding_type": str(layer.padding_type)}}
        return meta, {"queue": np.stack([np.asarray(o) for o in layer.obs_queue]),
                      "padding": np.array(layer.padding_value)}

    def check(self, layer: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """See `EnvStateCodec.check`."""
        want = {"stack_size": int(layer.stack_size), "padding_type": str(layer.padding_type)}
        if meta.get("config") != want:
            raise WireError(f"env state of FrameStackObservation: settings {meta.get('config')!r:.80} are not this "
                            f"env's {want}; continue the state in an env made with the same frame stack")
        space = layer.env.observation_space
        frame, dtype = tuple(space.shape or ()), np.dtype(space.dtype)
        queue, padding = arrays.get("queue"), arrays.get("padding")
        if set(arrays) != {"queue", "padding"} or queue is None or padding is None:
            raise WireError(f"env state of FrameStackObservation: needs arrays queue and padding, got {sorted(arrays)}")
        if queue.shape != (want["stack_size"], *frame) or padding.shape != frame or queue.dtype != dtype or \
                padding.dtype != dtype:
            raise WireError(f"env state of FrameStackObservation: queue {queue.dtype}{list(queue.shape)} and padding "
                            f"{padding.dtype}{list(padding.shape)} do not fit {want['stack_size']} x "
                            f"{dtype}{list(frame)}")

    def restore(self, layer: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """See `EnvStateCodec.restore`."""
        from collections import deque

        layer.obs_queue = deque([np.array(o) for o in arrays["queue"]], maxlen=layer.stack_size)
        layer.padding_value = np.array(arrays["padding"])


#: The observation pipeline's layers (`device._obs_pipeline`): the frame stack carries its queue; the codec round
#: trip and strata's pixel env hold no state (settings only).
PIPELINE: dict[str, EnvStateCodec] = {
    "gymnasium.wrappers.stateful_observation.FrameStackObservation": FrameStackCodec(),
    "device._obs_wrappers.CodecRoundTrip": FieldCodec(config=("codec_spec",)),
    "device._obs_wrappers.PixelCartPole": FieldCodec(config=("size",)),
}

WRAPPERS: dict[str, FieldCodec] = {
    "gymnasium.wrappers.common.TimeLimit": FieldCodec(
        [Field("_elapsed_steps", dtypes=("int64",), optional=True)], config=("_max_episode_steps",)),
    "gymnasium.wrappers.common.OrderEnforcing": FieldCodec(
        [Field("_has_reset", dtypes=("bool",))], config=("_disable_render_order_enforcing",)),
    "gymnasium.wrappers.common.PassiveEnvChecker": FieldCodec(
        [Field(name, dtypes=("bool",)) for name in ("checked_reset", "checked_step", "checked_render",
                                                    "close_called")],
        after_restore=_passive_checker_restored),
}


def _load_builtins() -> None:
    if _builtins_loaded:
        return
    _builtins_loaded.append(True)
    for key, codec in {**WRAPPERS, **CLASSIC_CONTROL, **PIPELINE}.items():
        _registry.setdefault(key, _Entry(codec, False))
    from functions._envstate_mujoco import MUJOCO_ENV, MujocoCodec

    _registry.setdefault(MUJOCO_ENV, _Entry(MujocoCodec(), True))
