"""Edge propagation: publish -> every one of 50 edge agents acting on the new version, beside the raw MQTT floor.

Two figures, each against its baseline in the same run:

1. Propagation. A real Mosquitto on loopback; 50 `edge.EdgeAgent`s spread over a few processes, each stepping
   CartPole at a 10 ms control period. Per round the parent publishes a new signed bundle (`edge.Publisher`) and
   every agent reports the wall time of its first decision with the new version: that includes delivery,
   verification, the A/B cache writes with fsync, the health check and the swap. The baseline (the floor) is a
   raw MQTT publish of a payload of the same size to 50 plain subscribers in the same processes.
2. Inference overhead. `edge.OnnxPolicy.act` (what the agent calls per decision) against a bare
   `InferenceSession.run` on the same model, back to back and at a 10 ms period, interleaved.

Prints a table and ends with one JSON line. ``--quick`` runs fewer rounds and agents (< 1 minute).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _mosquitto
import numpy as np

FLOOR_TOPIC = "bench/floor"


def start_mosquitto(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    return _mosquitto.start_mosquitto(workdir, "max_queued_messages 100000")


def cartpole_onnx() -> bytes:
    """MLP 4-64-64-2 (tanh) with argmax, the size MEASURED.md uses; random weights are fine for timing."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    shapes = [(4, 64), (64, 64), (64, 2)]
    inits, nodes, x = [], [], "obs"
    for i, (a, b) in enumerate(shapes):
        w = (rng.standard_normal((a, b)) * 0.3).astype(np.float32)
        inits += [helper.make_tensor(f"W{i}", TensorProto.FLOAT, [a, b], w.ravel().tolist()),
                  helper.make_tensor(f"b{i}", TensorProto.FLOAT, [b], np.zeros(b, np.float32).tolist())]
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"],
                                                                                       [f"a{i}"])]
        x = f"a{i}"
        if i < 2:
            nodes.append(helper.make_node("Tanh", [x], [f"t{i}"]))
            x = f"t{i}"
    nodes += [helper.make_node("Identity", [x], ["logits"]),
              helper.make_node("ArgMax", ["logits"], ["action"], axis=1, keepdims=0)]
    graph = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("action", TensorProto.INT64, ["b"]),
                               helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def make_bundle(key: Any, version: int, model: bytes) -> Any:
    from device import build_bundle

    obs = {"type": "Box", "shape": [4], "dtype": "float32",
           "low": [-4.800000190734863, "-inf", -0.41887903213500977, "-inf"],
           "high": [4.800000190734863, "inf", 0.41887903213500977, "inf"]}
    return build_bundle(model, policy="cartpole", version=version, parent_version=version - 1 or None,
                        observation_space=obs, action_space={"type": "Discrete", "n": 2}, signing_key=key,
                        target_tier="edge", output_names=("action", "logits"))


# ------------------------------------------------------------------------------------------------- child

def child(args: argparse.Namespace) -> None:
    """Run agents and floor subscribers; answer the parent's commands on stdin with JSON lines on stdout."""
    from edge import EdgeAgent, EdgeAgentConfig, MqttLink
    from edge._mqtt import LinkConfig

    floor_times: dict[int, list[float]] = {}
    lock = threading.Lock()

    def on_floor(topic: str, payload: bytes, retained: bool) -> None:
        now = time.time()
        if retained:
            return
        with lock:
            floor_times.setdefault(int(payload[:8]), []).append(now)

    ids = args.nodes.split(",")
    links = []
    for node in ids:
        link = MqttLink(LinkConfig(broker=args.broker, client_id=f"floor-{node}", clean_session=True),
                        on_message=on_floor)
        link.subscribe(FLOOR_TOPIC)
        links.append(link.start())
    agents = []
    for node in ids:
        config = EdgeAgentConfig(fleet="bench", node_id=node, cache_dir=str(Path(args.cache) / node),
                                 trust=(args.pub,), broker=args.broker, policy="cartpole", control_period_s=0.01,
                                 telemetry_interval_s=1.0, health_latency_budget_ms=500.0, health_deadline_s=30.0)
        agents.append(EdgeAgent(config).start())
    threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
    for t in threads:
        t.start()
    while not all(link.connected for link in links) or not all(a.link and a.link.connected for a in agents):
        time.sleep(0.01)
    print(json.dumps({"ready": True}), flush=True)
    cpu_mark = time.process_time()
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "floor":
            r = int(arg)
            deadline = time.monotonic() + 30
            while len(floor_times.get(r, [])) < len(links) and time.monotonic() < deadline:
                time.sleep(0.002)
            print(json.dumps({"floor": floor_times.get(r, [])}), flush=True)
        elif cmd == "mark":
            cpu_mark = time.process_time()
            print(json.dumps({"ok": True}), flush=True)
        elif cmd == "wait":
            v = int(arg)
            deadline = time.monotonic() + 60
            while not all(v in a.counters.first_act_at for a in agents) and time.monotonic() < deadline:
                time.sleep(0.002)
            print(json.dumps({"acts": [a.counters.first_act_at.get(v) for a in agents],
                              "cpu_s": time.process_time() - cpu_mark}), flush=True)
        elif cmd == "stages":
            traces = [getattr(a.counters, "update_stages", {}) for a in agents]  # absent in older agents
            print(json.dumps({"stages": [{str(k): v for k, v in t.items()} for t in traces]}), flush=True)
        elif cmd == "quit":
            break
    for a in agents:
        a.stop()
    for t in threads:
        t.join(timeout=5)
    for a in agents:
        a.close(drain_s=0.2)
    for link in links:
        link.close()


