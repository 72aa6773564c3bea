"""Pure simulator code behind the rollout handler: step env streams with a policy, cut fragments.

Nothing here knows about Lambda, events on the wire or S3: `simulate` takes a validated
`RolloutRequest`, ready envs and an ``act`` function, and returns `device.RolloutBatch` fragments.
Env streams step in lockstep; an episode that ends is reset in place (autoreset) and its real last
observation is kept in ``final_obs``. Transition ``seq`` numbers run seq_base..seq_base+T-1 per stream
across all fragments of one rollout, so ``(source, stream_base + i, seq)`` identifies every transition.

A stream given a `functions._envstate.StreamCarry` continues that running episode (the env is restored,
not reset); when the request asks for carries, every stream's running episode is captured at the end.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from device import RolloutBatch
from functions._envstate import StreamCarry, capture, codec_gap, encode_carry, obs_dtype, write_checked
from functions._errors import NoEnvCodecError, SimulationError
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
    """Undiscounted return of each ended episode, in the order they ended (carried episodes: whole)."""
    carries: tuple[bytes | None, ...] | None = None
    """Each stream's running episode at the end, encoded; None when not asked for."""
    carry_note: str | None = None
    """Why `carries` holds None entries (the env has no env-state codec)."""


def env_key(spec: EnvSpec) -> str:
    """A cache key for envs made from `spec`."""
    return spec.id + "|" + json.dumps([dict(spec.kwargs), spec.pipeline.to_json()], sort_keys=True, default=str)


def make_envs(spec: EnvSpec, num_envs: int) -> list[Any]:
    """Make `num_envs` gymnasium envs through the spec's observation pipeline (gymnasium imported on first use).

    Raises:
        SimulationError: the id is not registered or the kwargs are refused.
    """
    from device import make_env, require

    require("gymnasium", extra="functions", purpose="simulating environments")
    try:
        return [make_env(spec.id, spec.pipeline, **dict(spec.kwargs)) for _ in range(num_envs)]
    except Exception as exc:  # gymnasium raises several types (NameNotFound, TypeError, ...) for a bad spec
        raise SimulationError(f"make_envs: gymnasium.make({spec.id!r}, **{dict(spec.kwargs)!r}) failed: "
                              f"{type(exc).__name__}: {exc}; send a registered env id and its valid kwargs") from exc


def action_seed(seeds: Sequence[int], salt: int = 0) -> list[int]:
    """The seed of a rollout's action sampler: its streams' seeds, plus `salt` when non-zero.

    The salt is a continued rollout's ``seq_base``: every invocation of a stream draws fresh actions,
    and a redelivery of one invocation repeats its own.
    """
    return [*seeds, salt] if salt else list(seeds)


def random_act(envs: Sequence[Any], seeds: Sequence[int], *, salt: int = 0) -> Act:
    """An ``act`` that samples the action space uniformly, seeded by the streams' seeds (and `salt`).

    Discrete and Box spaces are sampled for all streams in one vectorised call; other spaces fall
    back to each env's own ``action_space.sample()``.
    """
    space = envs[0].action_space
    rng = np.random.default_rng(action_seed(seeds, salt))
    n = len(envs)
    if hasattr(space, "n") and not hasattr(space, "low"):
        start, count = int(getattr(space, "start", 0)), int(space.n)
        return lambda obs: rng.integers(start, start + count, size=n, dtype=np.int64)
    if hasattr(space, "low") and hasattr(space, "high") and np.all(np.isfinite(space.low)) and np.all(
            np.isfinite(space.high)):
        low, high, dtype = np.asarray(space.low), np.asarray(space.high), space.dtype
        return lambda obs: rng.uniform(low, high, size=(n, *low.shape)).astype(dtype)
    for env, seed in zip(envs, seeds, strict=True):
        env.action_space.seed(int(np.random.SeedSequence(action_seed([seed], salt)).generate_state(1)[0]))
    return lambda obs: np.stack([np.asarray(env.action_space.sample()) for env in envs])


