"""`strata demo`: the whole strata story on one machine, on embedded defaults, with a report folder.

Stages:

1. train      PPO on CartPole-v1, co-located (shared-memory env workers). The switcher moves the live
              run to decoupled execution on serverless functions (the local Lambda-compatible runtime,
              invoked with boto3; or AWS with ``--functions aws``) by the phase-schedule rule, and back
              when the design's threshold rule says a fast env belongs co-located; every switch is
              logged with its reason. Training stops once the last 20 episodes and the deterministic
              policy both average 475, or at the step budget.
2. export     a signed edge bundle (ONNX, normalisation inside the graph, verified against torch) and
              a distilled micro policy as a signed device bundle
3. verify     both bundles as their consumers would; the edge bundle is evaluated with the numpy-only
              device executor on 20 fresh episodes
4. fleet      the embedded MQTT broker (or ``--broker``): three edge agents take the edge bundle,
              verify it and act on their simulators; two devices get the micro policy through their
              edge and escalate low-confidence observations; telemetry flows back into the fleet view
5. fleet trains  a fresh PPO run whose only experience is the fleet's (``--modes edge``): edge agent processes
              act with each version the learner publishes and send their steps back through the broker; an
              ingester stores each record once and receipts it; the run learns from every record exactly once
              (records, duplicates, staleness in the report)
6. report     summary.md linking learning_curve.png (with switch markers), fleet_training.png (the fleet-trained
              curve beside the co-located one), throughput_by_mode.png, fleet.txt / fleet.json and summary.json

Ctrl-C at any point stops every worker, service, runtime, agent and broker the demo started (they are
all owned by context managers or ``finally`` blocks), and leaves no shared memory behind.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from device import ConfigError, atomic_file, require, write_atomic

ENV_ID = "CartPole-v1"
SOLVED_RETURN = 475.0
"""CartPole-v1's reward threshold, over a 20-episode mean."""
EVAL_EPISODES = 20


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """Settings of `strata demo`."""

    out: str = "demo-report"
    """Report folder to write (its run/ sub-folder is replaced on every run)."""
    seed: int = 0
    """Random seed for every stage."""
    total_steps: int = 150_000
    """Env-step budget of the training stage; it stops earlier once solved."""
    switch_at: int = 8_192
    """Env steps after which the phase schedule moves training to the functions."""
    functions: Literal["local", "aws"] = "local"
    """Where the decoupled phase's functions run: the embedded local runtime or AWS Lambda."""
    broker: str | None = None
    """MQTT broker URL for the fleet stage; None starts the embedded broker."""
    edge_nodes: int = 3
    """Edge agents in the fleet stage."""
    devices: int = 2
    """Terminal devices in the fleet stage."""
    fleet: bool = True
    """Run the export-to-fleet stages (False: train, export and evaluate only)."""
    fleet_training: bool = True
    """With fleet: also train a fresh policy from the fleet's experience alone (the edge mode)."""
    fleet_training_steps: int = 40_000
    """Env-step budget of the fleet-trained run; it stops earlier once its 20-episode mean reaches 475."""
    fleet_training_nodes: int = 3
    """Edge agent processes whose experience trains the fleet-trained run."""

    def __post_init__(self) -> None:
        # Checked before the first stage: a bad value would otherwise surface only minutes later, at stage 5.
        if self.fleet_training_steps < 1:
            raise ConfigError(f"demo: --fleet-training-steps {self.fleet_training_steps} must be >= 1")
        if not 1 <= self.fleet_training_nodes <= 16:
            raise ConfigError(f"demo: --fleet-training-nodes {self.fleet_training_nodes} must be between 1 and 16")


FLEET_TRAINING_NODE_STEPS_PER_S = 300
"""Each fleet-training node's experience budget (recorded steps/s). Unbudgeted, three nodes record ~10x what the
learner takes: the surplus goes stale in the spool and is refused, and carrying it through the in-process embedded
broker slows the learner several times over (docs/edge.md: give nodes a budget near what the learner takes)."""


