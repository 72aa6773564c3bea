"""Quality gates inside the test command: ruff and mypy (strict) on the packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ["cloud", "edge", "device", "functions", "infra"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_is_clean() -> None:
    result = run("ruff", "check", "--no-cache", *PACKAGES, "tests", "benchmarks", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    result = run("mypy", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr
