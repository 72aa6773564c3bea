"""The one place the learner gets its environments from: `make_vector_env(env_id, num_envs, seed, mode)`.

Every vector env this factory returns follows one contract, which the learner relies on:

- a `gymnasium.vector.VectorEnv` whose single observation space is a flat `Box` or image frames (uint8, ``[H, W]``,
  ``[H, W, C]`` or a frame stack ``[k, H, W, C]``) and whose single action space is a `Discrete` or a `Box`
  (anything else is refused by `check_spaces`, naming the space);
- every env made through the run's observation pipeline (`device.ObsPipeline`: a lossy codec's round trip, frame
  stacking), so the observations are what the policy sees in every mode and at the edge;
- **same-step autoreset** (``gymnasium.vector.AutoresetMode.SAME_STEP``): when sub-env ``i`` ends at
  a step, that step already returns the first observation of the next episode, and the real last
  observation is in ``info["final_obs"][i]`` (masked by ``info["_final_obs"]``). Gymnasium 1.x
  defaults to NEXT_STEP, where the step after the end is a dummy reset step; with SAME_STEP every
  step is a real transition and a truncated episode can be bootstrapped from its real final
  observation.

Modes are a registry, not ``if``s: ``"sync"`` runs the envs in this process (`SyncVectorEnv`). The
co-located shared-memory source registers itself here as ``"colocated"`` (a drop-in VectorEnv with
the same contract), so the learner never changes when a new source lands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from device import ConfigError, MissingDependencyError, ObsPipeline, env_maker, frame_shape, is_image, require

if TYPE_CHECKING:
    import gymnasium

VectorEnvBuilder = Callable[..., "gymnasium.vector.VectorEnv[Any, Any, Any]"]
"""Signature of a mode's builder: ``builder(env_id, *, num_envs, seed[, pipeline]) -> VectorEnv`` (same-step
autoreset); `make_vector_env` passes ``pipeline`` only when it is not the identity, so a builder that makes plain
envs need not take it."""


def _make_sync(env_id: str, *, num_envs: int, seed: int, pipeline: ObsPipeline | None = None
               ) -> gymnasium.vector.VectorEnv[Any, Any, Any]:
    gym = require("gymnasium", extra="cloud", purpose="training environments")
    envs = gym.vector.SyncVectorEnv(
        [env_maker(env_id, pipeline) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    envs.reset(seed=seed)
    return cast("gymnasium.vector.VectorEnv[Any, Any, Any]", envs)


VECTOR_ENV_MODES: dict[str, VectorEnvBuilder] = {"sync": _make_sync}
"""Registered modes of `make_vector_env`; another source adds itself with ``VECTOR_ENV_MODES[name] = builder``."""


def make_vector_env(
    env_id: str, *, num_envs: int, seed: int, mode: str = "sync", pipeline: ObsPipeline | None = None
) -> gymnasium.vector.VectorEnv[Any, Any, Any]:
    """Build `num_envs` copies of the gymnasium env `env_id` (through `pipeline`) as one same-step-autoreset vector env.

    The returned env has already been reset with `seed` (sub-env ``i`` gets ``seed + i``); call
    ``reset()`` without a seed to continue the same random streams.

    Raises:
        ConfigError: `mode` is not registered, `num_envs` is not positive, `env_id` is not a
            registered gymnasium env, or its spaces are not Box observations with Discrete or Box
            actions.
    """
    if mode not in VECTOR_ENV_MODES:
        raise ConfigError(f"make_vector_env: mode {mode!r} is not available; choose one of {sorted(VECTOR_ENV_MODES)}")
    if num_envs < 1:
        raise ConfigError(f"make_vector_env: num_envs must be >= 1, got {num_envs}")
    gym = require("gymnasium", extra="cloud", purpose="training environments")
    _known(env_id, "make_vector_env")
    extra = {} if pipeline is None or pipeline == ObsPipeline() else {"pipeline": pipeline}
    try:
        envs = VECTOR_ENV_MODES[mode](env_id, num_envs=num_envs, seed=seed, **extra)
    except gym.error.DependencyNotInstalled as exc:
        raise MissingDependencyError(f"make_vector_env: {env_id!r} needs a package that is not installed: "
                                     f"{exc}") from exc
    try:
        check_spaces(env_id, envs.single_observation_space, envs.single_action_space)
        autoreset = envs.metadata.get("autoreset_mode")
        if autoreset is not None and autoreset != gym.vector.AutoresetMode.SAME_STEP:
            raise ConfigError(f"make_vector_env: mode {mode!r} built a vector env with autoreset mode {autoreset}; "
                              "the learner needs AutoresetMode.SAME_STEP")
    except ConfigError:
        envs.close()
        raise
    return envs


def _known(env_id: str, caller: str) -> None:
    """Refuse an env id gymnasium does not know (strata's own ids are registered first)."""
    from device._obs_pipeline import register_envs

    gym = require("gymnasium", extra="cloud", purpose="training environments")
    register_envs()
    if env_id not in gym.registry and ":" not in env_id:
        raise ConfigError(f"{caller}: {env_id!r} is not a registered gymnasium env id; "
                          f"list them with `python -c 'import gymnasium; gymnasium.pprint_registry()'`")


def is_image_space(space: Any) -> bool:
    """Whether a gymnasium space holds image frames (uint8 Box of two or more axes): a CNN's input."""
    shape = getattr(space, "shape", None)
    return shape is not None and getattr(space, "dtype", None) is not None and is_image(tuple(shape), space.dtype)


def check_spaces(env_id: str, observation_space: Any, action_space: Any) -> None:
    """Raise `ConfigError` unless the spaces are a flat Box or image observation and a Discrete or Box action.

    Args:
        env_id: Named in the message.
        observation_space: The env's single (unbatched) observation space.
        action_space: The env's single (unbatched) action space.
    """
    gym = require("gymnasium", extra="cloud", purpose="training environments")
    if not isinstance(observation_space, gym.spaces.Box):
        raise ConfigError(f"{env_id}: observation space {observation_space} is not supported; "
                          "strata's PPO needs a Box observation space (flatten the observation with a wrapper)")
    if not isinstance(action_space, gym.spaces.Discrete | gym.spaces.Box):
        raise ConfigError(f"{env_id}: action space {action_space} is not supported; "
                          "strata's PPO needs a Discrete or a Box action space")
    if is_image_space(observation_space):
        shape = tuple(observation_space.shape)
        frame = frame_shape(shape)
        if len(shape) - len(frame) > 1 or min(frame[:2]) < 36:
            raise ConfigError(f"{env_id}: image observations of shape {shape} are not [H, W], [H, W, C] or a frame "
                              "stack [k, H, W, C] of frames at least 36 x 36 (the Nature CNN's smallest input); "
                              "resize them with gymnasium.wrappers.ResizeObservation")
    elif len(observation_space.shape) != 1:
        raise ConfigError(f"{env_id}: observation space {observation_space} is not flat or an image; strata's "
                          "learners need a 1-D Box observation space (flatten it with "
                          "gymnasium.wrappers.FlattenObservation) or uint8 image frames")
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1:
        raise ConfigError(f"{env_id}: action space {action_space} is not flat; strata's PPO needs a 1-D Box "
                          "action space")
    if isinstance(action_space, gym.spaces.Discrete) and action_space.start != 0:
        raise ConfigError(f"{env_id}: action space {action_space} starts at {action_space.start}; "
                          "strata's PPO needs Discrete actions numbered from 0")



def probe_spaces(env_id: str, pipeline: ObsPipeline | None = None) -> tuple[Any, Any]:
    """Return ``(observation_space, action_space)`` of one `env_id` instance made through `pipeline`, checked.

    The spaces pass `check_spaces` first.

    Raises:
        ConfigError: `env_id` is not registered, or its spaces are not supported.
        MissingDependencyError: The env needs a package that is not installed (e.g. Box2D).
    """
    from device import make_env

    gym = require("gymnasium", extra="cloud", purpose="training environments")
    _known(env_id, "train")
    try:
        probe = make_env(env_id, pipeline)
    except gym.error.DependencyNotInstalled as exc:
        raise MissingDependencyError(f"train: {env_id!r} needs a package that is not installed: {exc}") from exc
    except ImportError as exc:  # an env whose module imports an optional package (jax, shimmy) at make time
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            raise MissingDependencyError(f"train: {env_id!r} needs the package {exc.name!r}, which is not "
                                         f"installed; install it (`pip install {exc.name}`) or pick another env"
                                         ) from exc
        raise MissingDependencyError(f"train: {env_id!r} needs a package that is not installed: {exc}") from exc
    except gym.error.Error as exc:  # the pipeline refused the env (a lossy codec on non-image observations)
        raise ConfigError(f"train: {env_id}: {exc}") from None
    try:
        check_spaces(env_id, probe.observation_space, probe.action_space)
        return probe.observation_space, probe.action_space
    finally:
        probe.close()


def episode_returns(env: Any, act: Callable[[Any], Any], *, episodes: int, seed: int) -> list[float]:
    """Undiscounted returns of `episodes` episodes of `act` in the single env `env` (episode ``i`` seeded ``seed + i``).

    `act` gets each observation as a float32 array and returns the action to step with.
    """
    import numpy as np

    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(np.asarray(obs, dtype=np.float32)))
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
    return returns
