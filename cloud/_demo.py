"""`strata demo`: runs what strata has, end to end, on embedded defaults, and writes a report folder."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device import require


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """Settings of `strata demo`."""

    out: str = "demo-report"
    """Report folder to write."""
    seed: int = 0
    """Random seed for every stage."""


def run_demo(config: DemoConfig) -> int:
    """Run the demo; return an exit status."""
    gym = require("gymnasium", extra="cloud", purpose="the demo's simulators")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(config.seed)
    returns = []
    for episode in range(5):
        env.reset(seed=config.seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(2)))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    summary = {"stage": "random-policy baseline", "episodes": len(returns), "mean_return": float(np.mean(returns)),
               "seconds": round(time.perf_counter() - started, 3)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"strata demo: {summary['stage']}: mean return {summary['mean_return']:.1f} over "
          f"{summary['episodes']} CartPole-v1 episodes; report in {out}/")
    return 0
