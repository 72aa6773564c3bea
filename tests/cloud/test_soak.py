"""The soak benchmark: its figures' arithmetic and bad input in the default run; a 10-minute soak under `-m slow`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cloud.runs._train import accounting_line
from tests.conftest import REPO

SOAK = REPO / "benchmarks" / "soak.py"

LEAK_BOUNDS_PER_H = {"rss_mb": 200.0, "fds": 60.0, "threads": 30.0}
"""Per role, the largest slope per hour after warm-up a 10-minute soak may show (beyond 3 standard errors): a
leak of 200 MB/h, 60 fds/h or 30 threads/h is what 10 minutes of samples every 5 s can tell from noise here."""


def soak_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak_benchmark", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def samples(points: list[tuple[int, float, float]]) -> list[dict[str, Any]]:
    return [{"segment": seg, "t": t, "roles": {"trainer": {"rss_mb": y}}} for seg, t, y in points]


def test_the_pooled_slope_ignores_the_drop_at_a_resume_and_finds_the_trend() -> None:
    soak = soak_module()
    # 36 MB/h inside each segment; the restart at t=1000 drops the level by 300 MB, which is not a trend.
    points = [(0, t, 500 + 0.01 * t) for t in range(0, 1000, 10)] + \
             [(1, t, 200 + 0.01 * t) for t in range(1000, 2000, 10)]
    fit = soak.pooled_slope(samples(points), ("roles", "trainer", "rss_mb"), warmup_s=100)
    assert fit["slope"] == pytest.approx(36.0) and fit["se"] == pytest.approx(0.0, abs=1e-6)
    assert fit["n"] == 180  # the first 100 s of each segment are warm-up
    flat = soak.pooled_slope(samples([(0, t, 500.0) for t in range(0, 1000, 10)]), ("roles", "trainer", "rss_mb"),
                             warmup_s=100)
    assert flat["slope"] == 0.0


def test_the_accounting_line_a_run_prints_is_the_one_the_soak_reads(tmp_path: Path) -> None:
    soak = soak_module()
    log = tmp_path / "trainer.log"
    line = accounting_line({"produced": 1_234_567, "consumed": 1_234_500, "duplicates": 3, "gaps": 2})
    log.write_text(f"train ...\nstrata train: {line} (the interrupted rollout is not consumed)\nstopped\n")
    assert soak.stream_accounting(log) == {"produced": 1_234_567, "consumed": 1_234_500, "duplicates": 3, "gaps": 2}
    assert soak.stream_accounting(tmp_path / "missing.log") is None


@pytest.mark.parametrize(("args", "message"), [
    (["--duration", "10"], "--duration 10 / --agents 2: need at least 60 s and 1 agent"),
    (["--out", "cloud"], "--out 'cloud' exists and is not a soak's folder; choose a new or empty one"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, str(SOAK), *args], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"soak: {message}"
    assert (REPO / "cloud" / "__init__.py").exists()  # the folder it refused is untouched


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_ten_minute_soak_under_faults_loses_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(SOAK), "--duration", "600", "--out", str(out)], capture_output=True,
                          text=True, timeout=1700, cwd=REPO, env=env)
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, (figures["checks"], proc.stdout[-3000:])
    assert all(figures["checks"].values())
    assert figures["transitions_lost"] == 0 and figures["transitions_duplicated"] == 0
    assert figures["faults_injected"] >= 25 and figures["faults_recovered"] == figures["faults_injected"]
    assert {f["kind"] for f in figures["faults"]} == {"pool-worker", "env-service", "function-worker", "edge-agent",
                                                      "broker"}
    assert figures["resumes"] >= 1 and figures["switches"] >= 15
    for name, fit in figures["slopes_per_h"].items():
        kind = name.rsplit(".", 1)[-1]
        if kind in LEAK_BOUNDS_PER_H and fit["n"]:
            assert fit["slope"] <= LEAK_BOUNDS_PER_H[kind] + 3 * fit["se"], (name, fit)
    assert figures["slopes_per_h"]["shm_segments"]["slope"] <= 3 * figures["slopes_per_h"]["shm_segments"]["se"]
    assert (out / "rss_mb.png").exists() and (out / "fds.png").exists()
