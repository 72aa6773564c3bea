"""Pure simulator code behind the rollout handler: step env streams with a policy, cut fragments.

Nothing here knows about Lambda, events on the wire or S3: `simulate` takes a validated
`RolloutRequest`, ready envs and an ``act`` function, and returns `device.RolloutBatch` fragments.
Env streams step in lockstep; an episode that ends is reset in place (autoreset) and its real last
observation is kept in ``final_obs``. Transition ``seq`` numbers run 0..T-1 per stream across all
fragments of one rollout, so ``(source, stream_base + i, seq)`` identifies every transition.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from device import RolloutBatch
from functions._errors import SimulationError
from functions._events import EnvSpec, RolloutRequest

#: ``act(obs[N, *S]) -> actions[N, *A]``.
Act = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, kw_only=True)
class Simulation:
    """What one rollout produced."""

    fragments: tuple[RolloutBatch, ...]
    steps: int
    """Steps per env stream."""
    episodes: int
    """Episodes that ended (terminated or truncated) during the rollout."""
    episode_returns: tuple[float, ...]
    """Undiscounted return of each ended episode, in the order they ended."""


def env_key(spec: EnvSpec) -> str:
    """A cache key for envs made from `spec`."""
    return spec.id + "|" + json.dumps(dict(spec.kwargs), sort_keys=True, default=str)


def make_envs(spec: EnvSpec, num_envs: int) -> list[Any]:
    """Make `num_envs` gymnasium envs (imports gymnasium on first use, not at module import).

    Raises:
        SimulationError: the id is not registered or the kwargs are refused.
    """
    from device import require

    gym = require("gymnasium", extra="functions", purpose="simulating environments")
    try:
        return [gym.make(spec.id, **dict(spec.kwargs)) for _ in range(num_envs)]
    except Exception as exc:  # gymnasium raises several types (NameNotFound, TypeError, ...) for a bad spec
        raise SimulationError(f"make_envs: gymnasium.make({spec.id!r}, **{dict(spec.kwargs)!r}) failed: "
                              f"{type(exc).__name__}: {exc}; send a registered env id and its valid kwargs") from exc


def random_act(envs: Sequence[Any], seeds: Sequence[int]) -> Act:
    """An ``act`` that samples the action space uniformly, seeded by the streams' seeds.

    Discrete and Box spaces are sampled for all streams in one vectorised call; other spaces fall
    back to each env's own ``action_space.sample()``.
    """
    space = envs[0].action_space
    rng = np.random.default_rng(list(seeds))
    n = len(envs)
    if hasattr(space, "n") and not hasattr(space, "low"):
        start, count = int(getattr(space, "start", 0)), int(space.n)
        return lambda obs: rng.integers(start, start + count, size=n, dtype=np.int64)
    if hasattr(space, "low") and hasattr(space, "high") and np.all(np.isfinite(space.low)) and np.all(
            np.isfinite(space.high)):
        low, high, dtype = np.asarray(space.low), np.asarray(space.high), space.dtype
        return lambda obs: rng.uniform(low, high, size=(n, *low.shape)).astype(dtype)
    for env, seed in zip(envs, seeds, strict=True):
        env.action_space.seed(seed)
    return lambda obs: np.stack([np.asarray(env.action_space.sample()) for env in envs])


def simulate(request: RolloutRequest, envs: Sequence[Any], act: Act, *, policy_version: int) -> Simulation:
    """Run the rollout `request` asks for on `envs` (one per stream) with `act`.

    Args:
        request: The validated event.
        envs: ``request.num_envs`` gymnasium envs; each is reset with its seed first.
        act: Batched policy, ``obs[N, *S] -> actions[N, *A]``.
        policy_version: Recorded with every transition.

    Raises:
        SimulationError: an env refused an action or returned a malformed step.
    """
    n = request.num_envs
    if len(envs) != n:
        raise SimulationError(f"simulate: got {len(envs)} envs but request {request.rollout_id!r} "
                              f"has num_envs={n}")
    horizon = request.steps if request.steps is not None else request.max_steps
    first = [env.reset(seed=seed)[0] for env, seed in zip(envs, request.seeds, strict=True)]
    obs_now = np.asarray(np.stack(first), dtype=np.float32)
    obs_shape = obs_now.shape[1:]
    probe = np.asarray(act(obs_now))
    if probe.shape[:1] != (n,):
        raise SimulationError(f"simulate: the policy returned actions of shape {probe.shape} for {n} observations; "
                              "it must return one action per env (shape [N, ...])")
    act_shape, act_dtype = probe.shape[1:], probe.dtype
    obs = np.zeros((horizon, n, *obs_shape), np.float32)
    final_obs = np.zeros_like(obs)
    actions = np.zeros((horizon, n, *act_shape), act_dtype)
    rewards = np.zeros((horizon, n), np.float32)
    terminations = np.zeros((horizon, n), bool)
    truncations = np.zeros((horizon, n), bool)
    running = np.zeros(n, np.float64)
    returns: list[float] = []
    pending_action: np.ndarray | None = probe
    # Discrete actions go to env.step as Python ints (what gymnasium's spaces expect); others as arrays.
    scalar_int = probe.ndim == 1 and np.issubdtype(act_dtype, np.integer)
    t = 0
    while t < horizon:
        a = pending_action if pending_action is not None else np.asarray(act(obs_now))
        pending_action = None
        obs[t] = obs_now
        actions[t] = a
        step_actions = a.tolist() if scalar_int else list(a)
        for i, env in enumerate(envs):
            step_action = step_actions[i]
            try:
                o, r, term, trunc, _ = env.step(step_action)
            except Exception as exc:  # an env may raise anything on a bad action; report it as a result
                raise SimulationError(f"simulate: {request.env.id} step {t} of env {i} failed with action "
                                      f"{a[i]!r}: {type(exc).__name__}: {exc}") from exc
            rewards[t, i] = r
            running[i] += float(r)
            if term or trunc:
                terminations[t, i], truncations[t, i] = bool(term), bool(trunc)
                final_obs[t, i] = o
                returns.append(float(running[i]))
                running[i] = 0.0
                o, _ = env.reset()
            obs_now[i] = o
        t += 1
        if request.episodes is not None and len(returns) >= request.episodes:
            break
    steps = t
    frag = request.fragment_length or steps
    worker = np.arange(request.stream_base, request.stream_base + n, dtype=np.int64)
    version = np.full((steps, n), policy_version, np.int64)
    seq = np.broadcast_to(np.arange(steps, dtype=np.int64)[:, None], (steps, n))
    fragments = []
    for start in range(0, steps, frag):
        stop = min(start + frag, steps)
        next_obs = obs[stop] if stop < steps else obs_now
        fragments.append(RolloutBatch(
            source=request.source, obs=obs[start:stop], actions=actions[start:stop], rewards=rewards[start:stop],
            terminations=terminations[start:stop], truncations=truncations[start:stop],
            final_obs=final_obs[start:stop], next_obs=np.array(next_obs), policy_version=version[start:stop],
            worker=worker, seq=np.ascontiguousarray(seq[start:stop])))
    return Simulation(fragments=tuple(fragments), steps=steps, episodes=len(returns), episode_returns=tuple(returns))
