"""The gRPC env service over real loopback gRPC: per-step, batched and fragment calls, deadlines, health."""

from __future__ import annotations

import contextlib
import filecmp
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import device
from functions._codec import CodecError, compress, decompress
from functions._envservice import (
    EnvService,
    EnvServiceClient,
    EnvServiceConfig,
    EnvServiceError,
    ServiceUnavailableError,
    space_from_json,
)
from tests._cli import STRATA

REPO = Path(__file__).resolve().parents[2]

needs_executor = pytest.mark.skipif(not hasattr(device, "NumpyExecutor"),
                                    reason="device.NumpyExecutor has not landed yet")


def mlp_model(obs_dim: int = 4, hidden: int = 16, n_actions: int = 2, seed: int = 0) -> bytes:
    """A strata-contract ONNX policy: obs -> Gemm/Tanh/Gemm -> logits, ArgMax -> action."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((obs_dim, hidden)).astype(np.float32)
    w2 = rng.standard_normal((hidden, n_actions)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(np.zeros(hidden, np.float32), "b1"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.zeros(n_actions, np.float32), "b2")]
    nodes = [helper.make_node("Gemm", ["obs", "w1", "b1"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Gemm", ["t", "w2", "b2"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["action"], axis=1, keepdims=0)]
    obs = helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", obs_dim])
    graph = helper.make_graph(nodes, "policy", [obs],
                              [helper.make_tensor_value_info("action", TensorProto.INT64, ["b"]),
                               helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", n_actions])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def make_bundle(tmp_path: Path, *, version: int = 1, seed: int = 0, env_id: str = "CartPole-v1") -> bytes:
    """A signed CartPole policy bundle of `mlp_model`."""
    key_path = tmp_path / "strata-signing.key"
    if not key_path.exists():
        device.generate_keypair(tmp_path)
    env = gym.make(env_id)
    bundle = device.build_bundle(mlp_model(seed=seed), policy="cartpole", version=version, parent_version=None,
                                 observation_space=device.space_to_json(env.observation_space),
                                 action_space=device.space_to_json(env.action_space),
                                 signing_key=device.load_signing_key(key_path), output_names=("action", "logits"))
    env.close()
    return bytes(bundle.to_bytes())


@pytest.fixture
def service() -> Iterator[EnvService]:
    svc = EnvService(EnvServiceConfig(envs=4, seed=3)).start()
    yield svc
    svc.stop(0)


@pytest.fixture
def client(service: EnvService) -> Iterator[EnvServiceClient]:
    c = EnvServiceClient(service.address, timeout_s=5.0)
    yield c
    c.close()


def test_spec_and_health(client: EnvServiceClient, service: EnvService) -> None:
    spec = client.spec()
    assert spec["num_envs"] == 4 and spec["env_id"] == "CartPole-v1" and spec["service_id"] == service.service_id
    assert space_from_json(spec["action_space"]) == gym.spaces.Discrete(2)
    assert space_from_json(spec["observation_space"]).shape == (4,)
    assert client.health(timeout_s=30.0)
    service.stop(0)
    assert not client.health(timeout_s=0.5)


def test_per_step_calls_match_a_local_env(client: EnvServiceClient) -> None:
    first = client.reset(seed=10)
    local = gym.make("CartPole-v1")
    obs, _ = local.reset(seed=11)  # env 1 of the service is seeded with seed + 1
    np.testing.assert_array_equal(first[1], obs)
    for _ in range(20):
        out = client.step_one(1, 1)
        obs, reward, term, trunc, _ = local.step(1)
        np.testing.assert_array_equal(out["obs"][0], obs)
        assert out["rewards"][0] == reward and out["terminations"][0] == term
        if term or trunc:
            break
    assert term, "pushing right for 20 steps ends a CartPole episode"


def test_batched_step_next_step_autoreset(client: EnvServiceClient) -> None:
    client.reset(seed=0)
    for _ in range(40):
        out = client.step(np.ones(4, dtype=np.int64))
        assert out["obs"].shape == (4, 4) and out["rewards"].shape == (4,)
        if out["terminations"].any():
            break
    done = out["terminations"].copy()
    after = client.step(np.ones(4, dtype=np.int64))  # NEXT_STEP: the ended envs only reset in this call
    assert np.all(after["rewards"][done] == 0.0) and not after["terminations"][done].any()


def test_batched_step_same_step_autoreset_returns_final_obs(client: EnvServiceClient) -> None:
    client.reset(seed=0)
    for _ in range(40):
        out = client.step(np.ones(4, dtype=np.int64), autoreset="same_step")
        if out["terminations"].any():
            break
    ended = np.flatnonzero(out["terminations"])
    assert ended.size
    # the final obs is past the termination threshold; the returned obs is a fresh reset (|x| small)
    assert np.all(np.abs(out["final_obs"][ended, 2]) > 0.2) and np.all(np.abs(out["obs"][ended]) < 0.06)


def test_bad_requests_are_refused_with_the_reason(client: EnvServiceClient) -> None:
    client.reset(seed=0)
    with pytest.raises(EnvServiceError, match=re.escape("the length of actions must match the 4 envs stepped, "
                                                        "got length=3")):
        client.step(np.ones(3, dtype=np.int64))
    with pytest.raises(EnvServiceError, match=re.escape("Rollout: no policy is loaded")):
        client.rollout(4)


class _SlowEnv(gym.Wrapper[Any, Any, Any, Any]):
    def step(self, action: Any) -> Any:
        time.sleep(1.0)
        return self.env.step(action)


def test_a_call_past_its_deadline_raises_service_unavailable() -> None:
    svc = EnvService(EnvServiceConfig(envs=1), env_fn=lambda: _SlowEnv(gym.make("CartPole-v1"))).start()
    c = EnvServiceClient(svc.address, timeout_s=0.2)
    try:
        c.reset(seed=0)
        with pytest.raises(ServiceUnavailableError, match=re.escape("DEADLINE_EXCEEDED")):
            c.step(np.ones(1, dtype=np.int64))
    finally:
        c.close()
        svc.stop(0)


def test_large_observations_travel_compressed() -> None:
    svc = EnvService(EnvServiceConfig(envs=2, compress_above=0)).start()  # compress every reply
    c = EnvServiceClient(svc.address)
    try:
        local = gym.make("CartPole-v1")
        want, _ = local.reset(seed=5)
        np.testing.assert_array_equal(c.reset(seed=5)[0], want)
        reply = c._stub.Reset(c._pb.ResetRequest(has_seed=True, seed=5), timeout=2)
        assert reply.result.codec == "zlib"
    finally:
        c.close()
        svc.stop(0)


def test_codec_round_trip_and_corruption() -> None:
    data = np.arange(10000, dtype=np.float32).tobytes()
    packed = compress(data, "zlib")
    assert len(packed) < len(data) and decompress(packed, "zlib", len(data)) == data
    assert decompress(data, "", len(data)) == data
    with pytest.raises(CodecError, match=re.escape("zlib payload decoded to")):
        decompress(packed, "zlib", len(data) - 1)
    with pytest.raises(CodecError, match=re.escape("compress: unknown codec 'brotli'")):
        compress(data, "brotli")


@needs_executor
def test_rollout_fragment_carries_ids_and_policy_version(client: EnvServiceClient, tmp_path: Path) -> None:
    assert client.set_policy(make_bundle(tmp_path, version=3)) == 3
    a = client.rollout(8)
    b = client.rollout(8, codec="zlib")
    assert a.obs.shape == (8, 4, 4) and a.actions.shape == (8, 4) and a.logprobs is not None
    assert np.all(a.policy_version == 3) and a.source == client.spec()["service_id"]
    np.testing.assert_array_equal(a.seq[:, 0], np.arange(8))
    np.testing.assert_array_equal(b.seq[:, 0], np.arange(8, 16))  # streams keep numbering across fragments
    np.testing.assert_array_equal(b.obs[0], a.next_obs)
    assert np.all(a.logprobs <= 0) and set(np.unique(a.actions)) <= {0, 1}
    with pytest.raises(EnvServiceError, match=re.escape("loaded policy version 3 is older than min_version=4")):
        client.rollout(8, min_version=4)
    stream = client.stream_rollouts(4)
    got = [next(stream) for _ in range(3)]
    stream.close()
    assert [int(g.seq[0, 0]) for g in got] == [16, 20, 24]


def test_generated_code_is_reproducible(tmp_path: Path) -> None:
    subprocess.run([str(REPO / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable})
    names = sorted(p.name for p in (REPO / "functions" / "_proto").glob("*.py*"))
    assert names == sorted(p.name for p in tmp_path.glob("*.py*"))
    _, mismatch, errors = filecmp.cmpfiles(REPO / "functions" / "_proto", tmp_path, names, shallow=False)
    assert mismatch == [] and errors == []


def test_strata_envs_serve_smoke() -> None:
    proc = subprocess.Popen([STRATA, "envs", "serve", "--env", "CartPole-v1", "--envs", "2", "--port", "0",
                             "--duration", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " on 127.0.0.1:" in line, line + (proc.stderr.read() if proc.stderr else "")
        c = EnvServiceClient(line.rsplit(" on ", 1)[1].strip(), timeout_s=10)
        assert c.reset(seed=0).shape == (2, 4)
        assert c.step(np.zeros(2, dtype=np.int64))["rewards"].tolist() == [1.0, 1.0]
        c.close()
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for s in (proc.stdout, proc.stderr):
            if s is not None:
                s.close()


def test_strata_envs_serve_refuses_an_unknown_env() -> None:
    from tests._cli import run_strata

    result = run_strata("envs", "serve", "--env", "NoSuchEnv-v0", "--duration", "1", timeout=60)
    assert result.returncode == 2
    assert "strata envs serve: error: --env 'NoSuchEnv-v0': is not a registered gymnasium env" in result.stderr


class _Stop(BaseException):
    """What a stop-signal handler raises (as `strata train`'s does)."""


@pytest.mark.parametrize("call", ["reset", "step"])
def test_a_stop_signal_during_calls_never_leaves_the_channel_unclosable(service: EnvService, call: str) -> None:
    # Found by benchmarks/soak.py: a SIGTERM raised inside a waiting gRPC call orphaned it, and the trainer then
    # hung for ever closing the channel after its stop line (about one stop in three).
    def stop(signum: int, frame: Any) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
    rng = np.random.default_rng(0)
    hung = 0
    try:
        for _ in range(20):
            client = EnvServiceClient(service.address, timeout_s=10.0)
            client.reset()
            threading.Timer(float(rng.uniform(0.01, 0.1)),
                            lambda: signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)).start()
            with contextlib.suppress(_Stop):
                while True:
                    if call == "reset":
                        client.reset()
                    else:
                        client.step(np.zeros(4, dtype=np.int64))
            closer = threading.Thread(target=client.close, daemon=True)
            closer.start()
            closer.join(timeout=30)
            hung += closer.is_alive()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert hung == 0, f"{hung} of 20 channels could not be closed"
