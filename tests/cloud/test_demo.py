"""`strata demo` end to end in a subprocess on a tiny budget, and Ctrl-C in the middle of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloud._demo import DemoConfig, run_demo
from tests._cli import STRATA, run_strata

PNG = b"\x89PNG\r\n\x1a\n"


def test_demo_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_strata("demo", "--out", str(out), "--seed", "1", "--total-steps", "4096", "--switch-at", "1024",
                        "--edge-nodes", "3", "--devices", "2", "--fleet-training-steps", "2048", timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 4096 and summary["eval_episodes"] == 20
    assert summary["eval_executor"] == "device.NumpyExecutor" and len(summary["eval_returns"]) == 20
    # The live switch to the functions happened, by the phase schedule, and lost nothing.
    assert summary["switches"][0]["to_mode"] == "functions" and summary["switches"][0]["trigger"] == "auto"
    acc = summary["accounting"]
    assert acc["produced"] == acc["consumed"] == 4096 and acc["duplicates"] == acc["gaps"] == 0
    assert set(summary["throughput_by_mode"]) >= {"colocated", "functions"}
    # The fleet: three edge agents on the exported version, two devices that used both tiers.
    nodes = summary["fleet"]["nodes"]
    assert [n["node"] for n in nodes] == ["edge-0", "edge-1", "edge-2"]
    assert all(n["online"] and n["version"] == summary["bundle_version"] for n in nodes)
    assert [d["device"] for d in summary["fleet"]["devices"]] == ["device-0", "device-1"]
    # The fleet trained a fresh policy from its experience alone, each record once.
    trained = summary["fleet_training"]
    assert trained["env_steps"] == trained["transitions"] == trained["records"] * 32 == 2048
    assert trained["duplicates_in_learner"] == trained["gaps"] == 0 and trained["staleness"]["max"] is not None
    for name in ("learning_curve.png", "throughput_by_mode.png", "fleet_training.png"):
        assert (out / name).read_bytes()[:8] == PNG
    report = (out / "summary.md").read_text()
    assert "![learning curve](learning_curve.png)" in report and "phase schedule" in report
    assert "## The fleet trains the policy" in report and "![fleet training](fleet_training.png)" in report
    assert "edge-2" in (out / "fleet.txt").read_text()
    assert (out / "policy.bundle").exists() and (out / "micro.bundle").exists()
    assert "eval mean return" in result.stdout and f"report in {out}/" in result.stdout
    # A second run (in-process, training only) replaces the demo's run dir instead of failing on its checkpoints.
    assert run_demo(DemoConfig(out=str(out), total_steps=256, fleet=False)) == 0
    assert json.loads((out / "summary.json").read_text())["env_steps"] == 256


def test_demo_refuses_a_bad_fleet_training_value_before_any_stage(tmp_path: Path) -> None:
    for flag, value in (("--fleet-training-steps", "0"), ("--fleet-training-nodes", "0"),
                        ("--fleet-training-nodes", "17")):
        result = run_strata("demo", "--out", str(tmp_path / "report"), flag, value, timeout=120)
        assert result.returncode == 2 and f"{flag} {value} must be" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "report").exists()


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = {int(x) for x in out.split()}
    for kid in list(kids):
        kids |= _children(kid)
    return kids


def _shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("strata")}


@pytest.mark.timeout(1200)  # the demo runs to its switch first: minutes on a loaded 2-core machine
def test_ctrl_c_stops_everything_cleanly(tmp_path: Path) -> None:
    before = _shm()
    proc = subprocess.Popen([STRATA, "demo", "--out", str(tmp_path / "report"), "--switch-at", "1024"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        # Wait until training runs in the functions phase: pool workers, the function runtime and its workers exist.
        for line in proc.stdout:
            if "colocated -> functions" in line:
                break
        descendants = _children(proc.pid)
        assert descendants, "the demo should have started worker processes"
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        proc.stdout.close()
        assert proc.wait(timeout=300) == 130, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "interrupted" in rest and "Traceback" not in rest
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in descendants) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in descendants if _alive(p)], "orphaned processes after Ctrl-C"
    # A segment is named after the process that made it; one whose maker still runs belongs to another program
    # on this machine (a benchmark, another suite), not to the demo, which has exited with all its processes.
    leaked = [name for name in _shm() - before if not _alive(_maker(name))]
    assert not leaked, f"shared-memory segments left after Ctrl-C: {leaked}"


def _maker(segment: str) -> int:
    """The pid in a ``strata_colo_{pid}_{token}`` name (0, never alive, for another shape of name)."""
    parts = segment.split("_")
    return int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent, the demo, has exited and init reaps it).
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


assert sys.platform.startswith("linux")
