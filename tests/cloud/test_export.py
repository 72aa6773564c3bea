"""The exporter: ONNX graph contract, torch vs onnxruntime vs the numpy executor, signed bundles."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from cloud.learners._agent import Agent, ObsNormalizer
from cloud.learners._onnx import ExportError, build_policy_graph, export_onnx, verify_onnx
from cloud.learners._ppo_config import PPOConfig
from cloud.runs._checkpoint import load_latest_checkpoint
from cloud.runs._export import export_run, write_bundle
from cloud.runs._train import train
from device import Bundle, ConfigError, NumpyExecutor, SigningKey, TrustStore, Verifier, space_bounds

torch.set_num_threads(1)
TINY = PPOConfig(num_envs=2, num_steps=32, update_epochs=2, hidden_sizes=(16, 16))


@pytest.fixture(scope="module", params=["CartPole-v1", "Pendulum-v1"])
def run_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(request.param)
    train(env_id=request.param, total_steps=256, run_dir=path, seed=0, config=TINY, checkpoint_every=2,
          progress=False, log=lambda _: None)
    return path


def _observations(state: dict, batch: int, seed: int) -> np.ndarray:
    low, high = space_bounds(state["observation_space"])
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(size=(batch, *low.shape)) * 2, low, high).astype(np.float32)


def test_graph_contract_and_torch_onnxruntime_agreement(run_dir: Path) -> None:
    result = export_run(run_dir, signing_key=SigningKey.generate())
    model = onnx.load_from_string(result.bundle.model)
    onnx.checker.check_model(model)
    assert model.opset_import[0].version == 17
    assert [i.name for i in model.graph.input] == ["obs"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch axis
    state = load_latest_checkpoint(run_dir, caller="test")
    discrete = state["action_space"]["type"] == "Discrete"
    assert [o.name for o in model.graph.output] == (["action", "logits"] if discrete else ["action"])

    # Independently of verify_onnx: rebuild the acting policy from the checkpoint and compare.
    agent = Agent(obs_dim=int(np.prod(state["observation_space"]["shape"])),
                  action_dim=state["action_space"]["n"] if discrete else 1, discrete=discrete,
                  hidden_sizes=TINY.hidden_sizes)
    agent.load_state_dict(state["agent"])
    normalizer = ObsNormalizer(state["observation_space"]["shape"], clip=TINY.obs_clip)
    normalizer.load_state_dict(state["normalizer"])
    assert normalizer.count > 0  # the normaliser really is in the graph, not the identity
    session = ort.InferenceSession(result.bundle.model)
    executor = NumpyExecutor.from_bundle(result.bundle)
    for batch in (1, 3):
        obs = _observations(state, batch, seed=batch)
        with torch.no_grad():
            out = agent.actor(torch.from_numpy(normalizer(obs))).numpy()
        got = session.run(None, {"obs": obs})
        numpy_got = executor.run({"obs": obs})
        if discrete:
            assert got[0].dtype == np.int64 and got[0].shape == (batch,)
            np.testing.assert_array_equal(got[0], out.argmax(-1))
            np.testing.assert_allclose(got[1], out, atol=1e-5, rtol=0)
            np.testing.assert_allclose(numpy_got["logits"], out, atol=1e-5, rtol=0)
        else:
            assert got[0].dtype == np.float32 and got[0].shape == (batch, 1)
            np.testing.assert_allclose(got[0], np.clip(out, -2.0, 2.0), atol=1e-5, rtol=0)
        np.testing.assert_allclose(numpy_got["action"], got[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(executor.act(obs), got[0], atol=1e-5, rtol=0)
    assert max(result.max_abs_diff.values()) <= 1e-5


def test_bundle_is_signed_verified_and_describes_the_run(run_dir: Path, tmp_path: Path) -> None:
    key = SigningKey.generate()
    result = export_run(run_dir, signing_key=key, target_tier="device", ttl_s=3600)
    path = tmp_path / "policy.bundle"
    write_bundle(path, result.bundle)
    assert [p.name for p in tmp_path.iterdir()] == ["policy.bundle"]  # no temp file left behind
    bundle = Verifier(trust=TrustStore([key.public_key]), tier="device").verify(path.read_bytes())
    m = bundle.manifest
    state = load_latest_checkpoint(run_dir, caller="test")
    assert (m.version, m.parent_version) == (state["version"], 2) == (4, 2)
    assert m.policy == state["env_id"] and m.target_tier == "device" and m.expires_at is not None
    assert m.observation_space == state["observation_space"] and m.action_space == state["action_space"]
    assert m.preprocessing["in_graph"] is True and m.preprocessing["obs_normalization"]["enabled"] is True
    assert m.producer["exporter"] == "torch.onnx.export(dynamo=False, opset_version=17)"
    assert Bundle.from_bytes(path.read_bytes()).key_id == key.key_id


def test_export_a_chosen_version(run_dir: Path) -> None:
    assert export_run(run_dir, signing_key=SigningKey.generate(), version=2).bundle.manifest.version == 2
    with pytest.raises(ConfigError, match=re.escape("has no checkpoint of version 3; it has [2, 4]")):
        export_run(run_dir, signing_key=SigningKey.generate(), version=3)


def test_verify_onnx_catches_a_graph_that_is_not_the_policy() -> None:
    agent = Agent(obs_dim=4, action_dim=2, discrete=True, hidden_sizes=(8,))
    normalizer = ObsNormalizer((4,), clip=10.0)
    normalizer.update(np.random.default_rng(0).normal(size=(50, 4)))
    obs_space = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}
    action_space = {"type": "Discrete", "n": 2}
    graph = build_policy_graph(agent, normalizer_state=normalizer.state_dict(), action_space=action_space)
    model = export_onnx(graph, obs_shape=(4,), action_space=action_space)
    with torch.no_grad():
        agent.actor[-1].bias += 1.0  # the torch side drifts away from the exported graph
    with pytest.raises(ExportError, match=re.escape("verify_onnx: output 'logits' at batch 1 differs from torch by")):
        verify_onnx(model, graph, obs_space=obs_space, action_space=action_space)


def test_export_without_checkpoints_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"export_run: run dir {str(tmp_path)!r} has no checkpoints")):
        export_run(tmp_path, signing_key=SigningKey.generate())
