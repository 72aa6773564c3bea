"""The parameter server and the replay service on the secure service plane: mutual TLS and roles per method."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from cloud.params._server import ParameterServer, ParamServerConfig
from cloud.replay._factory import make_replay, start_replay_server
from cloud.replay._grpc import GrpcReplayClient
from cloud.replay._tables import ReplayConfig, ReplayError, Signature
from cloud.rollout._decoupled import discover_services
from device._pki import issue_run_certificates
from functions._paramclient import ParamClientError, ParameterClient
from functions._secure import PLAINTEXT, ServicePlaneError, ServiceTLS

SIG: Signature = {"obs": ((3,), "float32"), "reward": ((), "float32")}


def role_tls(run: Path, role: str) -> ServiceTLS:
    return ServiceTLS(tls_ca=str(run / "ca.crt"), tls_cert=str(run / role / "tls.crt"),
                      tls_key=str(run / role / "tls.key"), tls_token_file=str(run / "token"))


@pytest.fixture(scope="module")
def run_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs") / "run"
    issue_run_certificates(out, roles={"learner": [], "env": []})
    return out


def test_the_learner_pushes_env_hosts_pull_and_may_not_push(run_certs: Path) -> None:
    server = ParameterServer(ParamServerConfig(tls=role_tls(run_certs, "learner"), health_port=0)).start()
    learner = ParameterClient(server.address, policy="p", tls=role_tls(run_certs, "learner"))
    env_host = ParameterClient(server.address, policy="p", tls=role_tls(run_certs, "env"))
    stranger = ParameterClient(server.address, policy="p", timeout_s=5.0)
    try:
        assert learner.push({"w": np.arange(4, dtype=np.float32)}) == (1, learner.latest()[1])
        assert env_host.update_and_wait(5.0)
        assert env_host.weights is not None and env_host.weights["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
        with pytest.raises(ParamClientError, match=re.escape("is not of a role that may call it (learner)")):
            env_host.push({"w": np.zeros(4, dtype=np.float32)})
        with pytest.raises(ParamClientError, match="closes plaintext clients"):
            stranger.latest()
        assert server.health_port > 0
    finally:
        for client in (learner, env_host, stranger):
            client.close()
        server.stop()


def test_the_parameter_server_refuses_a_public_plaintext_bind() -> None:
    with pytest.raises(ServicePlaneError, match=re.escape("refusing to listen on '0.0.0.0' without TLS")):
        ParameterServer(ParamServerConfig(host="0.0.0.0"))


def test_the_replay_service_over_mutual_tls(run_certs: Path) -> None:
    config = ReplayConfig(capacity=8, prioritized=False)
    server = start_replay_server(SIG, config, tls=role_tls(run_certs, "learner"))
    try:
        actor = make_replay("grpc", SIG, config, address=server.address, tls=role_tls(run_certs, "env"))
        assert actor.insert({"obs": np.ones((2, 3), np.float32), "reward": np.zeros(2, np.float32)})
        assert actor.stats().size == 2
        actor.close()
        with pytest.raises(ReplayError, match="closes plaintext clients"):
            GrpcReplayClient(server.address, signature=SIG, tls=PLAINTEXT, connect_timeout=1.0)
    finally:
        server.stop(grace=None)


def test_a_headless_service_name_is_one_env_service_per_address() -> None:
    # documentation addresses (RFC 5737), never dialled
    answers = {"envs.strata.svc": ["192.0.2.7", "198.51.100.9", "192.0.2.7"]}

    def resolve(host: str, port: int, type: int) -> list[tuple[object, ...]]:
        return [(2, type, 6, "", (ip, port)) for ip in answers[host]]

    found = discover_services("envs.strata.svc:50051,127.0.0.1:7000", resolve=resolve)
    assert found == [("192.0.2.7:50051", "envs.strata.svc"), ("198.51.100.9:50051", "envs.strata.svc"),
                     ("127.0.0.1:7000", "")]


def test_train_refuses_tls_flags_it_would_not_use(run_certs: Path, tmp_path: Path) -> None:
    from tests._cli import run_strata

    token = ["--tls-token-file", str(run_certs / "token")]
    ppo = run_strata("train", "--env", "CartPole-v1", "--total-steps", "64", "--run-dir", str(tmp_path / "r"), *token)
    assert ppo.returncode == 2
    assert "this run has neither: add --env-services" in ppo.stderr.strip().splitlines()[-1]
    sac = run_strata("train", "--env", "Pendulum-v1", "--algo", "sac", "--total-steps", "64", "--run-dir",
                     str(tmp_path / "s"), *token)
    assert sac.returncode == 2
    assert "does not use --tls-token-file" in sac.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()
