"""A device on the secure broker: escalation rate, decision latency, and fallbacks when its edge dies.

Setup, one run on loopback: `strata broker config --devices dev-0` files (passwords, ACLs, client id bound to the
username) on a real Mosquitto; an `edge.EdgeGateway` as node ``edge-0`` (the user an edge agent's gateway shares)
answering escalations with a 4-64-2 tanh CartPole controller in onnxruntime; the micro bundle published by the
cloud user to ``strata/FLEET/device-policy`` (what `strata publish --tier device` does) and relayed by the gateway;
`device.DeviceRuntime` as user ``dev-0`` (password file) acting on CartPole-v1, escalating when the probability
margin is under 0.1, with a 20 ms budget. Baseline in the same run: the same device and gateway on an anonymous
broker. Then the gateway is stopped (the edge dies) and the device makes 500 more decisions: every escalation
must fall back when its budget expires.

Reported per phase: decisions, escalated fraction, fallbacks, decision latency p50/p99 (ms, escalation round trip
included) and the slowest fallback. Usage: ``python benchmarks/device_secure_broker.py [--quick]``; the last
output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import _mosquitto
import numpy as np
from tiered_decisions import OBS, episodes, teacher_model

FLEET = "secure"


def phase(runtime: Any, n_eps: int, seed: int) -> dict[str, Any]:
    rets, lats, tiers = episodes(runtime.controller(), n_eps, seed=seed)
    return summary(rets, lats, tiers)


def summary(rets: list[float], lats: list[float], tiers: dict[str, int]) -> dict[str, Any]:
    total = sum(tiers.values())
    return {"decisions": total, "mean_return": round(float(np.mean(rets)), 1),
            "escalated": round((tiers["edge"] + tiers["device-fallback"]) / total, 4),
            "answered_by_edge": tiers["edge"], "fallbacks": tiers["device-fallback"],
            "latency_p50_ms": round(float(np.percentile(lats, 50)) * 1e3, 3),
            "latency_p99_ms": round(float(np.percentile(lats, 99)) * 1e3, 3),
            "latency_max_ms": round(float(np.max(lats)) * 1e3, 3)}


def dead_edge(runtime: Any, n_decisions: int, seed: int) -> dict[str, Any]:
    """Decisions after the edge died: the escalated ones must fall back when the budget expires."""
    controller = runtime.controller()
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    fallback_lats, tiers, rets = [], {"device": 0, "edge": 0, "device-fallback": 0}, []
    obs, _ = env.reset(seed=seed)
    total, episode = 0.0, 0
    for _ in range(n_decisions):
        d = controller.decide(np.asarray(obs, dtype=np.float32))
        tiers[d.tier] += 1
        if d.tier == "device-fallback":
            fallback_lats.append(d.latency_s)
        obs, r, term, trunc, _ = env.step(d.action)
        total += float(r)
        if term or trunc:
            rets.append(total)
            total, episode = 0.0, episode + 1
            obs, _ = env.reset(seed=seed + episode)
    env.close()
    out = {"decisions": sum(tiers.values()), "answered_by_edge": tiers["edge"], "fallbacks": tiers["device-fallback"],
           "escalated": round((tiers["edge"] + tiers["device-fallback"]) / max(1, sum(tiers.values())), 4)}
    if fallback_lats:
        out.update(fallback_p50_ms=round(float(np.percentile(fallback_lats, 50)) * 1e3, 3),
                   fallback_p99_ms=round(float(np.percentile(fallback_lats, 99)) * 1e3, 3),
                   fallback_max_ms=round(float(np.max(fallback_lats)) * 1e3, 3))
    return out


def run(url: str, workdir: Path, *, creds: dict[str, Path] | None, n_eps: int, budget_ms: float, threshold: float,
        dead_decisions: int) -> dict[str, Any]:
    from device import DeviceConfig, DeviceRuntime, TrustStore, build_bundle, generate_keypair, load_public_key
    from device import load_signing_key as signing
    from edge._gateway import EdgeGateway, GatewayConfig
    from edge._policy import OnnxPolicy
    from edge._publish import Publisher

    keys = workdir / "keys"
    if not (keys / "strata-signing.key").exists():
        generate_keypair(keys)
    model = teacher_model()
    trust = TrustStore([load_public_key(keys / "strata-signing.pub")])

    def bundle(tier: str) -> Any:
        return build_bundle(model, policy=f"cartpole-{tier}", version=1, parent_version=None, observation_space=OBS,
                            action_space={"type": "Discrete", "n": 2}, signing_key=signing(keys / "strata-signing.key"),
                            target_tier=tier, output_names=("action", "logits"))  # type: ignore[arg-type]

    def password(user: str) -> str | None:
        return None if creds is None else creds[user].read_text().strip()

    edge_policy = OnnxPolicy(bundle("edge"))
    gateway = EdgeGateway(GatewayConfig(broker=url, fleet=FLEET, node="edge-0",
                                        username=None if creds is None else "edge-0", password=password("edge-0")),
                          policy_source=lambda: edge_policy, trust=trust).start(connect_timeout=30)
    with Publisher(broker=url, fleet=FLEET, username=None if creds is None else "cloud",
                   password=password("cloud")) as publisher:
        publisher.publish_device_bundle(bundle("device"))
    config = DeviceConfig(broker=url, fleet=FLEET, edge_node="edge-0", device_id="dev-0",
                          username=None if creds is None else "dev-0",
                          password_file=None if creds is None else str(creds["dev-0"]), threshold=threshold,
                          budget_ms=budget_ms)
    result: dict[str, Any] = {}
    try:
        with DeviceRuntime(config, trust=trust) as runtime:
            runtime.wait_for_policy(30)
            result["edge_up"] = phase(runtime, n_eps, seed=100)
            result["relay_failures"] = gateway.counters.relay_failures
            if dead_decisions:
                gateway.close()
                result["edge_dead"] = dead_edge(runtime, dead_decisions, seed=100)
    finally:
        gateway.close()
    return result


def anonymous_refused(url: str) -> bool:
    from device import LinkOptions, MqttLinkError
    from device._mqtt import DeviceLink, parse_broker

    host, port, _ = parse_broker(url)
    try:
        DeviceLink(LinkOptions(host=host, port=port, client_id="anon"), on_message=lambda *a: None,
                   subscriptions=[]).connect().close()
    except MqttLinkError:
        return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 episodes per phase, 100 decisions with a dead edge")
    parser.add_argument("--episodes", type=int, default=20, help="CartPole episodes per phase (default: 20)")
    parser.add_argument("--budget-ms", type=float, default=20.0, help="escalation budget (default: 20)")
    parser.add_argument("--threshold", type=float, default=0.1, help="escalate under this probability margin "
                        "(default: 0.1)")
    args = parser.parse_args()
    n_eps = 2 if args.quick else args.episodes
    dead_decisions = 100 if args.quick else 500
    from edge._broker_config import write_broker_config

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = write_broker_config(work / "broker", fleet=FLEET, nodes=["edge-0"], devices=["dev-0"])
        secure_proc, secure_url = _mosquitto.start_mosquitto(
            work / "broker", "allow_anonymous false", f"password_file {files.passwd}", f"acl_file {files.acl}",
            "use_username_as_clientid true")
        (work / "open").mkdir()
        open_proc, open_url = _mosquitto.start_mosquitto(work / "open")
        procs: list[subprocess.Popen[bytes]] = [secure_proc, open_proc]
        try:
            assert anonymous_refused(secure_url), "the secure broker let an anonymous client in"
            t0 = time.perf_counter()
            results["secure"] = run(secure_url, work, creds=files.credentials, n_eps=n_eps,
                                    budget_ms=args.budget_ms, threshold=args.threshold, dead_decisions=dead_decisions)
            results["open_baseline"] = run(open_url, work, creds=None, n_eps=n_eps, budget_ms=args.budget_ms,
                                           threshold=args.threshold, dead_decisions=0)
            elapsed = time.perf_counter() - t0
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=10)
    print(f"{'phase':<26}{'decisions':>10}{'return':>8}{'escalated':>10}{'by edge':>8}{'fallback':>9}"
          f"{'p50 ms':>8}{'p99 ms':>8}")
    for name, r in (("secure broker, edge up", results["secure"]["edge_up"]),
                    ("open broker, edge up", results["open_baseline"]["edge_up"])):
        print(f"{name:<26}{r['decisions']:>10}{r['mean_return']:>8}{r['escalated']:>10.1%}{r['answered_by_edge']:>8}"
              f"{r['fallbacks']:>9}{r['latency_p50_ms']:>8}{r['latency_p99_ms']:>8}")
    dead = results["secure"]["edge_dead"]
    print(f"secure broker, edge dead: {dead['decisions']} decisions, {dead['fallbacks']} fallbacks, "
          f"{dead['answered_by_edge']} answered by the edge; fallback p50/p99/max "
          f"{dead.get('fallback_p50_ms')}/{dead.get('fallback_p99_ms')}/{dead.get('fallback_max_ms')} ms "
          f"(budget {args.budget_ms} ms)")
    print(json.dumps({"benchmark": "device_secure_broker", "quick": args.quick, "episodes_per_phase": n_eps,
                      "budget_ms": args.budget_ms, "threshold": args.threshold, "elapsed_s": round(elapsed, 1),
                      **results,
                      "goals": {"no_relay_failures": results["secure"]["relay_failures"] == 0,
                                "edge_answers_on_secure_broker": results["secure"]["edge_up"]["answered_by_edge"] > 0,
                                "dead_edge_all_fallback": dead["answered_by_edge"] == 0}}, sort_keys=True))


if __name__ == "__main__":
    main()
