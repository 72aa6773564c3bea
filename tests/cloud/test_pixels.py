"""Image observations end to end: codecs, the frame table, every mode carrying frames bit-exactly, the CNN export."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from device import ConfigError, ObsCodec, ObsPipeline, RolloutBatch, WireError, make_env
from device._obs_codec import FrameCodec, decode_frame, frame_codec

PIXELS = "strata/PixelCartPole-v1"
LOSSLESS = ["png", "webp", "jxl"]
LOSSY_PSNR_DB = 30.0
"""The stated bound of lossy codecs at quality >= 75: every CarRacing-v3 frame's PSNR against the raw frame
(measured minima over 20 frames: webp:75 33.6 dB, webp:90 34.9, jxl:75 32.8, jxl:90 36.0)."""


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def frames(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    a[..., : shape[1] // 2, :] = 17  # some structure, so codecs have something to compress
    return a


def batch_of(obs: np.ndarray) -> RolloutBatch:
    t, n = obs.shape[:2]
    final = np.zeros_like(obs)
    final[1, 0] = obs[2, 0]
    return RolloutBatch(source="t", obs=obs, actions=np.zeros((t, n), np.int64), rewards=np.zeros((t, n), np.float32),
                        terminations=np.zeros((t, n), bool), truncations=np.zeros((t, n), bool), final_obs=final,
                        next_obs=obs[-1].copy(), policy_version=np.zeros((t, n), np.int64),
                        worker=np.arange(n, dtype=np.int64), seq=np.zeros((t, n), np.int64))


# -- codecs and the frame table -----------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", LOSSLESS)
@pytest.mark.parametrize("shape", [(5, 2, 40, 40), (5, 2, 40, 40, 1), (5, 2, 40, 40, 3), (5, 2, 40, 40, 4),
                                   (5, 2, 3, 40, 40, 3)])
def test_lossless_codecs_carry_frames_bit_exactly(codec: str, shape: tuple[int, ...]) -> None:
    batch = batch_of(frames(shape))
    back = RolloutBatch.from_bytes(batch.to_bytes(ObsCodec.parse(codec)))
    for name in ("obs", "final_obs", "next_obs"):
        assert np.array_equal(getattr(back, name), getattr(batch, name)), name
        assert getattr(back, name).dtype == np.uint8
    assert back.obs_codec == codec


def test_a_frame_stack_encodes_each_distinct_frame_once() -> None:
    stream = frames((12, 40, 40, 3))
    obs = np.stack([stream[t:t + 4] for t in range(8)])[:, None]  # [8, 1, 4, 40, 40, 3]: 11 distinct frames
    data = batch_of(obs).to_bytes(ObsCodec(name="png"))
    one = len(ObsCodec(name="png").encode(stream[0]))
    assert len(data) < 13 * one, "stacked frames were encoded more than once"
    raw = len(batch_of(obs).to_bytes())
    assert raw > 3 * len(data)


def test_a_lossy_codec_changes_frames_once_where_they_are_made_and_the_wire_keeps_them() -> None:
    coder = frame_codec(ObsCodec.parse("webp:60"))
    raw = frames((6, 1, 40, 40, 3))
    seen = coder.roundtrip_obs(raw)
    assert not np.array_equal(seen, raw)  # lossy
    before = coder.fallbacks
    back = RolloutBatch.from_bytes(batch_of(seen).to_bytes(coder.codec))
    # the round trip's own bytes travelled; only final_obs's all-zero filler frame was never made by it
    assert np.array_equal(back.obs, seen) and coder.fallbacks == before + 1
    # A frame the pipeline never made (here: the raw one) travels losslessly instead of being degraded again.
    other = RolloutBatch.from_bytes(batch_of(raw).to_bytes(coder.codec))
    assert np.array_equal(other.obs, raw) and coder.fallbacks > before


@pytest.mark.parametrize("spec", ["webp:75", "webp:90", "jxl:75", "jxl:90"])
def test_lossy_codecs_keep_carracing_frames_within_the_stated_bound(spec: str) -> None:
    pytest.importorskip("Box2D")
    env = make_env("CarRacing-v3")
    env.reset(seed=0)
    raw = np.stack([env.step(np.array([0.1 * (i % 5 - 2), 0.5, 0.0], np.float32))[0] for i in range(70)])[-20:]
    env.close()
    seen = FrameCodec(ObsCodec.parse(spec)).roundtrip_obs(raw)
    worst = min(psnr(a, b) for a, b in zip(seen, raw, strict=True))
    assert LOSSY_PSNR_DB <= worst < math.inf, f"{spec}: worst frame {worst:.1f} dB"


@pytest.mark.parametrize(("spec", "message"), [
    ("png:90", "codec 'png' has no quality (it is lossless); pass --obs-quality only with webp or jxl"),
    ("webp:0", "quality 0 must be an integer in [1, 100]"),
    ("gif", "codec 'gif' is not one of ['raw', 'png', 'webp', 'jxl']"),
])
def test_bad_codecs_are_refused_with_the_fix(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ObsCodec.parse(spec)


def test_hostile_frame_tables_are_refused_before_decoding() -> None:
    good = ObsCodec(name="png").encode(frames((40, 40, 3)))
    with pytest.raises(WireError, match="is not PNG, WebP or JPEG-XL"):
        decode_frame(b"GIF89a" + good, (40, 40, 3))
    with pytest.raises(WireError, match="is not the declared 20x40"):
        decode_frame(good, (40, 20, 3))
    with pytest.raises(WireError, match="corrupt"):
        decode_frame(good[:60], (40, 40, 3))
    from device import pack_arrays, unpack_arrays

    meta, arrays = unpack_arrays(batch_of(frames((3, 1, 40, 40, 3))).to_bytes(ObsCodec(name="png")))
    arrays = dict(arrays)
    arrays["frames:index:obs"] = np.full_like(arrays["frames:index:obs"], 99)
    with pytest.raises(WireError, match="indexes frames outside the table"):
        RolloutBatch.from_bytes(pack_arrays(meta, arrays))


# -- the modes ----------------------------------------------------------------------------------------------------

def replay(actions: np.ndarray, pipeline: ObsPipeline, seed: int) -> np.ndarray:
    """Observations of one env of `pipeline` seeded `seed` under `actions` (autoreset), as one process sees them."""
    env = make_env(PIXELS, pipeline)
    obs, _ = env.reset(seed=seed)
    out = []
    for a in actions:
        out.append(obs)
        obs, _, term, trunc, _ = env.step(int(a))
        if term or trunc:
            obs, _ = env.reset()
    return np.stack(out)


@pytest.mark.parametrize("mode", ["colocated", "decoupled"])
def test_vector_env_modes_carry_frames_bit_exactly(mode: str) -> None:
    import cloud  # noqa: F401  (registers the colocated and decoupled builders)
    from cloud.rollout._envs import make_vector_env

    pipeline = ObsPipeline(frame_stack=2, obs_codec="png")
    envs = make_vector_env(PIXELS, num_envs=2, seed=3, mode=mode, pipeline=pipeline)
    reference = make_vector_env(PIXELS, num_envs=2, seed=3, mode="sync", pipeline=pipeline)
    try:
        assert envs.single_observation_space.shape == (2, 40, 40, 3)
        rng = np.random.default_rng(0)
        for _ in range(30):
            a = rng.integers(0, 2, 2)
            got, want = envs.step(a), reference.step(a)
            assert got[0].dtype == np.uint8 and np.array_equal(got[0], want[0])
            assert np.array_equal(got[2], want[2])
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("mode", ["colocated", "decoupled"])
def test_vector_env_modes_carry_lossy_frames_as_the_one_round_trip_made_them(mode: str) -> None:
    import cloud  # noqa: F401  (registers the colocated and decoupled builders)
    from cloud.rollout._envs import make_vector_env

    envs = make_vector_env(PIXELS, num_envs=2, seed=3, mode=mode, pipeline=ObsPipeline(obs_codec="webp:80"))
    reference = make_vector_env(PIXELS, num_envs=2, seed=3, mode="sync", pipeline=ObsPipeline())
    coder = FrameCodec(ObsCodec.parse("webp:80"))
    try:
        rng = np.random.default_rng(0)
        for _ in range(20):
            a = rng.integers(0, 2, 2)
            got, raw = envs.step(a)[0], reference.step(a)[0]
            assert np.array_equal(got, coder.roundtrip_obs(raw))  # degraded once, then carried bit-exactly
            assert min(psnr(g, r) for g, r in zip(got, raw, strict=True)) >= 25.0  # PixelCartPole's hard edges
    finally:
        envs.close()
        reference.close()


def test_the_colocated_pool_keeps_frames_in_aligned_shared_memory() -> None:
    from cloud.rollout._colocated import build_colocated_vector_env

    pool = build_colocated_vector_env(PIXELS, num_envs=2, seed=0, pipeline=ObsPipeline(frame_stack=4))
    try:
        spec = pool._arena.layout.arrays["obs"]
        assert spec.offset % 64 == 0 and spec.dtype == "|u1" and spec.shape == (2, 4, 40, 40, 3)
    finally:
        pool.close()


def cnn_bundle(tmp_path: Path, pipeline: ObsPipeline) -> tuple[bytes, Any]:
    from cloud.learners._agent import ObsNormalizer
    from cloud.learners._cnn import make_agent
    from cloud.learners._ppo_config import PPOConfig
    from cloud.switching._modes import PolicyPublisher
    from device import space_to_json

    env = make_env(PIXELS, pipeline)
    agent = make_agent(tuple(env.observation_space.shape), np.uint8, action_dim=2, discrete=True, config=PPOConfig())
    publisher = PolicyPublisher(tmp_path, agent=agent,
                                normalizer=ObsNormalizer(env.observation_space.shape, clip=10, enabled=False),
                                obs_space=space_to_json(env.observation_space),
                                action_space=space_to_json(env.action_space), policy="pixels", pipeline=pipeline)
    return publisher.bundle(0), publisher


def test_fragments_from_env_services_carry_frames_bit_exactly(tmp_path: Path) -> None:
    from cloud.rollout._decoupled import FragmentSource, start_services

    pipeline = ObsPipeline(frame_stack=2, obs_codec="webp")
    bundle, publisher = cnn_bundle(tmp_path, pipeline)
    services = start_services(PIXELS, count=1, envs=2, seed=7, trust=[str(publisher.public_key)], pipeline=pipeline)
    source = FragmentSource([s.address for s in services], steps=24, inflight=1, owned=services, timeout_s=60)
    try:
        source.set_policy(bundle)  # a CNN: the service runs it in onnxruntime
        fragment = next(iter(source.fragments(1)))
    finally:
        source.close()
    assert fragment.obs_codec == "webp" and fragment.obs.dtype == np.uint8
    for i in range(2):
        assert np.array_equal(fragment.obs[:, i], replay(fragment.actions[:, i], pipeline, seed=7 + i))


def handler_event(pipeline: ObsPipeline, **kw: Any) -> dict[str, Any]:
    event = {"rollout_id": "r-1", "env": {"id": PIXELS, **pipeline.to_json()}, "num_envs": 2, "seed": 11,
             "steps": 30, "policy": {"kind": "random"}}
    event.update(kw)
    return event


def decode_result(result: dict[str, Any]) -> list[RolloutBatch]:
    assert result["ok"], result
    return [RolloutBatch.from_bytes(base64.b64decode(f)) for f in result["fragments"]]


@pytest.mark.parametrize("codec", ["raw", *LOSSLESS])
def test_functions_carry_frames_bit_exactly(codec: str) -> None:
    from functions._handlers import reset_caches, rollout_handler

    reset_caches()
    pipeline = ObsPipeline(frame_stack=3, obs_codec=codec)
    result = rollout_handler(handler_event(pipeline), None)
    assert result["obs_codec"] == codec
    (fragment,) = decode_result(result)
    assert fragment.obs.shape == (30, 2, 3, 40, 40, 3) and fragment.obs_codec == codec
    for i in range(2):
        assert np.array_equal(fragment.obs[:, i], replay(fragment.actions[:, i], pipeline, seed=11 + i))


def test_image_episodes_round_trip_through_the_carry() -> None:
    from functions._handlers import reset_caches, rollout_handler

    reset_caches()
    pipeline = ObsPipeline(frame_stack=2, obs_codec="png")
    (whole,) = decode_result(rollout_handler(handler_event(pipeline, steps=40), None))
    first = rollout_handler(handler_event(pipeline, steps=20, carry=[None, None]), None)
    assert all(c is not None for c in first["carry"]), first.get("carry_note")
    reset_caches()  # another instance continues the episodes
    second = rollout_handler(handler_event(pipeline, steps=20, carry=first["carry"], seq_base=20,
                                           rollout_id="r-2"), None)
    (a,), (b,) = decode_result(first), decode_result(second)
    # the random policy draws per invocation, so compare what the envs did with the actions they got
    actions = np.concatenate([a.actions, b.actions])
    for i in range(2):
        obs = np.concatenate([a.obs[:, i], b.obs[:, i]])
        assert np.array_equal(obs, replay(actions[:, i], pipeline, seed=11 + i))
    assert whole.obs.shape == (40, 2, 2, 40, 40, 3)


def test_functions_act_with_a_cnn_bundle_in_onnxruntime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from functions._handlers import reset_caches, rollout_handler

    pipeline = ObsPipeline(frame_stack=2, obs_codec="webp:80")
    bundle, publisher = cnn_bundle(tmp_path, pipeline)
    monkeypatch.setenv("STRATA_TRUSTED_KEYS", publisher.public_key.read_text())
    reset_caches()
    policy = {"kind": "inline", "bundle_b64": base64.b64encode(bundle).decode()}
    (fragment,) = decode_result(rollout_handler(handler_event(pipeline, policy=policy, actions="sample"), None))
    assert fragment.policy_version.min() == 1 and fragment.obs_codec == "webp:80"
    # the policy acted on decoded frames: each one is what the lossy round trip of the raw frame gives
    raw = replay(fragment.actions[:, 0], ObsPipeline(frame_stack=2), seed=11)
    assert np.array_equal(fragment.obs[:, 0], FrameCodec(ObsCodec.parse("webp:80")).roundtrip_obs(raw))


def test_an_oversized_event_is_refused_before_it_is_sent() -> None:
    from cloud.rollout._serverless import ServerlessConfig, ServerlessError, ServerlessRolloutSource

    class NeverInvoked:
        def invoke(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("an oversized event was sent")

    config = ServerlessConfig(env_id=PIXELS, envs_per_invocation=2, steps_per_invocation=8, frame_stack=4,
                              obs_codec="png")
    source = ServerlessRolloutSource(config, invoker=NeverInvoked())
    try:
        lane_carry = (b"\0" * (4 << 20), b"\0" * (4 << 20))  # two image carries of 4 MB each
        source._issue(0)  # opens lane 0
        lane = source._issued.pop(0).lane
        lane.carry = lane_carry
        source._idle_lanes.append(lane)
        with pytest.raises(ServerlessError, match=r"over Lambda's 6291456-byte request limit"):
            source._issue(1)
    finally:
        source.close()


def test_functions_events_name_a_bad_pipeline() -> None:
    from functions._handlers import rollout_handler

    result = rollout_handler(handler_event(ObsPipeline(), env={"id": PIXELS, "obs_codec": "webp:101"}), None)
    assert not result["ok"] and result["error"]["field"] == "env.obs_codec"
    assert "quality 101 must be an integer in [1, 100]" in result["error"]["message"]


# -- the CNN policy -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_the_exported_cnn_matches_torch_and_the_device_tier_refuses_it(algo: str, tmp_path: Path) -> None:
    import torch

    from cloud.learners._onnx import export_onnx, verify_onnx
    from device import (
        NumpyExecutor,
        UnsupportedOperatorError,
        build_bundle,
        generate_keypair,
        load_signing_key,
        space_to_json,
    )

    env = make_env(PIXELS, ObsPipeline(frame_stack=2))
    obs_space = space_to_json(env.observation_space)
    shape = tuple(env.observation_space.shape)
    if algo == "ppo":
        from cloud.learners._agent import ObsNormalizer
        from cloud.learners._cnn import make_agent
        from cloud.learners._onnx import build_policy_graph
        from cloud.learners._ppo_config import PPOConfig

        action_space = space_to_json(env.action_space)
        agent = make_agent(shape, np.uint8, action_dim=2, discrete=True, config=PPOConfig())
        graph = build_policy_graph(agent, normalizer_state=ObsNormalizer(shape, clip=10, enabled=False).state_dict(),
                                   action_space=action_space)
    else:
        from cloud.learners._sac_networks import DeterministicPolicy, build_networks

        action_space = {"type": "Box", "shape": [2], "dtype": "float32", "low": [-1.0, -1.0], "high": [1.0, 1.0]}
        actor, qf, _ = build_networks(int(np.prod(shape)), 2, (64,), np.array([-1.0, -1]), np.array([1.0, 1]),
                                      image_shape=shape)
        graph = DeterministicPolicy(actor).eval()
        assert qf(torch.zeros((3, *shape), dtype=torch.uint8), torch.zeros((3, 2))).shape == (2, 3)
    model = export_onnx(graph, obs_shape=shape, action_space=action_space)
    worst = verify_onnx(model, graph, obs_space=obs_space, action_space=action_space)
    assert all(v <= 1e-5 for v in worst.values())
    generate_keypair(tmp_path)
    bundle = build_bundle(model, policy="p", version=1, parent_version=None, observation_space=obs_space,
                          action_space=action_space,
                          signing_key=load_signing_key(tmp_path / "strata-signing.key"))
    with pytest.raises(UnsupportedOperatorError, match=r"this is a convolutional policy \(3 Conv layers, "
                                                       r"[\d,]+ weights, [\d.]+ MB\).*Run it on the edge tier"):
        NumpyExecutor.from_bundle(bundle)


def test_ppo_trains_a_cnn_on_pixels_in_the_functions_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cloud.learners._ppo_config import PPOConfig
    from cloud.runs._export import export_run
    from cloud.runs._train import train
    from cloud.switching._modes import SwitchingConfig
    from device import generate_keypair, load_signing_key

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    config = PPOConfig(num_envs=2, num_steps=16, update_epochs=1, frame_stack=2, obs_codec="webp", obs_quality=85)
    result = train(env_id=PIXELS, total_steps=64, run_dir=tmp_path / "run", config=config, progress=False,
                   log=lambda line: None,
                   switching=SwitchingConfig(modes=("functions",), fragment_steps=16, control=False))
    assert result.global_step == 64 and result.accounting is not None and result.accounting["gaps"] == 0
    generate_keypair(tmp_path / "keys")
    exported = export_run(tmp_path / "run", signing_key=load_signing_key(tmp_path / "keys" / "strata-signing.key"))
    manifest = exported.bundle.manifest
    assert manifest.preprocessing["pipeline"] == {"frame_stack": 2, "obs_codec": "webp:85"}
    assert manifest.observation_space["low"] == 0.0 and len(manifest.to_bytes()) < 4096
    assert json.loads(json.dumps(dataclasses.asdict(config)))["obs_codec"] == "webp"


# -- the edge -----------------------------------------------------------------------------------------------------

def test_the_edge_acts_through_the_pipeline_and_sends_image_experience_through_its_codec(tmp_path: Path) -> None:
    import sqlite3

    from edge import EdgeAgent, EdgeAgentConfig, Experience

    pipeline = ObsPipeline(frame_stack=2, obs_codec="webp:80")
    bundle, publisher = cnn_bundle(tmp_path / "run", pipeline)
    config = EdgeAgentConfig(fleet="f", node_id="n1", cache_dir=str(tmp_path / "n1"),
                             trust=(str(publisher.public_key),), env=PIXELS, frame_stack=2, obs_codec="webp:80",
                             experience_steps=8, steps=24, telemetry_interval_s=3600.0)
    agent = EdgeAgent(config)
    agent.cache.stage(agent.cache.verify(bundle))
    agent.cache.commit()
    agent.start()
    try:
        assert agent.version == 1  # the CNN, in onnxruntime
        agent.run()
    finally:
        agent.close(drain_s=0.0)
    with sqlite3.connect(tmp_path / "n1" / "outbox.sqlite") as db:
        rows = db.execute("SELECT topic, payload FROM records ORDER BY id").fetchall()
    records = [Experience.decode(topic, bytes(payload)) for topic, payload in rows if topic.endswith("/experience")]
    assert len(records) == 3
    batches = [r.batch for r in records]
    assert all(b.obs_codec == "webp:80" and b.obs.dtype == np.uint8 and b.obs.shape == (8, 1, 2, 40, 40, 3)
               for b in batches)
    # what the node saw is what the same pipeline makes: the lossy round trip of each frame, stacked
    actions = np.concatenate([b.actions[:, 0] for b in batches])
    obs = np.concatenate([b.obs[:, 0] for b in batches])
    assert np.array_equal(obs, replay(actions, pipeline, seed=0))
    # the frame table holds each distinct frame once, compressed: a fraction of the raw record
    sent = sum(len(bytes(p)) for t, p in rows if t.endswith("/experience"))
    raw = sum(len(Experience(record_id=1, node="n1", batch=b).encode()) for b in batches)
    assert sent * 3 < raw, (sent, raw)


def test_the_edge_refuses_a_policy_trained_through_another_pipeline(tmp_path: Path) -> None:
    from device import Bundle
    from edge import HealthConfig, check_policy

    data, _ = cnn_bundle(tmp_path, ObsPipeline(frame_stack=2, obs_codec="webp:80"))
    bundle = Bundle.from_bytes(data)
    node = ObsPipeline(frame_stack=2, obs_codec="png")  # same shapes; the node's frames are not degraded
    policy, report = check_policy(bundle, lambda: make_env(PIXELS, node),
                                  HealthConfig(pipeline=node.to_json(), latency_budget_ms=5000.0))
    assert policy is None and report.reason == (
        "the policy was trained on observations through frame stack 2 and codec webp:80; this node makes frame "
        "stack 2 and codec png: start the agent with --frame-stack 2 --obs-codec webp:80")
    same = ObsPipeline(frame_stack=2, obs_codec="webp:80")
    policy, report = check_policy(bundle, lambda: make_env(PIXELS, same),
                                  HealthConfig(pipeline=same.to_json(), latency_budget_ms=5000.0))
    assert policy is not None, report.reason
