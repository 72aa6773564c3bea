"""Decoupled rollout sources over real gRPC env services: vector env, fragments, failover, staleness."""

from __future__ import annotations

import itertools
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cloud.rollout._decoupled import (
    DecoupledError,
    FragmentSource,
    StalenessGate,
    decoupled_vector_env_class,
    make_decoupled_vector_env,
    parse_services,
    start_services,
)
from device import RolloutBatch
from functions._envservice import EnvService, EnvServiceConfig
from tests.functions.test_envservice import make_bundle, needs_executor


@pytest.fixture
def services() -> Iterator[list[EnvService]]:
    started = [EnvService(EnvServiceConfig(envs=2, seed=10 * i)).start() for i in range(3)]
    yield started
    for s in started:
        s.stop(0)


def _fragment(version: int, t: int = 2, n: int = 3) -> RolloutBatch:
    z = np.zeros((t, n), dtype=np.float32)
    return RolloutBatch(source="s", obs=np.zeros((t, n, 4), np.float32), actions=np.zeros((t, n), np.int64),
                        rewards=z, terminations=z.astype(bool), truncations=z.astype(bool),
                        final_obs=np.zeros((t, n, 4), np.float32), next_obs=np.zeros((n, 4), np.float32),
                        policy_version=np.full((t, n), version, np.int64), worker=np.arange(n),
                        seq=np.zeros((t, n), np.int64))


def test_staleness_gate_drops_and_counts() -> None:
    gate = StalenessGate(max_lag=1)
    assert gate.admit(_fragment(5), learner_version=5) is not None
    assert gate.admit(_fragment(4), learner_version=5) is not None
    assert gate.admit(_fragment(3), learner_version=5) is None
    s = gate.summary()
    assert s["dropped_fragments"] == 1 and s["dropped_transitions"] == 6 and s["accepted_transitions"] == 12
    assert s["lag_histogram"] == {"0": 6, "1": 6, "2": 6}


def test_parse_services() -> None:
    assert parse_services("127.0.0.1:5000, [::1]:6000") == ["127.0.0.1:5000", "[::1]:6000"]
    with pytest.raises(DecoupledError, match=re.escape("expected HOST:PORT[,HOST:PORT...], bad entries ['nope']")):
        parse_services("127.0.0.1:5000,nope")


def test_vector_env_has_the_learners_contract(services: list[EnvService]) -> None:
    import gymnasium as gym

    envs = make_decoupled_vector_env("CartPole-v1", num_envs=4, seed=0,
                                     services=",".join(s.address for s in services))
    try:
        assert isinstance(envs, gym.vector.VectorEnv) and isinstance(envs, decoupled_vector_env_class())
        assert envs.num_envs == 4 and envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        assert envs.observation_space.shape == (4, 4) and envs.single_action_space == gym.spaces.Discrete(2)
        ended = 0
        for _ in range(60):
            obs, rew, term, _, info = envs.step(np.ones(4, dtype=np.int64))
            assert obs.shape == (4, 4) and rew.dtype == np.float64
            if term.any():
                ended += int(term.sum())
                for i in np.flatnonzero(term):
                    assert info["_final_obs"][i] and abs(info["final_obs"][i][2]) > 0.2
        assert ended >= 4
    finally:
        envs.close()


