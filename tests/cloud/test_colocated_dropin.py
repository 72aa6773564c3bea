"""SharedMemoryVectorEnv as a drop-in for gymnasium's AsyncVectorEnv: one test per defect of issue 18.

Gymnasium's own tests/vector (not in its sdist) runs with the pool swapped in through
scripts/gymnasium_conformance.sh; these tests keep each defect it found fixed in our own suite.
"""

from __future__ import annotations

import copy
import gc
import multiprocessing
import os
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces import Box, Dict, Discrete, Graph, Text, Tuple
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from cloud import ColocatedConfig, SharedMemoryVectorEnv
from cloud._errors import EnvWorkerError, PoolStateError, WorkerFailedError


def shm_entries() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"strata_colo_{os.getpid()}_")}


@pytest.fixture(autouse=True)
def _no_leaked_segments() -> Iterator[None]:
    before = shm_entries()
    yield
    assert shm_entries() - before == set()


def dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


class EchoEnv(gym.Env[Any, Any]):
    """Returns the action it was given in the info (what the env saw), with configurable spaces."""

    def __init__(self, observation_space: gym.Space[Any] | None = None, action_space: gym.Space[Any] | None = None,
                 episode: int = 3, sleep_s: float = 0.0, fail_on: Any = None) -> None:
        self.observation_space = observation_space or Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = action_space or Discrete(3)
        self.episode, self.sleep_s, self.fail_on = episode, sleep_s, fail_on
        self.t = 0
        self.last_action: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.fail_on is not None and action == self.fail_on:
            raise KeyError(f"bad action {action!r}")
        self.last_action = action
        self.t += 1
        return self.observation_space.sample(), 1.0, self.t >= self.episode, False, {}


class IntObsEnv(gym.Env[int, int]):
    """A Discrete-observation env that returns plain Python ints, ending every second step."""

    observation_space = Discrete(5)
    action_space = Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return 0, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return 2, 0.0, self.t >= 2, False, {}


