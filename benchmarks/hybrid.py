"""Hybrid units vs pure co-located vs pure decoupled PPO, same run, equal env workers and env-step budget.

Three deployments of W = 2 env workers (this machine has 2 cores) train the same PPO (8 envs x 32 steps per
update in total, strata's defaults) until a target return or the budget:

    colocated   1 learner + W shared-memory env workers (`SharedMemoryVectorEnv`, mode ``colocated``)
    decoupled   1 learner + W gRPC env services (`strata envs serve`, mode ``decoupled``)
    hybrid      U = 2 units x (1 learner + W/U workers), one torch.distributed gloo group (`cloud.hybrid`),
                4 envs per unit so an update holds the same 256 transitions

on CartPole-v1 and on a heavy env registered here (`SlowCartPole`: CartPole whose every step busy-waits
1 ms of CPU, a stand-in for a physics simulator). Reported per run: env steps/s, wall-clock and env steps to
the target (20-episode mean, no greedy confirmation), and the learner's share of the CPU the run used (learner
processes vs env workers/services). Then two torchrun invocations (``--nnodes 2``, c10d on 127.0.0.1) run the
CartPole hybrid run as two "hosts".

The cost model (`predict`) takes per-step CPU costs measured in those runs (learner CPU and env CPU per env
step, the gradient all-reduce per update) and predicts H hosts x (1 learner + 8 env workers), H = 1..16:

    colocated   one learner with its 8 workers on one host; it cannot use a second host (shared memory)
    decoupled   one learner, H x 8 env services on H hosts; each step costs the learner its inference and RPC
    hybrid      H units; each update costs every unit its own share plus 22 collectives of log2(H) rounds

Every deployment's update is serial inside a learner (act, step the envs, update) and no faster than its CPU
work divided by the cores it has. CPU seconds per step are what the runs measure (robust to other load); the
all-reduce latency comes from a 2-process gloo micro-benchmark. The model is checked against the measured
H = 1 (co-located and decoupled runs) and H = 2 (local units; two torchrun nodes) figures on this machine: 2
cores for everything, each busy process getting the share of a core a probe measures before and after.

    .venv/bin/python benchmarks/hybrid.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

HEAVY_ID = "strata-bench/SlowCartPole-v0"
STEP_MS = 1.0
WORKERS = 2
UNITS = 2
REPO = Path(__file__).resolve().parent.parent


class SlowCartPole(CartPoleEnv):
    """CartPole-v1 whose every step also burns `STEP_MS` of CPU (busy-wait), like a physics simulator would."""

    def step(self, action: Any) -> Any:
        """Burn the CPU, then step CartPole."""
        deadline = time.perf_counter() + STEP_MS / 1000.0
        while time.perf_counter() < deadline:
            pass
        return super().step(action)  # type: ignore[no-untyped-call]


def _make_slow(**kwargs: Any) -> gym.Env[Any, Any]:
    return SlowCartPole(**kwargs)


def register_heavy() -> None:
    """Register `HEAVY_ID` in this process (forked workers inherit it; services and units call this)."""
    if HEAVY_ID not in gym.registry:
        gym.register(HEAVY_ID, entry_point=_make_slow, max_episode_steps=500, reward_threshold=475.0)


register_heavy()


# --- processes and their CPU ----------------------------------------------------------------------------------

def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Services:
    """W `strata envs serve` processes that know `HEAVY_ID` too (started through this script's ``serve`` mode)."""

    def __init__(self, env_id: str, *, count: int, envs: int, seed: int) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.addresses: list[str] = []
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for i in range(count):
            proc = subprocess.Popen([sys.executable, __file__, "serve", "--env", env_id, "--envs", str(envs),
                                     "--port", "0", "--seed", str(seed + i * envs)],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
            self.procs.append(proc)
            assert proc.stdout is not None
            line = ""
            while " on " not in line:
                line = proc.stdout.readline()
                if not line and proc.poll() is not None:
                    raise RuntimeError(f"env service for {env_id} did not start")
            self.addresses.append(line.rsplit(" on ", 1)[1].strip())

    def cpu(self) -> float:
        """CPU seconds the services have used so far."""
        return sum(_proc_cpu(p.pid) for p in self.procs)

    def stop(self) -> None:
        """Terminate the services."""
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(10)


# --- the three deployments ------------------------------------------------------------------------------------

HEAVY_TARGET = [200.0]
"""Target 20-episode mean return of the heavy env's full runs (``--heavy-target``)."""


def _budget(env_id: str, quick: bool) -> tuple[int, float]:
    """(env-step budget, target 20-episode mean return) of a run."""
    if env_id == HEAVY_ID:
        return (6_000, 60.0) if quick else (25_000, HEAVY_TARGET[0])
    return (12_000, 100.0) if quick else (100_000, 475.0)


def run_single(env_id: str, mode: str, *, seed: int, quick: bool, work: Path) -> dict[str, Any]:
    """One learner process (this one) fed by W co-located workers or W decoupled env services."""
    from cloud.learners._ppo_config import PPOConfig
    from cloud.runs._train import train
    from cloud.switching._modes import SwitchingConfig

    total, target = _budget(env_id, quick)
    config = PPOConfig(num_envs=8, num_steps=32, env_mode=mode)
    services = Services(env_id, count=WORKERS, envs=config.num_envs // WORKERS, seed=seed) if mode == "decoupled" \
        else None
    switching = SwitchingConfig(modes=(mode,), control=False,
                                env_services=",".join(services.addresses) if services else "")
    cpu0, kids0 = time.process_time(), _children_cpu()
    svc0 = services.cpu() if services else 0.0
    try:
        result = train(env_id=env_id, total_steps=total, run_dir=work / f"{mode}-{seed}", seed=seed, config=config,
                       target_return=target, confirm_episodes=0, progress=False, switching=switching,
                       log=lambda line: None)
        svc = services.cpu() - svc0 if services else 0.0
    finally:
        if services:
            services.stop()
    learner = time.process_time() - cpu0
    workers = svc if services else _children_cpu() - kids0
    return {"deployment": mode, "env": env_id, "seed": seed, "steps": result.global_step, "wall_s": result.wall_s,
            "steps_per_s": result.global_step / result.wall_s, "solved_at_step": result.solved_at_step,
            "solved_at_s": result.solved_at_s, "learner_cpu_s": learner, "worker_cpu_s": workers,
            "learner_share": learner / max(learner + workers, 1e-9), "units": 1}


def _bench_unit(spec: Any) -> Any:
    """The units' entry point here: register the heavy env, then be a plain `cloud.hybrid` unit."""
    from cloud.hybrid._unit import run_unit

    register_heavy()
    return run_unit(spec)


def hybrid_spec(env_id: str, *, seed: int, quick: bool, work: Path, name: str) -> Any:
    from cloud.hybrid import HybridConfig, UnitSpec
    from cloud.learners._ppo_config import PPOConfig
    from cloud.switching._modes import SwitchingConfig

    total, target = _budget(env_id, quick)
    return UnitSpec(env_id=env_id, total_steps=total, run_dir=work / f"{name}-{seed}", seed=seed,
                    config=PPOConfig(num_envs=8 // UNITS, num_steps=32),
                    switching=SwitchingConfig(modes=("colocated",), control=False),
                    hybrid=HybridConfig(units=UNITS, workers_per_unit=WORKERS // UNITS), target_return=target,
                    confirm_episodes=0, progress=False)


def run_hybrid(env_id: str, *, seed: int, quick: bool, work: Path) -> dict[str, Any]:
    """U units on this host, started by torch's elastic launcher (what `strata train --modes hybrid` does)."""
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    spec = hybrid_spec(env_id, seed=seed, quick=quick, work=work, name="hybrid")
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=UNITS, run_id=f"bench-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0, start_method="spawn")
    started = time.perf_counter()
    results = elastic_launch(launch, _bench_unit)(spec)
    launch_s = time.perf_counter() - started
    r = results[0]
    learner = sum(results[k].timings["cpu_s"] for k in results)
    workers = sum(results[k].timings["workers_cpu_s"] for k in results)
    updates = max(r.timings["updates"], 1.0)
    return {"deployment": "hybrid", "env": env_id, "seed": seed, "steps": r.global_step, "wall_s": r.wall_s,
            "steps_per_s": r.global_step / r.wall_s, "solved_at_step": r.solved_at_step,
            "solved_at_s": r.solved_at_s, "learner_cpu_s": learner, "worker_cpu_s": workers,
            "learner_share": learner / max(learner + workers, 1e-9), "units": r.units,
            "allreduce_s_per_update": r.timings["allreduce_s"] / updates, "launch_s": launch_s,
            "digests_equal": len(set(r.digests)) == 1}


def run_two_nodes(*, seed: int, quick: bool, work: Path) -> dict[str, Any]:
    """The CartPole hybrid run as two torchrun "hosts": ``torchrun --nnodes 2 --nproc-per-node 1`` twice."""
    import socket

    from cloud.runs._metrics import read_metrics

    total, target = _budget("CartPole-v1", quick)
    run = work / f"two-nodes-{seed}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    strata = str(Path(sys.executable).with_name("strata"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend",
         "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"bench-{port}", "--rdzv-conf",
         f"is_host={int(node == 0)}", "--no-python", strata, "train", "--env", "CartPole-v1", "--modes", "hybrid",
         "--workers-per-unit", str(WORKERS // UNITS), "--num-envs", str(8 // UNITS), "--num-steps", "32",
         "--total-steps", str(total), "--target-return", str(target), "--confirm-episodes", "0", "--seed",
         str(seed), "--run-dir", str(run), "--checkpoint-every", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for node in (0, 1)]
    outputs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("two-node run failed:\n" + "\n".join(o[-2000:] for o in outputs))
    records = read_metrics(run)
    first, last = records[0], records[-1]
    steps = last["global_step"]
    wall = last["global_step"] / last["perf/env_steps_per_s"]
    summary = next(o for o in outputs if "hybrid units, policy version" in o)
    solved = next((r for r in records if (r.get("charts/mean_return_20") or 0) >= target), None)
    allreduce = float(np.mean([r["perf/allreduce_s"] for r in records[1:]] or [first["perf/allreduce_s"]]))
    return {"deployment": "hybrid 2 torchrun nodes", "env": "CartPole-v1", "seed": seed, "steps": steps,
            "wall_s": wall, "steps_per_s": steps / wall, "solved_at_step": solved["global_step"] if solved else None,
            "solved_at_s": None, "units": 2, "allreduce_s_per_update": allreduce,
            "digests_equal": "policy digests of the units: identical" in summary}


# --- the cost model -------------------------------------------------------------------------------------------

COLLECTIVES_PER_UPDATE = 20 + 2
"""Gradient all-reduces of one update (update_epochs 20 x 1 minibatch) plus the summary gather and decision."""


@dataclasses.dataclass(frozen=True)
class Costs:
    """Costs measured in this run: CPU seconds per env step (robust to load) and one all-reduce's latency."""

    learner: float
    """Learner CPU per env step, co-located (acting, GAE, the PPO update amortised over the batch)."""
    learner_rpc: float
    """Learner CPU per env step when its envs are behind gRPC (acting + the RPC client + the update)."""
    env: float
    """Env worker CPU per env step, co-located (the simulator plus the shared-memory protocol)."""
    env_rpc: float
    """Env service CPU per env step (the simulator plus the gRPC server)."""
    allreduce: float
    """Wall seconds of one gradient all-reduce (the actor-critic's gradients) between 2 processes."""


def costs_from(runs: dict[str, dict[str, Any]], allreduce: float) -> Costs:
    col, dec = runs["colocated"], runs["decoupled"]
    return Costs(learner=col["learner_cpu_s"] / col["steps"], learner_rpc=dec["learner_cpu_s"] / dec["steps"],
                 env=col["worker_cpu_s"] / col["steps"], env_rpc=dec["worker_cpu_s"] / dec["steps"],
                 allreduce=allreduce)


def predict(c: Costs, deployment: str, hosts: int, *, workers_per_host: int = 8, cores_per_host: float = 9.0,
            shared_cores: float | None = None, cpu_share: float = 1.0, batch: int = 256) -> float:
    """Predicted env steps/s of `deployment` on `hosts` hosts (each 1 learner + `workers_per_host` workers).

    An update of ``batch`` transitions per learner lasts the longer of (a) the learner's serial path: its own
    CPU for every step, the env CPU of a step spread over the workers it waits on (strata's collect is
    synchronous), and for hybrid the update's collectives, each an all-reduce of ``log2(H)`` rounds (gloo's
    halving-doubling); (b) the deployment's CPU work over its cores. `shared_cores` puts every host on the
    same cores (this machine) and `cpu_share` is the fraction of a core one busy process gets there.
    """
    if deployment == "colocated":
        hosts = 1  # the workers share memory with the one learner: a second host cannot join
    if deployment == "hybrid":
        units, per_learner, learner, env = hosts, batch, c.learner, c.env
        collectives = COLLECTIVES_PER_UPDATE * c.allreduce * float(np.log2(hosts)) if hosts > 1 else 0.0
    elif deployment == "decoupled":
        units, per_learner, learner, env = 1, batch * hosts, c.learner_rpc, c.env_rpc
        collectives = 0.0
    else:
        units, per_learner, learner, env = 1, batch, c.learner, c.env
        collectives = 0.0
    workers_per_learner = workers_per_host * hosts / units
    serial = (per_learner * learner + per_learner * env / workers_per_learner) / cpu_share + collectives
    cores = shared_cores if shared_cores is not None else cores_per_host * hosts
    work = units * per_learner * (learner + env) / cores
    return units * per_learner / max(serial, work)


def _allreduce_worker(rank: int, port: int, numel: int, repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    grads = torch.ones(numel)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        dist.all_reduce(grads)
        times.append(time.perf_counter() - started)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(float(np.median(times))))


def measure_allreduce(numel: int = 9_155, repeats: int = 300) -> float:
    """Median seconds of one gloo all-reduce of `numel` float32 between 2 processes.

    9,155 is the CartPole agent's actor-critic (64x64) parameter count.
    """
    import socket
    import tempfile

    from torch.multiprocessing.spawn import start_processes

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(tempfile.mkdtemp()) / "allreduce.json"
    start_processes(_allreduce_worker, args=(port, numel, repeats, str(out)), nprocs=2,  # type: ignore[no-untyped-call]
                    start_method="spawn")
    return float(json.loads(out.read_text()))


def cpu_share(seconds: float = 1.0) -> float:
    """The fraction of a core one busy process gets on this machine now (1.0 when it is idle)."""
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        pass
    return min(1.0, (time.process_time() - cpu) / (time.perf_counter() - wall))


# --- main -------------------------------------------------------------------------------------------------------

def _serve(argv: list[str]) -> int:
    from cloud.cli import main as strata_main

    return strata_main(["envs", *argv])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        return _serve(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small budgets and low targets (a smoke run)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per deployment (default: %(default)s)")
    parser.add_argument("--work", type=Path, default=None, help="folder for the run dirs (default: a temp dir)")
    parser.add_argument("--envs", nargs="+", choices=["cartpole", "heavy"], default=["cartpole", "heavy"],
                        help="which envs to run (default: both; the torchrun two-node run needs cartpole)")
    parser.add_argument("--heavy-target", type=float, default=HEAVY_TARGET[0],
                        help="target return of the heavy env's full runs (default: %(default)s)")
    args = parser.parse_args(argv)

    import tempfile

    import torch

    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="strata-hybrid-bench-"))
    HEAVY_TARGET[0] = args.heavy_target
    env_ids = [{"cartpole": "CartPole-v1", "heavy": HEAVY_ID}[name] for name in args.envs]
    allreduce = measure_allreduce(repeats=100 if args.quick else 300)
    share = cpu_share()
    rows: list[dict[str, Any]] = []
    for env_id in env_ids:
        for seed in range(args.seeds):
            rows.append(run_single(env_id, "colocated", seed=seed, quick=args.quick, work=work / env_id))
            rows.append(run_single(env_id, "decoupled", seed=seed, quick=args.quick, work=work / env_id))
            rows.append(run_hybrid(env_id, seed=seed, quick=args.quick, work=work / env_id))
    if "CartPole-v1" in env_ids:
        rows.append(run_two_nodes(seed=0, quick=args.quick, work=work / "CartPole-v1"))
    share = (share + cpu_share()) / 2  # load moves during a run: the mean of a probe before and after

    print(f"{'env':<30} {'deployment':<24} {'seed':>4} {'steps':>8} {'steps/s':>9} {'to target s':>11} "
          f"{'to target steps':>15} {'learner CPU':>11}")
    for r in rows:
        to_s = "-" if r["solved_at_s"] is None else f"{r['solved_at_s']:.1f}"
        to_n = "-" if r["solved_at_step"] is None else f"{r['solved_at_step']:,}"
        learner = f"{r['learner_share']:.0%}" if "learner_share" in r else "-"
        print(f"{r['env']:<30} {r['deployment']:<24} {r['seed']:>4} {r['steps']:>8,} {r['steps_per_s']:>9,.0f} "
              f"{to_s:>11} {to_n:>15} {learner:>11}")

    model: dict[str, Any] = {}
    cores = float(os.cpu_count() or 1)
    for env_id in env_ids:
        mine = {r["deployment"]: r for r in rows if r["env"] == env_id and r["seed"] == 0}
        costs = costs_from(mine, allreduce)
        table = {d: [predict(costs, d, h) for h in range(1, 17)] for d in ("colocated", "decoupled", "hybrid")}

        def here(deployment: str, hosts: int, workers: int, batch: int = 256, c: Costs = costs) -> float:
            return predict(c, deployment, hosts, workers_per_host=workers, batch=batch, shared_cores=cores,
                           cpu_share=share)

        checks = {"H=1 colocated": (here("colocated", 1, WORKERS), mine["colocated"]["steps_per_s"]),
                  "H=1 decoupled": (here("decoupled", 1, WORKERS), mine["decoupled"]["steps_per_s"]),
                  "H=2 hybrid (2 local units)": (here("hybrid", 2, WORKERS // UNITS, 256 // UNITS),
                                                 mine["hybrid"]["steps_per_s"])}
        if env_id == "CartPole-v1":
            two = next(r for r in rows if r["deployment"] == "hybrid 2 torchrun nodes")
            checks["H=2 hybrid (2 torchrun nodes)"] = (here("hybrid", 2, WORKERS // UNITS, 256 // UNITS),
                                                       two["steps_per_s"])
        ratio = [table["hybrid"][h] / table["decoupled"][h] for h in range(16)]
        crossing = next((h + 1 for h in range(16) if ratio[h] >= 3.2), None)
        model[env_id] = {"costs_us": {k: round(v * 1e6, 1) for k, v in dataclasses.asdict(costs).items()},
                         "predicted_steps_per_s": {d: [round(x) for x in v] for d, v in table.items()},
                         "hybrid_over_decoupled": [round(x, 2) for x in ratio], "reaches_3.2x_at_H": crossing,
                         "checks": {k: {"predicted": round(p), "measured": round(m)} for k, (p, m) in checks.items()}}
        print(f"\n# model, {env_id}: costs (us; per env step, all-reduce per call) "
              + ", ".join(f"{k} {v * 1e6:.1f}" for k, v in dataclasses.asdict(costs).items()))
        print(f"{'H':>3} {'colocated':>10} {'decoupled':>10} {'hybrid':>10} {'hybrid/decoupled':>17}")
        for h in range(16):
            print(f"{h + 1:>3} {table['colocated'][h]:>10,.0f} {table['decoupled'][h]:>10,.0f} "
                  f"{table['hybrid'][h]:>10,.0f} {ratio[h]:>17.2f}")
        print(f"# hybrid/decoupled reaches 3.2x at H = {crossing}")
        for name, (p, m) in checks.items():
            print(f"# check on this machine ({cores:.0f} cores, a busy process gets {share:.0%} of one), {name}: "
                  f"predicted {p:,.0f} steps/s, measured {m:,.0f} ({p / m - 1:+.0%})")
    print(json.dumps({"benchmark": "hybrid", "quick": args.quick, "cpus": os.cpu_count(), "cpu_share": share,
                      "allreduce_s": allreduce, "load_avg": os.getloadavg()[0], "runs": rows, "model": model}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
