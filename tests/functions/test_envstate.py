"""Env-state codecs: capture/restore is bit-exact, an episode continued over N invocations matches one process."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from device import RolloutBatch, WireError
from functions import FieldCodec, NoEnvCodecError, register_env_codec
from functions import _envstate as envstate
from functions._envstate import (
    Field,
    capture,
    codec_gap,
    decode_carry,
    decode_env_state,
    encode_env_state,
    restore,
)
from functions._handlers import reset_caches, rollout_handler

CLASSIC = ["CartPole-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1", "Acrobot-v1"]
#: Ant and Humanoid read body positions computed by the previous step before they step: the codec carries them.
MUJOCO = ["HalfCheetah-v5", "Hopper-v5", "Ant-v5", "Humanoid-v5", "Reacher-v5"]


def _actions(env_id: str, count: int, seed: int) -> list[Any]:
    space = gym.make(env_id).action_space
    space.seed(seed)
    return [space.sample() for _ in range(count)]


def _step_log(env: Any, actions: list[Any], *, restart_every: int = 0, env_id: str = "") -> list[tuple[Any, ...]]:
    """Step `env` through `actions` with autoreset; every `restart_every` steps move to a fresh env via the wire."""
    log: list[tuple[Any, ...]] = []
    for t, a in enumerate(actions):
        if restart_every and t and t % restart_every == 0:
            blob = encode_env_state(capture(env))
            env = gym.make(env_id)
            restore(env, decode_env_state(blob, env))
        o, r, term, trunc, _ = env.step(a)
        log.append((np.asarray(o).tobytes(), float(r), bool(term), bool(trunc)))
        if term or trunc:
            o, _ = env.reset()
            log.append(("reset", np.asarray(o).tobytes()))
    return log


@pytest.mark.parametrize("env_id", CLASSIC)
def test_capture_and_restore_through_the_wire_is_bit_exact(env_id: str) -> None:
    actions = _actions(env_id, 1100, seed=1)  # past every classic env's time limit (MountainCarContinuous: 999)
    reference = gym.make(env_id)
    reference.reset(seed=3)
    want = _step_log(reference, actions)
    moved = gym.make(env_id)
    moved.reset(seed=3)
    got = _step_log(moved, actions, restart_every=37, env_id=env_id)
    assert got == want
    # the run crossed episode ends (the RNG and the time limit travelled, not just the physics)
    assert any(entry[0] == "reset" for entry in want)


def test_the_rng_and_the_time_limit_travel() -> None:
    env = gym.make("Pendulum-v1")
    env.reset(seed=11)
    for _ in range(150):
        env.step(np.array([0.5], dtype=np.float32))
    other = gym.make("Pendulum-v1")
    restore(other, decode_env_state(encode_env_state(capture(env)), other))
    assert other.get_wrapper_attr("_elapsed_steps") == 150
    assert other.unwrapped.np_random.random() == env.unwrapped.np_random.random()
    assert other.unwrapped.np_random_seed == env.unwrapped.np_random_seed == 11
    for _ in range(50):
        out_a, out_b = env.step(np.array([0.1], np.float32)), other.step(np.array([0.1], np.float32))
    assert out_a[3] and out_b[3]  # both truncate at step 200


# ---- validation: a state that does not fit the env is a WireError naming the mismatch --------------------------

def _state(env_id: str = "CartPole-v1", **make: Any) -> tuple[Any, bytes]:
    env = gym.make(env_id, **make)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    return env, encode_env_state(capture(env))


def test_a_state_of_another_env_is_refused() -> None:
    _, blob = _state("CartPole-v1")
    with pytest.raises(WireError, match=re.escape("captured from env 'CartPole-v1', cannot continue in 'Pendulum-v1'")):
        decode_env_state(blob, gym.make("Pendulum-v1"))


def test_a_state_of_an_env_made_with_other_settings_is_refused() -> None:
    _, blob = _state("CartPole-v1", max_episode_steps=200)
    with pytest.raises(WireError, match=re.escape("_max_episode_steps is 200 in the state but 500 in this env")):
        decode_env_state(blob, gym.make("CartPole-v1"))


def test_wrong_shapes_and_dtypes_are_refused() -> None:
    env, _ = _state()
    state = capture(env)
    inner = state.layers[-1]
    bad_shape = envstate.EnvState(env_id=state.env_id, layers=(*state.layers[:-1], envstate.LayerState(
        type=inner.type, meta=inner.meta, arrays={**inner.arrays, "state": np.zeros(3)})))
    with pytest.raises(WireError, match=re.escape("field 'state' has shape (3,), this env needs (4,)")):
        decode_env_state(encode_env_state(bad_shape), gym.make("CartPole-v1"))
    bad_dtype = envstate.EnvState(env_id=state.env_id, layers=(*state.layers[:-1], envstate.LayerState(
        type=inner.type, meta=inner.meta, arrays={**inner.arrays, "state": np.zeros(4, np.int32)})))
    with pytest.raises(WireError, match=re.escape("field 'state' has dtype int32, this env needs one of")):
        restore(gym.make("CartPole-v1"), bad_dtype)  # restore checks a hand-built state too
    with pytest.raises(WireError, match="bad magic"):
        decode_env_state(b"not a state at all", gym.make("CartPole-v1"))


def test_a_carry_with_a_wrong_observation_is_refused() -> None:
    env, _ = _state()
    blob = envstate.encode_carry(envstate.StreamCarry(state=capture(env), obs=np.zeros(5, np.float32)))
    with pytest.raises(WireError, match=re.escape("the observation must be float32 of shape (4,)")):
        decode_carry(blob, gym.make("CartPole-v1"))


# ---- the rollout handler: one episode continued across N invocations --------------------------------------------

def _invoke(event: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(rollout_handler(json.loads(json.dumps(event)), None)))
    assert out["ok"], out
    return out


def _batches(result: dict[str, Any]) -> list[Any]:
    return [RolloutBatch.from_bytes(base64.b64decode(f)) for f in result["fragments"]]


def _continued(env_id: str, invocations: int, steps: int, *, num_envs: int = 2, seed: int = 7) -> list[Any]:
    """Run one rollout as `invocations` handler calls, each on a different "instance" (caches dropped or dirtied)."""
    carry: list[Any] = [None] * num_envs
    batches = []
    for k in range(invocations):
        event = {"rollout_id": f"r-{k}", "env": {"id": env_id}, "num_envs": num_envs, "seed": seed, "steps": steps,
                 "policy": {"kind": "random"}, "carry": carry, "seq_base": k * steps}
        result = _invoke(event)
        assert "carry_note" not in result
        carry = result["carry"]
        assert all(isinstance(c, str) for c in carry)
        batches += _batches(result)
        if k % 2:
            reset_caches()  # the next invocation lands on a cold instance
        else:
            from functions._handlers import _envs_cache

            for envs in _envs_cache.values():  # ... or on a warm one whose envs ran someone else's episode
                for env in envs:
                    env.reset(seed=999)
                    env.step(env.action_space.sample())
    reset_caches()
    return batches


def _replay(env_id: str, seed: int, actions: np.ndarray) -> dict[str, np.ndarray]:
    env = gym.make(env_id)
    o, _ = env.reset(seed=seed)
    out: dict[str, list[Any]] = {"obs": [], "rewards": [], "terminations": [], "truncations": [], "final_obs": []}
    for a in actions:
        out["obs"].append(np.asarray(o, np.float32))
        step_a = int(a) if np.ndim(a) == 0 else a
        o, r, term, trunc, _ = env.step(step_a)
        out["rewards"].append(np.float32(r))
        out["terminations"].append(term)
        out["truncations"].append(trunc)
        out["final_obs"].append(np.asarray(o, np.float32) if term or trunc else np.zeros_like(out["obs"][-1]))
        if term or trunc:
            o, _ = env.reset()
    return {k: np.array(v) for k, v in out.items()}


@pytest.fixture
def needs(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """Skip a MuJoCo case where mujoco is not installed; run it in tmp_path (MuJoCo writes MUJOCO_LOG.TXT to cwd)."""

    def check(env_id: str) -> None:
        if env_id in MUJOCO:
            pytest.importorskip("mujoco", reason="the MuJoCo codec is tested where mujoco is installed "
                                "(pip install 'gymnasium[mujoco]')")
            monkeypatch.chdir(tmp_path)

    return check


@pytest.mark.parametrize("invocations", [2, 5, 50])
@pytest.mark.parametrize("env_id", [*CLASSIC, "HalfCheetah-v5", "Ant-v5"])
def test_an_episode_continued_across_invocations_matches_one_process(env_id: str, invocations: int,
                                                                    needs: Any) -> None:
    needs(env_id)
    total = 300 if invocations < 50 else 350
    steps = total // invocations
    batches = _continued(env_id, invocations, steps)
    for j in range(2):
        seqs = np.concatenate([b.seq[:, j] for b in batches])
        assert seqs.tolist() == list(range(invocations * steps))  # one stream, counting on across invocations
        got = {name: np.concatenate([getattr(b, name)[:, j] for b in batches])
               for name in ("obs", "actions", "rewards", "terminations", "truncations", "final_obs")}
        want = _replay(env_id, 7 + j, got["actions"])
        for name in ("obs", "rewards", "terminations", "truncations", "final_obs"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{env_id} stream {j}: {name} differs")
    if env_id in ("CartPole-v1", "Pendulum-v1"):
        # episodes ended inside later invocations: the carry held the time limit and the RNG through them
        assert sum(int(b.truncations.sum() + b.terminations.sum()) for b in batches) > 0


def test_returned_episode_returns_span_invocations() -> None:
    carry: list[Any] = [None]
    returns: list[float] = []
    for k in range(4):
        out = _invoke({"rollout_id": f"p-{k}", "env": {"id": "Pendulum-v1"}, "seed": 1, "steps": 60,
                       "policy": {"kind": "random"}, "carry": carry, "seq_base": 60 * k})
        carry = out["carry"]
        returns += out["episode_returns"]
    reset_caches()
    assert len(returns) == 1  # the 200-step episode ended in the 4th invocation, and its return is whole
    assert returns[0] < -200  # a random pendulum collects roughly -1000 over 200 steps, not a fragment's share


def test_a_tampered_carry_is_an_error_result_naming_the_stream() -> None:
    out = _invoke({"rollout_id": "c-0", "env": {"id": "CartPole-v1"}, "num_envs": 2, "steps": 5,
                   "policy": {"kind": "random"}, "carry": [None, None]})
    pendulum = _invoke({"rollout_id": "c-1", "env": {"id": "Pendulum-v1"}, "steps": 5, "policy": {"kind": "random"},
                        "carry": [None]})
    bad = rollout_handler({"rollout_id": "c-2", "env": {"id": "CartPole-v1"}, "num_envs": 2, "steps": 5,
                           "policy": {"kind": "random"}, "carry": [out["carry"][0], pendulum["carry"][0]]}, None)
    reset_caches()
    assert bad["ok"] is False and bad["error"]["field"] == "carry[1]"
    assert "cannot continue in 'CartPole-v1'" in bad["error"]["message"]
    wrong_length = rollout_handler({"rollout_id": "c-3", "env": {"id": "CartPole-v1"}, "num_envs": 2, "steps": 5,
                                    "policy": {"kind": "random"}, "carry": [None]}, None)
    assert wrong_length["error"]["field"] == "carry"


# ---- an env without a codec, then with one registered --------------------------------------------------------

class Counter(gym.Env[np.ndarray, int]):
    """A user's env: counts up with noise, terminates at 30."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1e9, 1e9, (2,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.level = 0.0
        self.ticks = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.level, self.ticks = float(self.np_random.normal()), 0
        return np.array([self.level, self.ticks], np.float64), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.level += action + float(self.np_random.normal())
        self.ticks += 1
        return np.array([self.level, self.ticks], np.float64), self.level, self.ticks >= 30, False, {}


