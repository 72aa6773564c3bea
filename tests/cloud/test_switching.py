"""Live switching of a real training job: co-located pool, gRPC env services, local functions.

Everything here is real: the shared-memory worker pool, `strata envs serve` subprocesses, the local
Lambda-compatible runtime invoked with boto3, the control endpoint over loopback HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloud.learners._ppo_config import PPOConfig
from cloud.runs._metrics import read_metrics
from cloud.runs._train import train
from cloud.switching._control import ControlClient, ControlError, SwitchRefused
from cloud.switching._modes import SwitchingConfig
from cloud.switching._switcher import SwitchRules
from tests._cli import run_strata


def client_for(run_dir: Path, timeout_s: float = 120.0) -> ControlClient:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ControlClient.for_run(run_dir)
        except ControlError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def wait_for(predicate: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_run_through_five_switches_loses_and_duplicates_no_transition(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done: list[Any] = []
    errors: list[BaseException] = []

    def driver() -> None:
        try:
            client = client_for(run_dir)
            wait_for(lambda: client.status().get("switches", 0) >= 1)  # the phase schedule fired
            assert client.status()["mode"] == "decoupled"
            with pytest.raises(SwitchRefused, match="already in mode 'decoupled'"):
                client.switch("decoupled")
            for to in ["functions", "colocated", "decoupled", "colocated"]:
                done.append(client.switch(to))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=driver)
    thread.start()
    config = PPOConfig(num_envs=8, num_steps=32)
    result = train(env_id="CartPole-v1", total_steps=256 * 24, run_dir=run_dir, seed=3, config=config,
                   switching=SwitchingConfig(modes=("colocated", "decoupled", "functions"), fragment_steps=128),
                   rules=SwitchRules(phase_steps=256 * 3, min_dwell_updates=1), log=lambda _: None)
    thread.join(timeout=60)
    assert not errors, errors
    trail = [(e.from_mode, e.to_mode, e.trigger) for e in result.switches]
    assert trail == [("colocated", "decoupled", "auto"), ("decoupled", "functions", "manual"),
                     ("functions", "colocated", "manual"), ("colocated", "decoupled", "manual"),
                     ("decoupled", "colocated", "manual")]
    assert result.switches[0].reason == "phase schedule: 768 env steps >= phase_steps=768"
    assert [d["to_mode"] for d in done] == ["functions", "colocated", "decoupled", "colocated"]
    accounting = result.accounting
    assert accounting is not None
    assert accounting["produced"] == accounting["consumed"] == result.global_step
    assert accounting["duplicates"] == 0 and accounting["gaps"] == 0
    # Every mode really fed the learner: its stream names are in the consumed ids.
    lines = [json.loads(x) for x in (run_dir / "switches.jsonl").read_text().splitlines()]
    assert [x["to_mode"] for x in lines] == ["colocated", "decoupled", "functions", "colocated", "decoupled",
                                             "colocated"]
    assert not (run_dir / "control.json").exists()  # withdrawn when the job ended


def test_cartpole_is_solved_in_a_run_that_switched_twice_without_collapse(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    errors: list[BaseException] = []

    def driver() -> None:
        try:
            client = client_for(run_dir)
            wait_for(lambda: client.status().get("switches", 0) >= 1, timeout_s=300)
            time.sleep(1.0)
            client.switch("colocated")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=driver)
    thread.start()
    result = train(env_id="CartPole-v1", total_steps=150_000, run_dir=run_dir, seed=0,
                   config=PPOConfig(env_mode="colocated"), target_return=475.0, confirm_episodes=20,
                   switching=SwitchingConfig(modes=("colocated", "decoupled")),
                   rules=SwitchRules(phase_steps=8_000), log=lambda _: None)
    thread.join(timeout=60)
    assert not errors, errors
    assert [e.to_mode for e in result.switches] == ["decoupled", "colocated"]
    assert result.solved_at_step is not None and result.greedy_return is not None and result.greedy_return >= 475
    assert result.accounting is not None and result.accounting["duplicates"] == result.accounting["gaps"] == 0
    # No collapse: the episodes finished in the 10 updates after each switch do as well as the 10 before.
    records = read_metrics(run_dir)
    for event in result.switches:
        before = [r["charts/episodic_return"] for r in records
                  if event.at_step - 2560 < r["global_step"] <= event.at_step and r.get("charts/episodic_return")]
        after = [r["charts/episodic_return"] for r in records
                 if event.at_step < r["global_step"] <= event.at_step + 2560 and r.get("charts/episodic_return")]
        assert after and np.mean(after) >= 0.5 * np.mean(before), (event, before, after)


def test_switch_status_and_runs_from_the_cli(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run_dir = root / "job"
    outputs: dict[str, Any] = {}

    def driver() -> None:
        client_for(run_dir)
        outputs["status"] = run_strata("status", str(run_dir))
        outputs["switch"] = run_strata("switch", str(run_dir), "--to", "decoupled")
        outputs["again"] = run_strata("switch", str(run_dir), "--to", "decoupled")
        outputs["runs"] = run_strata("runs", "--root", str(root))

    thread = threading.Thread(target=driver)
    thread.start()
    train_run = run_strata("train", "--env", "CartPole-v1", "--total-steps", "12000", "--run-dir", str(run_dir),
                           "--modes", "sync", "decoupled", "--num-envs", "4", "--confirm-episodes", "0",
                           timeout=300)
    thread.join(timeout=120)
    assert train_run.returncode == 0, train_run.stderr
    assert "switched sync -> decoupled" in train_run.stdout and "duplicates 0, gaps 0" in train_run.stdout
    assert outputs["status"].returncode == 0 and "mode  sync (modes: decoupled, sync)" in outputs["status"].stdout
    assert outputs["switch"].returncode == 0 and "sync -> decoupled at step" in outputs["switch"].stdout
    assert outputs["again"].returncode == 2
    assert "the run is already in mode 'decoupled'; nothing to do" in outputs["again"].stderr
    assert outputs["runs"].returncode == 0 and "running" in outputs["runs"].stdout
    after = run_strata("runs", "--root", str(root))
    assert "stopped" in after.stdout and "decoupled" in after.stdout
    missing = run_strata("status", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "': does not exist; pass an existing run folder" in missing.stderr


def test_fragment_mode_env_services_act_with_the_exported_policy(tmp_path: Path) -> None:
    # "fragments": env services act themselves with the learner's policy, exported as a signed bundle per version.
    result = train(env_id="CartPole-v1", total_steps=256 * 8, run_dir=tmp_path / "run", seed=5,
                   config=PPOConfig(num_envs=8, num_steps=32),
                   switching=SwitchingConfig(modes=("sync", "fragments"), control=False),
                   rules=SwitchRules(phase_steps=256 * 2, phase_to="fragments"), log=lambda _: None)
    assert [(e.from_mode, e.to_mode) for e in result.switches] == [("sync", "fragments")]
    accounting = result.accounting
    assert accounting is not None
    assert accounting["produced"] == accounting["consumed"] == 256 * 8
    assert accounting["duplicates"] == 0 and accounting["gaps"] == 0
    assert (tmp_path / "run" / "keys" / "strata-signing.pub").exists()  # the hosts verified bundles with it


def child_pids(needle: str) -> list[int]:
    """Processes this test process started whose command line contains `needle` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and needle in cmdline:
            found.append(int(entry.name))
    return found


