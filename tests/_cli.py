"""Run the real `strata` console script in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

STRATA = str(Path(sys.executable).with_name("strata"))


def run_strata(*args: str, timeout: float = 600, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``strata ARGS`` and return the finished process (never raises on a non-zero exit)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([STRATA, *args], capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=cwd)
