"""SharedMemoryVectorEnv: step-for-step parity with gymnasium's vector envs, halves, vector workers, errors."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from cloud import ColocatedConfig, SharedMemoryVectorEnv
from cloud._errors import CloudError, ColocatedError, EnvWorkerError, PoolStateError
from device import ConfigError, StrataError


def shm_entries() -> set[str]:
    # Only this test process's segments (their names carry the creating pid): other processes on the machine,
    # a concurrent benchmark or demo among them, may own pools of their own while a test runs.
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"strata_colo_{os.getpid()}_")}


@pytest.fixture(autouse=True)
def _no_leaked_segments() -> Iterator[None]:
    before = shm_entries()
    yield
    assert shm_entries() - before == set()


def assert_infos_equal(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    assert set(ours) == set(theirs), f"{where}: info keys {sorted(ours)} != {sorted(theirs)}"
    for key, value in theirs.items():
        mine = ours[key]
        if isinstance(value, dict):
            assert_infos_equal(mine, value, f"{where}[{key}]")
        elif key == "final_obs":
            assert mine.dtype == value.dtype == object
            for a, b in zip(mine, value, strict=True):
                assert (a is None) == (b is None), where
                if a is not None:
                    np.testing.assert_array_equal(a, b, err_msg=where)
        else:
            assert np.asarray(mine).dtype == np.asarray(value).dtype, f"{where}[{key}]"
            np.testing.assert_array_equal(mine, value, err_msg=f"{where}[{key}]")


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_matches_async_and_sync_vector_env_step_for_step(env_id: str, mode: AutoresetMode) -> None:
    num_envs, steps = 4, 230  # Pendulum truncates at 200 steps, CartPole episodes end every ~20 random steps
    fns = [lambda: gym.make(env_id) for _ in range(num_envs)]
    pool = SharedMemoryVectorEnv(fns, config=ColocatedConfig(num_workers=2), autoreset_mode=mode)
    references = [
        AsyncVectorEnv(fns, shared_memory=True, autoreset_mode=mode),
        SyncVectorEnv(fns, autoreset_mode=mode),
    ]
    try:
        assert isinstance(pool, gym.vector.VectorEnv)
        assert pool.num_envs == num_envs
        assert pool.metadata["autoreset_mode"] == mode
        for ref in references:
            assert pool.single_observation_space == ref.single_observation_space
            assert pool.observation_space == ref.observation_space
            assert pool.single_action_space == ref.single_action_space
            assert pool.action_space == ref.action_space
        obs, info = pool.reset(seed=[7, 8, 9, 10])
        for ref in references:
            ref_obs, ref_info = ref.reset(seed=[7, 8, 9, 10])
            np.testing.assert_array_equal(obs, ref_obs)
            assert_infos_equal(info, ref_info, "reset")
        pool.action_space.seed(3)
        ends = 0
        for t in range(steps):
            actions = pool.action_space.sample()
            got = pool.step(actions)
            for ref in references:
                want = ref.step(actions)
                for name, mine, theirs in zip(("obs", "reward", "terminated", "truncated"), got, want, strict=False):
                    assert mine.dtype == theirs.dtype, f"step {t} {name}"
                    np.testing.assert_array_equal(mine, theirs, err_msg=f"step {t} {name} vs {type(ref).__name__}")
                assert_infos_equal(got[4], want[4], f"step {t} vs {type(ref).__name__}")
            ends += int(np.sum(got[2] | got[3]))
        assert ends >= num_envs  # every env ended at least one episode, so autoreset was exercised
    finally:
        pool.close()
        for ref in references:
            ref.close()


class _InfoEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose reset and step infos are not empty (scalars, arrays, nested dicts, on some steps only)."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.t = 0

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self.t = 0
        return obs, {**info, "reset_marker": 1.5, "nested": {"depth": np.array([1, 2])}}

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        info = {**info, "t": self.t}
        if self.t % 3 == 0:
            info["every_third"] = np.float32(self.t)
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_non_empty_infos_match_async_vector_env(mode: AutoresetMode) -> None:
    fns = [_InfoEnv for _ in range(4)]
    pool = SharedMemoryVectorEnv(fns, config=ColocatedConfig(num_workers=2), autoreset_mode=mode)
    ref = AsyncVectorEnv(fns, shared_memory=True, autoreset_mode=mode)
    try:
        obs, info = pool.reset(seed=1)
        ref_obs, ref_info = ref.reset(seed=1)
        np.testing.assert_array_equal(obs, ref_obs)
        assert_infos_equal(info, ref_info, "reset")
        pool.action_space.seed(2)
        for t in range(80):
            actions = pool.action_space.sample()
            got, want = pool.step(actions), ref.step(actions)
            np.testing.assert_array_equal(got[0], want[0])
            assert_infos_equal(got[4], want[4], f"step {t}")
    finally:
        pool.close()
        ref.close()


def test_reset_seed_int_list_and_mask_follow_gymnasium() -> None:
    fns = [lambda: gym.make("CartPole-v1") for _ in range(4)]
    pool = SharedMemoryVectorEnv(fns, config=ColocatedConfig(num_workers=2))
    ref = SyncVectorEnv(fns)
    try:
        np.testing.assert_array_equal(pool.reset(seed=5)[0], ref.reset(seed=5)[0])
        assert pool.get_attr("np_random_seed") == ref.get_attr("np_random_seed") == (5, 6, 7, 8)
        mask = np.array([False, True, False, True])
        obs, _ = pool.reset(seed=[None, 42, None, 43], options={"reset_mask": mask})
        ref_obs, _ = ref.reset(seed=[None, 42, None, 43], options={"reset_mask": mask})
        np.testing.assert_array_equal(obs, ref_obs)
        with pytest.raises(
            ValueError,
            match=re.escape("If seeds are passed as a list the length must match num_envs=4 but got length=3."),
        ):
            pool.reset(seed=[1, 2, 3])
    finally:
        pool.close()
        ref.close()


def test_call_get_attr_set_attr() -> None:
    pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=2, envs_per_worker=2)
    try:
        pool.reset(seed=0)
        assert pool.get_attr("gravity") == (9.8,) * 4
        pool.set_attr("gravity", [1.0, 2.0, 3.0, 4.0])
        assert pool.get_attr("gravity") == (1.0, 2.0, 3.0, 4.0)
        pool.set_attr("gravity", 9.8)
        assert pool.call("get_wrapper_attr", "gravity") == (9.8,) * 4
        with pytest.raises(ValueError, match=re.escape("Got `3` values for 4 environments.")):
            pool.set_attr("gravity", [1.0, 2.0, 3.0])
    finally:
        pool.close()


def test_works_under_gymnasium_vector_wrappers() -> None:
    pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=2, envs_per_worker=2, autoreset_mode="SameStep")
    envs = gym.wrappers.vector.RecordEpisodeStatistics(pool)
    try:
        envs.reset(seed=1)
        envs.action_space.seed(1)
        returns = []
        for _ in range(200):
            _, _, _, _, info = envs.step(envs.action_space.sample())
            if "episode" in info:
                returns += list(info["episode"]["r"][info["_episode"]])
        assert returns and all(r >= 1 for r in returns)
    finally:
        envs.close()


@pytest.mark.parametrize("envs_per_worker", [1, 4])
def test_halves_overlap_and_match_a_full_sync_step(envs_per_worker: int) -> None:
    n = 2 * envs_per_worker
    fns = [lambda: gym.make("CartPole-v1") for _ in range(n)]
    pool = SharedMemoryVectorEnv(fns, config=ColocatedConfig(num_workers=2))
    ref = SyncVectorEnv(fns)
    try:
        h0, h1 = pool.half_indices(0), pool.half_indices(1)
        assert sorted([*h0, *h1]) == list(range(n)) and len(h0) == len(h1) == n // 2
        np.testing.assert_array_equal(pool.reset(seed=11)[0], ref.reset(seed=11)[0])
        rng = np.random.default_rng(0)
        for t in range(60):
            actions = rng.integers(0, 2, size=n)
            pool.step_half_async(0, actions[h0])
            pool.step_half_async(1, actions[h1])  # both halves in flight at once
            with pytest.raises(PoolStateError, match=re.escape("(half 0 is stepping; call the matching *_wait first)")):
                pool.step_half_async(0, actions[h0])
            o1, r1, te1, tr1, _ = pool.step_half_wait(1)
            o0, r0, te0, tr0, _ = pool.step_half_wait(0)
            ro, rr, rte, rtr, _ = ref.step(actions)
            np.testing.assert_array_equal(o0, ro[h0], err_msg=f"step {t}")
            np.testing.assert_array_equal(o1, ro[h1], err_msg=f"step {t}")
            np.testing.assert_array_equal(np.concatenate([r0, r1]), np.concatenate([rr[h0], rr[h1]]))
            done = rte | rtr
            np.testing.assert_array_equal(np.concatenate([te0 | tr0, te1 | tr1]), np.concatenate([done[h0], done[h1]]))
        with pytest.raises(ValueError, match=re.escape(f"actions must have shape ({n // 2},) (half_indices(0))")):
            pool.step_half_async(0, np.zeros(n + 1, dtype=np.int64))
    finally:
        pool.close()
        ref.close()


def test_numpy_vectorised_envs_in_workers() -> None:
    k = 8
    pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=2, envs_per_worker=k, vectorized=True)
    refs = [gym.make_vec("CartPole-v1", num_envs=k, vectorization_mode="vector_entry_point") for _ in range(2)]
    try:
        assert pool.num_envs == 2 * k
        obs, _ = pool.reset(seed=100)
        want = np.concatenate([ref.reset(seed=100 + w * k)[0] for w, ref in enumerate(refs)])
        np.testing.assert_array_equal(obs, want)
        rng = np.random.default_rng(1)
        for t in range(100):
            actions = rng.integers(0, 2, size=2 * k)
            got = pool.step(actions)
            parts = [ref.step(actions[w * k : (w + 1) * k]) for w, ref in enumerate(refs)]
            for i in range(4):
                np.testing.assert_array_equal(got[i], np.concatenate([p[i] for p in parts]), err_msg=f"step {t}")
    finally:
        pool.close()
        for ref in refs:
            ref.close()


class _RaisingEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole that raises on its `fail_at`-th step."""

    def __init__(self, fail_at: int) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.fail_at, self.steps = fail_at, 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError(f"boom at step {self.steps}")
        return self.env.step(action)


