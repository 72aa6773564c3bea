"""What the secure service plane costs: fragments/s of a decoupled run across network namespaces, mTLS vs plaintext.

Three "hosts" (Linux network namespaces on one bridge, `tests._netns`): a learner and two env hosts. Each env host
runs two `strata envs serve` with K CartPole envs on its own address: one plaintext (``--insecure-plaintext-off-
loopback``, the baseline) and one with mutual TLS and the per-run token (`strata certs`). A client in the
learner's namespace drives a `FragmentSource` over both services of each kind (the services act with an MLP
4-64-64-2 bundle for F steps of K envs per call, 2 calls in flight per service) and alternates plaintext and mTLS
windows of the same number of fragments, so both see the same machine in the same minutes. Two shapes: the
decoupled run's usual fragments (F=64 steps x K=32 envs) and small ones (F=8 x K=8), where the per-call cost of
TLS weighs most. Goal: mTLS costs at most 10% of the fragments/s at the usual shape.

All namespaces share this machine's cores: the figure is the CPU cost of TLS (handshake once, then AES-GCM and
framing per message, and the per-call role and token check), not a network's latency. Each window also records
the CPU time the client and the driven services used per env step (from /proc): fragments/s move with whatever
else loads the machine in that window, CPU per step does much less. Needs root and network namespaces.

    PYTHONPATH=. .venv/bin/python -m benchmarks.service_plane_tls [--quick]
"""

from __future__ import annotations

import argparse
import json
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPES = {"usual": (64, 32), "small": (8, 8)}
"""Shape name -> (F steps per fragment, K envs per service)."""
PLAIN_PORT, TLS_PORT = 50051, 50052


