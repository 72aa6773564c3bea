"""`strata demo`: runs what strata has, end to end, on embedded defaults, and writes a report folder.

Stages (v1): train PPO on CartPole-v1 until the 20-episode mean return reaches 475 and the
deterministic policy confirms it on 20 fresh episodes, or the step budget runs out -> export the
newest policy as a signed bundle for the device tier -> verify it as a consumer would (trust store,
signature, digest, tier, version) -> run 20 evaluation episodes with the numpy-only
`device.NumpyExecutor` -> print a summary table, and write ``summary.json``, ``learning_curve.png``,
``policy.bundle``, the key pair and the run dir into the report folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device import require

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


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run_demo(config: DemoConfig) -> int:
    """Run the demo; return an exit status."""
    gym = require("gymnasium", extra="cloud", purpose="the demo's simulators")
    require("torch", extra="cloud", purpose="the demo's learner")
    from cloud._export import export_run, write_bundle
    from cloud._train import train
    from device import NumpyExecutor, TrustStore, Verifier, generate_keypair, load_public_key, load_signing_key

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    # 1. Train. The demo owns out/run: a previous demo's run is replaced, not resumed.
    run_dir = out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    print(f"strata demo: training PPO on {ENV_ID} (budget {config.total_steps:,} env steps; stop once the last 20 "
          f"episodes and the deterministic policy both average {SOLVED_RETURN:g})")
    result = train(env_id=ENV_ID, total_steps=config.total_steps, run_dir=run_dir, seed=config.seed,
                   target_return=SOLVED_RETURN, confirm_episodes=EVAL_EPISODES)

    # 2. Export and sign for the device tier, 3. verify as a device would.
    key_dir = out / "keys"
    private, public = key_dir / "strata-signing.key", key_dir / "strata-signing.pub"
    if not private.exists():
        private, public = generate_keypair(key_dir)
    exported = export_run(run_dir, signing_key=load_signing_key(private), policy="cartpole", target_tier="device")
    bundle_path = out / "policy.bundle"
    write_bundle(bundle_path, exported.bundle)
    verifier = Verifier(trust=TrustStore([load_public_key(public)]), tier="device")
    bundle = verifier.verify(bundle_path.read_bytes())
    verifier.accept(bundle)

    # 4. Evaluate with the numpy-only executor, on episodes the learner never saw.
    executor = NumpyExecutor.from_bundle(bundle)
    env = gym.make(ENV_ID)
    returns: list[float] = []
    for episode in range(EVAL_EPISODES):
        obs, _ = env.reset(seed=10_000 + 1000 * config.seed + episode)
        total, done = 0.0, False
        while not done:
            action = executor.act(np.asarray(obs, dtype=np.float32)[None])
            obs, reward, terminated, truncated, _ = env.step(int(action[0]))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    eval_mean = float(np.mean(returns))

    summary: dict[str, Any] = {
        "env_id": ENV_ID, "seed": config.seed, "budget_env_steps": config.total_steps,
        "env_steps": result.global_step, "policy_version": result.policy_version,
        "train_seconds": round(result.wall_s, 2),
        "env_steps_per_s": round(result.global_step / max(result.wall_s, 1e-9)),
        "train_mean_return_20": result.mean_return, "solved_at_step": result.solved_at_step,
        "greedy_return_during_training": result.greedy_return,
        "bundle": str(bundle_path), "bundle_bytes": bundle_path.stat().st_size, "key_id": bundle.key_id,
        "policy": bundle.manifest.policy, "bundle_version": bundle.manifest.version,
        "max_abs_diff_torch_vs_onnxruntime": exported.max_abs_diff,
        "eval_executor": "device.NumpyExecutor", "eval_episodes": EVAL_EPISODES, "eval_mean_return": eval_mean,
        "eval_min_return": float(np.min(returns)), "eval_returns": returns,
        "solved": eval_mean >= SOLVED_RETURN, "total_seconds": round(time.perf_counter() - started, 2),
    }
    _learning_curve(out / "learning_curve.png", [(e.global_step, e.episodic_return) for e in result.episodes])
    _write_atomic(out / "summary.json", json.dumps(summary, indent=2).encode())
    _print_table(summary)
    print(f"strata demo: report in {out}/ (summary.json, learning_curve.png, policy.bundle, keys/, run/)")
    return 0


def _learning_curve(path: Path, points: list[tuple[int, float]]) -> None:
    """Plot every training episode's return and its 20-episode moving mean against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if points:
        steps = np.array([p[0] for p in points])
        rets = np.array([p[1] for p in points])
        ax.scatter(steps, rets, s=4, alpha=0.35, label="episode return")
        window = np.convolve(rets, np.ones(20) / 20, mode="valid") if len(rets) >= 20 else rets
        ax.plot(steps[len(steps) - len(window):], window, linewidth=2, label="20-episode mean")
    ax.axhline(SOLVED_RETURN, color="grey", linestyle="--", linewidth=1, label=f"solved ({SOLVED_RETURN:g})")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(f"strata PPO on {ENV_ID}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"strata demo: {summary['env_id']}", show_header=True)
    table.add_column("stage")
    table.add_column("figure")
    table.add_column("value", justify="right")
    solved_at = summary["solved_at_step"]
    rows = [
        ("train", "env steps", f"{summary['env_steps']:,} of {summary['budget_env_steps']:,}"),
        ("train", "policy version (updates)", str(summary["policy_version"])),
        ("train", "seconds / env steps per s", f"{summary['train_seconds']:.1f} / {summary['env_steps_per_s']:,}"),
        ("train", "20-episode mean return", f"{summary['train_mean_return_20']:.1f}"),
        ("train", "solved at env step", "-" if solved_at is None else f"{solved_at:,}"),
        ("export", "bundle", f"{summary['policy']} v{summary['bundle_version']}, {summary['bundle_bytes']:,} B"),
        ("export", "torch vs onnxruntime max |diff|",
         ", ".join(f"{k} {v:.1e}" for k, v in summary["max_abs_diff_torch_vs_onnxruntime"].items())),
        ("verify", "signed by key / tier", f"{summary['key_id']} / device"),
        ("device", f"eval mean return ({summary['eval_episodes']} episodes)", f"{summary['eval_mean_return']:.1f}"),
        ("device", "eval min return", f"{summary['eval_min_return']:.1f}"),
        ("", "solved (eval mean >= 475)", "yes" if summary["solved"] else "no"),
    ]
    for row in rows:
        table.add_row(*row)
    Console().print(table)