def raising_fns(bad_index: int, n: int = 4, fail_at: int = 5) -> list[Any]:
    return [(lambda i=i: _RaisingEnv(fail_at if i == bad_index else 10**9)) for i in range(n)]


def test_env_exception_reaches_the_parent_with_index_and_traceback() -> None:
    pool = SharedMemoryVectorEnv(raising_fns(3), config=ColocatedConfig(num_workers=2))
    try:
        pool.reset(seed=0)
        actions = np.zeros(4, dtype=np.int64)
        for _ in range(4):
            pool.step(actions)
        message = "env 3 (worker 1) raised while stepping (step): RuntimeError: boom at step 5"
        # As AsyncVectorEnv: the worker's error is logged (gymnasium's logger warns), then re-raised as its own type.
        with pytest.warns(UserWarning) as logged, pytest.raises(RuntimeError, match=re.escape(message)) as err:
            pool.step(actions)
        assert "Received the following error from Worker-3" in str(logged[0].message)
        assert isinstance(err.value, EnvWorkerError)
        assert err.value.env_index == 3 and err.value.worker_index == 1
        assert "raise RuntimeError" in err.value.remote_traceback
        assert isinstance(err.value, ColocatedError | CloudError | StrataError)
        assert pool.counters.env_errors == 1 and pool.counters.worker_restarts == 1
        # The pool goes on: the restarted worker's envs report their dropped episodes as truncated once.
        _, rewards, terminated, truncated, info = pool.step(actions)
        np.testing.assert_array_equal(truncated[2:], [True, True])
        np.testing.assert_array_equal(rewards[2:], [0.0, 0.0])
        np.testing.assert_array_equal(info["_worker_restarted"], [False, False, True, True])
        assert not terminated[2:].any()
    finally:
        pool.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_env_exception_with_restart_policy_continues(mode: AutoresetMode) -> None:
    pool = SharedMemoryVectorEnv(
        raising_fns(0), config=ColocatedConfig(num_workers=2, on_env_error="restart"), autoreset_mode=mode
    )
    try:
        before, _ = pool.reset(seed=0)
        actions = np.zeros(4, dtype=np.int64)
        for _ in range(4):
            last_obs = pool.step(actions)[0]
        obs, rewards, _, truncated, info = pool.step(actions)  # env 0 raises; worker 0 is replaced
        assert pool.counters.env_errors == 1 and pool.counters.dropped_episodes == 2
        np.testing.assert_array_equal(truncated[:2], [True, True])
        np.testing.assert_array_equal(rewards[:2], [0.0, 0.0])
        np.testing.assert_array_equal(info["_worker_restarted"], [True, True, False, False])
        if mode == AutoresetMode.SAME_STEP:
            np.testing.assert_array_equal(info["_final_obs"], [True, True, False, False])
            assert info["final_obs"][1] is not None
            assert not np.array_equal(obs[:2], last_obs[:2])  # new episodes
        else:
            np.testing.assert_array_equal(obs[1], last_obs[1])  # the dropped episode's last known observation
        obs, rewards, _, truncated, _ = pool.step(actions)
        assert not truncated[:2].any()
        if mode == AutoresetMode.NEXT_STEP:
            np.testing.assert_array_equal(rewards[:2], [0.0, 0.0])  # the autoreset step
        del before
    finally:
        pool.close()


