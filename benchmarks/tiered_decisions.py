"""Tiered decisions: device-only vs edge-only vs tiered control on CartPole-v1 and Pendulum-v1, and the C micro policy.

Setup, all in one run on loopback: a real Mosquitto; an edge policy (the teacher: a 4-64-2 tanh network, by
default a balancing controller spread over 64 units, or ``--teacher FILE`` for an exported bundle); a micro
policy distilled from it (`cloud.learners._distill.distill`, one hidden layer of 16); an `edge.EdgeGateway` answering
escalations with the teacher in onnxruntime and relaying the micro bundle; a `device.DeviceRuntime` on the
paho link that receives the micro bundle through the gateway. Then, over the same seeded episodes:

- device-only: the micro policy decides everything (threshold 0);
- edge-only: every decision is escalated (the policy is marked stale at once);
- tiered: escalate when the micro policy's probability margin is under each threshold of a sweep.

Pendulum-v1 (continuous actions) runs the same modes with a SAC teacher trained in this run
(`cloud.learners._sac.train_sac`, 15,000 env steps; ``--quick``: 2,500 steps, a much weaker teacher, a smoke run; or
``--pendulum-teacher FILE`` for an exported bundle) and 1x16 micro policies distilled from it. A Box micro policy has
no logits: its confidence is `device.StateRegion`'s, ``min(1, radius / Mahalanobis distance)`` of the observation
from the states it was distilled on, and the tiered sweep is over that threshold.

Reported per mode: mean return, decision latency p50/p99 (ms, escalation round trip included) and the fraction
escalated. Goal: tiered within 5% of edge-only return with at most 20% escalated. Then the C export of the
micro policy (`device._export_c`): nanoseconds per decision measured by its harness over many calls, against
`NumpyExecutor` on the same policy in the same run, and the compiled code size (``size`` of the object file).

Usage: ``python benchmarks/tiered_decisions.py [--quick] [--teacher FILE] [--pendulum-teacher FILE]``; the last
output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import _mosquitto
import numpy as np

OBS = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}


def start_mosquitto(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    return _mosquitto.start_mosquitto(workdir, "log_dest stderr", "log_type error")


def teacher_model() -> bytes:
    """A 4-64-2 tanh network that balances CartPole (a linear controller spread over 64 units)."""
    import io
    import warnings

    import torch

    gains = torch.tensor([0.1, 0.5, 1.0, 0.5])
    scales = torch.linspace(0.5, 3.0, 64)

    class Teacher(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden, self.out = torch.nn.Linear(4, 64), torch.nn.Linear(64, 2)
            with torch.no_grad():
                self.hidden.weight.copy_(scales[:, None] * gains[None, :])
                self.hidden.bias.zero_()
                self.out.weight.copy_(torch.stack([-torch.ones(64), torch.ones(64)]) / 16.0)
                self.out.bias.zero_()

        def forward(self, obs: torch.Tensor) -> Any:
            logits = self.out(torch.tanh(self.hidden(obs)))
            return torch.argmax(logits, dim=-1), logits

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Teacher().eval(), (torch.zeros(1, 4),), buf, dynamo=False, opset_version=17,  # type: ignore[arg-type]
                          input_names=["obs"], output_names=["action", "logits"],
                          dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}, "logits": {0: "batch"}})
    return buf.getvalue()


def episodes(controller: Any, n: int, seed: int, env_id: str = "CartPole-v1"
             ) -> tuple[list[float], list[float], dict[str, int]]:
    import gymnasium as gym

    env = gym.make(env_id)
    returns, latencies, tiers = [], [], {"device": 0, "edge": 0, "device-fallback": 0}
    for ep in range(n):
        obs, _ = env.reset(seed=seed + ep)
        total, done = 0.0, False
        while not done:
            d = controller.decide(np.asarray(obs, dtype=np.float32))
            latencies.append(d.latency_s)
            tiers[d.tier] += 1
            obs, r, term, trunc, _ = env.step(d.action)
            total += float(r)
            done = bool(term or trunc)
        returns.append(total)
    env.close()
    return returns, latencies, tiers


def c_policy_figures(model: bytes, workdir: Path, calls: int) -> dict[str, Any]:
    from device import NumpyExecutor
    from device._export_c import export_c

    gcc = shutil.which("gcc")
    if gcc is None:
        return {"skipped": "gcc not installed"}
    _policy, paths = export_c(model, workdir / "c")
    exe = workdir / "c" / "harness"
    subprocess.run([gcc, "-std=c99", "-O2", "-o", str(exe), str(paths[1]), str(paths[2]), "-lm"], check=True)
    sizes = {}
    for opt in ("-O2", "-Os"):
        obj = workdir / "c" / f"policy{opt}.o"
        subprocess.run([gcc, "-std=c99", opt, "-c", "-o", str(obj), str(paths[1])], check=True)
        text, data = subprocess.run(["size", str(obj)], capture_output=True, text=True, check=True
                                    ).stdout.splitlines()[1].split()[:2]
        sizes[opt] = {"text_bytes": int(text), "data_bytes": int(data)}
    runs = []
    for _ in range(5):
        out = subprocess.run([str(exe), "--bench", str(calls)], input="0.01 0.02 0.03 0.04\n", capture_output=True,
                             text=True, check=True).stdout
        runs.append(float(out.split()[0]))
    executor = NumpyExecutor(model)
    obs = np.array([[0.01, 0.02, 0.03, 0.04]], np.float32)
    numpy_runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(2000):
            executor.run({"obs": obs})
        numpy_runs.append((time.perf_counter() - t0) / 2000 * 1e9)
    c_ns, np_ns = float(np.median(runs)), float(np.median(numpy_runs))
    return {"c_ns_per_decision": round(c_ns, 1), "numpy_executor_ns_per_decision": round(np_ns, 1),
            "numpy_over_c": round(np_ns / c_ns, 1), "object_size": sizes}


def run_modes(teacher: Any, results: dict[str, Any], thresholds: tuple[float, ...], *, env_id: str, url: str,
              trust: Any, n_eps: int, budget_ms: float) -> dict[str, dict[str, Any]]:
    """Device-only, edge-only and tiered@threshold for each distilled student, over the same seeded episodes."""
    from device._device_run import DeviceConfig, DeviceRuntime
    from edge._gateway import EdgeGateway, GatewayConfig
    from edge._policy import OnnxPolicy

    fleet = env_id.split("-")[0].lower()
    rows: dict[str, dict[str, Any]] = {}
    edge_policy = OnnxPolicy(teacher)
    gateway = EdgeGateway(GatewayConfig(broker=url, fleet=fleet, node="edge-0"),
                          policy_source=lambda: edge_policy, trust=trust).start()
    try:
        modes: list[tuple[str, dict[str, Any]]] = [("device-only", {"threshold": 0.0}),
                                                   ("edge-only", {"threshold": 0.0, "stale_after_s": 0.0})]
        modes += [(f"tiered@{t}", {"threshold": t}) for t in thresholds]
        for student, result in results.items():
            assert gateway.relay(result.bundle.to_bytes()), gateway.last_refusal
            for name, extra in modes:
                if name == "edge-only" and rows.get("edge-only") is not None:
                    continue  # the edge policy does not depend on the student
                config = DeviceConfig(broker=url, fleet=fleet, edge_node="edge-0", device_id=f"dev-{len(rows)}",
                                      budget_ms=budget_ms, **extra)
                with DeviceRuntime(config, trust=trust) as runtime:
                    runtime.wait_for_policy(10)
                    deadline = time.monotonic() + 10
                    while runtime.bundle.manifest.policy != result.bundle.manifest.policy:  # type: ignore[union-attr]
                        assert time.monotonic() < deadline, "the relayed bundle did not arrive"
                        time.sleep(0.01)
                    rets, lats, tiers = episodes(runtime.controller(), n_eps, seed=100, env_id=env_id)
                total = sum(tiers.values())
                key_name = name if name == "edge-only" else f"{student}/{name}"
                rows[key_name] = {"mean_return": float(np.mean(rets)),
                                  "latency_p50_ms": float(np.percentile(lats, 50)) * 1e3,
                                  "latency_p99_ms": float(np.percentile(lats, 99)) * 1e3,
                                  "escalated": (tiers["edge"] + tiers["device-fallback"]) / total,
                                  "fallbacks": tiers["device-fallback"], "decisions": total}
    finally:
        gateway.close()
    return rows


def goal_met_by(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Tiered modes within 5% of edge-only return (either sign of return) with at most 20% escalated."""
    edge = rows["edge-only"]["mean_return"]
    return [n for n, r in rows.items() if "tiered" in n and r["escalated"] <= 0.2
            and r["mean_return"] >= edge - 0.05 * abs(edge)]


