"""Hybrid units: two learner replicas in one torch.distributed group keep one policy and one normaliser."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cloud.hybrid import HybridConfig, UnitSpec, train_hybrid
from cloud.hybrid._sync import state_digest
from cloud.learners._agent import Agent, ObsNormalizer
from cloud.learners._ppo_config import PPOConfig
from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint
from cloud.runs._metrics import read_metrics
from cloud.switching._control import ControlClient, ControlError
from cloud.switching._modes import SwitchingConfig
from tests._cli import run_strata

REPO = Path(__file__).resolve().parents[2]
TINY = PPOConfig(num_envs=2, num_steps=32, update_epochs=2, hidden_sizes=(16,))
TINY_FLAGS = ("--num-envs", "2", "--num-steps", "32", "--update-epochs", "2", "--hidden-sizes", "16")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _digest_of_checkpoint(path: Path) -> str:
    state = load_checkpoint(path)
    config = PPOConfig.from_dict(state["config"])
    agent = Agent(obs_dim=4, action_dim=2, discrete=True, hidden_sizes=config.hidden_sizes)
    agent.load_state_dict(state["agent"])
    normalizer = ObsNormalizer((4,), clip=config.obs_clip)
    normalizer.load_state_dict(state["normalizer"])
    return state_digest(agent, normalizer)


# --- the collectives, on their own -----------------------------------------------------------------------------

def _sync_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    from cloud.hybrid._sync import UnitGroup

    group = UnitGroup(timeout_s=60)
    torch.manual_seed(rank)  # different initial weights on purpose: the broadcast must make them equal
    net = torch.nn.Linear(3, 2)
    group.broadcast_module(net)
    x = torch.full((1, 3), float(rank + 1))
    net(x).sum().backward()  # gradients differ per rank: d/dW = x
    group.average_gradients(net.parameters())
    rng = np.random.default_rng(rank)
    obs = rng.normal(loc=rank * 3.0, size=(50 + 10 * rank, 4))
    table = group.all_gather(np.concatenate([[len(obs)], obs.mean(0), obs.var(0)]))
    normalizer = ObsNormalizer((4,), clip=10.0)
    for row in table:
        normalizer.update_moments(row[1:5], row[5:9], row[0])
    decision = group.broadcast(np.array([7 if rank == 0 else -1, rank], dtype=np.int64))
    result = {"weight": net.weight.detach().tolist(), "grad": net.weight.grad.tolist(),
              "mean": normalizer.mean.tolist(), "var": normalizer.var.tolist(), "count": normalizer.count,
              "decision": decision.tolist()}
    group.close()
    Path(out, f"{rank}.json").write_text(json.dumps(result))


def test_unit_group_averages_gradients_merges_moments_and_broadcasts(tmp_path: Path) -> None:
    torch.multiprocessing.start_processes(_sync_worker, args=(_free_port(), str(tmp_path)), nprocs=2,
                                          start_method="spawn")
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    assert r0["weight"] == r1["weight"]  # rank 0's weights everywhere
    assert np.allclose(r0["grad"], [[1.5] * 3] * 2) and r0["grad"] == r1["grad"]  # mean of x=1 and x=2
    both = np.concatenate([np.random.default_rng(r).normal(loc=r * 3.0, size=(50 + 10 * r, 4)) for r in (0, 1)])
    reference = ObsNormalizer((4,), clip=10.0)
    reference.update(both)  # the normaliser of one learner that saw every unit's observations
    for r in (r0, r1):
        assert np.allclose(r["mean"], reference.mean) and np.allclose(r["var"], reference.var)
        assert r["count"] == reference.count == 110
        assert r["decision"] == [7, 0]  # rank 0's decision
    assert (r0["mean"], r0["var"]) == (r1["mean"], r1["var"])  # bit-identical: merged in the same order


# --- training -----------------------------------------------------------------------------------------------------

def test_two_units_train_one_policy_with_one_normaliser(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = dataclasses.replace(TINY, normalize_reward=True)
    spec = UnitSpec(env_id="CartPole-v1", total_steps=6 * 2 * TINY.batch_size, run_dir=run, seed=4, config=config,
                    switching=SwitchingConfig(modes=("colocated",), control=False),
                    hybrid=HybridConfig(units=2, workers_per_unit=1), checkpoint_every=2)
    result = train_hybrid(spec)
    assert result.units == 2 and result.policy_version == 6
    assert result.global_step == 6 * 2 * TINY.batch_size
    assert result.unit_steps == [6 * TINY.batch_size] * 2
    assert len(result.digests) == 2 and result.digests[0] == result.digests[1]
    assert result.digests[0] == _digest_of_checkpoint(latest_checkpoint(run))[:15]  # rank 0 saved what all hold
    assert result.normalizer_count == result.global_step  # every unit's observations, merged
    rewards = load_checkpoint(latest_checkpoint(run))["reward_scaler"]["stats"]
    assert rewards["count"] == result.global_step  # and every unit's discounted returns: one reward scale
    assert result.accounting["total"] == {"produced": result.global_step, "consumed": result.global_step,
                                          "duplicates": 0, "gaps": 0}
    assert result.published == 6
    kept = {p.name for p in (run / "checkpoints").glob("*.pt")}
    assert {f"{v:09d}.pt" for v in (2, 4, 6)} <= kept and latest_checkpoint(run).name == "000000006.pt"
    records = read_metrics(run)
    assert [r["policy_version"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[-1]["global_step"] == result.global_step and records[-1]["perf/allreduce_s"] > 0


def test_cli_trains_hybrid_units_and_exports_their_policy(tmp_path: Path) -> None:
    run = tmp_path / "run"
    trained = run_strata("train", "--env", "CartPole-v1", "--total-steps", "512", "--run-dir", str(run), "--seed",
                         "1", "--modes", "hybrid", "--units", "2", "--workers-per-unit", "1", *TINY_FLAGS,
                         env={"PYTHONPATH": str(REPO)}, timeout=240)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "2 hybrid units, policy version 4, 512 env steps (256, 256 per unit)" in trained.stdout
    assert "policy digests of the units: identical" in trained.stdout
    exported = run_strata("export", "--run", str(run), "--out", str(tmp_path / "p.bundle"),
                          env={"PYTHONPATH": str(REPO)})
    assert exported.returncode == 0, exported.stderr
    assert "version 4" in exported.stdout


@pytest.mark.parametrize(("flags", "message"), [
    (("--units", "2"), "strata train: error: train: --units only apply to hybrid units; add --modes hybrid"),
    (("--modes", "colocated", "hybrid"), "strata train: error: train: --modes colocated hybrid: hybrid must come "
                                          "first"),
    (("--modes", "hybrid", "functions"), "strata train: error: train --modes hybrid: units cannot use modes "
                                         "['functions']"),
    (("--modes", "hybrid", "--phase-steps", "10"), "automatic switching rules (phase_steps) are not supported"),
    (("--modes", "hybrid", "--num-envs", "1", "--workers-per-unit", "2"), "--workers-per-unit 2 is more than "
                                                                         "--num-envs 1 (per unit)"),
])
def test_cli_refuses_what_hybrid_units_cannot_do(flags: tuple[str, ...], message: str, tmp_path: Path) -> None:
    result = run_strata("train", "--env", "CartPole-v1", "--total-steps", "64", "--run-dir", str(tmp_path / "r"),
                        *flags, env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


# --- across hosts: two torchrun invocations, as two nodes would run them ----------------------------------------

def _torchrun(node: int, port: int, run: Path, *train_flags: str, max_restarts: int = 0,
              marker: str = "") -> subprocess.Popen[str]:
    """``torchrun --nnodes 2 --nproc-per-node 1`` (c10d rendezvous on 127.0.0.1) running `strata train`."""
    strata = str(Path(sys.executable).with_name("strata"))
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"strata-{port}",
               "--rdzv-conf", f"is_host={int(node == 0)}", "--max-restarts", str(max_restarts),
               "--no-python", strata, "train", "--env", "CartPole-v1", "--run-dir", str(run), "--modes", "hybrid",
               "--workers-per-unit", "1", *TINY_FLAGS, *train_flags]
    env = {**os.environ, "PYTHONPATH": str(REPO), "STRATA_TEST_MARKER": marker or f"hybrid-{port}"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_two_torchrun_nodes_train_one_policy(tmp_path: Path) -> None:
    run, port = tmp_path / "run", _free_port()
    nodes = [_torchrun(node, port, run, "--total-steps", "512", "--seed", "2") for node in (0, 1)]
    outputs = [node.communicate(timeout=280)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(outputs)
    summary = next(out for out in outputs if "hybrid units, policy version" in out)
    assert "2 hybrid units, policy version 4, 512 env steps (256, 256 per unit)" in summary
    assert "policy digests of the units: identical" in summary
    assert "unit 0 on node 0 (local rank 0)" in summary and "unit 1 on node 1 (local rank 0)" in summary
    assert load_checkpoint(latest_checkpoint(run))["global_step"] == 512


# --- rank 0 talks to the rest of strata ---------------------------------------------------------------------------

def _wait_for(what: str, check: Callable[[], Any], *, timeout: float = 240.0) -> Any:
    """Poll `check()` until it returns something truthy; the timeout only fails a hung test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except ControlError:  # the job has not advertised its endpoint yet
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _status_when(run: Path, ready: Callable[[dict[str, Any]], bool]) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        status = ControlClient.for_run(run).status()
        return status if ready(status) else None
    return check