def test_vector_env_moves_a_dead_services_envs_to_a_spare(services: list[EnvService]) -> None:
    envs = make_decoupled_vector_env("CartPole-v1", num_envs=4, seed=0, timeout_s=1.0,
                                     services=[s.address for s in services])
    try:
        before, *_ = envs.step(np.zeros(4, dtype=np.int64))
        services[1].stop(0)  # slots 2 and 3
        _, rew, term, trunc, info = envs.step(np.zeros(4, dtype=np.int64))
        assert trunc[2:].all() and not trunc[:2].any() and not term[2:].any()
        assert envs.failovers == [f"{services[1].address}->{services[2].address}"]
        np.testing.assert_array_equal(info["final_obs"][2], before[2])
        for _ in range(5):
            _, rew, *_ = envs.step(np.zeros(4, dtype=np.int64))
        assert rew.tolist() == [1.0] * 4
        services[2].stop(0)
        with pytest.raises(DecoupledError, match=re.escape("no spare with 2 envs is left")):
            envs.step(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()


def test_ppo_trains_with_env_mode_decoupled(tmp_path: Path) -> None:
    """The learner, unchanged, on mode "decoupled": the source registered itself and starts its own services."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from cloud.learners._ppo_config import PPOConfig
    from cloud.rollout._envs import VECTOR_ENV_MODES
    from cloud.runs._train import train

    assert VECTOR_ENV_MODES["decoupled"] is make_decoupled_vector_env
    result = train(env_id="CartPole-v1", total_steps=256, run_dir=tmp_path / "run", seed=0, progress=False,
                   config=PPOConfig(num_envs=4, num_steps=32, update_epochs=1, env_mode="decoupled"),
                   log=lambda line: None)
    assert result.global_step == 256 and result.policy_version == 2


@needs_executor
def test_bundle_pulled_from_the_parameter_server_by_version(services: list[EnvService], tmp_path: Path) -> None:
    from cloud.params._server import ParameterServer
    from functions._envservice import EnvServiceClient

    server = ParameterServer().start()
    client = EnvServiceClient(services[0].address)
    try:
        as_tensor = lambda b: {"bundle": np.frombuffer(b, dtype=np.uint8)}  # noqa: E731
        server.push("cartpole", as_tensor(make_bundle(tmp_path, version=1)), version=1)
        assert client.set_policy(param_server=server.address, policy="cartpole", min_version=1) == 1
        server.push("cartpole", as_tensor(make_bundle(tmp_path, version=2, seed=1)), version=2)
        versions = {int(client.rollout(2, refresh_policy=True).policy_version[0, 0]) for _ in range(50)}
        assert versions == {1, 2} or versions == {2}  # the non-blocking refresh lands within a few calls
        assert client.spec()["policy_version"] == 2
    finally:
        client.close()
        server.stop(0)

@needs_executor
def test_fragment_source_tags_versions_and_gates_staleness(services: list[EnvService], tmp_path: Path) -> None:
    src = FragmentSource([s.address for s in services], steps=8, gate=StalenessGate(max_lag=0))
    try:
        assert src.set_policy(make_bundle(tmp_path, version=1)) == 1
        # Unbounded iteration keeps work in flight (a bounded one would leave none behind).
        got = list(itertools.islice(src.fragments(), 6))
        assert {b.source for b in got} <= {s.service_id for s in services} and len(got) == 6
        assert all(int(b.policy_version.min()) == 1 for b in got)
        ids = [i for b in got for i in b.transition_ids()]
        assert len(ids) == len(set(ids)) == 6 * 8 * 2  # no transition twice
        src.learner_version = 2  # the learner moved on; in-flight fragments of version 1 are now stale
        src.set_policy(make_bundle(tmp_path, version=2))
        fresh = list(src.fragments(3))
        assert all(int(b.policy_version.min()) == 2 for b in fresh)
        assert src.gate.dropped_fragments >= 1 and src.gate.lags[1] > 0
    finally:
        src.close()


@needs_executor
def test_bounded_fragments_leave_nothing_in_flight(services: list[EnvService], tmp_path: Path) -> None:
    src = FragmentSource([s.address for s in services], steps=4, inflight=3)
    try:
        src.set_policy(make_bundle(tmp_path, version=1))
        for _ in range(3):
            assert len(list(src.fragments(5))) == 5
            assert sum(src._pending.values()) == 0 and src._done.empty()
        assert src.stats.fragments == 15
    finally:
        src.close()


@needs_executor
@pytest.mark.parametrize("failure", ["killed", "hung"])
def test_fragments_of_a_dead_or_hung_service_are_reissued(failure: str, tmp_path: Path) -> None:
    procs = start_services("CartPole-v1", count=2, envs=2)
    src = FragmentSource([p.address for p in procs], steps=4, timeout_s=2.0)
    try:
        src.set_policy(make_bundle(tmp_path, version=1))
        assert len(list(src.fragments(2))) == 2
        os.kill(procs[0].proc.pid, signal.SIGKILL if failure == "killed" else signal.SIGSTOP)
        more = []
        for batch in src.fragments():  # training goes on while the failure is detected (deadline 2 s)
            more.append(batch)
            if src.stats.dead and len(more) >= 6:
                break
        assert src.stats.dead == [procs[0].address] and src.stats.reissued >= 1
        assert {b.source for b in more[-3:]} == {more[-1].source}  # only the live service answers now
    finally:
        src.close()
        if failure == "hung" and procs[0].proc.poll() is None:
            os.kill(procs[0].proc.pid, signal.SIGCONT)
        for p in procs:
            p.stop()


@needs_executor
def test_a_restarted_service_is_revived(services: list[EnvService], tmp_path: Path) -> None:
    src = FragmentSource([s.address for s in services[:2]], steps=2, timeout_s=2.0)
    try:
        bundle = make_bundle(tmp_path, version=1)
        src.set_policy(bundle)
        port = services[0].port
        services[0].stop(0)
        for _ in src.fragments():
            if src.stats.dead:
                break
        assert src.revive() == []  # still down
        services[0] = EnvService(EnvServiceConfig(envs=2, port=port)).start()
        services[0].load_bundle(bundle)
        assert src.revive(timeout_s=5.0) == [services[0].address] and src.stats.dead == []
        sources = {b.source for b in src.fragments(8)}
        assert services[0].service_id in sources
    finally:
        src.close()