def print_table(rows: dict[str, dict[str, Any]]) -> None:
    print(f"{'mode':<22}{'return':>9}{'p50 ms':>9}{'p99 ms':>9}{'escalated':>11}{'fallbacks':>11}")
    for name, r in rows.items():
        print(f"{name:<22}{r['mean_return']:>9.1f}{r['latency_p50_ms']:>9.3f}{r['latency_p99_ms']:>9.3f}"
              f"{r['escalated']:>11.1%}{r['fallbacks']:>11}")


def figures_of(rows: dict[str, dict[str, Any]], results: dict[str, Any]) -> dict[str, Any]:
    """The JSON figures of one env: distillation, modes, tiered/edge return ratios and the goal."""
    edge_return = rows["edge-only"]["mean_return"]
    return {"distill": {n: {"kept": round(r.kept, 4), "student_return": r.student_return,
                            "teacher_return": r.teacher_return, "student_params": r.student_params,
                            "teacher_params": r.teacher_params} for n, r in results.items()},
            "modes": {n: {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                      for n, r in rows.items()},
            # Return ratio to edge-only; for negative returns (Pendulum) edge / tiered, so 1.0 = equal, < 1 = worse.
            "tiered_over_edge_return": {n: round(r["mean_return"] / edge_return if edge_return > 0
                                                 else edge_return / r["mean_return"], 4)
                                        for n, r in rows.items() if "tiered" in n},
            "goal_met_by": goal_met_by(rows)}


def run_pendulum(args: argparse.Namespace, tmp: Path, key: Any, trust: Any, url: str, n_eps: int) -> dict[str, Any]:
    """Pendulum-v1: a SAC teacher (trained here unless given), a distilled 1x16 micro policy, the modes."""
    from cloud.learners._distill import DistillConfig
    from cloud.runs._export import distill
    from device import Bundle

    t0 = time.perf_counter()
    if args.pendulum_teacher is not None:
        teacher, teacher_steps = Bundle.from_bytes(args.pendulum_teacher.read_bytes()), None
    else:
        from cloud.learners._sac import SACConfig
        from cloud.runs._sac_run import train_sac

        teacher_steps = 2_500 if args.quick else 15_000
        sac = train_sac(SACConfig(replay="local", eval_episodes=3 if args.quick else 10), env_id="Pendulum-v1",
                        run_dir=tmp / "sac", seed=0, total_steps=teacher_steps, signing_key=key,
                        policy="Pendulum-v1", log=lambda line: None)
        assert sac.bundle is not None
        teacher = sac.bundle
    teacher_s = time.perf_counter() - t0
    students: dict[str, DistillConfig] = {
        # 1x16 tanh, DAgger; Pendulum's near-bang-bang teacher needs a longer fit than CartPole's (the defaults'
        # 20 epochs at lr 3e-3 leave the student far behind): 6 iterations, 60 epochs, lr 1e-2.
        "micro16": (DistillConfig(iterations=2, steps_per_iteration=1000, epochs=8, learning_rate=1e-2,
                                  eval_episodes=3) if args.quick
                    else DistillConfig(iterations=6, epochs=60, learning_rate=1e-2, eval_episodes=10)),
    }
    if not args.quick:
        # The same 1x16 student with the default DistillConfig: under-fitted, so there is something to rescue.
        students["default16"] = DistillConfig(eval_episodes=10)
    t0 = time.perf_counter()
    results = {name: distill(teacher, env_id="Pendulum-v1", signing_key=key, config=dconf, policy=f"pd-{name}")
               for name, dconf in students.items()}
    distill_s = time.perf_counter() - t0
    thresholds = (0.5, 0.8) if args.quick else PENDULUM_THRESHOLDS
    rows = run_modes(teacher, results, thresholds, env_id="Pendulum-v1", url=url, trust=trust, n_eps=n_eps,
                     budget_ms=args.budget_ms)
    print(f"Pendulum-v1: teacher SAC, {teacher_steps or 'given'} steps, {teacher_s:.1f} s; students distilled in "
          f"{distill_s:.1f} s")
    for name, r in results.items():
        print(f"{name}: {r.student_params} weights vs teacher {r.teacher_params}; eval return "
              f"{r.student_return:.1f} vs teacher {r.teacher_return:.1f} ({r.kept:.1%} kept)")
    print_table(rows)
    calibration = {name: region_calibration(teacher, r.bundle, thresholds, n_eps, seed=100)
                   for name, r in results.items()}
    for name, per_t in calibration.items():
        print(f"{name}: mean |student - teacher action| on escalated vs kept decisions (device-only episodes): "
              + ", ".join(f"@{t}: {v['error_escalated']} vs {v['error_kept']}" for t, v in per_t.items()))
    met = goal_met_by(rows)
    print(f"Pendulum-v1 goal (tiered within 5% of edge-only return, <= 20% escalated): "
          f"{'met by ' + ', '.join(met) if met else 'NOT met'}")
    return {"teacher": "given" if teacher_steps is None else f"sac-{teacher_steps}-steps",
            "teacher_wall_s": round(teacher_s, 1), "distill_wall_s": round(distill_s, 1),
            "region_calibration": calibration, **figures_of(rows, results)}


def region_calibration(teacher: Any, bundle: Any, thresholds: tuple[float, ...], n_eps: int, seed: int
                       ) -> dict[str, dict[str, float | None]]:
    """Whether the region confidence is informative: the student's action error on escalated vs kept decisions.

    Mean |student action - teacher action| per threshold, over the student's own device-only episodes (same
    seeds as the modes).
    """
    import gymnasium as gym

    from device import NumpyExecutor, StateRegion
    from edge._policy import OnnxPolicy

    executor, oracle = NumpyExecutor(bundle.model), OnnxPolicy(teacher)
    region = StateRegion.from_manifest(bundle.manifest.preprocessing, dim=3)
    assert region is not None, "the micro bundle records no state region"
    env = gym.make("Pendulum-v1")
    confs, errors = [], []
    for ep in range(n_eps):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        while not done:
            x = np.asarray(obs, dtype=np.float32)
            action = executor.act(x[None])[0]
            confs.append(region.confidence(x))
            errors.append(float(np.abs(action - oracle.act(x)).mean()))
            obs, _r, term, trunc, _ = env.step(action)
            done = bool(term or trunc)
    env.close()
    c, e = np.array(confs), np.array(errors)
    out: dict[str, dict[str, float | None]] = {}
    for t in thresholds:
        high = c < t
        out[str(t)] = {"escalated": round(float(high.mean()), 4),
                       "error_escalated": round(float(e[high].mean()), 4) if high.any() else None,
                       "error_kept": round(float(e[~high].mean()), 4) if (~high).any() else None}
    return out


PENDULUM_THRESHOLDS = (0.3, 0.5, 0.7, 0.8, 0.9)
"""Sweep of StateRegion confidence thresholds (escalate beyond radius / threshold)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small budget (< 1 minute)")
    parser.add_argument("--teacher", type=Path, default=None, help="an exported CartPole-v1 bundle as edge policy")
    parser.add_argument("--pendulum-teacher", type=Path, default=None,
                        help="an exported Pendulum-v1 bundle as edge policy (skips training SAC)")
    parser.add_argument("--budget-ms", type=float, default=50.0, help="escalation latency budget")
    args = parser.parse_args()

    import torch

    from cloud.learners._distill import DistillConfig
    from cloud.runs._export import distill
    from device import Bundle, TrustStore, build_bundle, generate_keypair, load_public_key, load_signing_key

    torch.set_num_threads(1)
    n_eps = 5 if args.quick else 20
    thresholds = (0.02, 0.05, 0.1, 0.2) if args.quick else (0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
    tmp = Path(tempfile.mkdtemp(prefix="strata-tiered-"))
    generate_keypair(tmp / "keys")
    key = load_signing_key(tmp / "keys" / "strata-signing.key")
    trust = TrustStore([load_public_key(tmp / "keys" / "strata-signing.pub")])
    if args.teacher is not None:
        teacher = Bundle.from_bytes(args.teacher.read_bytes())
    else:
        teacher = build_bundle(teacher_model(), policy="CartPole-v1", version=1, parent_version=None,
                               observation_space=OBS, action_space={"type": "Discrete", "n": 2}, signing_key=key,
                               target_tier="edge", output_names=("action", "logits"),
                               producer={"env_id": "CartPole-v1"})
    students: dict[str, DistillConfig] = {
        # The default micro policy: one hidden layer of 16, DAgger.
        "micro16": (DistillConfig(iterations=2, steps_per_iteration=1000, epochs=8, eval_episodes=3) if args.quick
                    else DistillConfig(eval_episodes=10)),
        # A deliberately under-trained 4-unit student (behaviour cloning of 1000 teacher states, 2 epochs): weak
        # on its own, so the tiered rule has something to rescue (if its confidence is calibrated).
        "weak4": DistillConfig(hidden_sizes=(4,), iterations=1, steps_per_iteration=1000, epochs=2, eval_episodes=3),
    }
    results = {}
    t0 = time.perf_counter()
    for name, dconf in students.items():
        results[name] = distill(teacher, env_id="CartPole-v1", signing_key=key, config=dconf, policy=f"cp-{name}")
    distill_s = time.perf_counter() - t0

    broker, url = start_mosquitto(tmp)
    try:
        rows = run_modes(teacher, results, thresholds, env_id="CartPole-v1", url=url, trust=trust, n_eps=n_eps,
                         budget_ms=args.budget_ms)
        pendulum = run_pendulum(args, tmp, key, trust, url, n_eps)
    finally:
        broker.terminate()
        broker.wait()

    result = results["micro16"]
    c_figs = c_policy_figures(result.bundle.model, tmp, 200_000 if args.quick else 2_000_000)
    shutil.rmtree(tmp, ignore_errors=True)

    print("CartPole-v1:")
    for name, r in results.items():
        print(f"{name}: {r.student_params} weights vs teacher {r.teacher_params}; eval return "
              f"{r.student_return:.1f} vs teacher {r.teacher_return:.1f} ({r.kept:.1%} kept)")
    print(f"(both distilled in {distill_s:.1f} s)")
    print_table(rows)
    meeting = goal_met_by(rows)
    print(f"C policy: {c_figs}")
    verdict = "met by " + ", ".join(meeting) if meeting else "NOT met"
    print(f"goal (tiered within 5% of edge-only return, <= 20% escalated): {verdict}")
    figures = {"quick": args.quick, "episodes_per_mode": n_eps, "budget_ms": args.budget_ms,
               **figures_of(rows, results), "distill_wall_s": round(distill_s, 1), "c_policy": c_figs,
               "pendulum": pendulum}
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