def _pids_with(marker: str) -> list[int]:
    """Processes whose environment carries `marker` (every descendant of a test's launcher inherits it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"STRATA_TEST_MARKER={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_rank0_serves_status_versions_and_a_switch_every_unit_follows(tmp_path: Path) -> None:
    from functions._paramclient import ParameterClient

    run, marker = tmp_path / "run", f"hybrid-live-{os.getpid()}"
    strata = str(Path(sys.executable).with_name("strata"))
    proc = subprocess.Popen([strata, "train", "--env", "CartPole-v1", "--total-steps", "100000000", "--run-dir",
                             str(run), "--modes", "hybrid", "colocated", "sync", "--units", "2", "--workers-per-unit",
                             "1", *TINY_FLAGS, "--checkpoint-every", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "STRATA_TEST_MARKER": marker})
    try:
        status = _wait_for("both units in the status", _status_when(run, lambda s: len(s.get("units", [])) == 2))
        units = status["units"]
        assert [u["rank"] for u in units] == [0, 1] and len({u["pid"] for u in units}) == 2
        assert [u["workers"] for u in units] == [1, 1] and {u["mode"] for u in units} == {"colocated"}
        assert status["workers"] == 2
        shown = run_strata("status", str(run), env={"PYTHONPATH": str(REPO)})
        assert shown.returncode == 0 and "unit 1" in shown.stdout and "1 workers, colocated" in shown.stdout

        info = json.loads((run / "paramserver.json").read_text())
        client = ParameterClient(info["address"], policy=info["policy"])
        try:
            version, _sha = client.latest()
        finally:
            client.close()
        assert version >= status["policy_version"] >= 1  # rank 0 pushes every version

        switched = ControlClient.for_run(run).switch("sync", timeout=240)
        assert (switched["from_mode"], switched["to_mode"], switched["trigger"]) == ("colocated", "sync", "manual")
        _wait_for("every unit in mode sync", _status_when(run, lambda s: {u["mode"] for u in s["units"]} == {"sync"}
                                                          and s["policy_version"] > switched["at_version"]))
    finally:
        proc.terminate()  # SIGTERM: every unit stops at its next boundary, rank 0 checkpoints
        out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out
    assert "stopped by SIGTERM" in out
    final = load_checkpoint(latest_checkpoint(run))
    assert final["version"] > switched["at_version"]
    events = [json.loads(line) for line in (run / "switches.jsonl").read_text().splitlines()]
    assert [(e["to_mode"], e["trigger"]) for e in events] == [("colocated", "start"), ("sync", "manual")]
    assert not (run / "control.json").exists() and not (run / "paramserver.json").exists()
    _wait_for("no process of the run left", lambda: not _pids_with(marker), timeout=60)
