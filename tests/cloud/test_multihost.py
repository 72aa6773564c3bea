"""Hosts, really separate: the learner, env services and hybrid units in their own network namespaces.

Each test makes its hosts with `tests._netns.Hosts` (namespaces joined by veth pairs on a bridge; the addresses
exist only inside them) and removes them when it ends, passed or failed. Every service listens on its host's
address, so the service plane's rule applies for real: plaintext off loopback is refused, these runs use the run's
certificates (`strata certs`).
"""

from __future__ import annotations

import json
import os
import select
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests._cli import STRATA
from tests._netns import Hosts, unavailable

SKIP = unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=f"network namespaces unavailable: {SKIP}")

ENV_PORT = "50051"

MakeHosts = Callable[..., Hosts]


@pytest.fixture
def hosts() -> Iterator[MakeHosts]:
    """Make `Hosts`; each is closed (processes killed, namespaces deleted) when the test ends, however it ends."""
    made: list[Hosts] = []

    def make(*names: str) -> Hosts:
        h = Hosts(names)
        made.append(h)
        return h.start()

    yield make
    for h in made:
        h.close()


def certs_for(net: Hosts, out: Path, *, learner: list[str], env: list[str]) -> Path:
    roles = ["--role", "learner=" + ",".join(net.address(h) for h in learner),
             "--role", "env=" + ",".join(net.address(h) for h in env)]
    made = subprocess.run([STRATA, "certs", "--out", str(out), *roles], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    return out


def tls_flags(certs: Path, role: str) -> list[str]:
    return ["--tls-ca", str(certs / "ca.crt"), "--tls-cert", str(certs / role / "tls.crt"),
            "--tls-key", str(certs / role / "tls.key"), "--tls-token-file", str(certs / "token")]


def read_line(proc: subprocess.Popen[str], what: str, timeout: float = 120.0) -> str:
    """The next stdout line of `proc` (waits on the pipe, not on a clock); fails naming `what` if none comes."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    assert line, f"{what}: no line within {timeout} s (exit status {proc.poll()})"
    return line


def serve_envs(net: Hosts, hosts: list[str], certs: Path, logs: Path, *, envs: int = 4
               ) -> dict[str, tuple[subprocess.Popen[str], str]]:
    """`strata envs serve` on each host's address over mutual TLS, started together; host -> (process, address).

    Each service's stderr goes to ``logs/HOST.err``.
    """
    procs = {}
    for host in hosts:
        with (logs / f"{host}.err").open("w") as err:
            procs[host] = net.popen(host, [STRATA, "envs", "serve", "--host", net.address(host), "--port", ENV_PORT,
                                           "--envs", str(envs), *tls_flags(certs, "env")],
                                    stdout=subprocess.PIPE, stderr=err, text=True)
    started = {}
    for host, proc in procs.items():
        line = read_line(proc, f"env service on {host}")
        assert "over mutual TLS on" in line, line
        started[host] = (proc, line.rsplit(" on ", 1)[1].strip())
    return started


def train_args(run_dir: Path, services: list[str], certs: Path, *, total_steps: int) -> list[str]:
    return [STRATA, "train", "--env", "CartPole-v1", "--preset", "none", "--total-steps", str(total_steps),
            "--run-dir", str(run_dir), "--modes", "decoupled", "--env-services", ",".join(services),
            "--num-envs", "8", "--num-steps", "64", "--confirm-episodes", "0", *tls_flags(certs, "learner")]


def test_decoupled_run_across_three_hosts_over_mtls_and_a_stranger_refused(hosts: MakeHosts, tmp_path: Path) -> None:
    """Learner, two env hosts and a stranger's host: the run trains over mutual TLS; the stranger gets nothing."""
    started = time.monotonic()
    net = hosts("learner", "env1", "env2", "stranger")
    certs = certs_for(net, tmp_path / "certs", learner=["learner"], env=["env1", "env2"])
    services = serve_envs(net, ["env1", "env2"], certs, tmp_path)
    addresses = [services[h][1] for h in ("env1", "env2")]

    # the run and the stranger's two attempts go on at once (independent hosts; the run's calls must not be hurt)
    run_dir = tmp_path / "run"
    with (tmp_path / "train.out").open("w") as out, (tmp_path / "train.err").open("w") as err:
        run = net.popen("learner", train_args(run_dir, addresses, certs, total_steps=1024), stdout=out, stderr=err,
                        text=True)
    # the stranger: no certificate at all (refused at the handshake), and an env host's certificate used as a
    # client of another env host (refused per call: env services take calls from the learner role only)
    probe = ("import sys; from functions._envservice import EnvServiceClient, EnvServiceError\n"
             "from functions._secure import service_tls_from_args\n"
             "import argparse; a = argparse.Namespace(tls_ca=sys.argv[2], tls_cert=sys.argv[3], tls_key=sys.argv[4],"
             " tls_token_file=sys.argv[5])\n"
             "c = EnvServiceClient(sys.argv[1], tls=service_tls_from_args(a), timeout_s=20)\n"
             "try:\n    c.spec()\nexcept EnvServiceError as e:\n    print(e)\n    sys.exit(3)\n")
    env_cert = [str(certs / "ca.crt"), str(certs / "env" / "tls.crt"), str(certs / "env" / "tls.key"),
                str(certs / "token")]
    plain = net.popen("stranger", [STRATA, "envs", "health", addresses[0], "--timeout", "20",
                                   "--insecure-plaintext-off-loopback"], stderr=subprocess.PIPE, text=True)
    wrong_role = net.popen("stranger", [sys.executable, "-c", probe, addresses[1], *env_cert], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    _, plain_err = plain.communicate(timeout=120)
    assert plain.returncode == 1, plain_err
    [line] = [x for x in plain_err.splitlines() if x.startswith("strata envs health:")]
    assert "closes plaintext clients" in line, plain_err
    wrong_out, _ = wrong_role.communicate(timeout=120)
    assert wrong_role.returncode == 3, wrong_out
    assert "is not of a role that may call it (learner)" in wrong_out

    assert run.wait(300) == 0, (tmp_path / "train.err").read_text()[-3000:]
    assert "1,024 env steps" in (tmp_path / "train.out").read_text()
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(m.get("mode", "decoupled") == "decoupled" for m in metrics)

    for proc, _ in services.values():
        net.kill(proc)
    # the servers' sides: one line each for the refusals they saw
    env1_log, env2_log = (tmp_path / "env1.err").read_text(), (tmp_path / "env2.err").read_text()
    assert sum("Handshake failed" in x for x in env1_log.splitlines()) == 1, env1_log
    refusals = [x for x in env2_log.splitlines() if "refused /strata.env.v1.EnvService/Spec" in x]
    assert len(refusals) == 1 and "spiffe://strata/env" in refusals[0], env2_log
    print(f"multi-host decoupled run over mTLS: {time.monotonic() - started:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "partitioned"])
def test_the_run_fails_over_when_a_hosts_services_die(how: str, hosts: MakeHosts, tmp_path: Path) -> None:
    """Three env hosts, two in use and one spare; one host's service is killed (or its link cut) mid-run."""
    net = hosts("learner", "env1", "env2", "env3")
    certs = certs_for(net, tmp_path / "certs", learner=["learner"], env=["env1", "env2", "env3"])
    services = serve_envs(net, ["env1", "env2", "env3"], certs, tmp_path)
    run_dir = tmp_path / "run"
    args = train_args(run_dir, [services[h][1] for h in ("env1", "env2", "env3")], certs, total_steps=16_384)
    with (tmp_path / "train.out").open("w") as out, (tmp_path / "train.err").open("w") as err:
        learner = net.popen("learner", args, stdout=out, stderr=err, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # two updates done: mid-run
        assert learner.poll() is None, (tmp_path / "train.err").read_text()[-2000:]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.1)
    if how == "killed":
        net.kill(services["env2"][0])
    else:
        net.cut("env2")
    assert learner.wait(300) == 0, (tmp_path / "train.err").read_text()[-3000:]
    out_text, err_text = (tmp_path / "train.out").read_text(), (tmp_path / "train.err").read_text()
    assert "16,384 env steps" in out_text, out_text
    assert f"env service {services['env2'][1]} is dead or hung" in err_text
    assert f"moved to spare {services['env3'][1]}" in err_text


@pytest.mark.slow
def test_torchrun_with_two_nodes_in_two_namespaces(hosts: MakeHosts, tmp_path: Path) -> None:
    """Two hybrid units, one per namespace, joined by torchrun's c10d rendezvous and gloo over the veth link.

    Rank 0's parameter server listens on node0's address, so it must (and does) use the run's certificates.
    """
    net = hosts("node0", "node1")
    certs = certs_for(net, tmp_path / "certs", learner=["node0", "node1"], env=[])
    endpoint = f"{net.address('node0')}:29400"
    run_dir = tmp_path / "run"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    procs: list[tuple[str, subprocess.Popen[Any]]] = []
    for node in ("node0", "node1"):
        # Both namespaces share the machine's hostname, so torchrun is told which node hosts the rendezvous store
        # (is_host) and which address each node's workers are reached at (--local-addr, else the hostname's).
        args = [torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                endpoint, "--rdzv-conf", f"is_host={int(node == 'node0')}", "--local-addr", net.address(node),
                "--rdzv-id", "t38", "--max-restarts", "0",
                "--no-python", STRATA, "train", "--env",
                "CartPole-v1", "--preset", "none", "--total-steps", "4096", "--run-dir", str(run_dir), "--modes",
                "hybrid", "sync", "--num-envs", "4", "--num-steps", "64", "--confirm-episodes", "0",
                "--param-server-host", net.address("node0"), *tls_flags(certs, "learner")]
        with (tmp_path / f"{node}.out").open("w") as out:
            procs.append((node, net.popen(node, args, stdout=out, stderr=subprocess.STDOUT, text=True,
                                          env={"GLOO_SOCKET_IFNAME": "eth0"})))
    for node, proc in procs:
        assert proc.wait(600) == 0, (tmp_path / f"{node}.out").read_text()[-3000:]
    summary = (tmp_path / "node0.out").read_text() + (tmp_path / "node1.out").read_text()
    assert "2 hybrid units" in summary, summary[-3000:]
    assert f"parameter server {net.address('node0')}:" in summary, summary[-3000:]


@pytest.mark.slow
def test_the_rendered_pods_commands_train_across_hosts(hosts: MakeHosts, tmp_path: Path) -> None:
    """What `strata infra k8s render` puts in the learner's and env services' pods, run on separate hosts.

    The commands are the rendered ones (resume wrapper, 0.0.0.0 binds, TLS flags, health ports), with the mount
    paths moved into this test's folder; the learner finds the env services through the headless Service's DNS
    name, which resolves (in its namespace's /etc/hosts) to both env hosts, as cluster DNS would.
    """
    from infra._k8s import K8sConfig, Names, certs_command, render

    config = K8sConfig(total_steps=1024, env_replicas=2, envs_per_service=4, learner_workers=1)
    names = Names(config)
    objs = [o for path, text in render(config).items() if path.startswith("base/") for o in yaml.safe_load_all(text)]
    pods = {o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]["command"] for o in objs
            if o["kind"] == "Deployment"}
    path_env = {"PATH": f"{Path(STRATA).parent}:{os.environ['PATH']}"}
    made = subprocess.run(shlex.split(certs_command(config, out=str(tmp_path / "certs"))), capture_output=True,
                          text=True, timeout=120, env={**os.environ, **path_env})
    assert made.returncode == 0, made.stderr

    def mounted(command: list[str], role: str) -> list[str]:
        moves = {names.tls_dir: str(tmp_path / "certs" / role), names.token_dir: str(tmp_path / "certs"),
                 names.run_dir: str(tmp_path / "run")}
        out = []
        for arg in command:
            for old, new in moves.items():
                arg = arg.replace(old, new)
            out.append(arg)
        return out

    net = hosts("learner", "env1", "env2", "kubelet")
    envs = {}
    for host in ("env1", "env2"):
        with (tmp_path / f"{host}.err").open("w") as err:
            envs[host] = net.popen(host, mounted(pods[names.name("env-service")], "env"), env=path_env,
                                   stdout=subprocess.PIPE, stderr=err, text=True)
    for host, proc in envs.items():
        line = read_line(proc, f"env service on {host}")
        assert f"over mutual TLS on 0.0.0.0:{names.env_port}" in line, line
    # the kubelet's probe: plaintext, on the health-only port
    probe = net.run("kubelet", [STRATA, "envs", "health", f"{net.address('env1')}:{names.env_health_port}",
                                "--timeout", "20", "--insecure-plaintext-off-loopback"])
    assert probe.returncode == 0 and "SERVING" in probe.stdout, probe.stderr

    net.hosts_file("learner", {names.fqdn(names.name("env-service")): ["env1", "env2"]})
    learner = net.run("learner", mounted(pods[names.name("learner")], "learner"), env=path_env, timeout=240)
    assert learner.returncode == 0, learner.stdout[-2000:] + learner.stderr[-3000:]
    assert "1,024 env steps" in learner.stdout and "mode decoupled" in learner.stdout, learner.stdout
    for host in ("env1", "env2"):
        net.kill(envs[host])
        assert "refused" not in (tmp_path / f"{host}.err").read_text()
