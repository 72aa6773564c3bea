"""Tiny-policy inference: strata's numpy executor against onnxruntime and torch eager, in the same run.

The policy is a 4-64-64-2 tanh MLP with observation normalisation ((obs - mean) / sqrt(var + eps),
clipped) and argmax inside the graph, exported as strata's exporter does (torch.onnx.export,
dynamo=False, opset 17). Measured, with every runtime given the same float32 [1, 4] observation:

- a hand-written numpy forward pass of the same policy, the floor for any numpy runtime;
- single-observation latency p50/p99, back to back, interleaved in blocks so all three share the noise;
- the same at a 10 ms control period (one call per tick, round-robin over the runtimes; fewer samples);
- batch-64 throughput (observations per second);
- bundle sizes with fp32, fp16 and int8 weight storage, and the accuracy cost of the latter two;
- the cost of verifying a bundle and of loading the executor.

Usage: ``python benchmarks/policy_inference.py [--quick]``; the last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

OBS_DIM, HIDDEN, N_ACTIONS = 4, 64, 2


def build_policy(seed: int = 0) -> tuple[Any, bytes]:
    """The torch policy module and its ONNX export."""
    import torch

    torch.manual_seed(seed)

    class Policy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(OBS_DIM, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
                torch.nn.Linear(HIDDEN, N_ACTIONS))
            self.register_buffer("mean", torch.randn(OBS_DIM))
            self.register_buffer("var", torch.rand(OBS_DIM) + 0.5)

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.clamp((obs - self.mean) / torch.sqrt(self.var + 1e-8), -10.0, 10.0)
            logits = self.net(x)
            return torch.argmax(logits, dim=-1), logits

    policy = Policy().eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(policy, (torch.zeros(1, OBS_DIM),), buf, dynamo=False, opset_version=17,
                          input_names=["obs"], output_names=["action", "logits"],
                          dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}, "logits": {0: "batch"}})
    return policy, buf.getvalue()


def runtimes(policy: Any, model: bytes) -> dict[str, Callable[[np.ndarray], Any]]:
    """One ``act(obs) -> action`` callable per runtime."""
    import onnxruntime as ort
    import torch

    from device import NumpyExecutor

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    executor = NumpyExecutor(model)

    def torch_act(obs: np.ndarray) -> Any:
        with torch.inference_mode():
            return policy(torch.from_numpy(obs))[0]

    # The floor for any numpy runtime: the same forward pass written by hand, as a person would.
    (w1, b1), (w2, b2), (w3, b3) = ((lin.weight.detach().numpy().T.copy(), lin.bias.detach().numpy().copy())
                                    for lin in (policy.net[0], policy.net[2], policy.net[4]))
    mean = policy.mean.numpy().copy()
    std = np.sqrt(policy.var.numpy() + np.float32(1e-8))

    def hand_act(obs: np.ndarray) -> Any:
        x = np.clip((obs - mean) / std, -10.0, 10.0)
        h = np.tanh(x @ w1 + b1)
        h = np.tanh(h @ w2 + b2)
        return (h @ w3 + b3).argmax(-1)

    return {
        "torch": torch_act,
        "onnxruntime": lambda obs: session.run(["action"], {"obs": obs})[0],
        "numpy": executor.act,
        "numpy_by_hand": hand_act,
    }


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    us = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99))}


def back_to_back(acts: dict[str, Callable[[np.ndarray], Any]], obs: np.ndarray, n: int,
                 block: int = 500) -> dict[str, dict[str, float]]:
    samples: dict[str, list[int]] = {name: [] for name in acts}
    clock = time.perf_counter_ns
    for act in acts.values():  # warm-up
        for _ in range(200):
            act(obs)
    for _ in range(max(1, n // block)):
        for name, act in acts.items():
            out = samples[name]
            for _ in range(block):
                t0 = clock()
                act(obs)
                out.append(clock() - t0)
    return {name: percentiles(s) for name, s in samples.items()}


def control_period(acts: dict[str, Callable[[np.ndarray], Any]], obs: np.ndarray, n: int,
                   period_s: float = 0.010) -> dict[str, dict[str, float]]:
    """One call per `period_s` tick, round-robin over the runtimes, as a controller would call it."""
    samples: dict[str, list[int]] = {name: [] for name in acts}
    names = list(acts)
    clock = time.perf_counter_ns
    next_tick = time.perf_counter() + period_s
    for i in range(n * len(names)):
        delay = next_tick - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        next_tick += period_s
        name = names[i % len(names)]
        t0 = clock()
        acts[name](obs)
        samples[name].append(clock() - t0)
    return {name: percentiles(s) for name, s in samples.items()}


def throughput(acts: dict[str, Callable[[np.ndarray], Any]], batch: np.ndarray, seconds: float) -> dict[str, float]:
    out = {}
    for name, act in acts.items():
        for _ in range(20):
            act(batch)
        calls = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(50):
                act(batch)
            calls += 50
        out[name] = calls * len(batch) / (time.perf_counter() - t0)
    return out


def bundle_figures(model: bytes) -> dict[str, Any]:
    from device import NumpyExecutor, SigningKey, TrustStore, Verifier, build_bundle, quantization_error, quantize_model

    key = SigningKey.generate()
    rng = np.random.default_rng(1)
    obs = (rng.normal(size=(10_000, OBS_DIM)) * 2).astype(np.float32)
    figures: dict[str, Any] = {}
    for weights in ("fp32", "fp16", "int8"):
        q = quantize_model(model, weights)  # type: ignore[arg-type]
        bundle = build_bundle(q, policy="bench", version=1, parent_version=None,
                              observation_space={"type": "Box", "shape": [OBS_DIM], "dtype": "float32",
                                                 "low": ["-inf"] * OBS_DIM, "high": ["inf"] * OBS_DIM},
                              action_space={"type": "Discrete", "n": N_ACTIONS}, signing_key=key,
                              output_names=("action", "logits"))
        data = bundle.to_bytes()
        entry: dict[str, Any] = {"model_bytes": len(q), "bundle_bytes": len(data)}
        if weights != "fp32":
            entry.update(quantization_error(model, q, obs))
        figures[weights] = entry
        if weights == "fp32":
            verifier = Verifier(trust=TrustStore([key.public_key]), tier="device")
            t0 = time.perf_counter()
            for _ in range(200):
                verifier.verify(data)
            figures["verify_us"] = (time.perf_counter() - t0) / 200 * 1e6
            t0 = time.perf_counter()
            for _ in range(20):
                NumpyExecutor(bundle.model)
            figures["executor_load_ms"] = (time.perf_counter() - t0) / 20 * 1e3
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples; finishes in well under a minute")
    args = parser.parse_args()
    import onnxruntime as ort
    import torch

    torch.set_num_threads(1)
    n_b2b, n_period, tput_s = (6_000, 60, 0.5) if args.quick else (60_000, 400, 2.0)

    policy, model = build_policy()
    acts = runtimes(policy, model)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(1, OBS_DIM)).astype(np.float32)
    batch = rng.normal(size=(64, OBS_DIM)).astype(np.float32)

    from device import NumpyExecutor

    check = rng.normal(size=(256, OBS_DIM)).astype(np.float32) * 3
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"obs": check})
    ours = NumpyExecutor(model).run({"obs": check})
    max_diff = float(np.abs(ours["logits"] - ref[1]).max())
    action_agree = float(np.mean(ours["action"] == ref[0]))

    b2b = back_to_back(acts, obs, n_b2b)
    spaced = control_period(acts, obs, n_period)
    tput = throughput(acts, batch, tput_s)
    bundles = bundle_figures(model)

    print(f"policy 4-64-64-2 tanh MLP, obs normalisation + argmax in the graph; numpy vs onnxruntime: "
          f"max |logit diff| {max_diff:.2e}, action agreement {action_agree:.3f}")
    print(f"{'runtime':<14} {'b2b p50 us':>11} {'b2b p99 us':>11} {'10ms p50 us':>12} {'10ms p99 us':>12} "
          f"{'batch64 obs/s':>14}")
    for name in acts:
        print(f"{name:<14} {b2b[name]['p50_us']:>11.2f} {b2b[name]['p99_us']:>11.2f} {spaced[name]['p50_us']:>12.1f} "
              f"{spaced[name]['p99_us']:>12.1f} {tput[name]:>14,.0f}")
    print(f"{'weights':<8} {'model B':>8} {'bundle B':>9} {'max |err|':>10} {'argmax agree':>13}")
    for weights in ("fp32", "fp16", "int8"):
        e = bundles[weights]
        err = f"{e['max_abs_error']:.2e}" if "max_abs_error" in e else "-"
        agree = f"{e['argmax_agreement']:.4f}" if "argmax_agreement" in e else "-"
        print(f"{weights:<8} {e['model_bytes']:>8} {e['bundle_bytes']:>9} {err:>10} {agree:>13}")
    print(f"verify one bundle: {bundles['verify_us']:.0f} us; load the numpy executor: "
          f"{bundles['executor_load_ms']:.2f} ms")

    ratios = {
        "numpy_over_ort_p50": b2b["numpy"]["p50_us"] / b2b["onnxruntime"]["p50_us"],
        "numpy_over_torch_p50": b2b["numpy"]["p50_us"] / b2b["torch"]["p50_us"],
        "numpy_over_hand_written_numpy_p50": b2b["numpy"]["p50_us"] / b2b["numpy_by_hand"]["p50_us"],
        "numpy_over_ort_10ms_p50": spaced["numpy"]["p50_us"] / spaced["onnxruntime"]["p50_us"],
        "numpy_over_ort_batch64_throughput": tput["numpy"] / tput["onnxruntime"],
    }
    result = {
        "benchmark": "policy_inference", "quick": args.quick, "samples_back_to_back": n_b2b,
        "samples_10ms": n_period, "back_to_back": b2b, "period_10ms": spaced, "batch64_obs_per_s": tput,
        "bundles": bundles, "numpy_vs_ort_max_abs_logit_diff": max_diff, "ratios": ratios,
        "goals": {"numpy_p50_within_1.5x_ort": ratios["numpy_over_ort_p50"] <= 1.5,
                  "numpy_p50_at_most_10us": b2b["numpy"]["p50_us"] <= 10.0,
                  "fp32_bundle_under_32KB": bundles["fp32"]["bundle_bytes"] < 32 * 1024},
    }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
