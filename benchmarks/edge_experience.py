"""Edge experience: the fleet's transitions into the learner exactly once, and what staleness does to learning.

1. ingest   real edge agents (`edge.EdgeAgent`: onnxruntime policy, CartPole simulator, sampled actions, the
            outbox with receipts), N = 10 and 100, as threads of a few worker processes (2 cores cannot run 100
            agent processes; 25 agents per process share one interpreter), against one Mosquitto (persistence on)
            and the learner's ingester processes (`strata edge ingest`, MQTT 5 shared subscription) writing one
            spool. Over a measured window: transitions/s ingested (stored in the spool, receipted), against the
            transitions/s the agents recorded. In the middle of the window the broker is killed with SIGKILL
            and started again (Mosquitto writes its persistence only now and then, so what it had not delivered
            is gone and must come again from the nodes' outboxes). At the end the agents stop and drain their
            outboxes; a record is lost when a node made it and it is neither in the spool nor still in the
            node's outbox. Baseline: the ingesters' raw capacity, records pre-encoded and published back to back
            by one paho client (no simulation).
2. learn    edge-only PPO (`--modes edge`, A `strata edge run` agent processes, nothing else) against co-located PPO
            (the same hyperparameters) at equal env steps: the 20-episode mean return at each point; the
            staleness (learner version - acting version) of every transition the edge run learned from; records
            learned from twice (the learner's record ids make that 0) and repeats it dropped before learning.
3. lag      the staleness correction under control: PPO on CartPole whose acting policy is exactly k versions old
            (k = 0, 2, 4, 8), corrected (the behaviour log-probs, `cloud.learners._losses.compute_vtrace` and the
            ratio against the acting policy) or not (learned from as if the learner's policy had acted); the
            20-episode mean return at the budget and the env steps at which it first reached 475, over seeds.

Prints tables and ends with one JSON line (``duplicates_in_learner``, ``transitions_lost`` and the rest).
``--quick`` (< 1 min): 10 agents, a short window, one seed of k = 4, a short learning comparison.
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import getpass
import json
import math
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FLEET = "bench"
STEPS = 32
"""Steps per experience record (the learner's num_steps; the bundle asks the fleet for it)."""


# ------------------------------------------------------------------------------------------------ broker

class Broker:
    """Mosquitto on a fixed loopback port, persistence on, that can be killed and started again."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text("\n".join([
            f"listener {self.port} 127.0.0.1", "allow_anonymous true", "set_tcp_nodelay true",
            f"user {getpass.getuser()}", "persistence true", f"persistence_location {workdir}/",
            "max_queued_messages 1000000", "max_inflight_messages 1000", ""]))
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until it listens."""
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = subprocess.Popen([binary, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("mosquitto did not start")

    def kill9(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def _child_env() -> dict[str, str]:
    from functions._lifetime import child_environment

    return {**child_environment(), "PYTHONPATH": str(REPO)}


def _cli(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:
        return subprocess.Popen([sys.executable, "-m", "cloud.cli", *args], stdout=f, stderr=f, env=_child_env(),
                                cwd=REPO)


# ------------------------------------------------------------------------------------------------ the policy

def policy_bundle(workdir: Path) -> tuple[bytes, Path, dict[str, Any]]:
    """A signed CartPole bundle of a fresh PPO actor asking for sampled actions in records of STEPS steps."""
    from cloud.learners._ppo import PPOLearner
    from cloud.learners._ppo_config import PPOConfig
    from cloud.rollout._envs import probe_spaces
    from cloud.switching._modes import PolicyPublisher
    from device import space_to_json
    from edge._experience import ExperienceRequest

    obs_space, act_space = probe_spaces("CartPole-v1")
    learner = PPOLearner(obs_space, act_space, PPOConfig())
    spaces = {"observation_space": space_to_json(obs_space), "action_space": space_to_json(act_space),
              "max_steps": 4096}
    publisher = PolicyPublisher(workdir, agent=learner.agent, normalizer=learner.normalizer,
                                obs_space=spaces["observation_space"], action_space=spaces["action_space"],
                                policy="cartpole", producer=ExperienceRequest(steps=STEPS).to_producer())
    return publisher.bundle(0), publisher.public_key, spaces


# ------------------------------------------------------------------------------------------------ agent workers

def agents_worker(args: argparse.Namespace) -> None:
    """Run `args.agents` edge agents as threads until the stop file appears; print one JSON line per node."""
    from edge import EdgeAgent, EdgeAgentConfig

    nodes = [f"n{args.first + i}" for i in range(args.agents)]
    agents = [EdgeAgent(EdgeAgentConfig(
        fleet=FLEET, node_id=node, cache_dir=str(Path(args.workdir) / node), trust=(args.trust,), broker=args.broker,
        experience_steps=STEPS, control_period_s=0.0, telemetry_interval_s=1e6, seed=args.first + i,
        health_latency_budget_ms=5000.0, health_deadline_s=120.0, experience_receipt_timeout_s=3.0)).start()
              for i, node in enumerate(nodes)]
    threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
    for t in threads:
        t.start()
    stop = Path(args.stop)
    while not stop.exists():
        time.sleep(0.05)
    for a in agents:
        a.stop()
    for t in threads:
        t.join(timeout=60)
    for a in agents:
        # the run loop wrote one telemetry record at its end, after every experience record: ids 1..records are
        # experience; drain what is left (the learner's receipts delete them)
        a.close(drain_s=float(args.drain_s))
    for a in agents:
        outbox = sqlite3.connect(Path(a.config.cache_dir) / "outbox.sqlite")
        left = sorted(int(r) for (r,) in outbox.execute("SELECT id FROM records WHERE topic LIKE '%/experience'"))
        outbox.close()
        print(json.dumps({"node": a.config.node_id, "records": a.counters.experience_records, "left": left,
                          "steps": a.counters.steps, "receipts": a.counters.receipts}), flush=True)


def spool_keys(spool: Path) -> tuple[set[tuple[str, int]], dict[str, int]]:
    """Every (node, record id) in the spool, and its counters (nothing before an ingester made it)."""
    empty = {"received": 0, "stored": 0, "duplicates_wire": 0, "refused": 0}
    if not spool.exists():
        return set(), empty
    db = sqlite3.connect(f"file:{spool}?mode=ro", uri=True, timeout=30)
    try:
        keys = {(str(n), int(r)) for n, r in db.execute("SELECT node, record_id FROM records")}
        counters = {**empty, **{str(k): int(v) for k, v in db.execute("SELECT name, value FROM counters")}}
    except sqlite3.OperationalError:  # the ingester is still making the tables
        return set(), empty
    finally:
        db.close()
    return keys, counters


def ingest(agents: int, *, processes: int, ingesters: int, window_s: float, workdir: Path, kill_broker: bool,
           ) -> dict[str, Any]:
    """Section 1 for `agents` agents (see the module docstring)."""
    from edge import Publisher

    work = Path(tempfile.mkdtemp(prefix=f"ingest{agents}-", dir=workdir))
    broker = Broker(work)
    broker.start()
    bundle, trust, spaces = policy_bundle(work / "run")
    spool = work / "spool.sqlite"
    (work / "spaces.json").write_text(json.dumps(spaces))
    ingest_procs = [_cli("edge", "ingest", "--broker", broker.url, "--fleet", FLEET, "--spool", str(spool),
                         "--spaces", str(work / "spaces.json"), "--name", f"ingest-{k}", log=work / f"ingest-{k}.log")
                    for k in range(ingesters)]
    stop = work / "stop"
    per = math.ceil(agents / processes)
    workers = []
    for p in range(processes):
        count = min(per, agents - p * per)
        if count <= 0:
            break
        workers.append(subprocess.Popen(
            [sys.executable, __file__, "--agents-worker", "--agents", str(count), "--first", str(p * per),
             "--workdir", str(work), "--trust", str(trust), "--broker", broker.url, "--stop", str(stop),
             "--drain-s", "30"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_child_env(), text=True))
    try:
        with Publisher(broker=broker.url, fleet=FLEET) as publisher:
            publisher.publish(bundle)
        # warm-up: every worker started its agents and records flow
        deadline = time.monotonic() + 300
        while len(spool_keys(spool)[0]) < agents * 2:
            if time.monotonic() > deadline:
                raise RuntimeError("ingest: the agents sent nothing within 300 s")
            time.sleep(0.2)
        t0, (k0, c0) = time.monotonic(), spool_keys(spool)
        if kill_broker:
            time.sleep(window_s / 2)
            broker.kill9()
            broker.start()
            time.sleep(window_s / 2)
        else:
            time.sleep(window_s)
        t1, (k1, c1) = time.monotonic(), spool_keys(spool)
        stop.touch()
        reports: list[dict[str, Any]] = []
        for w in workers:
            out, _ = w.communicate(timeout=600)
            reports += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        # what the nodes still held when they stopped was sent again and receipted by the drain, or is in `left`
        keys, counters = spool_keys(spool)
    finally:
        stop.touch()
        for w in workers:
            if w.poll() is None:
                w.kill()
        for proc in ingest_procs:
            proc.terminate()
            proc.wait(30)
        broker.stop()
    made = sum(r["records"] for r in reports)
    lost = sum(1 for r in reports for rid in range(1, r["records"] + 1)
               if (r["node"], rid) not in keys and rid not in set(r["left"]))
    stored = len(k1) - len(k0)
    return {"agents": agents, "processes": len(workers), "ingesters": ingesters, "window_s": round(t1 - t0, 2),
            "ingested_transitions_per_s": round(stored * STEPS / (t1 - t0)),
            "received_messages_per_s": round((c1["received"] - c0["received"]) / (t1 - t0)),
            "recorded_transitions": made * STEPS, "records": made, "stored_records": len(keys),
            "duplicates_on_wire": counters["duplicates_wire"], "refused": counters["refused"],
            "left_in_outboxes": sum(len(r["left"]) for r in reports), "transitions_lost": lost * STEPS,
            "broker_killed": kill_broker}


def capacity(workdir: Path, *, ingesters: int, seconds: float) -> dict[str, Any]:
    """Baseline of section 1: pre-encoded records published back to back by one paho client."""
    from device import RolloutBatch
    from edge import Experience, FleetTopics, LinkConfig, MqttLink

    work = Path(tempfile.mkdtemp(prefix="capacity-", dir=workdir))
    broker = Broker(work)
    broker.start()
    _, _, spaces = policy_bundle(work / "run")
    spool = work / "spool.sqlite"
    (work / "spaces.json").write_text(json.dumps(spaces))
    procs = [_cli("edge", "ingest", "--broker", broker.url, "--fleet", FLEET, "--spool", str(spool), "--spaces",
                  str(work / "spaces.json"), "--name", f"ingest-{k}", log=work / f"ingest-{k}.log")
             for k in range(ingesters)]
    rng = np.random.default_rng(0)
    t = STEPS
    batch = RolloutBatch(source="x", obs=rng.normal(size=(t, 1, 4)).astype(np.float32),
                         actions=rng.integers(0, 2, (t, 1)), rewards=np.ones((t, 1), np.float32),
                         terminations=np.zeros((t, 1), bool), truncations=np.zeros((t, 1), bool),
                         final_obs=np.zeros((t, 1, 4), np.float32), next_obs=np.zeros((1, 4), np.float32),
                         policy_version=np.ones((t, 1), np.int64), worker=np.zeros(1, np.int64),
                         seq=np.arange(t)[:, None], behaviour_logprobs=np.full((t, 1), -0.69, np.float32))
    topics = FleetTopics(FLEET)
    payloads = [(topics.node(f"n{i % 100}", "experience"),
                 Experience(record_id=1 + i // 100, node=f"n{i % 100}", batch=batch).encode()) for i in range(20000)]
    acked: set[int] = set()
    try:
        link = MqttLink(LinkConfig(broker=broker.url, client_id="capacity", clean_session=True, max_inflight=1000,
                                   max_queued=5000), on_ack=acked.add).start()
        link.wait_connected(30)
        time.sleep(2.0)  # the ingesters subscribe (a record published before reaches nobody)
        started, sent = time.monotonic(), 0
        while time.monotonic() - started < seconds and sent < len(payloads):
            if link.publish(*payloads[sent]).accepted:
                sent += 1
            else:
                time.sleep(0.001)
        deadline = time.monotonic() + 120
        while len(spool_keys(spool)[0]) < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        stored = len(spool_keys(spool)[0])
        link.close()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        broker.stop()
    return {"records": sent, "stored": stored, "seconds": round(elapsed, 2),
            "ingested_transitions_per_s": round(stored * STEPS / elapsed)}


# ------------------------------------------------------------------------------------------------ learning

def curve(run_dir: Path, points: list[int]) -> list[float | None]:
    """The 20-episode mean return at each env-step point (the last update at or before it)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "charts/mean_return_20" in r]
    out: list[float | None] = []
    for point in points:
        before = [r for r in records if r["global_step"] <= point]
        value = before[-1]["charts/mean_return_20"] if before else None
        out.append(None if value is None or (isinstance(value, float) and math.isnan(value)) else round(value, 1))
    return out


def learn(workdir: Path, *, total_steps: int, agents: int, seed: int) -> dict[str, Any]:
    """Section 2: edge-only against co-located PPO at equal env steps."""
    from cloud.learners._ppo_config import PPOConfig
    from cloud.rollout._edge import EdgeSourceConfig, RecordIds, summarise_staleness
    from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint
    from cloud.runs._train import train
    from cloud.switching._modes import SwitchingConfig
    from device import generate_keypair

    config = PPOConfig(clip_vloss=False, learning_rate=1.5e-3)  # cloud/presets/ppo.toml's CartPole-v1
    points = [p for p in range(5000, total_steps + 1, 5000)] or [total_steps]
    work = Path(tempfile.mkdtemp(prefix="learn-", dir=workdir))
    colocated_dir = work / "colocated"
    colocated = train(env_id="CartPole-v1", total_steps=total_steps, run_dir=colocated_dir, seed=seed, config=config,
                      progress=False, log=lambda line: None)
    broker = Broker(work)
    broker.start()
    run_dir = work / "edge"
    _, pub = generate_keypair(run_dir / "keys")
    procs = [_cli("edge", "run", "--fleet", FLEET, "--node-id", f"n{i}", "--cache-dir", str(work / f"n{i}"),
                  "--trust", str(pub), "--broker", broker.url, "--experience-steps", str(STEPS),
                  "--control-period-s", "0", "--health-latency-budget-ms", "5000", "--seed", str(i),
                  log=work / f"n{i}.log") for i in range(agents)]
    try:
        edge = train(env_id="CartPole-v1", total_steps=total_steps, run_dir=run_dir, seed=seed, config=config,
                     switching=SwitchingConfig(modes=("edge",), control=False), progress=False, log=lambda line: None,
                     edge=EdgeSourceConfig(edge_broker=broker.url, edge_fleet=FLEET, edge_wait_s=300))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)
        broker.stop()
    state = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    ledger = state["edge"]
    counters = ledger["counters"]
    ids = RecordIds(ledger["record_ids"])
    refused = sum(int(counters.get(k, 0)) for k in ("refused_stale", "refused_shape", "malformed"))
    learned_twice = int(counters["records"]) + refused - ids.count()  # > 0 only if a record entered twice
    histogram = {int(k): int(v) for k, v in ledger["staleness"].items()}
    return {"points": points, "edge": curve(run_dir, points), "colocated": curve(colocated_dir, points),
            "edge_wall_s": round(edge.wall_s, 1), "colocated_wall_s": round(colocated.wall_s, 1),
            "edge_transitions": int(counters["transitions"]), "edge_records": int(counters["records"]),
            "refused_stale_records": int(counters.get("refused_stale", 0)),
            "duplicates_dropped_by_learner": int(counters.get("duplicates_learner", 0)),
            "duplicates_in_learner": max(learned_twice, 0) * STEPS + (edge.accounting or {}).get("duplicates", 0),
            "staleness_histogram": dict(sorted(histogram.items())),
            "staleness": {k: round(v, 2) for k, v in summarise_staleness(histogram.items()).items()},
            "agents": agents}


# ------------------------------------------------------------------------------------------------ lag

def lagged_run(lag: int, correction: str, seed: int, total: int) -> list[tuple[int, float]]:
    """PPO on CartPole acting with its policy of exactly `lag` versions ago; the (env step, mean return) curve."""
    import torch

    from cloud.learners._ppo import PPOLearner
    from cloud.learners._ppo_config import PPOConfig
    from cloud.rollout._collector import RolloutCollector
    from cloud.rollout._envs import make_vector_env, probe_spaces

    torch.manual_seed(seed)
    cfg = PPOConfig(clip_vloss=False, learning_rate=1.5e-3)
    obs_space, act_space = probe_spaces("CartPole-v1")
    learner = PPOLearner(obs_space, act_space, cfg)
    envs = make_vector_env("CartPole-v1", num_envs=cfg.num_envs, seed=seed, mode="sync")
    collector = RolloutCollector(envs, num_steps=cfg.num_steps)
    acting: collections.deque[tuple[Any, Any]] = collections.deque(maxlen=lag + 1)
    generator = np.random.default_rng(seed)
    step, version, returns, out = 0, 0, collections.deque(maxlen=20), []
    updates = cfg.num_updates(total)
    try:
        while step < total:
            acting.append((copy.deepcopy(learner.agent), copy.deepcopy(learner.normalizer)))
            agent, normalizer = acting[0]  # the policy (weights and normaliser) of `lag` versions ago acts
            batch, episodes = collector.collect(agent, normalizer, policy_version=version, global_step=step)
            step += batch.size
            t, n = batch.num_steps, batch.num_envs
            with torch.inference_mode():
                b_obs = torch.from_numpy(learner.normalizer(batch.obs.reshape(t * n, *batch.obs.shape[2:])))
                logprobs, _ = learner.agent.evaluate_actions(b_obs, torch.from_numpy(batch.actions.reshape(t * n)))
                values = learner.agent.get_value(b_obs)
            batch = dataclasses.replace(batch, logprobs=logprobs.numpy().reshape(t, n),
                                        values=values.numpy().reshape(t, n),
                                        behaviour_logprobs=batch.logprobs if correction == "vtrace" else None)
            learner.anneal(version, updates)
            learner.update(batch, generator=generator)
            version += 1
            learner.normalizer.update(batch.obs)
            returns.extend(e.episodic_return for e in episodes)
            out.append((step, float(np.mean(returns)) if returns else 0.0))
    finally:
        envs.close()
    return out


def lag_effect(lags: list[int], seeds: int, total: int) -> list[dict[str, Any]]:
    """Section 3."""
    rows = []
    for lag in lags:
        for correction in ("none", "vtrace"):
            finals, solved = [], []
            for seed in range(seeds):
                points = lagged_run(lag, correction, seed, total)
                finals.append(points[-1][1])
                solved.append(next((s for s, r in points if r >= 475), None))
            rows.append({"lag": lag, "correction": correction, "final_mean_return": round(float(np.mean(finals)), 1),
                         "finals": [round(f) for f in finals], "solved_at": solved,
                         "solved": sum(s is not None for s in solved), "seeds": seeds})
    return rows


# ------------------------------------------------------------------------------------------------ main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short version (< 1 min)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the lag section (default: 3)")
    parser.add_argument("--agents-worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--agents", "--first"):
        parser.add_argument(name, type=int, default=0, help=argparse.SUPPRESS)
    for name in ("--workdir", "--trust", "--broker", "--stop", "--drain-s"):
        parser.add_argument(name, default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agents_worker:
        agents_worker(args)
        return
    import torch

    torch.set_num_threads(1)
    workdir = Path(tempfile.mkdtemp(prefix="strata-edge-bench-"))
    started = time.monotonic()
    try:
        if args.quick:
            runs = [ingest(10, processes=1, ingesters=1, window_s=6.0, workdir=workdir, kill_broker=True)]
            cap = capacity(workdir, ingesters=1, seconds=3.0)
            learning = learn(workdir, total_steps=10_000, agents=3, seed=0)
            lags = lag_effect([4], 1, 10_000)
        else:
            runs = [ingest(10, processes=1, ingesters=1, window_s=20.0, workdir=workdir, kill_broker=True),
                    ingest(100, processes=4, ingesters=2, window_s=30.0, workdir=workdir, kill_broker=True)]
            cap = capacity(workdir, ingesters=2, seconds=10.0)
            learning = learn(workdir, total_steps=40_000, agents=4, seed=0)
            lags = lag_effect([0, 2, 4, 8], args.seeds, 30_000)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("ingest (real agents; broker killed with SIGKILL mid-window):")
    print(f"{'agents':>7} {'procs':>5} {'ingesters':>9} {'ingested tr/s':>14} {'recorded':>9} {'dup wire':>8} "
          f"{'lost':>5} {'left':>5}")
    for r in runs:
        print(f"{r['agents']:>7} {r['processes']:>5} {r['ingesters']:>9} {r['ingested_transitions_per_s']:>14,} "
              f"{r['recorded_transitions']:>9,} {r['duplicates_on_wire']:>8} {r['transitions_lost']:>5} "
              f"{r['left_in_outboxes']:>5}")
    print(f"baseline: raw ingest capacity {cap['ingested_transitions_per_s']:,} transitions/s "
          f"({cap['stored']:,} pre-encoded records in {cap['seconds']} s)")
    print(f"\nlearning at equal env steps ({learning['agents']} edge agents vs co-located):")
    print(f"{'env steps':>9} {'edge':>7} {'colocated':>9}")
    for p, e, c in zip(learning["points"], learning["edge"], learning["colocated"], strict=True):
        print(f"{p:>9,} {e if e is not None else '-':>7} {c if c is not None else '-':>9}")
    print(f"edge staleness (versions): {learning['staleness']}; histogram {learning['staleness_histogram']}")
    print(f"edge: {learning['edge_records']} records learned from, {learning['refused_stale_records']} refused as "
          f"stale, {learning['duplicates_dropped_by_learner']} repeats dropped, "
          f"{learning['duplicates_in_learner']} learned twice")
    print("\nstaleness correction (acting policy exactly k versions old):")
    print(f"{'k':>3} {'correction':>10} {'final mean':>10} {'solved':>7} {'solved at env steps'}")
    for row in lags:
        print(f"{row['lag']:>3} {row['correction']:>10} {row['final_mean_return']:>10} "
              f"{row['solved']:>3}/{row['seeds']:<3} {row['solved_at']}")
    figures = {
        "quick": args.quick, "seconds": round(time.monotonic() - started, 1),
        "ingest": runs, "capacity": cap, "learning": learning, "lag": lags,
        "transitions_per_s_10": runs[0]["ingested_transitions_per_s"],
        "transitions_per_s_100": runs[1]["ingested_transitions_per_s"] if len(runs) > 1 else None,
        "duplicates_on_wire": sum(r["duplicates_on_wire"] for r in runs) + learning["duplicates_dropped_by_learner"],
        "duplicates_in_learner": learning["duplicates_in_learner"],
        "transitions_lost": sum(r["transitions_lost"] for r in runs),
        "staleness": learning["staleness"],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
