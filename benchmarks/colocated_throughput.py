"""Co-located env stepping: strata's SharedMemoryVectorEnv vs gymnasium and SB3 vector envs, same run.

Env steps/s with actions chosen in the parent process (pre-drawn random actions), 2 worker processes x
{1, 8, 32} envs each, for CartPole-v1, Pendulum-v1 and a heavy stand-in env whose step busy-waits ~200 us:

- strata:   SharedMemoryVectorEnv, 2 workers x K envs;
- async:    gymnasium AsyncVectorEnv(shared_memory=True) over the same 2K envs (one process per env, its design);
- subproc:  Stable-Baselines3 SubprocVecEnv over the same 2K envs (one process per env, fork);
- sync:     gymnasium SyncVectorEnv of 2K envs in this process;
- single:   the plain one-env step loop in this process (the per-core limit; x2 is "linear scaling");
- strata 2Kx1 (heavy env only): strata with one worker per env, the process count async and subproc use;
- envpool (CartPole-v1 and Pendulum-v1 only): EnvPool's C++ envs, 2K envs on 2 threads (`pip install envpool`),
  what a user who wants speed picks today;
- before (with ``--before REV``): the pool as it was at git revision REV (REV's cloud tier loaded as the package
  ``cloud_before``), for same-run before/after ratios of a change to the pool.

Also numpy-vectorised CartPole (`gymnasium.make_vec(..., vectorization_mode="vector_entry_point")`) in the
workers vs in this process, and co-located inference (an MLP 4-64-64-2 ONNX policy): batched in the
learner with onnxruntime (all envs, or double-buffered halves) vs a per-worker copy (onnxruntime or
strata's numpy-only `device.NumpyExecutor`).

Each figure is the median of `--repeats` timed windows (5 by default, 3 with --quick); within one configuration
all variants are built first and their windows alternate, so load from other processes hits them alike.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from cloud import ColocatedConfig, SharedMemoryVectorEnv

HEAVY_ID = "strata-bench/Busy200us-v0"
WORKERS = 2
REPO = Path(__file__).resolve().parent.parent
ENVPOOL_IDS = ("CartPole-v1", "Pendulum-v1")


class BusyEnv(gym.Env[np.ndarray, int]):
    """A stand-in for a physics simulator: each step busy-waits `step_us` microseconds; episodes last 200 steps."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, step_us: float = 200.0) -> None:
        self.step_s = step_us * 1e-6
        self.t = 0
        self.state = np.zeros(4, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Start a 200-step episode near the origin."""
        super().reset(seed=seed)
        self.t = 0
        self.state = self.np_random.uniform(-0.05, 0.05, 4).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Busy-wait `step_us`, then move the state a little."""
        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:
            pass
        self.t += 1
        self.state[0] += 0.01 if action else -0.01
        return self.state.copy(), 1.0, False, self.t >= 200, {}


gym.register(HEAVY_ID, entry_point=BusyEnv)


def action_batches(env_id: str, n: int, count: int = 64) -> list[np.ndarray]:
    space = gym.vector.utils.batch_space(gym.make(env_id).action_space, n)
    space.seed(0)
    return [np.asarray(space.sample()) for _ in range(count)]


def timed(step: Callable[[np.ndarray], Any], batches: list[np.ndarray], n: int, window_s: float) -> float:
    """Env steps per second of `step` over one window (at least 3 calls)."""
    calls, i = 0, 0
    start = time.perf_counter()
    while True:
        step(batches[i])
        i = (i + 1) % len(batches)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= window_s and calls >= 3:
            return calls * n / elapsed


def interleaved(variants: dict[str, tuple[Callable[[], Any], list[np.ndarray], int]], repeats: int,
                window_s: float) -> dict[str, float]:
    """Median steps/s of each variant; all are built first and their windows alternate, so load drift hits all alike."""
    built: dict[str, tuple[Callable[[np.ndarray], Any], Callable[[], None]]] = {}
    try:
        for name, (build, batches, n) in variants.items():
            built[name] = build()
            timed(built[name][0], batches, n, window_s / 4)  # warm-up
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(repeats):
            for name, (_build, batches, n) in variants.items():
                samples[name].append(timed(built[name][0], batches, n, window_s))
        return {name: statistics.median(values) for name, values in samples.items()}
    finally:
        for _step, close in built.values():
            close()


def build_strata(env_id: str, k: int, *, vectorized: bool = False) -> Any:
    pool = SharedMemoryVectorEnv.make(env_id, num_workers=WORKERS, envs_per_worker=k, vectorized=vectorized,
                                      config=ColocatedConfig(num_workers=WORKERS))
    pool.reset(seed=0)
    return pool.step, pool.close


def build_strata_per_env(env_id: str, k: int) -> Any:
    """A pool with one worker process per env (2K workers), the process count AsyncVectorEnv uses."""
    pool = SharedMemoryVectorEnv.make(env_id, num_workers=WORKERS * k, envs_per_worker=1)
    pool.reset(seed=0)
    return pool.step, pool.close


def load_pool_at(rev: str) -> Any:
    """`SharedMemoryVectorEnv` as it was at git revision `rev`, whatever the cloud tier's layout was then.

    REV's ``cloud/`` is unpacked into a temporary folder as the package ``cloud_before`` (its own imports of
    ``cloud`` renamed), so both versions of the pool run in one process and are measured in the same rounds.
    """
    out = Path(tempfile.mkdtemp(prefix="strata_before_"))
    archive = subprocess.run(["git", "archive", rev, "cloud"], cwd=REPO, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"colocated_throughput: --before {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    (out / "cloud").rename(out / "cloud_before")
    for source in (out / "cloud_before").rglob("*.py"):
        text = source.read_text()
        text = re.sub(r"\b(from|import) cloud\b", r"\1 cloud_before", text)
        source.write_text(text.replace("cloud._", "cloud_before._").replace("cloud.", "cloud_before."))
    sys.path.insert(0, str(out))
    module = importlib.import_module("cloud_before")
    return module.SharedMemoryVectorEnv


def build_before(pool_class: Any, env_id: str, k: int) -> Any:
    fns = [functools.partial(gym.make, env_id)] * (WORKERS * k)
    pool = pool_class(fns, config=ColocatedConfig(num_workers=WORKERS))
    pool.reset(seed=0)
    return pool.step, pool.close


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_env_step(pool_class: Any, env_id: str, k: int, batches: list[np.ndarray], steps: int) -> float:
    """CPU microseconds (parent + workers) one env step costs in a 2-worker pool of `pool_class`.

    The work the pool does, not how fast a contended host lets it run: CPU time barely moves with load, where
    steps/s on this shared 2-core host swings 2x between windows.
    """
    fns = [functools.partial(gym.make, env_id)] * (WORKERS * k)
    pool = pool_class(fns, config=ColocatedConfig(num_workers=WORKERS))
    try:
        pool.reset(seed=0)
        for i in range(50):
            pool.step(batches[i % len(batches)])
        pids = [int(wk.process.pid) for wk in pool._workers]
        workers0, parent0 = sum(_cpu_s(p) for p in pids), time.process_time()
        for i in range(steps):
            pool.step(batches[i % len(batches)])
        used = time.process_time() - parent0 + sum(_cpu_s(p) for p in pids) - workers0
    finally:
        pool.close()
    return 1e6 * used / (steps * WORKERS * k)


def build_envpool(env_id: str, k: int) -> Any:
    import warnings

    import envpool

    with warnings.catch_warnings():  # its Pendulum-v1 builds a float64-bounded Box: gymnasium warns, harmlessly
        warnings.simplefilter("ignore", UserWarning)
        envs = envpool.make_gymnasium(env_id, num_envs=WORKERS * k, num_threads=WORKERS, seed=0)
    envs.reset()
    return envs.step, envs.close


def build_async(env_id: str, k: int) -> Any:
    envs = gym.vector.AsyncVectorEnv([functools.partial(gym.make, env_id)] * (WORKERS * k), shared_memory=True)
    envs.reset(seed=0)
    return envs.step, envs.close


def build_sync(env_id: str, k: int) -> Any:
    envs = gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id)] * (WORKERS * k))
    envs.reset(seed=0)
    return envs.step, envs.close


