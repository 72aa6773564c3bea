"""The parameter server over real gRPC with the env hosts' client: full, delta and lossy pulls, hash check."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import numpy as np
import pytest

from cloud.params._server import ParameterServer, ParamServerConfig, ParamServerError
from functions._codec import weights_sha256
from functions._paramclient import ParamClientError, ParameterClient, WeightsHashError


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal((64, 4)).astype(np.float32), "b1": np.zeros(64, np.float32),
            "w2": rng.standard_normal((2, 64)).astype(np.float32)}


def _sgd_step(w: dict[str, np.ndarray], rng: np.random.Generator, lr: float = 1e-3) -> dict[str, np.ndarray]:
    return {k: (v - lr * rng.standard_normal(v.shape)).astype(np.float32) for k, v in w.items()}


@pytest.fixture
def server() -> Iterator[ParameterServer]:
    srv = ParameterServer(ParamServerConfig(keep_versions=3)).start()
    yield srv
    srv.stop(0)


@pytest.fixture
def client(server: ParameterServer) -> Iterator[ParameterClient]:
    c = ParameterClient(server.address, policy="cartpole", timeout_s=5)
    yield c
    c.close()


def test_full_then_delta_then_nothing(server: ParameterServer, client: ParameterClient) -> None:
    assert client.update_and_wait() is False and client.version == 0  # nothing pushed yet
    w = _weights()
    assert client.push(w) == (1, weights_sha256(w))
    assert client.update_and_wait() and client.version == 1
    rng = np.random.default_rng(0)
    for _ in range(3):
        w = _sgd_step(w, rng)
        server.push("cartpole", w)
        assert client.update_and_wait()
        assert client.weights is not None and weights_sha256(client.weights) == weights_sha256(w)
    assert client.update_and_wait() is False  # reload only when the server's version is newer
    assert client.stats.kinds == {"none": 2, "full": 1, "delta": 3}
    assert all(p < f for p, f in zip(client.stats.payload_bytes[1:], client.stats.full_bytes[1:], strict=True))


def test_a_client_older_than_the_kept_versions_gets_a_full_snapshot(server: ParameterServer,
                                                                     client: ParameterClient) -> None:
    w = _weights()
    server.push("cartpole", w)
    client.update_and_wait()
    rng = np.random.default_rng(1)
    for _ in range(4):  # keep_versions=3: version 1 is gone
        w = _sgd_step(w, rng)
        server.push("cartpole", w)
    client.update_and_wait()
    assert client.version == 5 and client.stats.kinds["full"] == 2


def test_lossy_deltas_do_not_accumulate_error(server: ParameterServer) -> None:
    c = ParameterClient(server.address, policy="cartpole", lossy=True)
    w = _weights()
    server.push("cartpole", w)
    c.update_and_wait()
    rng = np.random.default_rng(2)
    errors = []
    for _ in range(20):
        w = _sgd_step(w, rng)
        server.push("cartpole", w)
        assert c.update_and_wait()
        assert c.weights is not None
        errors.append(max(float(np.abs(c.weights[k] - w[k]).max()) for k in w))
    c.close()
    assert c.stats.kinds["lossy"] == 20 and c.stats.hash_mismatches == 0
    assert max(errors) < 1e-4 and errors[-1] < 3 * errors[0]  # one quantisation step, never a sum of them
    assert sum(c.stats.payload_bytes[1:]) < 0.4 * sum(c.stats.full_bytes[1:])


def test_hash_mismatch_drops_state_and_resyncs_in_full(server: ParameterServer, client: ParameterClient) -> None:
    w = _weights()
    server.push("cartpole", w)
    client.update_and_wait()
    assert client.weights is not None
    client.weights["b1"][0] = 42.0  # the client's copy is corrupted: the next delta rebuilds wrong weights
    server.push("cartpole", {**w, "w1": w["w1"] + np.float32(1e-3)})  # b1 unchanged: travels as "same"
    with pytest.raises(WeightsHashError, match=re.escape("rebuilt weights hash to")):
        client.update_and_wait()
    assert client.version == 0 and client.stats.hash_mismatches == 1
    assert client.update_and_wait() and client.version == 2 and client.stats.kinds["full"] == 2


def test_update_is_non_blocking_with_one_fetch_in_flight(server: ParameterServer, client: ParameterClient) -> None:
    server.push("cartpole", _weights())
    assert client.update() is False  # starts the fetch, does not wait for it
    first = client._inflight
    assert first is not None and client.update() in (False, True)
    deadline = time.monotonic() + 60
    while client.version == 0 and time.monotonic() < deadline:
        client.update()
        time.sleep(0.01)
    assert client.version == 1
    assert client._inflight is not None  # always one fetch in flight, never more


def test_versions_must_increase(server: ParameterServer, client: ParameterClient) -> None:
    server.push("cartpole", _weights(), version=5)
    with pytest.raises(ParamServerError, match=re.escape("push: version 5 of policy 'cartpole' is not newer than "
                                                         "the latest 5")):
        server.push("cartpole", _weights(), version=5)
    with pytest.raises(ParamClientError, match=re.escape("Push of policy 'cartpole'")):
        client.push(_weights(), version=3)
    assert client.push(_weights())[0] == 6


def test_unreachable_server_is_a_typed_error() -> None:
    c = ParameterClient("127.0.0.1:1", policy="p", timeout_s=0.5)
    with pytest.raises(ParamClientError,
                       match=re.escape("Pull of policy 'p' on parameter server 127.0.0.1:1: UNAVAILABLE")):
        c.update_and_wait()
    c.close()