# ------------------------------------------------------------------------------------------------- parent

def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc), 0 where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def propagation(n_agents: int, n_procs: int, rounds: int, tmp: Path) -> dict[str, Any]:
    from device import generate_keypair, load_signing_key
    from edge import MqttLink, Publisher
    from edge._mqtt import LinkConfig

    broker_proc, url = start_mosquitto(tmp)
    key_path, pub_path = generate_keypair(tmp, name="bench")
    key = load_signing_key(key_path)
    model = cartpole_onnx()
    children = []
    try:
        nodes = [f"n{i:02d}" for i in range(n_agents)]
        groups = [nodes[i::n_procs] for i in range(n_procs)]
        with Publisher(broker=url, fleet="bench") as publisher:
            publisher.publish(make_bundle(key, 1, model))  # every agent starts on v1
            for group in groups:
                children.append(subprocess.Popen(
                    [sys.executable, __file__, "--child", "--broker", url, "--pub", str(pub_path), "--cache",
                     str(tmp / "cache"), "--nodes", ",".join(group)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    text=True))
            for c in children:
                assert c.stdout is not None
                json.loads(c.stdout.readline())

            def ask(cmd: str) -> list[dict[str, Any]]:
                for c in children:
                    assert c.stdin is not None
                    c.stdin.write(cmd + "\n")
                    c.stdin.flush()
                return [json.loads(c.stdout.readline()) for c in children if c.stdout is not None]

            ask("wait 1")
            size = len(make_bundle(key, 2, model).to_bytes())
            raw = MqttLink(LinkConfig(broker=url, client_id="floor-publisher", clean_session=True)).start()
            raw.wait_connected(10)
            floor, prop, missing = [], [], 0
            windows: list[float] = []
            window_cpu: list[float] = []
            for r in range(rounds):
                time.sleep(0.3)
                t0 = time.time()
                raw.publish(FLOOR_TOPIC, f"{r:08d}".encode() + bytes(size - 8))
                floor += [t - t0 for reply in ask(f"floor {r}") for t in reply["floor"]]
                time.sleep(0.3)
                bundle = make_bundle(key, r + 2, model)
                ask("mark")
                broker_cpu = _proc_cpu_s(broker_proc.pid)
                t0 = time.time()
                publisher.publish(bundle)
                replies = ask(f"wait {r + 2}")
                acts = [t for reply in replies for t in reply["acts"]]
                missing += sum(t is None for t in acts)
                prop += [t - t0 for t in acts if t is not None]
                windows.append(max([t for t in acts if t is not None], default=t0) - t0)
                window_cpu.append(sum(reply["cpu_s"] for reply in replies) + _proc_cpu_s(broker_proc.pid) - broker_cpu)
            raw.close()
            time.sleep(0.5)  # the last version's cache writes (after acting) finish
            per_stage: dict[str, list[float]] = {}
            critical_by_version: dict[str, float] = {}
            for reply in ask("stages"):
                for traced in reply["stages"]:
                    for version, stages in traced.items():
                        if int(version) >= 2:
                            for name, value in stages.items():
                                per_stage.setdefault(name, []).append(value)
                            critical_by_version[version] = (critical_by_version.get(version, 0.0)
                                                            + stages.get("critical_cpu", 0.0))
            for c in children:
                assert c.stdin is not None
                c.stdin.write("quit\n")
                c.stdin.close()
    finally:
        for c in children:
            try:
                c.wait(timeout=15)
            except subprocess.TimeoutExpired:
                c.kill()
        broker_proc.terminate()
        broker_proc.wait()
    ms = 1000.0
    return {"agents": n_agents, "processes": n_procs, "rounds": rounds, "bundle_bytes": size, "missing": missing,
            "floor_p50_ms": _pct(floor, 50) * ms, "floor_p99_ms": _pct(floor, 99) * ms,
            "floor_max_ms": max(floor) * ms, "prop_p50_ms": _pct(prop, 50) * ms, "prop_p99_ms": _pct(prop, 99) * ms,
            "prop_max_ms": max(prop) * ms,
            "window_p50_ms": _pct(windows, 50) * ms, "window_cpu_p50_ms": _pct(window_cpu, 50) * ms,
            "critical_cpu_sum_p50_ms": _pct(list(critical_by_version.values()), 50) if critical_by_version else None,
            "window_cores_used_p50": _pct([c / w for c, w in zip(window_cpu, windows, strict=True) if w > 0], 50),
            "stages_ms": {name: {"p50": round(_pct(v, 50), 3), "p99": round(_pct(v, 99), 3), "max": round(max(v), 3)}
                          for name, v in per_stage.items()}}


def inference_overhead(calls: int, spaced_calls: int) -> dict[str, float]:
    import onnxruntime as ort

    from device import SigningKey
    from edge import OnnxPolicy

    model = cartpole_onnx()
    bundle = make_bundle(SigningKey.generate(), 1, model)
    policy = OnnxPolicy(bundle)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    bare = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    obs = np.array([0.01, -0.02, 0.03, 0.04], np.float32)
    outputs = ["action"]

    def bare_call() -> None:
        bare.run(outputs, {"obs": obs[None]})

    def agent_call() -> None:
        policy.act(obs)

    def measure(n: int, period: float) -> tuple[list[float], list[float]]:
        b_times: list[float] = []
        a_times: list[float] = []
        for _ in range(n):
            for fn, out in ((bare_call, b_times), (agent_call, a_times)):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
                if period:
                    time.sleep(period)
        return b_times, a_times

    measure(200, 0.0)  # warm up
    b, a = measure(calls, 0.0)
    bs, as_ = measure(spaced_calls, 0.01)
    us = 1e6
    return {"bare_p50_us": _pct(b, 50) * us, "agent_p50_us": _pct(a, 50) * us,
            "overhead_back_to_back": _pct(a, 50) / _pct(b, 50) - 1,
            "bare_10ms_p50_us": _pct(bs, 50) * us, "agent_10ms_p50_us": _pct(as_, 50) * us,
            "overhead_10ms": _pct(as_, 50) / _pct(bs, 50) - 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer agents and rounds (< 1 minute)")
    parser.add_argument("--agents", type=int, default=None, help="edge agents (default 50; 20 with --quick)")
    parser.add_argument("--processes", type=int, default=5, help="processes the agents are spread over")
    parser.add_argument("--rounds", type=int, default=None, help="published versions (default 10; 3 with --quick)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    parser.add_argument("--pub", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    agents = args.agents or (20 if args.quick else 50)
    rounds = args.rounds or (3 if args.quick else 10)
    with tempfile.TemporaryDirectory(prefix="edge-bench-") as tmp:
        prop = propagation(agents, min(args.processes, agents), rounds, Path(tmp))
    inf = inference_overhead(2000 if args.quick else 20000, 100 if args.quick else 500)
    goal_ms = 2 * prop["floor_p99_ms"] + 20
    print(f"edge propagation: {agents} agents in {prop['processes']} processes, {rounds} versions, "
          f"bundle {prop['bundle_bytes']} B, machine shared (load {os.getloadavg()[0]:.1f})")
    print(f"{'':28s}{'p50 ms':>10s}{'p99 ms':>10s}{'max ms':>10s}")
    print(f"{'raw MQTT floor':28s}{prop['floor_p50_ms']:10.2f}{prop['floor_p99_ms']:10.2f}{prop['floor_max_ms']:10.2f}")
    print(f"{'publish -> agent acting':28s}{prop['prop_p50_ms']:10.2f}{prop['prop_p99_ms']:10.2f}"
          f"{prop['prop_max_ms']:10.2f}")
    print(f"window publish -> last agent acting p50 {prop['window_p50_ms']:.1f} ms; CPU our processes "
          f"(agents + broker) used in it p50 {prop['window_cpu_p50_ms']:.1f} ms = "
          f"{prop['window_cores_used_p50']:.2f} of {os.cpu_count()} cores; critical-path CPU of all agents p50 "
          f"{prop['critical_cpu_sum_p50_ms'] or float('nan'):.1f} ms")
    print(f"{'per-agent update stage':28s}{'p50 ms':>10s}{'p99 ms':>10s}{'max ms':>10s}")
    for name, q in prop["stages_ms"].items():  # empty for an agent without update tracing
        print(f"{'  ' + name:28s}{q['p50']:10.2f}{q['p99']:10.2f}{q['max']:10.2f}")
    verdict = "met" if prop["prop_p99_ms"] <= goal_ms else "NOT met"
    print(f"goal p99 <= 2 x floor p99 + 20 ms = {goal_ms:.1f} ms: {verdict}")
    print(f"{'inference':28s}{'bare us':>10s}{'agent us':>10s}{'overhead':>10s}")
    print(f"{'back to back (p50)':28s}{inf['bare_p50_us']:10.2f}{inf['agent_p50_us']:10.2f}"
          f"{inf['overhead_back_to_back']:10.1%}")
    print(f"{'10 ms period (p50)':28s}{inf['bare_10ms_p50_us']:10.2f}{inf['agent_10ms_p50_us']:10.2f}"
          f"{inf['overhead_10ms']:10.1%}")
    figures = {**{k: round(v, 3) if isinstance(v, float) else v for k, v in prop.items()},
               **{k: round(v, 4) for k, v in inf.items()}, "goal_p99_ms": round(goal_ms, 2),
               "prop_p99_over_floor_p99": round(prop["prop_p99_ms"] / prop["floor_p99_ms"], 2),
               "quick": args.quick}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
