"""Run dirs written by strata before `cloud/` was regrouped (main at 5668e92) still resume and export.

tests/data/legacy_runs/ holds a PPO CartPole-v1 run (2 updates, hidden 16x16) and a SAC Pendulum-v1 run (300 steps,
hidden 16x16), each made with that revision's `strata train`. Checkpoints hold only tensors and plain values, so the
moves of modules cannot break them; these tests hold the promise.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cloud import SACConfig, export_run, train, train_sac
from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint
from device import TrustStore, Verifier, generate_keypair, load_public_key, load_signing_key

LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy_runs"


def _copy(name: str, tmp_path: Path) -> Path:
    run = tmp_path / name
    shutil.copytree(LEGACY / name, run)
    return run


def _verified(run: Path, keys: Path) -> None:
    result = export_run(run, signing_key=load_signing_key(keys / "strata-signing.key"))
    Verifier(trust=TrustStore([load_public_key(keys / "strata-signing.pub")]), tier="edge").verify(result.bundle)
    assert result.bundle.manifest.version == int(load_checkpoint(result.checkpoint)["version"])


def test_a_legacy_ppo_run_exports_and_resumes(tmp_path: Path) -> None:
    run, keys = _copy("ppo-cartpole", tmp_path), tmp_path / "keys"
    generate_keypair(keys)
    _verified(run, keys)
    result = train(env_id="CartPole-v1", total_steps=512, run_dir=run, seed=3, resume=True, progress=False,
                   log=lambda _: None)
    assert (result.policy_version, result.global_step) == (4, 512)  # continued from version 2, step 256
    _verified(run, keys)


def test_a_legacy_sac_run_exports_and_resumes(tmp_path: Path) -> None:
    run, keys = _copy("sac-pendulum", tmp_path), tmp_path / "keys"
    generate_keypair(keys)
    _verified(run, keys)
    state = load_checkpoint(latest_checkpoint(run))  # type: ignore[arg-type]
    config = SACConfig.from_dict(state["config"])
    result = train_sac(config, env_id="Pendulum-v1", run_dir=run, seed=3, total_steps=400, resume=True,
                       log=lambda _: None)
    assert result.global_step == 400
    assert int(load_checkpoint(latest_checkpoint(run))["version"]) == 400  # type: ignore[arg-type]
    _verified(run, keys)
