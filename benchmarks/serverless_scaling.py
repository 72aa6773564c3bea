"""Serverless scaling on the local function runtime: invoke overhead, cold vs warm, rollout throughput.

Measured in one run against its baselines:

1. warm invoke overhead: boto3 ``lambda.invoke`` of `functions._handlers.ping_handler` through
   `strata functions serve`'s runtime (HTTP -> warm awslambdaric worker -> HTTP), against calling the
   handler in-process; overhead = p50(invoke) - p50(in-process). Goal: <= 2 ms p50.
2. cold vs warm: the first invocation of a fresh function (worker start, awslambdaric, imports)
   against warm ones, for the ping and the rollout handler.
3. rollout throughput of `cloud.rollout._serverless.ServerlessRolloutSource` at concurrency 1, 2, 4, 8 (CartPole,
   random policy) against the handler in-process on one core; scaling efficiency = throughput(c) /
   (c * throughput(1)). Goal: >= 0.8 at concurrency = cores.
4. the cost of carrying episodes across invocations (`functions._envstate`): bytes of carries per
   invocation and per fragment (sent with the event + returned with the result, base64 as on the wire)
   next to the fragment's own bytes, and ms per invocation with carries against the same source with
   ``carry_episodes=False``, alternating windows on one warm runtime; plus the handler alone, in-process.

Run: ``.venv/bin/python benchmarks/serverless_scaling.py [--quick]``; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import time
from typing import Any

import boto3
from botocore.config import Config

from cloud.rollout._serverless import ServerlessConfig, ServerlessRolloutSource, local_scaling
from functions._handlers import ping_handler, rollout_handler
from functions._lambda_api import FunctionSpec
from functions._runtime import LocalRuntime, RuntimeConfig, SourceTreeFunctions


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def lambda_client(url: str, pool: int = 10) -> Any:
    return boto3.client("lambda", endpoint_url=url, region_name="us-east-1", aws_access_key_id="bench",
                        aws_secret_access_key="bench",
                        config=Config(retries={"total_max_attempts": 1}, max_pool_connections=pool, read_timeout=120))


def rollout_event(envs: int, steps: int, seed: int = 0) -> dict[str, Any]:
    return {"rollout_id": f"bench-{seed}", "env": {"id": "CartPole-v1"}, "num_envs": envs, "seed": seed,
            "steps": steps, "policy": {"kind": "random"}}


def measure_overhead(url: str, n: int) -> dict[str, float]:
    """Interleave in-process calls, raw HTTP invokes and boto3 invokes; p50/p99 of each."""
    client = lambda_client(url)
    host, port = url.split("//")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port))
    payload = {"n": 1}
    body = json.dumps(payload).encode()

    def raw() -> None:
        conn.request("POST", "/2015-03-31/functions/ping/invocations", body=body,
                     headers={"Content-Type": "application/json"})
        conn.getresponse().read()

    for _ in range(30):
        client.invoke(FunctionName="ping", Payload=body)["Payload"].read()
        raw()
    inproc, http_raw, invoke = [], [], []
    for _ in range(n):
        t = time.perf_counter()
        json.loads(json.dumps(ping_handler(json.loads(body), None)))
        inproc.append(time.perf_counter() - t)
        t = time.perf_counter()
        raw()
        http_raw.append(time.perf_counter() - t)
        t = time.perf_counter()
        client.invoke(FunctionName="ping", Payload=body)["Payload"].read()
        invoke.append(time.perf_counter() - t)
    conn.close()
    out = {}
    for name, xs in (("inproc", inproc), ("raw_http", http_raw), ("invoke", invoke)):
        out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = pct(xs, 0.5) * 1e3, pct(xs, 0.99) * 1e3
    out["overhead_p50_ms"] = out["invoke_p50_ms"] - out["inproc_p50_ms"]
    out["overhead_p99_ms"] = out["invoke_p99_ms"] - out["inproc_p99_ms"]
    out["runtime_overhead_p50_ms"] = out["raw_http_p50_ms"] - out["inproc_p50_ms"]
    return out


def measure_cold(repeats: int) -> dict[str, float]:
    names = [f"ping{i}" for i in range(repeats)] + [f"roll{i}" for i in range(repeats)]
    specs = [FunctionSpec(name=n, handler="functions._handlers." + ("ping_handler" if n.startswith("ping")
                                                                   else "rollout_handler")) for n in names]
    out: dict[str, list[float]] = {"ping_cold": [], "ping_warm": [], "rollout_cold": [], "rollout_warm": []}
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0)) as rt:
        client = lambda_client(rt.url)
        for name in names:
            kind = "ping" if name.startswith("ping") else "rollout"
            body = json.dumps(rollout_event(1, 10) if kind == "rollout" else {}).encode()
            for i in range(4):
                t = time.perf_counter()
                client.invoke(FunctionName=name, Payload=body)["Payload"].read()
                out[f"{kind}_{'cold' if i == 0 else 'warm'}"].append(time.perf_counter() - t)
    return {f"{k}_ms": statistics.median(v) * 1e3 for k, v in out.items()}


def inproc_throughput(envs: int, steps: int, rounds: int) -> float:
    rollout_handler(rollout_event(envs, steps), None)
    t = time.perf_counter()
    for r in range(rounds):
        rollout_handler(rollout_event(envs, steps, seed=r), None)
    return envs * steps * rounds / (time.perf_counter() - t)


def source_throughputs(levels: tuple[int, ...], envs: int, steps: int, rollouts_per_worker: int,
                       repeats: int) -> dict[int, dict[str, float]]:
    """Steps/s of the serverless source at each concurrency, median of `repeats` windows.

    All runtimes are started and warm first, then measured round-robin, so load drift on a shared
    machine hits every level alike.
    """
    import contextlib

    with contextlib.ExitStack() as stack:
        sources = {}
        for c in levels:
            spec = FunctionSpec(name="strata-rollout", handler="functions._handlers.rollout_handler",
                                reserved_concurrency=c)
            rt = stack.enter_context(LocalRuntime(SourceTreeFunctions([spec]), config=RuntimeConfig(port=0)))
            cfg = local_scaling(ServerlessConfig(lambda_endpoint_url=rt.url, envs_per_invocation=envs,
                                                 steps_per_invocation=steps, min_concurrency=c, max_concurrency=c,
                                                 target_steps_per_s=1e12))
            source = stack.enter_context(ServerlessRolloutSource(cfg))
            for _ in source.fragments(count=c):  # start and warm every worker
                pass
            sources[c] = source
        rates: dict[int, list[float]] = {c: [] for c in levels}
        for _ in range(repeats):
            for c, source in sources.items():
                t = time.perf_counter()
                n = sum(b.size for b in source.fragments(count=rollouts_per_worker * c))
                rates[c].append(n / (time.perf_counter() - t))
        return {c: {"steps_per_s": statistics.median(rates[c]), "cost_usd": sources[c].stats.cost_usd(),
                    "gb_seconds": sources[c].stats.gb_seconds} for c in levels}


def _handler_ms(envs: int, steps: int, rounds: int) -> dict[str, float]:
    """p50 ms of the rollout handler in-process, fresh vs continued from the previous call's carries (interleaved)."""
    fresh, carried = [], []
    carry: list[Any] = [None] * envs
    seq = 0
    for r in range(rounds + 2):
        t = time.perf_counter()
        json.loads(json.dumps(rollout_handler(rollout_event(envs, steps, seed=r), None)))
        took_fresh = time.perf_counter() - t
        event = {**rollout_event(envs, steps), "carry": carry, "seq_base": seq}
        t = time.perf_counter()
        out = json.loads(json.dumps(rollout_handler(json.loads(json.dumps(event)), None)))
        took_carried = time.perf_counter() - t
        carry, seq = out["carry"], seq + steps
        if r >= 2:  # the first calls make the envs
            fresh.append(took_fresh)
            carried.append(took_carried)
    return {"handler_fresh_ms": statistics.median(fresh) * 1e3, "handler_carried_ms": statistics.median(carried) * 1e3}