def test_out_of_order_calls_and_bad_inputs_raise_typed_errors() -> None:
    message = "ColocatedConfig.on_env_error must be 'raise' or 'restart', got 'x'"
    with pytest.raises(ConfigError, match=re.escape(message)):
        ColocatedConfig(on_env_error="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("num_workers=4 is more than len(env_fns)=3")):
        SharedMemoryVectorEnv([lambda: gym.make("CartPole-v1")] * 3, config=ColocatedConfig(num_workers=4))
    pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=1, envs_per_worker=2)
    try:
        message = "Calling `step_wait` without any prior call to `step_async`."
        with pytest.raises(PoolStateError, match=re.escape(message)):
            pool.step_wait()
        pool.reset(seed=0)
        with pytest.raises(ValueError, match=re.escape("SharedMemoryVectorEnv.step: actions must have shape (2,)")):
            pool.step(np.zeros(3, dtype=np.int64))
        pool.step_async(np.zeros(2, dtype=np.int64))
        message = "Calling `reset_async` while waiting for a pending call to `step`"
        with pytest.raises(PoolStateError, match=re.escape(message)):
            pool.reset()
        pool.step_wait()
    finally:
        pool.close()
    message = "Trying to operate on `SharedMemoryVectorEnv`, after a call to `close()`."
    with pytest.raises(PoolStateError, match=re.escape(message)):
        pool.step(np.zeros(2, dtype=np.int64))


