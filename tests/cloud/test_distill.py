"""Micro-policy distillation: a 1x16 student keeps its teacher's return as a device-tier bundle, with its region."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from cloud.learners._distill import DistillConfig
from cloud.runs._export import distill
from device import Bundle, NumpyExecutor, TrustStore, Verifier, build_bundle, generate_keypair, load_public_key
from device import load_signing_key as load_key


def cartpole_teacher_model(units: int = 64, out_scale: float = 1 / 16) -> bytes:
    """A 4-`units`-2 tanh network that balances CartPole (a linear controller spread over the units)."""
    import torch

    from tests.device._models import export

    gains = torch.tensor([0.1, 0.5, 1.0, 0.5])
    scales = torch.linspace(0.5, 3.0, units)

    class Teacher(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.nn.Linear(4, units)
            self.out = torch.nn.Linear(units, 2)
            with torch.no_grad():
                self.hidden.weight.copy_(scales[:, None] * gains[None, :])
                self.hidden.bias.zero_()
                self.out.weight.copy_(torch.stack([-torch.ones(units), torch.ones(units)]) * out_scale)
                self.out.bias.zero_()

        def forward(self, obs: torch.Tensor) -> object:
            logits = self.out(torch.tanh(self.hidden(obs)))
            return torch.argmax(logits, dim=-1), logits

    return export(Teacher().eval(), (torch.zeros(1, 4),), ["action", "logits"])


def cartpole_teacher(key_dir: Path, version: int = 3) -> Bundle:
    key_path = key_dir / "strata-signing.key"
    if not key_path.exists():
        generate_keypair(key_dir)
    inf = "inf"
    return build_bundle(
        cartpole_teacher_model(), policy="CartPole-v1", version=version, parent_version=None,
        observation_space={"type": "Box", "shape": [4], "dtype": "float32", "low": [f"-{inf}"] * 4,
                           "high": [inf] * 4},
        action_space={"type": "Discrete", "n": 2}, signing_key=load_key(key_path), target_tier="edge",
        output_names=("action", "logits"))


def test_student_keeps_90_percent_of_the_teachers_return(tmp_path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    teacher = cartpole_teacher(tmp_path / "keys")
    config = DistillConfig(iterations=3, steps_per_iteration=1500, epochs=15, eval_episodes=5)
    result = distill(teacher, env_id="CartPole-v1", signing_key=load_key(tmp_path / "keys" / "strata-signing.key"),
                     config=config)
    assert result.teacher_return >= 475
    assert result.kept >= 0.9, result
    m = result.bundle.manifest
    assert (m.policy, m.version, m.target_tier) == ("CartPole-v1-micro", 3, "device")
    assert m.output_names == ("action", "logits")
    assert result.student_params < result.teacher_params / 3
    # Signed like every bundle; a device verifier accepts it.
    verifier = Verifier(trust=TrustStore([load_public_key(tmp_path / "keys" / "strata-signing.pub")]), tier="device")
    verifier.verify(result.bundle.to_bytes())
    # Observation normalisation lives inside the graph: raw observations in.
    executor = NumpyExecutor.from_bundle(result.bundle)
    out = executor.run({"obs": np.zeros((3, 4), np.float32)})
    assert out["action"].shape == (3,) and out["logits"].shape == (3, 2)


def test_int8_weights_and_relu(tmp_path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    teacher = cartpole_teacher(tmp_path / "keys")
    # 1x64: int8 storage is smaller than fp32 from about 32 hidden units; below it stays fp32/fp16 (issue 21)
    config = DistillConfig(iterations=1, steps_per_iteration=500, epochs=2, eval_episodes=1, weights="int8",
                           activation="relu", hidden_sizes=(64,))
    result = distill(teacher, env_id="CartPole-v1", signing_key=load_key(tmp_path / "keys" / "strata-signing.key"),
                     config=config, policy="tiny", version=9)
    assert b"DequantizeLinear" in result.bundle.model and result.bundle.manifest.producer["weights"] == "int8"
    assert result.bundle.manifest.policy == "tiny" and result.bundle.manifest.version == 9
    # The exporter's graph (Sub/Mul/Clip normalisation, Gemm, Relu, ArgMax) with int8 weights goes to C.
    if shutil.which("gcc") is not None:
        from tests.device.test_export_c import build, reference, run_harness

        obs = np.random.default_rng(1).normal(size=(32, 4)).astype(np.float32)
        got = run_harness(build(result.bundle.model, tmp_path / "c"), obs)
        np.testing.assert_allclose(got[:, 1:], reference(result.bundle.model, obs)["logits"], atol=1e-4, rtol=0)
        np.testing.assert_array_equal(got[:, 0].astype(np.int64), reference(result.bundle.model, obs)["action"])


def test_bad_config_is_refused() -> None:
    from device import ConfigError

    with pytest.raises(ConfigError, match=re.escape("DistillConfig: iterations must be >= 1, got 0")):
        DistillConfig(iterations=0)


@pytest.mark.slow
def test_distil_a_trained_ppo_run(tmp_path: Path) -> None:
    import torch

    from cloud.runs._train import train

    torch.set_num_threads(1)
    run = train(env_id="CartPole-v1", total_steps=200_000, run_dir=tmp_path / "run", seed=1, target_return=475,
                progress=False)
    generate_keypair(tmp_path / "keys")
    result = distill(run.run_dir, env_id="CartPole-v1", signing_key=load_key(tmp_path / "keys" / "strata-signing.key"),
                     config=DistillConfig(eval_episodes=10))
    assert result.kept >= 0.9, result


def test_strata_export_tier_device_smoke(tmp_path: Path) -> None:
    from tests._cli import run_strata

    run = tmp_path / "run"
    trained = run_strata("train", "--env", "CartPole-v1", "--total-steps", "64", "--run-dir", str(run),
                         "--num-envs", "2", "--num-steps", "16", "--update-epochs", "1", "--hidden-sizes", "16")
    assert trained.returncode == 0, trained.stderr
    out = tmp_path / "micro.bundle"
    exported = run_strata("export", "--run", str(run), "--out", str(out), "--tier", "device", "--weights", "fp16",
                          "--policy", "cp-micro", "--distill-steps", "200")
    assert exported.returncode == 0, exported.stderr
    assert "micro policy 'cp-micro' version 2, tier device" in exported.stdout
    assert "kept)" in exported.stdout and "iteration 4/4" in exported.stdout
    bundle = Bundle.from_bytes(out.read_bytes())
    assert bundle.manifest.producer["weights"] == "fp16" and bundle.manifest.target_tier == "device"


def test_a_box_micro_policy_records_the_region_it_was_trained_on(tmp_path: Path) -> None:
    """Pendulum-v1 (continuous action): the micro bundle's signed manifest carries a StateRegion of its states."""
    import torch

    from device import StateRegion
    from tests.device._models import export

    class Damper(torch.nn.Module):
        """torque = clip(-2 sin(theta) - thetadot, -2, 2): a fixed controller as the teacher."""

        def forward(self, obs: torch.Tensor) -> object:
            return torch.clamp(-2.0 * obs[:, 1:2] - obs[:, 2:3], -2.0, 2.0)

    torch.set_num_threads(1)
    generate_keypair(tmp_path / "keys")
    key = load_key(tmp_path / "keys" / "strata-signing.key")
    teacher = build_bundle(export(Damper().eval(), (torch.zeros(1, 3),), ["action"]), policy="Pendulum-v1",
                           version=1, parent_version=None,
                           observation_space={"type": "Box", "shape": [3], "dtype": "float32",
                                              "low": [-1.0, -1.0, -8.0], "high": [1.0, 1.0, 8.0]},
                           action_space={"type": "Box", "shape": [1], "dtype": "float32", "low": [-2.0],
                                         "high": [2.0]},
                           signing_key=key, target_tier="edge", output_names=("action",))
    config = DistillConfig(iterations=2, steps_per_iteration=400, epochs=2, eval_episodes=1)
    result = distill(teacher, env_id="Pendulum-v1", signing_key=key, config=config)
    region = StateRegion.from_manifest(result.bundle.manifest.preprocessing, dim=3)
    assert region is not None and region.samples == result.samples == 800
    assert np.all(np.abs(region.mean[:2]) <= 1.0)
    assert region.confidence(region.mean) == 1.0
    assert region.confidence(np.array([1.0, 0.0, 40.0])) < 0.5  # spinning far faster than any training state
    out = NumpyExecutor.from_bundle(result.bundle).act(np.zeros((2, 3), np.float32))
    assert out.shape == (2, 1) and np.all(np.abs(out) <= 2.0)