def simulate(request: RolloutRequest, envs: Sequence[Any], act: Act, *, policy_version: int,
             carries: Sequence[StreamCarry | None] | None = None) -> Simulation:
    """Run the rollout `request` asks for on `envs` (one per stream) with `act`.

    Args:
        request: The validated event.
        envs: ``request.num_envs`` gymnasium envs; each is reset with its seed first, or restored from its carry.
        act: Batched policy, ``obs[N, *S] -> actions[N, *A]``.
        policy_version: Recorded with every transition.
        carries: Per stream, the running episode to continue (from `decode_carry` against its env), or None.

    Raises:
        SimulationError: an env refused an action or returned a malformed step.
    """
    n = request.num_envs
    if len(envs) != n:
        raise SimulationError(f"simulate: got {len(envs)} envs but request {request.rollout_id!r} "
                              f"has num_envs={n}")
    horizon = request.steps if request.steps is not None else request.max_steps
    carries = list(carries) if carries is not None else [None] * n
    running = np.zeros(n, np.float64)
    lengths = np.zeros(n, np.int64)
    first = []
    dtype = obs_dtype(envs[0].observation_space)  # image frames stay uint8, everything else float32
    for i, (env, seed, carry) in enumerate(zip(envs, request.seeds, carries, strict=True)):
        if carry is None:
            first.append(np.asarray(env.reset(seed=seed)[0], dtype=dtype))
        else:
            write_checked(env, carry.state)  # decode_carry checked it against this env
            first.append(carry.obs)
            running[i], lengths[i] = carry.episode_return, carry.episode_length
    obs_now = np.asarray(np.stack(first), dtype=dtype)
    obs_shape = obs_now.shape[1:]
    probe = np.asarray(act(obs_now))
    if probe.shape[:1] != (n,):
        raise SimulationError(f"simulate: the policy returned actions of shape {probe.shape} for {n} observations; "
                              "it must return one action per env (shape [N, ...])")
    act_shape, act_dtype = probe.shape[1:], probe.dtype
    obs = np.zeros((horizon, n, *obs_shape), dtype)
    final_obs = np.zeros_like(obs)
    actions = np.zeros((horizon, n, *act_shape), act_dtype)
    rewards = np.zeros((horizon, n), np.float32)
    terminations = np.zeros((horizon, n), bool)
    truncations = np.zeros((horizon, n), bool)
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
            lengths[i] += 1
            if term or trunc:
                terminations[t, i], truncations[t, i] = bool(term), bool(trunc)
                final_obs[t, i] = o
                returns.append(float(running[i]))
                running[i], lengths[i] = 0.0, 0
                o, _ = env.reset()
            obs_now[i] = o
        t += 1
        if request.episodes is not None and len(returns) >= request.episodes:
            break
    steps = t
    frag = request.fragment_length or steps
    worker = np.arange(request.stream_base, request.stream_base + n, dtype=np.int64)
    version = np.full((steps, n), policy_version, np.int64)
    seq = np.broadcast_to(np.arange(request.seq_base, request.seq_base + steps, dtype=np.int64)[:, None], (steps, n))
    fragments = []
    for start in range(0, steps, frag):
        stop = min(start + frag, steps)
        next_obs = obs[stop] if stop < steps else obs_now
        fragments.append(RolloutBatch(
            source=request.source, obs=obs[start:stop], actions=actions[start:stop], rewards=rewards[start:stop],
            terminations=terminations[start:stop], truncations=truncations[start:stop],
            final_obs=final_obs[start:stop], next_obs=np.array(next_obs), policy_version=version[start:stop],
            worker=worker, seq=np.ascontiguousarray(seq[start:stop])))
    out, note = None, None
    if request.carry is not None:
        out, note = _capture_all(request, envs, obs_now, running, lengths, steps)
    return Simulation(fragments=tuple(fragments), steps=steps, episodes=len(returns), episode_returns=tuple(returns),
                      carries=out, carry_note=note)


def _capture_all(request: RolloutRequest, envs: Sequence[Any], obs_now: np.ndarray, running: np.ndarray,
                 lengths: np.ndarray, steps: int) -> tuple[tuple[bytes | None, ...], str | None]:
    """Every stream's running episode, encoded; or all None and the one-line note when the env has no codec."""
    gap = codec_gap(envs[0])
    try:
        if gap is None:
            return tuple(encode_carry(StreamCarry(state=capture(env), obs=obs_now[i],
                                                  episode_return=float(running[i]),
                                                  episode_length=int(lengths[i])))
                         for i, env in enumerate(envs)), None
        reason = f"its {gap} layer has no env-state codec"
    except NoEnvCodecError as exc:
        reason = str(exc)
    return (None,) * len(envs), (
        f"{request.env.id}: episodes cannot continue across invocations ({reason}), so they end at the fragment "
        f"length ({steps} steps per invocation); register a codec with functions.register_env_codec "
        "(see functions/_envstate.py)")