def test_a_warm_mode_whose_services_died_while_idle_is_started_anew_by_the_next_switch(tmp_path: Path) -> None:
    # Found by benchmarks/soak.py: the switch used to fail and stop the whole run with SwitchError.
    run_dir = tmp_path / "run"
    done: list[Any] = []
    errors: list[BaseException] = []
    lines: list[str] = []

    def driver() -> None:
        try:
            client = client_for(run_dir)
            wait_for(lambda: (client.status().get("policy_version") or 0) >= 2)
            services = child_pids("envs serve")
            assert len(services) == 2, services
            for pid in services:
                os.kill(pid, signal.SIGKILL)
            done.append(client.switch("decoupled"))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=driver)
    thread.start()
    result = train(env_id="CartPole-v1", total_steps=128 * 60, run_dir=run_dir, seed=1,
                   config=PPOConfig(num_envs=4, num_steps=32, update_epochs=1),
                   switching=SwitchingConfig(modes=("sync", "decoupled")), log=lines.append)
    thread.join(timeout=60)
    assert not errors, errors
    assert [(e.from_mode, e.to_mode) for e in result.switches] == [("sync", "decoupled")]
    assert any("the warm decoupled source failed to start" in line for line in lines), lines
    assert result.global_step == 128 * 60
    accounting = result.accounting
    assert accounting is not None
    assert accounting["produced"] == accounting["consumed"] == result.global_step
    assert accounting["duplicates"] == 0 and accounting["gaps"] == 0
