"""The fleet-scale benchmark runs end to end on a small swarm: fan-out, two broker restarts, no record lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_fleet_scale_small_swarm() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fleet_scale.py"), "--agents", "30",
                           "--processes", "2", "--telemetry-interval", "0.5"], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["agents"] == 30 and figures["fleet_cli_rows"] == 30 and figures["fleet_cli_rc"] == 0
    assert figures["restart_baseline"]["all_back"] and figures["restart_jittered"]["all_back"]
    assert figures["telemetry_records"] > 0 and figures["telemetry_lost"] == 0
