"""Hybrid units: two learner replicas in one torch.distributed group keep one policy and one normaliser."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from cloud._agent import Agent, ObsNormalizer
from cloud._checkpoint import latest_checkpoint, load_checkpoint
from cloud._metrics import read_metrics
from cloud._ppo import PPOConfig
from cloud._switching import SwitchingConfig
from cloud.hybrid import HybridConfig, UnitSpec, train_hybrid
from cloud.hybrid._sync import state_digest
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
    spec = UnitSpec(env_id="CartPole-v1", total_steps=6 * 2 * TINY.batch_size, run_dir=run, seed=4, config=TINY,
                    switching=SwitchingConfig(modes=("colocated",), control=False),
                    hybrid=HybridConfig(units=2, workers_per_unit=1), checkpoint_every=2)
    result = train_hybrid(spec)
    assert result.units == 2 and result.policy_version == 6
    assert result.global_step == 6 * 2 * TINY.batch_size
    assert result.unit_steps == [6 * TINY.batch_size] * 2
    assert len(result.digests) == 2 and result.digests[0] == result.digests[1]
    assert result.digests[0] == _digest_of_checkpoint(latest_checkpoint(run))[:15]  # rank 0 saved what all hold
    assert result.normalizer_count == result.global_step  # every unit's observations, merged
    assert result.accounting["total"] == {"produced": result.global_step, "consumed": result.global_step,
                                          "duplicates": 0, "gaps": 0}
    assert result.published == 6
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == [f"{v:09d}.pt" for v in (2, 4, 6)]
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
    (("--modes", "hybrid", "--num-envs", "3", "--workers-per-unit", "2"), "--num-envs 3 (per unit) is not a "
                                                                         "multiple of --workers-per-unit 2"),
])
def test_cli_refuses_what_hybrid_units_cannot_do(flags: tuple[str, ...], message: str, tmp_path: Path) -> None:
    result = run_strata("train", "--env", "CartPole-v1", "--total-steps", "64", "--run-dir", str(tmp_path / "r"),
                        *flags, env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