def _serve(net: Any, host: str, certs: Path, *, envs: int, port: int, secure: bool) -> tuple[Any, str]:
    flags = (["--tls-ca", str(certs / "ca.crt"), "--tls-cert", str(certs / "env" / "tls.crt"), "--tls-key",
              str(certs / "env" / "tls.key"), "--tls-token-file", str(certs / "token")] if secure
             else ["--insecure-plaintext-off-loopback"])
    strata = str(Path(sys.executable).with_name("strata"))
    proc = net.popen(host, [strata, "envs", "serve", "--host", net.address(host), "--port", str(port), "--envs",
                            str(envs), "--max-workers", "4", *flags],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if " on " not in line:
        raise RuntimeError(f"env service on {host} did not start: {line!r}")
    return proc, line.rsplit(" on ", 1)[1].strip()


def client(args: argparse.Namespace) -> int:
    """Inside the learner's namespace: alternate plaintext and mTLS windows; print one JSON line."""
    from cloud.rollout._decoupled import FragmentSource
    from functions._secure import ServiceTLS

    certs = Path(args.certs)
    secure = ServiceTLS(tls_ca=str(certs / "ca.crt"), tls_cert=str(certs / "learner" / "tls.crt"),
                        tls_key=str(certs / "learner" / "tls.key"), tls_token_file=str(certs / "token"))
    bundle = Path(args.bundle).read_bytes()
    sources = {"plaintext": FragmentSource(args.plain.split(","), steps=args.steps, inflight=2, timeout_s=120,
                                           tls=ServiceTLS(insecure_plaintext_off_loopback=True)),
               "mtls": FragmentSource(args.tls.split(","), steps=args.steps, inflight=2, timeout_s=120, tls=secure)}
    for source in sources.values():
        source.set_policy(bundle)
    # warm-up (connections, handshakes, first policy loads), and the window size from the plaintext rate
    started = time.perf_counter()
    for source in sources.values():
        for _ in source.fragments(count=8):
            pass
    rate = 16 / (time.perf_counter() - started)
    per_window = max(8, int(rate * args.seconds))
    pids = {"plaintext": [int(p) for p in args.plain_pids.split(",")],
            "mtls": [int(p) for p in args.tls_pids.split(",")]}
    rounds: dict[str, list[float]] = {name: [] for name in sources}
    steps: dict[str, list[float]] = {name: [] for name in sources}
    cpu: dict[str, list[float]] = {name: [] for name in sources}
    for r in range(args.rounds):
        order = list(sources) if r % 2 == 0 else list(reversed(sources))
        for name in order:
            n, transitions = 0, 0
            cpu0, t0 = _cpu_s(pids[name]), time.perf_counter()
            for batch in sources[name].fragments(count=per_window):
                n += 1
                transitions += batch.size
            elapsed, used = time.perf_counter() - t0, _cpu_s(pids[name]) - cpu0
            rounds[name].append(n / elapsed)
            steps[name].append(transitions / elapsed)
            cpu[name].append(used / transitions * 1e6)
    for source in sources.values():
        source.close()
    print(json.dumps({"fragments_per_s": rounds, "env_steps_per_s": steps, "cpu_us_per_env_step": cpu,
                      "fragments_per_window": per_window}))
    return 0


def _cpu_s(server_pids: list[int]) -> float:
    """CPU seconds used so far by this client (all its threads) and the given env-service processes.

    Read from /proc (namespaces share the machine's process table), so the figure counts work, not waiting: it
    holds still when other programs load the machine, where fragments/s do not.
    """
    import os

    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in server_pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short windows and fewer rounds (< 1 minute)")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    for name in ("--plain", "--tls", "--certs", "--bundle", "--plain-pids", "--tls-pids"):
        parser.add_argument(name, default="", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=64, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=4.0, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        return client(args)

    from benchmarks.decoupled_transport import policy_bundle
    from tests._netns import Hosts, unavailable

    why = unavailable()
    if why is not None:
        print(f"service_plane_tls: cannot run here: {why}", file=sys.stderr)
        print(json.dumps({"benchmark": "service_plane_tls", "skipped": why}))
        return 1
    seconds, rounds = (1.5, 5) if args.quick else (4.0, 7)
    shapes = {"usual": SHAPES["usual"]} if args.quick else SHAPES
    strata = str(Path(sys.executable).with_name("strata"))
    figures: dict[str, Any] = {"benchmark": "service_plane_tls", "quick": args.quick, "env": "CartPole-v1",
                               "rounds": rounds, "services": "2 env hosts x (1 plaintext + 1 mTLS service)"}
    with tempfile.TemporaryDirectory() as tmp_name, Hosts(["learner", "env1", "env2"]) as net:
        tmp = Path(tmp_name)
        bundle = tmp / "policy.bundle"
        bundle.write_bytes(policy_bundle(tmp))
        certs = tmp / "certs"
        subprocess.run([strata, "certs", "--out", str(certs), "--role", f"learner={net.address('learner')}",
                        "--role", f"env={net.address('env1')},{net.address('env2')}"], check=True,
                       capture_output=True)
        for shape, (steps, envs) in shapes.items():
            procs, plain, secure, plain_pids, tls_pids = [], [], [], [], []
            for host in ("env1", "env2"):
                p, a = _serve(net, host, certs, envs=envs, port=PLAIN_PORT, secure=False)
                procs.append(p)
                plain.append(a)
                plain_pids.append(str(p.pid))  # `ip netns exec` execs the command: the same process
                p, a = _serve(net, host, certs, envs=envs, port=TLS_PORT, secure=True)
                procs.append(p)
                secure.append(a)
                tls_pids.append(str(p.pid))
            run = net.run("learner", [sys.executable, "-m", "benchmarks.service_plane_tls", "--client", "--plain",
                                      ",".join(plain), "--tls", ",".join(secure), "--certs", str(certs), "--bundle",
                                      str(bundle), "--steps", str(steps), "--seconds", str(seconds), "--rounds",
                                      str(rounds), "--plain-pids", ",".join(plain_pids), "--tls-pids",
                                      ",".join(tls_pids)], timeout=600)
            for p in procs:
                net.kill(p)
            if run.returncode != 0:
                raise RuntimeError(f"the client failed: {run.stderr[-2000:]}")
            got = json.loads(run.stdout.strip().splitlines()[-1])
            plain_rate = statistics.median(got["fragments_per_s"]["plaintext"])
            tls_rate = statistics.median(got["fragments_per_s"]["mtls"])
            plain_cpu = statistics.median(got["cpu_us_per_env_step"]["plaintext"])
            tls_cpu = statistics.median(got["cpu_us_per_env_step"]["mtls"])
            figures[shape] = {
                "fragment_steps": steps, "envs_per_service": envs,
                "plaintext_fragments_per_s": round(plain_rate, 1), "mtls_fragments_per_s": round(tls_rate, 1),
                "plaintext_env_steps_per_s": round(statistics.median(got["env_steps_per_s"]["plaintext"])),
                "mtls_env_steps_per_s": round(statistics.median(got["env_steps_per_s"]["mtls"])),
                "mtls_cost": round(1 - tls_rate / plain_rate, 4),
                "plaintext_cpu_us_per_env_step": round(plain_cpu, 2), "mtls_cpu_us_per_env_step": round(tls_cpu, 2),
                "mtls_cpu_cost": round(tls_cpu / plain_cpu - 1, 4),
                "rounds_cpu_us_per_env_step": got["cpu_us_per_env_step"],
                "rounds_fragments_per_s": got["fragments_per_s"], "fragments_per_window": got["fragments_per_window"],
            }
    print(f"{'shape':<22} {'plaintext frag/s':>17} {'mTLS frag/s':>12} {'mTLS cost':>10} {'steps/s plain':>14} "
          f"{'steps/s mTLS':>13} {'CPU us/step plain':>18} {'CPU us/step mTLS':>17} {'CPU cost':>9}")
    for shape in shapes:
        f = figures[shape]
        label = f"{shape} ({f['fragment_steps']}x{f['envs_per_service']})"
        print(f"{label:<22} {f['plaintext_fragments_per_s']:>17,.1f} {f['mtls_fragments_per_s']:>12,.1f} "
              f"{f['mtls_cost']:>10.1%} {f['plaintext_env_steps_per_s']:>14,} {f['mtls_env_steps_per_s']:>13,} "
              f"{f['plaintext_cpu_us_per_env_step']:>18.2f} {f['mtls_cpu_us_per_env_step']:>17.2f} "
              f"{f['mtls_cpu_cost']:>9.1%}")
    figures["goal_mtls_cost_le_10pct"] = figures["usual"]["mtls_cost"] <= 0.10
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
