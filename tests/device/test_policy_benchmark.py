"""The policy-inference benchmark runs end to end and ends with its JSON line (slow: ~15 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_benchmark_prints_figures() -> None:
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "policy_inference.py"), "--quick"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["goals"]["fp32_bundle_under_32KB"]
    assert figures["numpy_vs_ort_max_abs_logit_diff"] < 1e-5