def measure_carry(envs: int, steps: int, rollouts: int, repeats: int) -> dict[str, float]:
    """Milliseconds per invocation with and without carries (alternating windows, one warm runtime), carry bytes."""
    import contextlib

    spec = FunctionSpec(name="strata-rollout", handler="functions._handlers.rollout_handler", reserved_concurrency=2)
    with contextlib.ExitStack() as stack:
        rt = stack.enter_context(LocalRuntime(SourceTreeFunctions([spec]), config=RuntimeConfig(port=0)))
        sources = {}
        for carry in (True, False):
            cfg = local_scaling(ServerlessConfig(lambda_endpoint_url=rt.url, envs_per_invocation=envs,
                                                 steps_per_invocation=steps, min_concurrency=1, max_concurrency=1,
                                                 target_steps_per_s=1e12, carry_episodes=carry))
            sources[carry] = stack.enter_context(ServerlessRolloutSource(cfg))
            for _ in sources[carry].fragments(count=2):  # warm, and give the carrying source its first carries
                pass
        ms: dict[bool, list[float]] = {True: [], False: []}
        fragment_bytes: list[int] = []
        for _ in range(repeats):
            for carry, source in sources.items():
                t = time.perf_counter()
                for b in source.fragments(count=rollouts):
                    fragment_bytes.append(len(b.to_bytes()))
                ms[carry].append((time.perf_counter() - t) / rollouts * 1e3)
        st = sources[True].stats
        per_rollout = (st.carry_bytes_sent + st.carry_bytes_received) / max(st.rollouts, 1)
        return {"carry_bytes_per_invocation": per_rollout, "carry_bytes_per_stream": per_rollout / envs / 2,
                "carry_bytes_per_fragment": per_rollout / sources[True].config.fragments_per_rollout,
                "fragment_bytes": statistics.median(fragment_bytes),
                "invocation_ms_carried": statistics.median(ms[True]),
                "invocation_ms_fresh": statistics.median(ms[False]),
                "episodes_continued": st.episodes_continued}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small budgets: done in under a minute")
    args = parser.parse_args()
    q = args.quick
    # boto3 signs every request; the local runtime accepts any credentials (as moto does).
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    cores = os.cpu_count() or 1
    n_overhead = 300 if q else 2000
    envs, steps = 8, (128 if q else 256)

    specs = [FunctionSpec(name="ping", handler="functions._handlers.ping_handler")]
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0)) as rt:
        overhead = measure_overhead(rt.url, n_overhead)
    print(f"{'warm invoke (ping)':<34}{'p50 ms':>10}{'p99 ms':>10}")
    print(f"{'  in-process handler call':<34}{overhead['inproc_p50_ms']:>10.3f}{overhead['inproc_p99_ms']:>10.3f}")
    print(f"{'  raw HTTP invoke, local runtime':<34}{overhead['raw_http_p50_ms']:>10.3f}"
          f"{overhead['raw_http_p99_ms']:>10.3f}")
    print(f"{'  boto3 invoke, local runtime':<34}{overhead['invoke_p50_ms']:>10.3f}{overhead['invoke_p99_ms']:>10.3f}")
    print(f"{'  overhead (boto3 - in-process)':<34}{overhead['overhead_p50_ms']:>10.3f}"
          f"{overhead['overhead_p99_ms']:>10.3f}")

    cold = measure_cold(2 if q else 5)
    print(f"\n{'cold vs warm (median ms)':<34}{'cold':>10}{'warm':>10}{'ratio':>10}")
    for kind in ("ping", "rollout"):
        c, w = cold[f"{kind}_cold_ms"], cold[f"{kind}_warm_ms"]
        print(f"{'  ' + kind:<34}{c:>10.1f}{w:>10.2f}{c / w:>10.0f}x")

    base = inproc_throughput(envs, steps, 6 if q else 20)  # before the workers start: a fair single core
    print(f"\nrollout throughput (CartPole, random policy, {envs} envs x {steps} steps per invocation, "
          f"{cores} cores)")
    print(f"{'  in-process handler, 1 core':<34}{base:>12.0f} steps/s")
    rows: dict[str, Any] = {}
    levels = (1, 2, 4, 8)
    measured = source_throughputs(levels, envs, steps, 3 if q else 6, 1 if q else 3)
    one = measured[1]["steps_per_s"]
    for c in levels:
        r = measured[c]
        eff = r["steps_per_s"] / (c * one)
        eff_inproc = r["steps_per_s"] / (min(c, cores) * base)
        rows[str(c)] = {"steps_per_s": round(r["steps_per_s"]), "efficiency": round(eff, 3),
                        "vs_inproc_linear": round(eff_inproc, 3), "cost_usd": r["cost_usd"]}
        print(f"{'  concurrency ' + str(c):<34}{r['steps_per_s']:>12.0f} steps/s  efficiency {eff:5.2f}  "
              f"vs min(c, cores) x in-process {eff_inproc:4.2f}  est. AWS cost ${r['cost_usd']:.7f}")
    carry_rows: dict[str, Any] = {}
    print(f"\ncarrying episodes across invocations (CartPole, random policy, concurrency 1, steps per invocation "
          f"{steps})")
    print(f"{'  envs per invocation':<24}{'carry B/inv':>12}{'B/stream':>10}{'fragment B':>12}{'ms/inv fresh':>14}"
          f"{'carried':>9}{'handler ms fresh':>18}{'carried':>9}")
    for n in (1, envs):
        row = {**measure_carry(n, steps, 4 if q else 12, 2 if q else 5), **_handler_ms(n, steps, 6 if q else 30)}
        carry_rows[str(n)] = {k: round(v, 3) for k, v in row.items()}
        print(f"{'  ' + str(n):<24}{row['carry_bytes_per_invocation']:>12.0f}{row['carry_bytes_per_stream']:>10.0f}"
              f"{row['fragment_bytes']:>12.0f}{row['invocation_ms_fresh']:>14.2f}{row['invocation_ms_carried']:>9.2f}"
              f"{row['handler_fresh_ms']:>18.2f}{row['handler_carried_ms']:>9.2f}")
    at_cores = rows[str(min((1, 2, 4, 8), key=lambda c: abs(c - cores)))]
    figures = {"benchmark": "serverless_scaling", "quick": q, "cores": cores,
               **{k: round(v, 4) for k, v in overhead.items()},
               **{k: round(v, 2) for k, v in cold.items()},
               "inproc_steps_per_s": round(base), "throughput": rows, "carry": carry_rows,
               "efficiency_at_cores": at_cores["efficiency"],
               "goal_overhead_p50_le_2ms": overhead["overhead_p50_ms"] <= 2.0,
               "goal_efficiency_at_cores_ge_0_8": at_cores["efficiency"] >= 0.8}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
