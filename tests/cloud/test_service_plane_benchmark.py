"""The service-plane TLS benchmark runs in --quick mode across namespaces, one JSON line last."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests._netns import unavailable
from tests.conftest import REPO

SKIP = unavailable()


@pytest.mark.slow
@pytest.mark.skipif(SKIP is not None, reason=f"network namespaces unavailable: {SKIP}")
def test_service_plane_tls_quick() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.service_plane_tls", "--quick"], capture_output=True,
                          text=True, timeout=600, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    usual = figures["usual"]
    assert usual["plaintext_fragments_per_s"] > 0 and usual["mtls_fragments_per_s"] > 0
    assert usual["plaintext_cpu_us_per_env_step"] > 0 and usual["mtls_cpu_us_per_env_step"] > 0
    assert "goal_mtls_cost_le_10pct" in figures
