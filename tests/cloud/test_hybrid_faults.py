"""Hybrid units under faults: a unit SIGKILLed under torchrun, with and without restarts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint
from tests.cloud.test_hybrid import REPO, TINY_FLAGS, _pids_with, _status_when, _wait_for

STRATA = str(Path(sys.executable).with_name("strata"))


def _standalone(run: Path, marker: str, *, max_restarts: int, total_steps: int,
                checkpoint_every: int) -> subprocess.Popen[str]:
    """``torchrun --standalone --nproc-per-node 2 --max-restarts N strata train --modes hybrid ...``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", str(max_restarts), "--no-python", STRATA, "train", "--env", "CartPole-v1",
               "--run-dir", str(run), "--modes", "hybrid", "--workers-per-unit", "1", *TINY_FLAGS,
               "--total-steps", str(total_steps), "--checkpoint-every", str(checkpoint_every), "--seed", "5"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "STRATA_TEST_MARKER": marker, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _kill_unit_1_after(run: Path, version: int) -> int:
    """SIGKILL unit 1 once rank 0 reports `version`; return the version rank 0 had reached."""
    status = _wait_for(f"policy version {version}", _status_when(
        run, lambda s: len(s.get("units", [])) == 2 and s["policy_version"] >= version))
    os.kill(status["units"][1]["pid"], signal.SIGKILL)
    return int(status["policy_version"])


@pytest.mark.slow
def test_a_unit_killed_under_max_restarts_comes_back_resumed_and_the_run_finishes(tmp_path: Path) -> None:
    run, marker = tmp_path / "run", f"hybrid-restart-{os.getpid()}"
    total = 60 * 2 * 64  # 60 updates of 2 units x 2 envs x 32 steps
    proc = _standalone(run, marker, max_restarts=1, total_steps=total, checkpoint_every=5)
    try:
        reached = _kill_unit_1_after(run, 7)
        out = proc.communicate(timeout=600)[0]
    except BaseException:
        proc.kill()
        print(proc.communicate()[0])
        raise
    assert proc.returncode == 0, out
    assert "the unit group was restarted (restart 1): every unit resumes from" in out
    resumed = int(out.split("every unit resumes from", 1)[1].split("(policy version ", 1)[1].split(",")[0])
    assert resumed >= reached  # rank 0 checkpointed the last completed update when it lost unit 1
    final = load_checkpoint(latest_checkpoint(run))
    assert final["global_step"] == total and final["version"] == 60
    versions = [json.loads(line)["policy_version"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert versions == list(range(1, 61))  # nothing lost, nothing logged twice
    assert "policy digests of the units: identical" in out
    _wait_for("no process of the run left", lambda: not _pids_with(marker), timeout=60)


@pytest.mark.slow
def test_a_unit_killed_without_restarts_stops_the_run_with_a_checkpoint_and_no_orphans(tmp_path: Path) -> None:
    run, marker = tmp_path / "run", f"hybrid-stop-{os.getpid()}"
    proc = _standalone(run, marker, max_restarts=0, total_steps=10_000 * 128, checkpoint_every=100_000)
    try:
        reached = _kill_unit_1_after(run, 3)
        out = proc.communicate(timeout=300)[0]
    except BaseException:
        proc.kill()
        print(proc.communicate()[0])
        raise
    assert proc.returncode != 0, out
    assert "strata train: stopped by " in out and "resume with: strata train" in out and "--resume" in out
    assert load_checkpoint(latest_checkpoint(run))["version"] >= reached  # written by the stop, not periodically
    _wait_for("no process of the run left", lambda: not _pids_with(marker), timeout=60)


@pytest.mark.slow
def test_sigterm_to_both_torchrun_nodes_stops_every_unit_with_one_resume_command_and_no_traceback(
        tmp_path: Path) -> None:
    # What a service manager does when it stops the run on each node: SIGTERM to each node's torchrun agent.
    from tests.cloud.test_hybrid import _free_port, _torchrun

    run, port = tmp_path / "run", _free_port()
    marker = f"hybrid-term-{port}"
    nodes = [_torchrun(node, port, run, "--total-steps", str(10_000 * 64), "--seed", "3", marker=marker)
             for node in (0, 1)]
    try:
        reached = _wait_for("policy version 3", _status_when(
            run, lambda s: len(s.get("units", [])) == 2 and s["policy_version"] >= 3))["policy_version"]
        for node in nodes:
            node.send_signal(signal.SIGTERM)
        outputs = [node.communicate(timeout=120)[0] for node in nodes]
    except BaseException:
        for node in nodes:
            node.kill()
            print(node.communicate()[0])
        raise
    everything = "\n".join(outputs)
    assert all(node.returncode != 0 for node in nodes), everything
    # The units print no traceback; torchrun's own agent (torch's code, not strata's) reports the signal it got
    # with its SignalException traceback, once per node.
    assert everything.count("Traceback") == everything.count("multiprocessing.api.SignalException: Process"), everything
    assert not re.search(r'File "[^"]*/(cloud|functions|device|edge|infra)/[^"]*\.py"', everything), everything
    assert "Connection closed by peer" not in everything, everything
    assert everything.count("resume with: strata train") == 1, everything
    assert load_checkpoint(latest_checkpoint(run))["version"] >= reached
    _wait_for("no process of the run left", lambda: not _pids_with(marker), timeout=60)
