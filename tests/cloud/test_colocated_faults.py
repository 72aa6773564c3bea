"""SharedMemoryVectorEnv fault isolation: crashed and hung workers, and no shared memory left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from cloud import ColocatedConfig, SharedMemoryVectorEnv
from cloud._errors import WorkerFailedError

REPO = Path(__file__).resolve().parents[2]


def shm_entries() -> set[str]:
    # Only this test process's segments (their names carry the creating pid): other processes on the machine,
    # a concurrent benchmark or demo among them, may own pools of their own while a test runs.
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
    # a zombie still answers kill(0); it is gone for our purposes once it is no longer running
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_sigkilled_worker_is_restarted_and_its_episodes_are_reported_truncated(mode: str) -> None:
    pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=2, envs_per_worker=2, autoreset_mode=mode)
    name = pool.shm_name
    try:
        pool.reset(seed=0)
        actions = np.zeros(4, dtype=np.int64)
        for _ in range(3):
            last_obs = pool.step(actions)[0]
        victim = pool.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        obs, rewards, terminated, truncated, info = pool.step(actions)
        assert pool.worker_pids[1] != victim and pool.worker_pids[0] != victim
        assert pool.counters.worker_crashes == 1 and pool.counters.worker_restarts == 1
        assert pool.counters.dropped_episodes == 2
        np.testing.assert_array_equal(truncated, [False, False, True, True])
        np.testing.assert_array_equal(rewards[2:], [0.0, 0.0])
        assert not terminated.any()
        np.testing.assert_array_equal(info["_worker_restarted"], [False, False, True, True])
        if mode == "SameStep":
            np.testing.assert_array_equal(info["final_obs"][3], last_obs[3])
        else:
            np.testing.assert_array_equal(obs[2:], last_obs[2:])
        for _ in range(20):  # stepping goes on
            pool.step(actions)
        assert pool.counters.worker_restarts == 1
    finally:
        pool.close()
    assert not Path(f"/dev/shm/{name}").exists()


class _HangOnce(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose third step sleeps for an hour, once per marker file."""

    def __init__(self, marker: str) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.marker, self.steps = marker, 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == 3 and not os.path.exists(self.marker):
            Path(self.marker).touch()
            time.sleep(3600)
        return self.env.step(action)


def test_hung_worker_is_killed_after_the_timeout_and_restarted(tmp_path: Path) -> None:
    marker = str(tmp_path / "hung")
    fns = [lambda: gym.make("CartPole-v1"), lambda: _HangOnce(marker)]
    pool = SharedMemoryVectorEnv(fns, config=ColocatedConfig(num_workers=2, step_timeout_s=5.0))
    try:
        pool.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)
        pool.step(actions)
        pool.step(actions)
        started = time.monotonic()
        _, _, _, truncated, info = pool.step(actions)
        assert time.monotonic() - started < 120  # killed after step_timeout_s, not after the hour
        assert pool.counters.worker_timeouts == 1 and pool.counters.dropped_episodes == 1
        np.testing.assert_array_equal(truncated, [False, True])
        np.testing.assert_array_equal(info["_worker_restarted"], [False, True])
        pool.step(actions)
    finally:
        pool.close()


def test_on_worker_failure_raise() -> None:
    pool = SharedMemoryVectorEnv.make(
        "CartPole-v1", num_workers=2, envs_per_worker=1, config=ColocatedConfig(on_worker_failure="raise")
    )
    try:
        pool.reset(seed=0)
        os.kill(pool.worker_pids[0], signal.SIGKILL)
        message = r"worker 0 \(envs 0..0\) exited with code -9; it was restarted"
        with pytest.raises(WorkerFailedError, match=message) as err:
            pool.step(np.zeros(2, dtype=np.int64))
        assert err.value.worker_index == 0
        _, _, _, truncated, _ = pool.step(np.zeros(2, dtype=np.int64))
        np.testing.assert_array_equal(truncated, [True, False])
    finally:
        pool.close()


def test_close_stops_every_worker_and_unlinks_the_segment() -> None:
    pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=2, envs_per_worker=1)
    pids, name = pool.worker_pids, pool.shm_name
    assert Path(f"/dev/shm/{name}").exists()
    pool.reset(seed=0)
    pool.step(np.zeros(2, dtype=np.int64))
    pool.close()
    pool.close()  # idempotent
    assert not Path(f"/dev/shm/{name}").exists()
    assert all(dead(pid) for pid in pids)


TRAINER = """
import numpy as np
from cloud import ColocatedConfig, SharedMemoryVectorEnv
pool = SharedMemoryVectorEnv.make(
    "CartPole-v1", num_workers=2, envs_per_worker=2, config=ColocatedConfig(context={context!r})
)
pool.reset(seed=0)
print(pool.shm_name, *pool.worker_pids, flush=True)
actions = np.zeros(4, dtype=np.int64)
while True:
    pool.step(actions)
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_sigint_of_the_parent_leaves_no_shared_memory_and_no_workers(context: str) -> None:
    script = TRAINER.format(context=context)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line, proc.stderr.read() if proc.stderr else ""
        name, pids = line[0], [int(p) for p in line[1:]]
        assert Path(f"/dev/shm/{name}").exists()
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in stderr
    assert "resource_tracker" not in stderr and "leaked" not in stderr, stderr
    assert not Path(f"/dev/shm/{name}").exists()
    deadline = time.monotonic() + 60
    while not all(dead(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(dead(pid) for pid in pids)


def test_a_worker_killed_with_both_halves_in_flight_reports_each_half_truncated() -> None:
    pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=2, envs_per_worker=2)
    try:
        pool.reset(seed=0)
        h0, h1 = pool.half_indices(0), pool.half_indices(1)
        assert list(h0) == [0, 2] and list(h1) == [1, 3]
        victim = pool.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not dead(victim) and time.monotonic() < deadline:
            time.sleep(0.01)
        pool.step_half_async(0, np.zeros(2, dtype=np.int64))
        pool.step_half_async(1, np.zeros(2, dtype=np.int64))
        _, r0, _, tr0, info0 = pool.step_half_wait(0)
        _, r1, _, tr1, info1 = pool.step_half_wait(1)
        np.testing.assert_array_equal(tr0, [True, False])  # env 0 (worker 0), env 2 (worker 1)
        np.testing.assert_array_equal(tr1, [True, False])  # env 1 (worker 0), env 3 (worker 1)
        np.testing.assert_array_equal(info0["_worker_restarted"], [True, False])
        np.testing.assert_array_equal(info1["_worker_restarted"], [True, False])
        assert r0[0] == r1[0] == 0.0
        assert pool.counters.worker_restarts == 1 and pool.counters.dropped_episodes == 2
        _, _, _, truncated, _ = pool.step(np.zeros(4, dtype=np.int64))  # NEXT_STEP: the autoreset step
        assert not truncated.any()
    finally:
        pool.close()
