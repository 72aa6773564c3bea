"""Decoupled transport on CartPole-v1: env steps/s over gRPC three ways vs co-located shared memory; weight-sync bytes.

Throughput, all in one run, 64 envs in total everywhere:

    (a) per-step gRPC        one env per Step call (the baseline), random actions
    (b) batched gRPC         all 64 envs of one service per Step call, random actions
    (c) rollout fragments    2 services x 32 envs act themselves (device.NumpyExecutor, MLP 4-64-64-2)
                             for F steps per call, 2 calls in flight per service
    (d) co-located           cloud.SharedMemoryVectorEnv, 2 workers x 32 envs, the same numpy policy
                             acting in the learner process

Weight sync: a real PPO run (cloud.runs._train.train, CartPole-v1) checkpoints every update; each version's
actor weights and observation-normaliser statistics are pushed to the parameter server, and clients
sync them over gRPC: every version (lossless), every 4th version (lossless), and every version with
int8 lossy deltas. Bytes per sync are the payload on the wire, as a distribution over the whole run.
The lossy client's final weights are then evaluated greedily against the exact final weights.

    .venv/bin/python benchmarks/decoupled_transport.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np


def policy_bundle(tmp: Path, hidden: int = 64) -> bytes:
    """A signed CartPole bundle of an MLP 4-64-64-2 (tanh) with logits and argmax outputs."""
    from onnx import TensorProto, helper, numpy_helper

    import device

    rng = np.random.default_rng(0)
    dims = [4, hidden, hidden, 2]
    inits, nodes, x = [], [], "obs"
    for i in range(3):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(dims[i + 1], np.float32),
                                                                                 f"b{i}")]
        out = "logits" if i == 2 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [out]))
        if i < 2:
            nodes.append(helper.make_node("Tanh", [out], [f"t{i}"]))
            x = f"t{i}"
    nodes.append(helper.make_node("ArgMax", ["logits"], ["action"], axis=1, keepdims=0))
    graph = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("action", TensorProto.INT64, ["b"]),
                               helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    device.generate_keypair(tmp)
    obs_space = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}
    bundle = device.build_bundle(model.SerializeToString(), policy="cartpole", version=1, parent_version=None,
                                 observation_space=obs_space, action_space={"type": "Discrete", "n": 2},
                                 signing_key=device.load_signing_key(tmp / "strata-signing.key"),
                                 output_names=("action", "logits"))
    return bytes(bundle.to_bytes())


def per_step(address: str, seconds: float) -> float:
    from functions._envservice import EnvServiceClient

    c = EnvServiceClient(address)
    k = c.spec()["num_envs"]
    c.reset(seed=0)
    rng = np.random.default_rng(0)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        c.step_one(n % k, int(rng.integers(2)))
        n += 1
    rate = n / (time.perf_counter() - start)
    c.close()
    return rate


def batched(address: str, seconds: float) -> float:
    from functions._envservice import EnvServiceClient

    c = EnvServiceClient(address)
    k = c.spec()["num_envs"]
    c.reset(seed=0)
    rng = np.random.default_rng(0)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        c.step(rng.integers(0, 2, size=k))
        n += k
    rate = n / (time.perf_counter() - start)
    c.close()
    return rate


def fragments(addresses: list[str], bundle: bytes, seconds: float, steps: int) -> tuple[float, dict[str, Any]]:
    from cloud.rollout._decoupled import FragmentSource

    src = FragmentSource(addresses, steps=steps, inflight=2, timeout_s=30)
    src.set_policy(bundle)
    it = src.fragments()
    for _ in range(2 * len(addresses)):
        next(it)  # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += next(it).size
    rate = n / (time.perf_counter() - start)
    src.close()
    return rate, src.gate.summary()


def colocated(bundle: bytes, seconds: float, envs: int = 64, workers: int = 2) -> tuple[float, str]:
    import gymnasium as gym

    import device

    executor = device.NumpyExecutor.from_bundle(device.Bundle.from_bytes(bundle))
    rng = np.random.default_rng(0)

    def act(obs: np.ndarray) -> np.ndarray:
        logits = executor.run({"obs": np.asarray(obs, dtype=np.float32)})["logits"]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (rng.random(len(p)) * p.sum(axis=1) > p[:, 0]).astype(np.int64)

    try:
        from cloud import ColocatedConfig, SharedMemoryVectorEnv

        vec: Any = SharedMemoryVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(envs)],
                                         config=ColocatedConfig(num_workers=workers),
                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        label = f"cloud.SharedMemoryVectorEnv {workers}x{envs // workers}"
    except ImportError:
        vec = gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(envs)], shared_memory=True,
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        label = f"gymnasium AsyncVectorEnv(shared_memory=True) {envs} workers (cloud.SharedMemoryVectorEnv missing)"
    try:
        obs, _ = vec.reset(seed=0)
        for _ in range(20):
            obs, *_ = vec.step(act(obs))
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            obs, *_ = vec.step(act(obs))
            n += envs
        return n / (time.perf_counter() - start), label
    finally:
        vec.close()


def _stats(xs: list[int]) -> dict[str, float]:
    if not xs:
        return {}
    a = np.asarray(xs, dtype=np.float64)
    return {"n": len(xs), "p10": float(np.percentile(a, 10)), "p50": float(np.median(a)),
            "p90": float(np.percentile(a, 90)), "max": float(a.max()), "mean": float(a.mean()),
            "total": float(a.sum())}


def weight_sync(total_steps: int, tmp: Path, eval_episodes: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from cloud.learners._agent import Agent, ObsNormalizer
    from cloud.learners._ppo_config import PPOConfig
    from cloud.params._server import ParameterServer
    from cloud.runs._checkpoint import list_checkpoints, load_checkpoint
    from cloud.runs._train import train
    from functions._codec import _shuffle
    from functions._paramclient import ParameterClient

    t0 = time.perf_counter()
    result = train(env_id="CartPole-v1", total_steps=total_steps, run_dir=tmp / "ppo", seed=0, progress=False,
                   config=PPOConfig(), checkpoint_every=1, log=lambda line: None)
    train_s = time.perf_counter() - t0

    def synced(state: dict[str, Any]) -> dict[str, np.ndarray]:
        w = {f"agent.{k}": v.numpy().astype(np.float32) for k, v in state["agent"].items()
             if k.startswith("actor") and v.numel() > 0}
        w["norm.mean"] = state["normalizer"]["mean"].numpy().astype(np.float32)
        w["norm.var"] = state["normalizer"]["var"].numpy().astype(np.float32)
        return w

    server = ParameterServer().start()
    every = ParameterClient(server.address, policy="ppo")
    sparse = ParameterClient(server.address, policy="ppo")
    lossy = ParameterClient(server.address, policy="ppo", lossy=True)
    states = [load_checkpoint(p) for p in list_checkpoints(tmp / "ppo")]
    # Reference: the best full snapshot we know (byte-shuffled, zlib), to judge deltas against it too.
    shuffled_full = [sum(len(zlib.compress(_shuffle(a), 1)) for a in synced(st).values()) for st in states[1:]]
    for i, state in enumerate(states):
        server.push("ppo", synced(state), version=int(state["version"]))
        every.update_and_wait()
        lossy.update_and_wait()
        if i % 4 == 3 or i == len(states) - 1:
            sparse.update_and_wait()
    final = states[-1]
    exact_w = synced(final)
    assert lossy.weights is not None and every.weights is not None
    max_err = max(float(np.abs(lossy.weights[k] - exact_w[k]).max()) for k in exact_w)

    import gymnasium as gym

    def evaluate(weights: dict[str, np.ndarray]) -> tuple[float, list[int]]:
        cfg = final["config"]
        agent = Agent(obs_dim=4, action_dim=2, discrete=True, hidden_sizes=tuple(cfg["hidden_sizes"]))
        sd = agent.state_dict()
        sd.update({k[len("agent."):]: torch.from_numpy(np.array(v)) for k, v in weights.items()
                   if k.startswith("agent.")})
        agent.load_state_dict(sd)
        norm = ObsNormalizer((4,), clip=float(cfg["obs_clip"]), enabled=bool(cfg["normalize_obs"]))
        norm.mean, norm.var = weights["norm.mean"].astype(np.float64), weights["norm.var"].astype(np.float64)
        env = gym.make("CartPole-v1")
        returns, acts = [], []
        for ep in range(eval_episodes):
            obs, _ = env.reset(seed=10_000 + ep)
            done, ret = False, 0.0
            while not done:
                with torch.inference_mode():
                    a = int(agent.actor(torch.from_numpy(norm(obs[None]))).argmax(-1).item())
                acts.append(a)
                obs, r, term, trunc, _ = env.step(a)
                ret += float(r)
                done = term or trunc
            returns.append(ret)
        return float(np.mean(returns)), acts

    exact_return, _ = evaluate(exact_w)
    lossy_return, _ = evaluate(lossy.weights)
    out = {
        "ppo_steps": result.global_step, "ppo_versions": len(states), "ppo_train_s": round(train_s, 1),
        "ppo_mean_return_20": result.mean_return, "synced_params": int(sum(v.size for v in exact_w.values())),
        "full_bytes": _stats(every.stats.full_bytes[1:]),
        "full_bytes_shuffled_zlib": _stats(shuffled_full),
        "delta_bytes_every_version": _stats(every.stats.payload_bytes[1:]),
        "delta_bytes_every_4th_version": _stats(sparse.stats.payload_bytes[1:]),
        "full_bytes_every_4th_version": _stats(sparse.stats.full_bytes[1:]),
        "lossy_bytes_every_version": _stats(lossy.stats.payload_bytes[1:]),
        "kinds_every_version": dict(every.stats.kinds), "kinds_lossy": dict(lossy.stats.kinds),
        "hash_mismatches": every.stats.hash_mismatches + sparse.stats.hash_mismatches + lossy.stats.hash_mismatches,
        "lossy_max_abs_weight_error": max_err,
        "eval_episodes": eval_episodes, "final_return_exact": exact_return, "final_return_lossy": lossy_return,
    }
    for c in (every, sparse, lossy):
        c.close()
    server.stop(0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (< 1 minute)")
    parser.add_argument("--fragment-steps", type=int, default=64, help="F: steps per rollout fragment")
    args = parser.parse_args(argv)
    seconds = 2.0 if args.quick else 6.0
    ppo_steps = 6144 if args.quick else 60_000
    eval_episodes = 5 if args.quick else 20

    from cloud.rollout._decoupled import start_services

    figures: dict[str, Any] = {"env": "CartPole-v1", "quick": args.quick, "seconds_per_mode": seconds}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        bundle = policy_bundle(tmp)
        procs = start_services("CartPole-v1", count=1, envs=64)
        try:
            figures["a_per_step_grpc"] = per_step(procs[0].address, seconds)
            figures["b_batched_grpc_64"] = batched(procs[0].address, seconds)
        finally:
            for p in procs:
                p.stop()
        procs = start_services("CartPole-v1", count=2, envs=32)
        try:
            rate, gate = fragments([p.address for p in procs], bundle, seconds, args.fragment_steps)
            figures["c_fragments_2x32"] = rate
            figures["c_staleness"] = gate
        finally:
            for p in procs:
                p.stop()
        figures["d_colocated"], figures["d_label"] = colocated(bundle, seconds)
        figures["c_over_a"] = figures["c_fragments_2x32"] / figures["a_per_step_grpc"]
        figures["c_over_d"] = figures["c_fragments_2x32"] / figures["d_colocated"]
        figures["goal_c_ge_20x_a"] = figures["c_over_a"] >= 20
        figures["goal_c_within_2x_d"] = figures["c_over_d"] >= 0.5
        figures["weight_sync"] = weight_sync(ppo_steps, tmp, eval_episodes)

    w = figures["weight_sync"]
    print(f"{'mode':<48} {'env steps/s':>12}")
    print(f"{'(a) per-step gRPC, 1 env per call':<48} {figures['a_per_step_grpc']:>12,.0f}")
    print(f"{'(b) batched gRPC, 64 envs per call':<48} {figures['b_batched_grpc_64']:>12,.0f}")
    print(f"{'(c) fragments F=' + str(args.fragment_steps) + ', 2 services x 32, numpy policy':<48} "
          f"{figures['c_fragments_2x32']:>12,.0f}")
    print(f"{'(d) ' + figures['d_label']:<48} {figures['d_colocated']:>12,.0f}")
    print(f"c/a = {figures['c_over_a']:.1f}x (goal >= 20x), c/d = {figures['c_over_d']:.2f} (goal >= 0.5)")
    print(f"\nweight sync over a PPO run: {w['ppo_versions']} versions, {w['synced_params']} float32 params "
          f"(actor + obs normaliser), PPO mean return {w['ppo_mean_return_20']:.1f}")
    print(f"{'bytes per sync':<38} {'p10':>8} {'p50':>8} {'p90':>8} {'max':>8}")
    for key, label in (("full_bytes", "full snapshot (zlib if smaller)"),
                       ("full_bytes_shuffled_zlib", "full, byte-shuffled zlib (reference)"),
                       ("delta_bytes_every_version", "delta, every version"),
                       ("delta_bytes_every_4th_version", "delta, every 4th version"),
                       ("lossy_bytes_every_version", "lossy int8 delta, every version")):
        s = w[key]
        print(f"{label:<38} {s['p10']:>8.0f} {s['p50']:>8.0f} {s['p90']:>8.0f} {s['max']:>8.0f}")
    print(f"final greedy return over {w['eval_episodes']} episodes: exact {w['final_return_exact']:.1f}, "
          f"lossy {w['final_return_lossy']:.1f} (max weight error {w['lossy_max_abs_weight_error']:.2e})")
    print(json.dumps(figures, sort_keys=True, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