def _say(line: str) -> None:
    print(f"strata demo: {line}", flush=True)


def run_demo(config: DemoConfig) -> int:
    """Run the demo; return an exit status."""
    require("gymnasium", extra="cloud", purpose="the demo's simulators")
    require("torch", extra="cloud", purpose="the demo's learner")
    from cloud.learners._distill import DistillConfig
    from cloud.learners._ppo_config import PPOConfig
    from cloud.runs._export import distill, export_run, write_bundle
    from cloud.runs._train import train
    from cloud.switching._modes import SwitchingConfig
    from cloud.switching._switcher import SwitchRules
    from device import TrustStore, Verifier, generate_keypair, load_public_key, load_signing_key

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    trains_from_fleet = config.fleet and config.fleet_training
    stages = 6 if trains_from_fleet else 5

    # 1. Train, switching live. The demo owns out/run: a previous demo's run is replaced, not resumed.
    run_dir = out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    _say(f"1/{stages} training PPO on {ENV_ID} co-located (budget {config.total_steps:,} env steps); the phase "
         f"schedule moves it to serverless functions ({config.functions}) after {config.switch_at:,} steps")
    rules = SwitchRules(phase_steps=config.switch_at, phase_to="functions", thresholds=True, min_dwell_updates=24)
    switching = SwitchingConfig(modes=("colocated", "functions"), functions=config.functions, fragment_steps=128)
    result = train(env_id=ENV_ID, total_steps=config.total_steps, run_dir=run_dir, seed=config.seed,
                   config=PPOConfig(env_mode="colocated"), target_return=SOLVED_RETURN,
                   confirm_episodes=EVAL_EPISODES, switching=switching, rules=rules,
                   log=lambda line: _say(line.removeprefix("switcher: ")))

    # 2. Export: a signed edge bundle, and a distilled micro policy for devices.
    key_dir = out / "keys"
    private, public = key_dir / "strata-signing.key", key_dir / "strata-signing.pub"
    if not private.exists():
        private, public = generate_keypair(key_dir)
    signing_key = load_signing_key(private)
    _say(f"2/{stages} exporting a signed edge bundle and distilling a micro policy for devices")
    exported = export_run(run_dir, signing_key=signing_key, policy="cartpole", target_tier="edge")
    bundle_path = out / "policy.bundle"
    write_bundle(bundle_path, exported.bundle)
    micro = distill(exported.bundle, env_id=ENV_ID, signing_key=signing_key, policy="cartpole-micro",
                    config=DistillConfig(seed=config.seed, iterations=3, steps_per_iteration=1500, eval_episodes=5))
    micro_path = out / "micro.bundle"
    write_bundle(micro_path, micro.bundle)

    # 3. Verify as the consumers would, and evaluate the edge bundle with the numpy-only executor.
    _say(f"3/{stages} verifying both bundles and evaluating the policy with the numpy device executor "
         f"({EVAL_EPISODES} episodes)")
    trust = TrustStore([load_public_key(public)])
    bundle = Verifier(trust=trust, tier="edge").verify(bundle_path.read_bytes())
    micro_bundle = Verifier(trust=trust, tier="device").verify(micro_path.read_bytes())
    returns = _evaluate(bundle, seed=config.seed)

    # 4. The fleet.
    fleet: Any = None
    if config.fleet:
        from edge import run_fleet_demo

        where = config.broker or "the embedded MQTT broker"
        _say(f"4/{stages} publishing through {where} to {config.edge_nodes} edge agents and {config.devices} devices")
        fleet = run_fleet_demo(bundle, trust=public, work_dir=out / "fleet", nodes=config.edge_nodes,
                               broker=config.broker, act_seconds=1.0, device_bundle=micro_bundle,
                               devices=config.devices, device_steps=1000, device_threshold=0.2)

    # 5. The fleet's experience trains a fresh policy.
    fleet_training: dict[str, Any] | None = None
    if trains_from_fleet:
        _say(f"5/6 training a fresh policy from the experience of {config.fleet_training_nodes} edge agents alone "
             f"(edge mode, budget {config.fleet_training_steps:,} env steps)")
        fleet_training = _fleet_trains(config, out, key_dir)

    # 6. The report.
    _say(f"{stages}/{stages} writing the report")
    summary = _summary(config, result, exported, bundle, bundle_path, micro, micro_path, returns, fleet, started)
    if fleet_training is not None:
        summary["fleet_training"] = fleet_training
        _fleet_training_curve(out / "fleet_training.png", fleet_training, result)
    switches = [e.to_dict() for e in result.switches]
    _learning_curve(out / "learning_curve.png", [(e.global_step, e.episodic_return) for e in result.episodes],
                    switches)
    summary["throughput_by_mode"] = _throughput_by_mode(out / "throughput_by_mode.png", run_dir)
    if fleet is not None:
        write_atomic(out / "fleet.txt", fleet.table + "\n")
        write_atomic(out / "fleet.json", json.dumps({"nodes": [v.__dict__ for v in fleet.views],
                                                      "devices": list(fleet.devices)}, indent=2,
                                                    default=str))
    write_atomic(out / "summary.json", json.dumps(summary, indent=2, default=str))
    write_atomic(out / "summary.md", _markdown(summary, switches, fleet))
    _print_table(summary)
    if fleet is not None:
        print(fleet.table)
    _say(f"report in {out}/ (summary.md, learning_curve.png, throughput_by_mode.png, fleet.txt, policy.bundle, "
         "micro.bundle, keys/, run/)")
    return 0


