"""The device-on-secure-broker benchmark runs in --quick mode, one JSON line last."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_device_secure_broker_quick() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "device_secure_broker.py"), "--quick"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(figures["goals"].values()), figures["goals"]
    assert figures["secure"]["edge_dead"]["fallbacks"] > 0