def build_subproc(env_id: str, k: int) -> Any:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    envs = SubprocVecEnv([functools.partial(gym.make, env_id)] * (WORKERS * k), start_method="fork")
    envs.reset()
    return envs.step, envs.close


def build_vec_local(env_id: str, k: int) -> Any:
    envs = gym.make_vec(env_id, num_envs=WORKERS * k, vectorization_mode="vector_entry_point")
    envs.reset(seed=0)
    return envs.step, envs.close


def build_single(env_id: str) -> Any:
    env = gym.make(env_id)
    env.reset(seed=0)

    def step(actions: np.ndarray) -> None:
        _, _, terminated, truncated, _ = env.step(actions[0])
        if terminated or truncated:
            env.reset()

    return step, env.close


# --- co-located inference ------------------------------------------------------------------------------------


def mlp_onnx(seed: int = 0) -> bytes:
    """An MLP 4-64-64-2 (tanh) policy graph built directly with onnx.helper (input "obs", output "logits")."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    sizes = [4, 64, 64, 2]
    inits, nodes, prev = [], [], "obs"
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        w = rng.normal(0, 1 / np.sqrt(a), (a, b)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(np.zeros(b, np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"W{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        prev = f"a{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Tanh", [prev], [f"h{i}"]))
            prev = f"h{i}"
    nodes.append(helper.make_node("Identity", [prev], ["logits"]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ort_session(model: bytes) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def ort_policy(model: bytes) -> Callable[[np.ndarray], np.ndarray]:
    sess = ort_session(model)
    return lambda obs: sess.run(None, {"obs": obs})[0].argmax(axis=1)


def numpy_policy(model: bytes) -> Callable[[np.ndarray], np.ndarray]:
    from device import NumpyExecutor

    ex = NumpyExecutor(model)
    return lambda obs: ex.run({"obs": obs})["logits"].argmax(axis=1)


def inference_rates(k: int, model: bytes, repeats: int, window_s: float) -> dict[str, float]:
    n = WORKERS * k
    dummy = [np.zeros(n, dtype=np.int64)]

    def learner_batched() -> Any:
        pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=WORKERS, envs_per_worker=k)
        policy = ort_policy(model)
        obs = [pool.reset(seed=0)[0]]

        def step(_: Any) -> None:
            obs[0] = pool.step(policy(obs[0]))[0]

        return step, pool.close

    def learner_halves() -> Any:
        # Double buffering: the policy runs on one half while the workers step the other.
        pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=WORKERS, envs_per_worker=k)
        policy = ort_policy(model)
        first = pool.reset(seed=0)[0]
        halves = [pool.half_indices(0), pool.half_indices(1)]
        pool.step_half_async(0, policy(first[halves[0]]))
        pool.step_half_async(1, policy(first[halves[1]]))

        def step(_: Any) -> None:
            for h in (0, 1):
                obs_h = pool.step_half_wait(h)[0]
                pool.step_half_async(h, policy(obs_h))

        def close() -> None:
            pool.step_half_wait(0)
            pool.step_half_wait(1)
            pool.close()

        return step, close

    def per_worker(factory: Callable[[bytes], Callable[[np.ndarray], np.ndarray]]) -> Any:
        pool = SharedMemoryVectorEnv.make("CartPole-v1", num_workers=WORKERS, envs_per_worker=k,
                                          worker_policy=functools.partial(factory, model))
        pool.reset(seed=0)
        return (lambda _: pool.act_step()), pool.close

    out = interleaved({
        "learner_ort": (learner_batched, dummy, n),
        "learner_ort_halves": (learner_halves, dummy, n),
        "worker_ort": (functools.partial(per_worker, ort_policy), dummy, n),
        "worker_numpy": (functools.partial(per_worker, numpy_policy), dummy, n),
    }, repeats, window_s)
    return out


def ppo_solve_times(seeds: tuple[int, ...], budget: int) -> dict[str, Any]:
    """Wall-clock and env steps for strata PPO to solve CartPole-v1 fed by the pool vs by in-process envs.

    Same seeds, same default PPOConfig (8 envs), same stopping rule as benchmarks/learning_speed.py (the mean of
    the last 20 training episodes first reaches 475); modes interleaved per seed so load drift hits both.
    """
    import tempfile
    from pathlib import Path

    from cloud.learners._ppo_config import PPOConfig
    from cloud.runs._train import train

    out: dict[str, Any] = {}
    for mode in ("sync", "colocated"):
        out[mode] = {"wall_s": [], "steps": []}
    for seed in seeds:
        for mode in ("sync", "colocated"):
            with tempfile.TemporaryDirectory() as tmp:
                r = train(env_id="CartPole-v1", total_steps=budget, run_dir=Path(tmp), seed=seed,
                          config=PPOConfig(env_mode=mode), target_return=475.0, log=lambda _: None)
            solved = r.solved_at_s is not None
            out[mode]["wall_s"].append(round(r.solved_at_s if solved else r.wall_s, 2))
            out[mode]["steps"].append(r.solved_at_step if solved else None)
            print(f"PPO CartPole-v1 seed {seed} {mode:9s}: solved at {r.solved_at_step} steps in "
                  f"{out[mode]['wall_s'][-1]:.1f} s", flush=True)
    for mode in out:
        out[mode]["median_wall_s"] = float(np.median(out[mode]["wall_s"]))
    out["colocated_over_sync_wall"] = out["colocated"]["median_wall_s"] / out["sync"]["median_wall_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer configurations and shorter windows (< 1 minute)")
    parser.add_argument("--repeats", type=int, default=None, help="timed windows per figure (default 5, quick 3)")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window (default 1.0, quick 0.2)")
    parser.add_argument("--before", default=None, metavar="REV",
                        help="also time the pool as it was at this git revision (same-run before/after ratios)")
    parser.add_argument("--only", default=None, choices=("throughput",),
                        help="throughput: only the env-stepping matrix (no numpy-vector, inference or PPO parts)")
    parser.add_argument("--ppo-seeds", type=int, default=None,
                        help="seeds of the PPO wall-clock comparison (default 3, quick 1; 0 skips it)")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 5)
    window = args.window or (0.2 if args.quick else 1.0)
    if args.quick:
        matrix = {"CartPole-v1": (1, 32), "Pendulum-v1": (1,), HEAVY_ID: (8,)}
        variants = ("strata", "async", "sync", "subproc")
        vec_sizes: tuple[int, ...] = (32,)
        inference_sizes: tuple[int, ...] = (8,)
    else:
        matrix = {"CartPole-v1": (1, 8, 32), "Pendulum-v1": (1, 8, 32), HEAVY_ID: (1, 8, 32)}
        variants = ("strata", "async", "sync", "subproc")
        vec_sizes = (32, 256)
        inference_sizes = (1, 8, 32)
    builders: dict[str, Callable[[str, int], Any]] = {
        "strata": build_strata, "async": build_async, "sync": build_sync, "subproc": build_subproc
    }
    try:
        import envpool  # noqa: F401

        have_envpool = True
    except ImportError:
        have_envpool = False
        print("# envpool is not installed (pip install envpool): no EnvPool column")
    if args.before:
        builders["before"] = functools.partial(build_before, load_pool_at(args.before))
        variants = (*variants, "before")
    if args.only == "throughput":
        vec_sizes, inference_sizes = (), ()
    load = os.getloadavg()
    print(f"# load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; "
          f"{repeats} windows of {window} s per figure (median)")

    figures: dict[str, Any] = {}
    ratios: dict[str, float] = {}
    rows = []
    for env_id, sizes in matrix.items():
        single_batches = [b[:1] for b in action_batches(env_id, 1)]
        for k in sizes:
            n = WORKERS * k
            batches = action_batches(env_id, n)
            todo: dict[str, tuple[Callable[[], Any], list[np.ndarray], int]] = {
                v: (functools.partial(builders[v], env_id, k), batches, n) for v in variants
            }
            todo["single"] = (functools.partial(build_single, env_id), single_batches, 1)
            if have_envpool and env_id in ENVPOOL_IDS:
                todo["envpool"] = (functools.partial(build_envpool, env_id, k), batches, n)
            if env_id == HEAVY_ID and k > 1:
                todo["strata_per_env"] = (functools.partial(build_strata_per_env, env_id, k), batches, n)
            rates = interleaved(todo, repeats, window)
            single = rates.pop("single")
            figures[f"{env_id}/{k}/single"] = single
            for v, r in rates.items():
                figures[f"{env_id}/{k}/{v}"] = r
            key = f"{env_id}/{k}"
            ratios[f"{key}/strata_vs_async"] = rates["strata"] / rates["async"]
            ratios[f"{key}/strata_vs_subproc"] = rates["strata"] / rates["subproc"]
            ratios[f"{key}/strata_vs_sync"] = rates["strata"] / rates["sync"]
            ratios[f"{key}/strata_vs_linear"] = rates["strata"] / (WORKERS * single)
            if "strata_per_env" in rates:
                ratios[f"{key}/strata_per_env_vs_async"] = rates["strata_per_env"] / rates["async"]
            if "envpool" in rates:
                ratios[f"{key}/strata_vs_envpool"] = rates["strata"] / rates["envpool"]
            if "before" in rates:
                ratios[f"{key}/strata_vs_before"] = rates["strata"] / rates["before"]
            rows.append((env_id, k, rates, single))
            print(f"{env_id:26s} 2x{k:<3d} strata {rates['strata']:>10,.0f}  async {rates['async']:>10,.0f}  "
                  f"subproc {rates['subproc']:>10,.0f}  sync {rates['sync']:>10,.0f}  single {single:>10,.0f}  "
                  f"strata/async {ratios[f'{key}/strata_vs_async']:5.2f}  "
                  f"strata/(2*single) {ratios[f'{key}/strata_vs_linear']:5.2f}"
                  + (f"  strata {n}x1 {rates['strata_per_env']:>8,.0f}" if "strata_per_env" in rates else "")
                  + (f"  envpool {rates['envpool']:>10,.0f}" if "envpool" in rates else "")
                  + (f"  before {rates['before']:>10,.0f} after/before {ratios[f'{key}/strata_vs_before']:5.2f}"
                     if "before" in rates else ""),
                  flush=True)

    if args.before:
        before_class = load_pool_at(args.before)
        print(f"# CPU us per env step, parent + workers (median of 3 alternated rounds), this tree vs {args.before}")
        for env_id in ("CartPole-v1", "Pendulum-v1"):
            for k in matrix.get(env_id, ()):
                batches = action_batches(env_id, WORKERS * k)
                steps = max(200, 12_000 // k) if not args.quick else max(50, 2_000 // k)
                cpu: dict[str, list[float]] = {"after": [], "before": []}
                for _ in range(3):
                    cpu["after"].append(cpu_per_env_step(SharedMemoryVectorEnv, env_id, k, batches, steps))
                    cpu["before"].append(cpu_per_env_step(before_class, env_id, k, batches, steps))
                after, before = statistics.median(cpu["after"]), statistics.median(cpu["before"])
                figures[f"cpu_us/{env_id}/{k}/after"], figures[f"cpu_us/{env_id}/{k}/before"] = after, before
                ratios[f"cpu_us/{env_id}/{k}/after_vs_before"] = after / before
                print(f"{env_id:26s} 2x{k:<3d} cpu us/env-step after {after:7.1f}  before {before:7.1f}  "
                      f"after/before {after / before:5.2f}", flush=True)

    for k in vec_sizes:
        n = WORKERS * k
        batches = action_batches("CartPole-v1", n)
        vec = interleaved({
            "strata": (functools.partial(build_strata, "CartPole-v1", k, vectorized=True), batches, n),
            "local": (functools.partial(build_vec_local, "CartPole-v1", k), batches, n),
        }, repeats, window)
        strata_vec, local_vec = vec["strata"], vec["local"]
        figures[f"CartPole-v1-vector/{k}/strata"] = strata_vec
        figures[f"CartPole-v1-vector/{k}/in_process"] = local_vec
        ratios[f"CartPole-v1-vector/{k}/strata_vs_in_process"] = strata_vec / local_vec
        print(f"{'CartPole-v1 numpy-vector':26s} 2x{k:<3d} strata {strata_vec:>10,.0f}  "
              f"in-process make_vec({n}) {local_vec:>10,.0f}  ratio {strata_vec / local_vec:5.2f}", flush=True)

    model = mlp_onnx()
    for k in inference_sizes:
        inf = inference_rates(k, model, repeats, window)
        for name, r in inf.items():
            figures[f"inference/{k}/{name}"] = r
        ratios[f"inference/{k}/worker_ort_vs_learner_ort"] = inf["worker_ort"] / inf["learner_ort"]
        print(f"{'inference CartPole MLP':26s} 2x{k:<3d} " + "  ".join(f"{n} {r:>10,.0f}" for n, r in inf.items()),
              flush=True)

    ppo_seeds = args.ppo_seeds if args.ppo_seeds is not None else (1 if args.quick else 3)
    if args.only == "throughput":
        ppo_seeds = 0
    ppo = ppo_solve_times(tuple(range(ppo_seeds)), budget=150_000) if ppo_seeds else None
    if ppo:
        print(f"PPO solve wall-clock median: sync {ppo['sync']['median_wall_s']:.1f} s, colocated "
              f"{ppo['colocated']['median_wall_s']:.1f} s, ratio {ppo['colocated_over_sync_wall']:.2f}", flush=True)

    goals: dict[str, Any] = {}
    if "CartPole-v1/1/strata_vs_async" in ratios:
        goals["cartpole_1_per_worker_vs_async>=3"] = ratios["CartPole-v1/1/strata_vs_async"]
    if "CartPole-v1/32/strata_vs_async" in ratios:
        goals["cartpole_32_per_worker_vs_async>=1.25"] = ratios["CartPole-v1/32/strata_vs_async"]
        goals["cartpole_32_per_worker_vs_2x_single>=0.7"] = ratios["CartPole-v1/32/strata_vs_linear"]
        goals["cartpole_32_per_worker_vs_2x_single>=0.85 (issue 18)"] = ratios["CartPole-v1/32/strata_vs_linear"]
    if "CartPole-v1/1/strata_vs_envpool" in ratios:
        goals["cartpole_1_per_worker_vs_envpool>=0.9"] = ratios["CartPole-v1/1/strata_vs_envpool"]
    heavy = {k: v for k, v in ratios.items() if k.startswith(HEAVY_ID) and k.endswith("strata_vs_linear")}
    if heavy:
        goals["heavy_vs_linear>=0.85_best"] = max(heavy.values())
    print("# goals:", ", ".join(f"{k} = {v:.2f}" for k, v in goals.items()))
    print(json.dumps({"benchmark": "colocated_throughput", "quick": args.quick, "load_avg": load[0],
                      "before": args.before,
                      "steps_per_s": {k: round(v) for k, v in figures.items() if not k.startswith("cpu_us/")},
                      "cpu_us_per_env_step": {k: round(v, 2) for k, v in figures.items() if k.startswith("cpu_us/")},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()},
                      "goals": {k: round(v, 3) for k, v in goals.items()}, "ppo_solve": ppo}))


if __name__ == "__main__":
    main()
