"""Switch pauses of a live PPO run on CartPole-v1: warm standby vs starting the other mode cold.

One PPO run per variant, ``--modes colocated decoupled``: a driver thread switches the run back and
forth through its control endpoint (`strata switch` over loopback HTTP) every few updates, N times
each way. Per direction it reports the pause (p50, max: the time the learner waits between the old
source's last batch and the new source being ready) and env steps/s in the updates before and after
the switches.

    warm   every mode started at the beginning and kept warm (strata's default)
    cold   the other mode's workers / services started at each first use (the baseline)

A cold run starts each mode once (it is then kept), so only its first switch each way pays the start;
both variants report all switches, and ``cold_first_*`` the start-up pauses.

    .venv/bin/python benchmarks/switch.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def run_variant(*, warm: bool, switches: int, every_updates: int, work: Path) -> dict[str, Any]:
    from cloud.learners._ppo_config import PPOConfig
    from cloud.runs._metrics import read_metrics
    from cloud.runs._train import train
    from cloud.switching._control import ControlClient, ControlError
    from cloud.switching._modes import SwitchingConfig

    run_dir = work / ("warm" if warm else "cold")
    config = PPOConfig(num_envs=8, num_steps=32)
    errors: list[BaseException] = []

    def driver() -> None:
        try:
            while True:
                try:
                    client = ControlClient.for_run(run_dir)
                    break
                except ControlError:
                    time.sleep(0.05)
            for i in range(2 * switches):
                version = client.status().get("policy_version") or 0
                while (client.status().get("policy_version") or 0) < version + every_updates:
                    time.sleep(0.02)
                client.switch("decoupled" if i % 2 == 0 else "colocated")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=driver)
    thread.start()
    budget = config.batch_size * (every_updates + 2) * (2 * switches + 2) * 2
    result = train(env_id="CartPole-v1", total_steps=budget, run_dir=run_dir, seed=0, config=config,
                   switching=SwitchingConfig(modes=("colocated", "decoupled"), warm_standby=warm),
                   log=lambda _: None)
    thread.join(timeout=60)
    if errors:
        raise errors[0]
    records = read_metrics(run_dir)
    out: dict[str, Any] = {"switches": len(result.switches), "accounting": result.accounting}
    for direction in (("colocated", "decoupled"), ("decoupled", "colocated")):
        events = [e for e in result.switches if (e.from_mode, e.to_mode) == direction]
        pauses = [e.pause_s * 1000 for e in events]
        key = f"{direction[0]}_to_{direction[1]}"
        out[f"{key}_pause_p50_ms"] = statistics.median(pauses)
        out[f"{key}_pause_max_ms"] = max(pauses)
        out[f"{key}_first_pause_ms"] = pauses[0]
        out[f"{key}_steps_per_s_before"] = _rate(records, events, before=True)
        out[f"{key}_steps_per_s_after"] = _rate(records, events, before=False)
    return out


def _rate(records: list[dict[str, Any]], events: list[Any], *, before: bool) -> float:
    """Median env steps/s over the update intervals just before (or just after) each switch."""
    rates = []
    for event in events:
        idx = next(i for i, r in enumerate(records) if r["global_step"] >= event.at_step)
        window = records[max(idx - 3, 0): idx + 1] if before else records[idx + 1: idx + 5]
        if len(window) >= 2 and window[-1]["time"] > window[0]["time"]:
            steps = window[-1]["global_step"] - window[0]["global_step"]
            rates.append(steps / (window[-1]["time"] - window[0]["time"]))
    return statistics.median(rates) if rates else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 switches each way instead of 10 (< 1 minute)")
    args = parser.parse_args(argv)
    switches = 3 if args.quick else 10
    with tempfile.TemporaryDirectory() as tmp:
        warm = run_variant(warm=True, switches=switches, every_updates=3, work=Path(tmp))
        cold = run_variant(warm=False, switches=switches, every_updates=3, work=Path(tmp))
    print(f"{'variant':<6} {'direction':<24} {'p50 ms':>8} {'max ms':>8} {'first ms':>9} {'steps/s before':>15} "
          f"{'after':>8}")
    for name, fig in (("warm", warm), ("cold", cold)):
        for key in ("colocated_to_decoupled", "decoupled_to_colocated"):
            print(f"{name:<6} {key:<24} {fig[key + '_pause_p50_ms']:>8.1f} {fig[key + '_pause_max_ms']:>8.1f} "
                  f"{fig[key + '_first_pause_ms']:>9.1f} {fig[key + '_steps_per_s_before']:>15,.0f} "
                  f"{fig[key + '_steps_per_s_after']:>8,.0f}")
    figures = {
        "benchmark": "switch", "quick": args.quick, "switches_each_way": switches,
        "warm": warm, "cold": cold,
        "warm_c2d_p50_ms": warm["colocated_to_decoupled_pause_p50_ms"],
        "warm_c2d_max_ms": warm["colocated_to_decoupled_pause_max_ms"],
        "cold_c2d_first_ms": cold["colocated_to_decoupled_first_pause_ms"],
        "cold_first_over_warm_p50": cold["colocated_to_decoupled_first_pause_ms"]
        / max(warm["colocated_to_decoupled_pause_p50_ms"], 1e-9),
        "goal_warm_c2d_p50_le_500ms": warm["colocated_to_decoupled_pause_p50_ms"] <= 500.0,
        "lossless": all(v["accounting"]["duplicates"] == v["accounting"]["gaps"] == 0
                        and v["accounting"]["produced"] == v["accounting"]["consumed"] for v in (warm, cold)),
    }
    print(json.dumps(figures, sort_keys=True, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