class FrameEnv(EchoEnv):
    """An env with an rgb_array render mode: its frame says how many steps it took."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self) -> None:
        super().__init__(episode=100)
        self.render_mode = "rgb_array"

    def render(self) -> np.ndarray:
        return np.full((4, 6, 3), self.t + 1, dtype=np.uint8)


# -- 1. reset after close ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared_memory", [True, False])
def test_every_call_after_close_raises_closed_environment_error(shared_memory: bool) -> None:
    pool = SharedMemoryVectorEnv([lambda: gym.make("CartPole-v1")] * 2, shared_memory=shared_memory)
    pool.reset(seed=0)
    pool.close()
    calls = [
        lambda: pool.reset(),
        lambda: pool.reset_async(),
        lambda: pool.reset_wait(),
        lambda: pool.step(np.zeros(2, dtype=np.int64)),
        lambda: pool.step_async(np.zeros(2, dtype=np.int64)),
        lambda: pool.step_wait(),
        lambda: pool.call("np_random_seed"),
        lambda: pool.set_attr("x", 1),
        lambda: pool.observations(),
    ]
    for call in calls:
        with pytest.raises(ClosedEnvironmentError, match=re.escape("after a call to `close()`")):
            call()
    pool.close()  # a second close is a no-op


# -- 2. gymnasium's error types -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shared_memory", [True, False])
@pytest.mark.parametrize("slow", [(1,), (0, 1)])
def test_timeouts_raise_multiprocessing_timeout_error_and_the_pool_goes_on(
    shared_memory: bool, slow: tuple[int, ...]
) -> None:
    fns = [lambda i=i: EchoEnv(sleep_s=30.0 if i in slow else 0.0) for i in range(2)]
    pool = SharedMemoryVectorEnv(fns, shared_memory=shared_memory, config=ColocatedConfig(num_workers=2))
    try:
        pool.reset(seed=0)
        pool.step_async(np.array([0, 1]))
        with pytest.raises(multiprocessing.TimeoutError, match=re.escape("The call to `step_wait` has timed out")):
            pool.step_wait(timeout=0.2)
        assert pool.counters.worker_timeouts == len(slow)
        pool.set_attr("sleep_s", 0.0)  # the restarted workers answer again
        _, _, _, truncated, _ = pool.step(np.array([0, 1]))
        np.testing.assert_array_equal(truncated, [i in slow for i in range(2)])  # the dropped episodes
    finally:
        pool.close()


def test_out_of_order_calls_raise_gymnasiums_errors_and_close_warns() -> None:
    pool = SharedMemoryVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    try:
        for wait, name in [(pool.step_wait, "step"), (pool.reset_wait, "reset"), (pool.call_wait, "call")]:
            message = f"Calling `{name}_wait` without any prior call to `{name}_async`."
            with pytest.raises(NoAsyncCallError, match=re.escape(message)):
                wait()
        pool.reset_async(seed=0)
        message = "Calling `step_async` while waiting for a pending call to `reset` to complete."
        with pytest.raises(AlreadyPendingCallError, match=re.escape(message)) as err:
            pool.step_async(np.zeros(2, dtype=np.int64))
        assert err.value.name == "reset"
        pool.reset_wait()
        pool.step_async(np.zeros(2, dtype=np.int64))
        for call, name in [(pool.reset_async, "reset_async"), (lambda: pool.call_async("spec"), "call_async")]:
            message = f"Calling `{name}` while waiting for a pending call to `step` to complete."
            with pytest.raises(AlreadyPendingCallError, match=re.escape(message)):
                call()
        assert isinstance(err.value, PoolStateError)  # still the pool's own error tree
    finally:
        with pytest.warns(UserWarning, match=re.escape("Calling `close` while waiting for a pending call to `step`")):
            pool.close()


@pytest.mark.parametrize("shared_memory", [True, False])
def test_an_env_exception_is_reraised_as_its_own_type_with_index_and_traceback(shared_memory: bool) -> None:
    fns = [lambda: EchoEnv(), lambda: EchoEnv(), lambda: EchoEnv(fail_on=2)]
    pool = SharedMemoryVectorEnv(fns, shared_memory=shared_memory, config=ColocatedConfig(num_workers=2))
    try:
        pool.reset(seed=0)
        with pytest.warns(UserWarning) as logged, pytest.raises(KeyError, match="bad action") as err:
            pool.step(np.array([0, 0, 2]))
        assert "Received the following error from Worker-2" in str(logged[0].message)
        assert isinstance(err.value, EnvWorkerError)
        assert err.value.env_index == 2 and err.value.worker_index == 1
        assert "in step" in err.value.remote_traceback and "KeyError" in err.value.remote_traceback
        pool.step(np.array([0, 0, 0]))  # the worker was rebuilt
    finally:
        pool.close()


# -- 3. actions reach the env unchanged --------------------------------------------------------------------------


@pytest.mark.parametrize("shared_memory", [True, False])
def test_actions_are_not_cast_to_the_action_dtype(shared_memory: bool) -> None:
    pool = SharedMemoryVectorEnv([lambda: EchoEnv(episode=100)] * 2, shared_memory=shared_memory)
    ref = AsyncVectorEnv([lambda: EchoEnv(episode=100)] * 2, shared_memory=shared_memory)
    try:
        for env in (pool, ref):
            env.reset(seed=0)
        for actions in (np.array([0.7, 1.0]), np.array([1, 2], dtype=np.int32), [2, 0], np.array([1, 0], np.float32)):
            pool.step(actions)
            ref.step(actions)
            got, want = pool.get_attr("last_action"), ref.get_attr("last_action")
            assert got == want, (actions, got, want)
        assert pool.get_attr("last_action")[0] == np.float32(1.0)
    finally:
        pool.close()
        ref.close()


def test_actions_of_another_shape_or_a_scalar_are_handled_as_async_vector_env_does() -> None:
    box = Box(-1.0, 1.0, (1,), np.float32)
    pool = SharedMemoryVectorEnv([lambda: EchoEnv(action_space=box, episode=100)] * 2)
    try:
        pool.reset(seed=0)
        pool.step([0.5, -0.5])  # one scalar per env where the space says (1,): each env gets its own element
        assert pool.get_attr("last_action") == (0.5, -0.5)
        with pytest.raises(TypeError, match=re.escape("actions must be a batch of shape (2, 1), got the scalar")):
            pool.step(0)
        with pytest.raises(ValueError, match=re.escape("actions must have shape (2, 1) (action_space.shape)")):
            pool.step(np.zeros((3, 1), np.float32))
    finally:
        pool.close()


# -- 4. sub-env spaces are checked -------------------------------------------------------------------------------


@pytest.mark.parametrize("shared_memory", [True, False])
def test_sub_envs_with_other_spaces_are_refused(shared_memory: bool) -> None:
    fns = [lambda: gym.make("CartPole-v1"), lambda: gym.make("FrozenLake-v1")]
    with pytest.raises(RuntimeError, match=re.escape("observation spaces are not equivalent")):
        SharedMemoryVectorEnv(fns, shared_memory=shared_memory)
    fns = [lambda: EchoEnv(action_space=Discrete(3)), lambda: EchoEnv(action_space=Discrete(4))]
    with pytest.raises(RuntimeError, match=re.escape("Some environments have an action space different from")):
        SharedMemoryVectorEnv(fns)
    fns = [lambda: EchoEnv(Box(-1.0, 1.0, (2,), np.float32)), lambda: EchoEnv(Box(-2.0, 2.0, (2,), np.float32))]
    pool = SharedMemoryVectorEnv(fns, observation_mode="different")
    try:
        assert pool.observation_space.high.tolist() == [[1.0, 1.0], [2.0, 2.0]]
    finally:
        pool.close()


# -- 5. composite and dynamic spaces -----------------------------------------------------------------------------


COMPOSITE = {
    "dict": Dict({"pos": Box(-1.0, 1.0, (3,), np.float32), "mode": Discrete(4)}),
    "nested": Tuple((Discrete(2), Dict({"a": Box(0, 5, (2, 2), np.int64), "b": Tuple((Discrete(3),))}))),
    "text": Text(5),
}


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, tuple) and not isinstance(a, str):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shared_memory", [True, False])
@pytest.mark.parametrize("name", sorted(COMPOSITE))
def test_composite_spaces_match_sync_vector_env(name: str, shared_memory: bool) -> None:
    space = COMPOSITE[name]
    # Each env gets its own copy of the space (and so its own sampling RNG), in this process as in a worker.
    fns = [lambda: EchoEnv(observation_space=copy.deepcopy(space), action_space=copy.deepcopy(space))] * 3
    pool = SharedMemoryVectorEnv(fns, shared_memory=shared_memory, autoreset_mode=AutoresetMode.SAME_STEP)
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        assert pool.observation_space == ref.observation_space and pool.action_space == ref.action_space
        assert_same(pool.reset(seed=4)[0], ref.reset(seed=4)[0])
        pool.action_space.seed(1)
        for _ in range(7):
            actions = pool.action_space.sample()
            got, want = pool.step(actions), ref.step(actions)
            assert_same(got[0], want[0])
            np.testing.assert_array_equal(got[2], want[2])
            assert got[4].keys() == want[4].keys()
            if "final_obs" in want[4]:
                for a, b in zip(got[4]["final_obs"], want[4]["final_obs"], strict=True):
                    assert (a is None) == (b is None)
                    if a is not None:
                        assert_same(a, b)
    finally:
        pool.close()
        ref.close()


def test_dynamic_and_custom_spaces_need_shared_memory_off_as_with_async() -> None:
    graph = Graph(node_space=Box(-1.0, 1.0, (2,)), edge_space=Discrete(3))
    message = "has a dynamic shape so its not possible to make a static shared memory"
    with pytest.raises(TypeError, match=re.escape(message)):
        SharedMemoryVectorEnv([lambda: EchoEnv(observation_space=graph)] * 2)
    pool = SharedMemoryVectorEnv([lambda: EchoEnv(observation_space=graph)] * 2, shared_memory=False)
    try:
        obs, _ = pool.reset(seed=0)
        assert len(obs) == 2 and all(o in graph for o in obs)
        obs, *_ = pool.step(np.array([0, 1]))
        assert all(o in graph for o in obs)
    finally:
        pool.close()


# -- 6. SAME_STEP final_obs is what the env returned -------------------------------------------------------------


@pytest.mark.parametrize("shared_memory", [True, False])
def test_same_step_final_obs_keeps_the_envs_own_values(shared_memory: bool) -> None:
    pool = SharedMemoryVectorEnv([IntObsEnv] * 2, shared_memory=shared_memory, autoreset_mode="SameStep")
    ref = AsyncVectorEnv([IntObsEnv] * 2, shared_memory=shared_memory, autoreset_mode="SameStep")
    try:
        for env in (pool, ref):
            env.reset(seed=0)
            env.step(np.zeros(2, dtype=np.int64))
        got, want = pool.step(np.zeros(2, dtype=np.int64))[4], ref.step(np.zeros(2, dtype=np.int64))[4]
        assert [type(x) for x in got["final_obs"]] == [type(x) for x in want["final_obs"]] == [int, int]
        assert list(got["final_obs"]) == [2, 2]
    finally:
        pool.close()
        ref.close()


# -- 7. autoreset DISABLED ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared_memory", [True, False])
def test_autoreset_disabled_matches_sync_vector_env(shared_memory: bool) -> None:
    fns = [lambda: gym.make("CartPole-v1")] * 3
    pool = SharedMemoryVectorEnv(fns, shared_memory=shared_memory, autoreset_mode=AutoresetMode.DISABLED)
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)
    try:
        assert pool.metadata["autoreset_mode"] == AutoresetMode.DISABLED
        np.testing.assert_array_equal(pool.reset(seed=1)[0], ref.reset(seed=1)[0])
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(80):
            actions = rng.integers(0, 2, 3)
            got, want = pool.step(actions), ref.step(actions)
            for a, b in zip(got[:4], want[:4], strict=True):
                np.testing.assert_array_equal(a, b)
            ended = got[2] | got[3]
            if ended.any():
                ends += 1
                mask = {"reset_mask": ended}
                np.testing.assert_array_equal(pool.reset(options=dict(mask))[0], ref.reset(options=dict(mask))[0])
        assert ends > 0
    finally:
        pool.close()
        ref.close()


# -- 8. np_random_seed per env, 9. any worker count ---------------------------------------------------------------


def test_np_random_seed_is_one_per_env_and_workers_need_not_divide_envs() -> None:
    fns = [lambda: gym.make("CartPole-v1")] * 3
    pool = SharedMemoryVectorEnv(fns, config=ColocatedConfig(num_workers=2))
    ref = SyncVectorEnv(fns)
    try:
        pool.reset(seed=5)
        ref.reset(seed=5)
        assert pool.np_random_seed == (5, 6, 7)
        assert len(pool.np_random) == 3
        assert sorted(len(pool.half_indices(h)) for h in (0, 1)) == [1, 2]
        for t in range(30):
            actions = np.array([t % 2, 1, 0])
            for a, b in zip(pool.step(actions)[:4], ref.step(actions)[:4], strict=True):
                np.testing.assert_array_equal(a, b)
    finally:
        pool.close()
        ref.close()
    with pytest.raises(ValueError, match=re.escape("num_workers=4 is more than len(env_fns)=3")):
        SharedMemoryVectorEnv(fns, config=ColocatedConfig(num_workers=4))


# -- 10. spawn and forkserver -----------------------------------------------------------------------------------


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_lambda_factories_work_with_spawn_and_forkserver(context: str) -> None:
    env_id = "Pendulum-v1"
    pool = SharedMemoryVectorEnv([lambda: gym.make(env_id)] * 2, context=context)
    ref = SyncVectorEnv([lambda: gym.make(env_id)] * 2)
    try:
        np.testing.assert_array_equal(pool.reset(seed=3)[0], ref.reset(seed=3)[0])
        actions = np.array([[0.5], [-1.5]], dtype=np.float32)
        np.testing.assert_array_equal(pool.step(actions)[0], ref.step(actions)[0])
    finally:
        pool.close()
        ref.close()


def test_a_factory_that_cannot_start_reports_its_own_error() -> None:
    def broken() -> gym.Env[Any, Any]:
        raise OSError("no simulator licence")

    with pytest.warns(UserWarning) as logged, pytest.raises(OSError, match=re.escape("no simulator licence")):
        SharedMemoryVectorEnv([lambda: gym.make("CartPole-v1"), broken], config=ColocatedConfig(num_workers=2))
    assert "Received the following error from Worker-1" in str(logged[0].message)


# -- 11. an unclosed pool is cleaned up by the garbage collector -------------------------------------------------


def test_an_unclosed_pool_is_cleaned_up_quietly_by_the_garbage_collector() -> None:
    pool = SharedMemoryVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    pool.reset(seed=0)
    pids, name = pool.worker_pids, pool.shm_name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del pool
        gc.collect()
    deadline = time.monotonic() + 30
    while not all(dead(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(dead(pid) for pid in pids)
    assert not Path(f"/dev/shm/{name}").exists()


# -- 12. render and AsyncVectorEnv's constructor arguments --------------------------------------------------------


def test_render_and_async_vector_env_constructor_arguments() -> None:
    fns = [lambda: FrameEnv()] * 2  # renders without pygame, which strata does not depend on
    pool = SharedMemoryVectorEnv(fns, True, False, "fork", False, None, "same", "SameStep", 1)
    try:
        assert (pool.shared_memory, pool.copy, pool.context, pool.daemon) == (True, False, "fork", False)
        assert pool.max_concurrency == 1 and pool.autoreset_mode == AutoresetMode.SAME_STEP
        obs, _ = pool.reset(seed=0)
        assert obs is pool.observations()  # copy=False: a view of shared memory
        frames = pool.render()
        assert len(frames) == 2 and frames[0].shape == (4, 6, 3) and frames[1][0, 0, 0] == 1
    finally:
        pool.close()
    with pytest.raises(ValueError, match=re.escape("a custom `worker` function is not supported")):
        SharedMemoryVectorEnv(fns, worker=lambda *args: None)
    with pytest.raises(ValueError, match=re.escape("`max_concurrency` must be a positive or None, got 0.")):
        SharedMemoryVectorEnv(fns, max_concurrency=0)


def test_gymnasium_make_vec_async_mode_can_build_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    from cloud.rollout._shm_pool import SharedMemoryVectorEnv as Pool

    monkeypatch.setattr(gym.vector, "AsyncVectorEnv", Pool)
    envs = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="async")
    try:
        assert isinstance(envs, SharedMemoryVectorEnv)
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (3, 4)
    finally:
        envs.close()


def test_worker_failures_are_still_the_pools_errors() -> None:
    assert issubclass(WorkerFailedError, Exception)
    from cloud._errors import WorkerTimeoutError

    assert issubclass(WorkerTimeoutError, WorkerFailedError)
    assert issubclass(WorkerTimeoutError, multiprocessing.TimeoutError)