def _fleet_trains(config: DemoConfig, out: Path, key_dir: Path) -> dict[str, Any]:
    """Stage 5: a fresh PPO run on the experience of edge agent processes alone (the edge mode); its figures."""
    import contextlib
    import subprocess
    import sys

    from cloud.learners._ppo_config import PPOConfig
    from cloud.rollout._edge import EdgeSourceConfig, summarise_staleness
    from cloud.runs._train import train
    from cloud.switching._modes import SwitchingConfig
    from edge import EmbeddedBroker
    from functions._lifetime import child_environment

    run_dir = out / "run-edge"
    for folder in (run_dir, out / "fleet-training"):
        if folder.exists():
            shutil.rmtree(folder)
    shutil.copytree(key_dir, run_dir / "keys")  # the run signs with the demo's key, which the agents trust
    fleet_name = "demo-training"
    with contextlib.ExitStack() as stack:
        url = config.broker or stack.enter_context(EmbeddedBroker()).url
        agents = []
        for i in range(config.fleet_training_nodes):
            cache = out / "fleet-training" / f"trainer-{i}"
            cache.mkdir(parents=True)
            log = stack.enter_context((cache.parent / f"trainer-{i}.log").open("ab"))
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "cloud.cli", "edge", "run", "--fleet", fleet_name, "--node-id", f"trainer-{i}",
                 "--cache-dir", str(cache), "--trust", str(key_dir / "strata-signing.pub"), "--broker", url,
                 "--experience-steps", "32", "--experience-max-steps-per-s", str(FLEET_TRAINING_NODE_STEPS_PER_S),
                 "--control-period-s", "0", "--health-latency-budget-ms", "5000",
                 "--seed", str(config.seed * 100 + i)], stdout=log, stderr=log, env=child_environment()))
        stack.callback(_end_all, agents)
        edge = EdgeSourceConfig(edge_broker=url, edge_fleet=fleet_name, edge_wait_s=300,
                                edge_protocol="auto" if config.broker else "3.1.1")
        result = train(env_id=ENV_ID, total_steps=config.fleet_training_steps, run_dir=run_dir, seed=config.seed,
                       config=PPOConfig(clip_vloss=False, learning_rate=1.5e-3), target_return=SOLVED_RETURN,
                       switching=SwitchingConfig(modes=("edge",), control=False), edge=edge, progress=False,
                       log=lambda line: _say(line.removeprefix("edge: ")) if "edge:" in line else None)
    from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint

    ledger = load_checkpoint(latest_checkpoint(run_dir))["edge"]  # type: ignore[arg-type]
    counters = ledger["counters"]
    staleness = summarise_staleness((int(k), int(v)) for k, v in ledger["staleness"].items())
    return {"env_steps": result.global_step, "seconds": round(result.wall_s, 1), "nodes": config.fleet_training_nodes,
            "solved_at_step": result.solved_at_step, "mean_return_20": result.mean_return,
            "records": int(counters.get("records", 0)), "transitions": int(counters.get("transitions", 0)),
            "duplicates_dropped": int(counters.get("duplicates_learner", 0)),
            "refused_stale": int(counters.get("refused_stale", 0)),
            "duplicates_in_learner": (result.accounting or {}).get("duplicates", 0),
            "gaps": (result.accounting or {}).get("gaps", 0),
            "staleness": {k: (None if math.isnan(v) else round(v, 2)) for k, v in staleness.items()},
            "curve": [(e.global_step, e.episodic_return) for e in result.episodes]}


