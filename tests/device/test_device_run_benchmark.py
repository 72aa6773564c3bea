"""The tiered-decisions benchmark (CartPole-v1 and Pendulum-v1) runs end to end in --quick mode, one JSON line last."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_tiered_decisions_quick() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tiered_decisions.py"), "--quick"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["modes"]["edge-only"]["escalated"] == 1.0
    assert figures["modes"]["micro16/device-only"]["escalated"] == 0.0
    assert figures["distill"]["micro16"]["kept"] >= 0.9
    pendulum = figures["pendulum"]
    assert pendulum["teacher"] == "sac-2500-steps"
    assert pendulum["modes"]["edge-only"]["escalated"] == 1.0
    assert pendulum["modes"]["micro16/device-only"]["escalated"] == 0.0
    assert set(pendulum["region_calibration"]["micro16"]) == {"0.5", "0.8"}