def test_spawn_context_and_box_actions() -> None:
    pool = SharedMemoryVectorEnv.make(
        "Pendulum-v1", num_workers=2, envs_per_worker=1, config=ColocatedConfig(context="spawn")
    )
    ref = SyncVectorEnv([lambda: gym.make("Pendulum-v1")] * 2)
    try:
        np.testing.assert_array_equal(pool.reset(seed=3)[0], ref.reset(seed=3)[0])
        actions = np.array([[0.5], [-1.5]], dtype=np.float32)
        for _ in range(5):
            np.testing.assert_array_equal(pool.step(actions)[0], ref.step(actions)[0])
    finally:
        pool.close()
        ref.close()


def test_make_vector_env_colocated_mode_builds_a_same_step_pool() -> None:
    from cloud.rollout._envs import make_vector_env

    envs = make_vector_env("CartPole-v1", num_envs=4, seed=3, mode="colocated")
    ref = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        assert isinstance(envs, SharedMemoryVectorEnv)
        assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert envs.get_attr("np_random_seed") == (3, 4, 5, 6)
        ref.reset(seed=3)
        actions = np.array([0, 1, 1, 0])
        for _ in range(30):
            np.testing.assert_array_equal(envs.step(actions)[0], ref.step(actions)[0])
    finally:
        envs.close()
        ref.close()


def test_worker_policy_chooses_actions_in_the_workers() -> None:
    def policy_factory() -> Any:
        return lambda obs: (obs[:, 2] > 0).astype(np.int64)  # push towards the side the pole leans to

    pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=2, envs_per_worker=2, worker_policy=policy_factory)
    ref = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    try:
        obs, _ = pool.reset(seed=0)
        ref_obs, _ = ref.reset(seed=0)
        for _ in range(50):
            actions, (obs, *_rest) = pool.act_step()
            np.testing.assert_array_equal(actions, (ref_obs[:, 2] > 0).astype(np.int64))
            ref_obs = ref.step(actions)[0]
            np.testing.assert_array_equal(obs, ref_obs)
    finally:
        pool.close()
        ref.close()
    plain = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=1, envs_per_worker=1)
    try:
        with pytest.raises(PoolStateError, match=re.escape("no worker_policy was given")):
            plain.act_step()
    finally:
        plain.close()


def test_vector_workers_must_match_the_autoreset_mode() -> None:
    message = "the vector envs in the workers autoreset with AutoresetMode.NEXT_STEP, but autoreset_mode="
    with pytest.raises(ValueError, match=re.escape(message)):
        SharedMemoryVectorEnv.make("CartPole-v1", num_workers=1, envs_per_worker=4, vectorized=True,
                                   autoreset_mode="SameStep")
    with pytest.raises(ValueError, match=re.escape("pass exactly one of env_fns")):
        SharedMemoryVectorEnv()