def _end_all(procs: list[Any]) -> None:
    """Stop the agent processes (SIGTERM: each closes its link; SIGKILL after 10 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except Exception:
            proc.kill()
            proc.wait()


def _fleet_training_curve(path: Path, figures: dict[str, Any], colocated: Any) -> None:
    """The fleet-trained run's 20-episode mean beside the co-located run's, by env steps."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, points in (("edge mode: fleet experience alone", figures["curve"]),
                          ("co-located (stage 1)", [(e.global_step, e.episodic_return) for e in colocated.episodes])):
        if len(points) >= 2:
            steps = np.array([p[0] for p in points])
            rets = np.array([p[1] for p in points])
            window = np.convolve(rets, np.ones(20) / 20, mode="valid") if len(rets) >= 20 else rets
            ax.plot(steps[len(steps) - len(window):], window, linewidth=2, label=label)
    ax.axhline(SOLVED_RETURN, color="grey", linestyle="--", linewidth=1, label=f"solved ({SOLVED_RETURN:g})")
    ax.set_xlabel("env steps")
    ax.set_ylabel("20-episode mean return")
    ax.set_title(f"PPO on {ENV_ID}: trained by the fleet's experience vs co-located")
    ax.legend(loc="lower right")
    fig.tight_layout()
    _save(fig, path)


def _evaluate(bundle: Any, *, seed: int) -> list[float]:
    import gymnasium as gym

    from cloud.rollout._envs import episode_returns
    from device import NumpyExecutor

    executor = NumpyExecutor.from_bundle(bundle)
    env = gym.make(ENV_ID)
    try:
        return episode_returns(env, lambda obs: int(executor.act(obs[None])[0]), episodes=EVAL_EPISODES,
                               seed=10_000 + 1000 * seed)
    finally:
        env.close()