@pytest.fixture
def counter_env(monkeypatch: pytest.MonkeyPatch) -> str:
    env_id = "StrataTestCounter-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=Counter, max_episode_steps=100)
    envstate._load_builtins()
    monkeypatch.setattr(envstate, "_registry", dict(envstate._registry))  # registrations end with the test
    return env_id


def test_an_env_without_a_codec_keeps_todays_behaviour_with_a_note(counter_env: str) -> None:
    assert codec_gap(gym.make(counter_env)) == "Counter"
    with pytest.raises(NoEnvCodecError, match=re.escape("register one with functions.register_env_codec")):
        env = gym.make(counter_env)
        env.reset(seed=0)
        capture(env)
    out = _invoke({"rollout_id": "n-0", "env": {"id": counter_env}, "steps": 10, "policy": {"kind": "random"},
                   "carry": [None]})
    reset_caches()
    assert out["carry"] == [None]
    assert out["carry_note"] == (
        "StrataTestCounter-v0: episodes cannot continue across invocations (its Counter layer has no env-state "
        "codec), so they end at the fragment length (10 steps per invocation); register a codec with "
        "functions.register_env_codec (see functions/_envstate.py)")


@pytest.mark.parametrize("invocations", [2, 5, 50])
def test_a_registered_codec_carries_a_users_env_bit_exactly(counter_env: str, invocations: int) -> None:
    register_env_codec(Counter, FieldCodec([Field("level"), Field("ticks", dtypes=("int64",))]))
    batches = _continued(counter_env, invocations, 100 // invocations, num_envs=1)
    got = {name: np.concatenate([getattr(b, name)[:, 0] for b in batches]) for name in ("obs", "actions", "rewards")}
    want = _replay(counter_env, 7, got["actions"])
    np.testing.assert_array_equal(got["obs"], want["obs"])
    np.testing.assert_array_equal(got["rewards"], want["rewards"])
    assert sum(int(b.terminations.sum()) for b in batches) == 3  # 100 steps: episodes of 30 ended 3 times


# ---- MuJoCo ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("env_id", MUJOCO)
def test_mujoco_envs_continue_bit_exactly(env_id: str, needs: Any) -> None:
    needs(env_id)
    actions = _actions(env_id, 120, seed=2)
    reference = gym.make(env_id)
    reference.reset(seed=5)
    want = _step_log(reference, actions)
    moved = gym.make(env_id)
    moved.reset(seed=5)
    assert _step_log(moved, actions, restart_every=17, env_id=env_id) == want


def test_carries_and_seq_base_round_trip_through_the_event_and_the_result() -> None:
    from functions._events import (
        EnvSpec,
        RandomPolicy,
        RolloutRequest,
        RolloutResult,
        parse_result,
        parse_rollout_event,
    )

    request = RolloutRequest(rollout_id="r", env=EnvSpec(id="CartPole-v1"), policy=RandomPolicy(), num_envs=2,
                             seeds=(1, 2), steps=4, seq_base=40, carry=(b"\x00state", None))
    parsed = parse_rollout_event(json.loads(json.dumps(request.to_event())))
    assert (parsed.seq_base, parsed.carry) == (40, (b"\x00state", None))
    result = RolloutResult(rollout_id="r", request_id="q", policy_version=0, num_envs=2, steps=4, transitions=8,
                           episodes=0, episode_returns=(), duration_s=0.1, carry=(None, None), carry_note="why")
    back = parse_result(json.loads(json.dumps(result.to_dict())))
    assert isinstance(back, RolloutResult) and (back.carry, back.carry_note) == ((None, None), "why")
    with pytest.raises(ValueError, match=re.escape("event field 'carry[0]': is not valid base64")):
        parse_rollout_event({**request.to_event(), "carry": ["not base64!", None]})


def test_a_result_over_6mb_sends_its_fragments_to_s3_and_keeps_its_carries_inline(aws_env: Any) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="results")
    event = {"rollout_id": "big", "env": {"id": "CartPole-v1"}, "num_envs": 64, "steps": 2000, "fragment_length": 500,
             "policy": {"kind": "random"}, "carry": [None] * 64, "result": {"s3_bucket": "results"}}
    first = _invoke(event)
    assert "fragments" not in first and len(first["fragment_refs"]) == 4  # over 6 MB: the fragments went to S3
    assert len(first["carry"]) == 64 and all(isinstance(c, str) for c in first["carry"])
    second = _invoke({**event, "rollout_id": "big-2", "carry": first["carry"], "seq_base": 2000, "steps": 5,
                      "fragment_length": None})
    reset_caches()
    assert second["steps"] == 5 and all(isinstance(c, str) for c in second["carry"])
