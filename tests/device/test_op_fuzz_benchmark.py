"""The op-fuzz benchmark runs in --quick mode: every claimed operator, no failures, one JSON line last."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_device_op_fuzz_quick() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.device_op_fuzz", "--quick"], capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["generated"]["operators"] >= 70
    assert figures["generated"]["failures"] == 0
    assert figures["generated"]["match"] >= 0.9 * figures["generated"]["cases"]
