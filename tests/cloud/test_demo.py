"""`strata demo` end to end in a subprocess, on a tiny training budget."""

from __future__ import annotations

import json
from pathlib import Path

from cloud._demo import DemoConfig, run_demo
from tests._cli import run_strata


def test_demo_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_strata("demo", "--out", str(out), "--seed", "1", "--total-steps", "512")
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 512 and summary["eval_episodes"] == 20
    assert summary["eval_executor"] == "device.NumpyExecutor"
    assert len(summary["eval_returns"]) == 20
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "policy.bundle").exists() and (out / "keys" / "strata-signing.pub").exists()
    assert "eval mean return" in result.stdout and f"report in {out}/" in result.stdout
    # A second run (in-process this time) replaces the demo's run dir instead of failing on its checkpoints.
    assert run_demo(DemoConfig(out=str(out), total_steps=256)) == 0
    assert json.loads((out / "summary.json").read_text())["env_steps"] == 256