def _summary(config: DemoConfig, result: Any, exported: Any, bundle: Any, bundle_path: Path, micro: Any,
             micro_path: Path, returns: list[float], fleet: Any, started: float) -> dict[str, Any]:
    eval_mean = float(np.mean(returns))
    summary: dict[str, Any] = {
        "env_id": ENV_ID, "seed": config.seed, "budget_env_steps": config.total_steps,
        "env_steps": result.global_step, "policy_version": result.policy_version,
        "train_seconds": round(result.wall_s, 2),
        "env_steps_per_s": round(result.global_step / max(result.wall_s, 1e-9)),
        "train_mean_return_20": result.mean_return, "solved_at_step": result.solved_at_step,
        "greedy_return_during_training": result.greedy_return,
        "switches": [e.to_dict() for e in result.switches], "accounting": result.accounting,
        "bundle": str(bundle_path), "bundle_bytes": bundle_path.stat().st_size, "key_id": bundle.key_id,
        "policy": bundle.manifest.policy, "bundle_version": bundle.manifest.version,
        "max_abs_diff_torch_vs_onnxruntime": exported.max_abs_diff,
        "micro_bundle": str(micro_path), "micro_bundle_bytes": micro_path.stat().st_size,
        "micro_weights": micro.student_params, "teacher_weights": micro.teacher_params,
        "micro_return": micro.student_return, "micro_kept": micro.kept,
        "eval_executor": "device.NumpyExecutor", "eval_episodes": EVAL_EPISODES, "eval_mean_return": eval_mean,
        "eval_min_return": float(np.min(returns)), "eval_returns": returns,
        "solved": eval_mean >= SOLVED_RETURN,
    }
    if fleet is not None:
        summary["fleet"] = {"broker": fleet.broker, "seconds": round(fleet.seconds, 2),
                            "nodes": [{"node": v.node, "online": v.online, "version": v.version, "steps": v.steps}
                                      for v in fleet.views],
                            "devices": list(fleet.devices)}
    summary["total_seconds"] = round(time.perf_counter() - started, 2)
    return summary


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    with atomic_file(path) as f:
        fig.savefig(f, dpi=100, format="png")
    plt.close(fig)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _learning_curve(path: Path, points: list[tuple[int, float]], switches: list[dict[str, Any]]) -> None:
    """Every training episode's return, its 20-episode moving mean, and a marker at each switch."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if points:
        steps = np.array([p[0] for p in points])
        rets = np.array([p[1] for p in points])
        ax.scatter(steps, rets, s=4, alpha=0.35, label="episode return")
        window = np.convolve(rets, np.ones(20) / 20, mode="valid") if len(rets) >= 20 else rets
        ax.plot(steps[len(steps) - len(window):], window, linewidth=2, label="20-episode mean")
    for i, s in enumerate(switches):
        ax.axvline(s["at_step"], color="tab:red", linestyle=":", linewidth=1.5,
                   label="switch" if i == 0 else None)
        ax.annotate(f"-> {s['to_mode']}", (s["at_step"], 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, -12 - 11 * (i % 3)), textcoords="offset points", color="tab:red", fontsize=8)
    ax.axhline(SOLVED_RETURN, color="grey", linestyle="--", linewidth=1, label=f"solved ({SOLVED_RETURN:g})")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(f"strata PPO on {ENV_ID}, switching live between execution modes")
    ax.legend(loc="lower right")
    fig.tight_layout()
    _save(fig, path)


def _throughput_by_mode(path: Path, run_dir: Path) -> dict[str, float]:
    """Plot env steps/s of every update, coloured by the mode that fed it; return the median per mode."""
    from cloud.runs._metrics import read_metrics
    from cloud.switching._control import SWITCHES_FILE

    # Update records only (a confirmation evaluation logs an extra record at the same step).
    records = [r for r in read_metrics(run_dir) if "perf/env_steps_per_s" in r]
    marks = [json.loads(line) for line in (run_dir / SWITCHES_FILE).read_text().splitlines() if line.strip()]
    rates: dict[str, list[tuple[int, float]]] = {}
    for prev, cur in itertools.pairwise(records):
        if cur["time"] <= prev["time"]:
            continue
        mode = next((m["to_mode"] for m in reversed(marks) if m["at_step"] < cur["global_step"]), marks[0]["to_mode"])
        rate = (cur["global_step"] - prev["global_step"]) / (cur["time"] - prev["time"])
        rates.setdefault(mode, []).append((cur["global_step"], rate))
    plt = _pyplot()
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 1]})
    medians = {}
    for mode, points in rates.items():
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=6, label=mode)
        medians[mode] = float(np.median([p[1] for p in points]))
    ax.set_xlabel("env steps")
    ax.set_ylabel("learner env steps/s (acting + update)")
    ax.set_title("throughput per update, by mode")
    if medians:
        ax.legend()
    bars.bar(list(medians), list(medians.values()), color=["tab:blue", "tab:orange", "tab:green"][:len(medians)])
    bars.set_title("median per mode")
    fig.tight_layout()
    _save(fig, path)
    return medians


def _markdown(summary: dict[str, Any], switches: list[dict[str, Any]], fleet: Any) -> str:
    lines = [f"# strata demo: {summary['env_id']}", "",
             f"Trained for {summary['env_steps']:,} env steps ({summary['train_seconds']:.1f} s, policy version "
             f"{summary['policy_version']}); the exported policy, run by the numpy-only device executor, averaged "
             f"**{summary['eval_mean_return']:.1f}** over {summary['eval_episodes']} fresh episodes "
             f"({'solved' if summary['solved'] else 'not solved'}: the threshold is {SOLVED_RETURN:g}).", "",
             "![learning curve](learning_curve.png)", "", "## Live switches", ""]
    if switches:
        lines += ["| at env step | from | to | trigger | reason | pause |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {s['at_step']:,} | {s['from_mode']} | {s['to_mode']} | {s['trigger']} | {s['reason']} | "
                  f"{s['pause_s'] * 1000:.0f} ms |" for s in switches]
    else:
        lines.append("No switch happened (the run was solved before the phase schedule fired).")
    if any(s["to_mode"] == "functions" for s in switches):
        lines += ["", "In the functions phase every invocation simulates 128 steps of one env stream and returns the "
                  "stream's running episode with its fragment (the env's state and RNG, never pickled); the next "
                  "invocation for that stream, on any instance, continues it, so episodes there run past 128 "
                  "steps as they do co-located."]
    acc = summary.get("accounting") or {}
    lines += ["", f"Transitions produced {acc.get('produced', 0):,}, consumed {acc.get('consumed', 0):,}, duplicates "
              f"{acc.get('duplicates', 0)}, gaps {acc.get('gaps', 0)}.", "",
              "![throughput by mode](throughput_by_mode.png)", "",
              "| mode | median learner env steps/s |", "| --- | --- |"]
    lines += [f"| {m} | {r:,.0f} |" for m, r in summary.get("throughput_by_mode", {}).items()]
    lines += ["", "## Bundles", "",
              f"- edge bundle `{Path(summary['bundle']).name}`: {summary['policy']} v{summary['bundle_version']}, "
              f"{summary['bundle_bytes']:,} B, signed by key {summary['key_id']}",
              f"- device bundle `{Path(summary['micro_bundle']).name}`: {summary['micro_weights']:,} weights "
              f"(teacher {summary['teacher_weights']:,}), {summary['micro_bundle_bytes']:,} B, return "
              f"{summary['micro_return']:.1f} ({summary['micro_kept']:.0%} of the teacher's)"]
    if fleet is not None:
        lines += ["", "## Fleet", "", f"Broker: {fleet.broker}. Full table: [fleet.txt](fleet.txt), "
                  "state: [fleet.json](fleet.json).", "", "```", fleet.table, "```", "",
                  "| device | edge | decisions | by device | by edge | fallbacks | mean return |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for d in fleet.devices:
            tiers = d["by_tier"]
            ret = "-" if d["mean_return"] is None else f"{d['mean_return']:.1f}"
            lines.append(f"| {d['device']} | {d['edge']} | {d['steps']} | {tiers['device']} | {tiers['edge']} | "
                         f"{tiers['device-fallback']} | {ret} |")
    ft = summary.get("fleet_training")
    if ft:
        solved = (f"reached a 20-episode mean of {SOLVED_RETURN:g} at env step {ft['solved_at_step']:,}"
                  if ft["solved_at_step"] is not None else f"ended at a 20-episode mean of {ft['mean_return_20']:.1f}")
        st = ft["staleness"]
        lines += ["", "## The fleet trains the policy", "",
                  f"A fresh PPO run learned from the experience of {ft['nodes']} edge agents alone (`--modes edge`): "
                  f"it {solved} ({ft['env_steps']:,} env steps, {ft['seconds']:.1f} s). Every version it made went "
                  "to the agents as a signed bundle; they acted with it (sampling their actions) and sent their "
                  "steps back as records through the broker, kept in their outboxes until the learner's receipt.",
                  "", "![fleet training](fleet_training.png)", "",
                  "| figure | value |", "| --- | --- |",
                  f"| records learned from | {ft['records']:,} ({ft['transitions']:,} transitions) |",
                  f"| repeats dropped before learning / transitions learned twice | {ft['duplicates_dropped']} / "
                  f"{ft['duplicates_in_learner']} |",
                  f"| records refused as stale | {ft['refused_stale']:,} |",
                  f"| staleness of learned transitions (versions): mean / p90 / max | {st['mean']} / {st['p90']} / "
                  f"{st['max']} |"]
    lines += ["", f"Total demo time {summary['total_seconds']:.1f} s. Raw figures: [summary.json](summary.json).", ""]
    return "\n".join(lines)


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"strata demo: {summary['env_id']}", show_header=True)
    table.add_column("stage")
    table.add_column("figure")
    table.add_column("value", justify="right")
    solved_at = summary["solved_at_step"]
    acc = summary.get("accounting") or {}
    rows = [
        ("train", "env steps", f"{summary['env_steps']:,} of {summary['budget_env_steps']:,}"),
        ("train", "policy version (updates)", str(summary["policy_version"])),
        ("train", "seconds / env steps per s", f"{summary['train_seconds']:.1f} / {summary['env_steps_per_s']:,}"),
        ("train", "20-episode mean return", f"{summary['train_mean_return_20']:.1f}"),
        ("train", "solved at env step", "-" if solved_at is None else f"{solved_at:,}"),
        ("switch", "switches", " ; ".join(f"{s['from_mode']}->{s['to_mode']} @{s['at_step']:,}"
                                          for s in summary["switches"]) or "none"),
        ("switch", "produced / consumed / dup / gaps",
         f"{acc.get('produced', 0):,} / {acc.get('consumed', 0):,} / {acc.get('duplicates', 0)} / "
         f"{acc.get('gaps', 0)}"),
        ("export", "edge bundle", f"{summary['policy']} v{summary['bundle_version']}, {summary['bundle_bytes']:,} B"),
        ("export", "torch vs onnxruntime max |diff|",
         ", ".join(f"{k} {v:.1e}" for k, v in summary["max_abs_diff_torch_vs_onnxruntime"].items())),
        ("export", "micro policy (device)",
         f"{summary['micro_weights']:,} weights, return {summary['micro_return']:.1f}"),
        ("device", f"eval mean return ({summary['eval_episodes']} episodes)", f"{summary['eval_mean_return']:.1f}"),
        ("", "solved (eval mean >= 475)", "yes" if summary["solved"] else "no"),
    ]
    for d in summary.get("fleet", {}).get("devices", []):
        rows.append(("fleet", f"{d['device']} (via {d['edge']})",
                     f"{d['by_tier']['edge']} of {d['steps']} escalated"))
    ft = summary.get("fleet_training")
    if ft:
        rows += [("fleet trains", "solved at env step (edge mode)",
                  "-" if ft["solved_at_step"] is None else f"{ft['solved_at_step']:,}"),
                 ("fleet trains", "records / learned twice / stale refused",
                  f"{ft['records']:,} / {ft['duplicates_in_learner']} / {ft['refused_stale']:,}"),
                 ("fleet trains", "staleness mean / max (versions)",
                  f"{ft['staleness']['mean']} / {ft['staleness']['max']}")]
    for row in rows:
        table.add_row(*row)
    Console().print(table)
