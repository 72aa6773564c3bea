"""The rollout handler: valid events give decodable fragments with unique transition ids; bad ones an error result."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

from device import RolloutBatch, SigningKey, build_bundle, generate_keypair, load_signing_key
from functions import _handlers
from functions._events import ErrorResult, RolloutResult, parse_result
from functions._handlers import rollout_handler
from tests._services import MotoServer

OBS = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}
ACT = {"type": "Discrete", "n": 2}


class Context:
    aws_request_id = "req-1"


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    _handlers.reset_caches()
    yield
    _handlers.reset_caches()


@pytest.fixture(scope="module")
def policy_model() -> bytes:
    from tests.device._models import mlp_policy

    return mlp_policy(hidden=(16,))


@pytest.fixture
def signing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SigningKey:
    key_path, pub_path = generate_keypair(tmp_path)
    monkeypatch.setenv("STRATA_TRUSTED_KEYS", pub_path.read_text())
    return load_signing_key(key_path)


def bundle_bytes(model: bytes, key: SigningKey, **kwargs: Any) -> bytes:
    return build_bundle(model, policy="cartpole", version=kwargs.pop("version", 3), parent_version=None,
                        observation_space=OBS, action_space=ACT, signing_key=key, output_names=("action", "logits"),
                        **kwargs).to_bytes()


def rollout(**overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"rollout_id": "r-1", "env": {"id": "CartPole-v1"}, "num_envs": 3, "seed": 7,
                             "steps": 40, "fragment_length": 16, "stream_base": 100, "policy": {"kind": "random"}}
    event.update(overrides)
    return event


def decode(result: dict[str, Any]) -> tuple[RolloutResult, list[RolloutBatch]]:
    parsed = parse_result(json.loads(json.dumps(result)))  # the result must survive JSON as Lambda returns it
    assert isinstance(parsed, RolloutResult), result
    return parsed, [RolloutBatch.from_bytes(f) for f in parsed.fragments]


def test_random_rollout_fragments_carry_unique_contiguous_transition_ids() -> None:
    result, batches = decode(rollout_handler(rollout(), Context()))
    assert (result.rollout_id, result.request_id, result.transitions, result.steps) == ("r-1", "req-1", 120, 40)
    assert [b.num_steps for b in batches] == [16, 16, 8]
    ids = [tid for b in batches for tid in b.transition_ids()]
    assert len(ids) == len(set(ids)) == 120
    assert {w for _, w, _ in ids} == {100, 101, 102}
    assert sorted(s for _, w, s in ids if w == 101) == list(range(40))
    np.testing.assert_array_equal(batches[0].next_obs, batches[1].obs[0])
    done = np.concatenate([b.terminations | b.truncations for b in batches])
    assert result.episodes == int(done.sum()) == len(result.episode_returns)


def test_the_same_event_gives_the_same_transitions() -> None:
    _, a = decode(rollout_handler(rollout(), Context()))
    _, b = decode(rollout_handler(rollout(), Context()))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.obs, y.obs)
        np.testing.assert_array_equal(x.actions, y.actions)


def test_episodes_mode_stops_after_enough_episodes() -> None:
    result, batches = decode(rollout_handler(rollout(steps=None, episodes=4, max_steps=2000), Context()))
    assert result.episodes >= 4
    assert sum(int((b.terminations | b.truncations).sum()) for b in batches) == result.episodes


@pytest.mark.parametrize(("event", "type_", "text"), [
    ({"rollout_id": "r-2", "steps": 3}, "EventError", "event field 'env': is missing"),
    ("not an object", "EventError", "event field '<event>': must be a JSON object, got str"),
    (rollout(env={"id": "NoSuchEnv-v0"}), "SimulationError", "make_envs: gymnasium.make('NoSuchEnv-v0', **{}) failed"),
    (rollout(policy={"kind": "parameter_server", "address": "127.0.0.1:1", "version": 2}), "PolicyUnavailableError",
     "policy reference kind 'parameter_server' (127.0.0.1:1, v2) has no resolver in this function"),
    (rollout(policy={"kind": "inline", "bundle_b64": "AAAA"}), "PolicyUnavailableError",
     "no trusted signing key is configured"),
])
def test_bad_events_get_an_error_result_not_a_crash(event: Any, type_: str, text: str) -> None:
    result = rollout_handler(event, Context())
    parsed = parse_result(result)
    assert isinstance(parsed, ErrorResult) and parsed.type == type_ and text in parsed.message
    assert result["ok"] is False


def test_a_signed_bundle_runs_with_the_numpy_executor(policy_model: bytes, signing: SigningKey) -> None:
    data = bundle_bytes(policy_model, signing)
    result, batches = decode(rollout_handler(
        rollout(policy={"kind": "inline", "bundle_b64": base64.b64encode(data).decode()}), Context()))
    assert result.policy_version == 3
    assert all((b.policy_version == 3).all() for b in batches)
    from device import NumpyExecutor

    executor = NumpyExecutor(policy_model)
    np.testing.assert_array_equal(batches[0].actions, executor.act(batches[0].obs.reshape(-1, 4)).reshape(16, 3))


def test_sampled_actions_follow_the_logits_and_repeat_on_redelivery(policy_model: bytes, signing: SigningKey) -> None:
    policy = {"kind": "inline", "bundle_b64": base64.b64encode(bundle_bytes(policy_model, signing)).decode()}
    _, a = decode(rollout_handler(rollout(policy=policy, actions="sample", steps=200, fragment_length=None), Context()))
    _, b = decode(rollout_handler(rollout(policy=policy, actions="sample", steps=200, fragment_length=None), Context()))
    np.testing.assert_array_equal(a[0].actions, b[0].actions)  # seeded by the streams: a duplicate is identical
    from device import NumpyExecutor

    greedy = NumpyExecutor(policy_model).act(a[0].obs.reshape(-1, 4)).reshape(a[0].actions.shape)
    disagree = float(np.mean(a[0].actions != greedy))
    assert 0.0 < disagree < 0.5  # a sample from the logits: mostly the greedy action, not always


def test_an_unknown_action_mode_is_refused() -> None:
    parsed = parse_result(rollout_handler(rollout(actions="explore"), Context()))
    assert isinstance(parsed, ErrorResult) and "event field 'actions': must be 'greedy' or 'sample'" in parsed.message


def test_a_tampered_or_untrusted_bundle_is_refused(policy_model: bytes, signing: SigningKey) -> None:
    data = bytearray(bundle_bytes(policy_model, signing))
    data[-40] ^= 0xFF
    result = parse_result(rollout_handler(
        rollout(policy={"kind": "inline", "bundle_b64": base64.b64encode(bytes(data)).decode()}), Context()))
    assert isinstance(result, ErrorResult) and result.type in ("TamperedBundleError", "BundleFormatError")
    stranger = SigningKey.generate()
    result = parse_result(rollout_handler(rollout(policy={
        "kind": "inline", "bundle_b64": base64.b64encode(bundle_bytes(policy_model, stranger)).decode()}), Context()))
    assert isinstance(result, ErrorResult) and result.type == "UnknownKeyError"
    assert "not in the trust store" in result.message


def test_an_edge_only_bundle_is_refused_by_the_device_tier_verifier(policy_model: bytes, signing: SigningKey) -> None:
    data = bundle_bytes(policy_model, signing, target_tier="edge")
    result = parse_result(rollout_handler(
        rollout(policy={"kind": "inline", "bundle_b64": base64.b64encode(data).decode()}), Context()))
    assert isinstance(result, ErrorResult) and result.type == "WrongTierError"


def test_s3_policy_and_s3_results(aws_env: MotoServer, policy_model: bytes, signing: SigningKey) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="policies")
    s3.put_object(Bucket="policies", Key="cartpole/000000003.bundle", Body=bundle_bytes(policy_model, signing))
    event = rollout(policy={"kind": "s3", "bucket": "policies", "key": "cartpole/000000003.bundle"},
                    result={"mode": "s3", "s3_bucket": "policies", "s3_prefix": "out/"})
    result = parse_result(rollout_handler(event, Context()))
    assert isinstance(result, RolloutResult) and not result.fragments and len(result.fragment_refs) == 3
    assert result.fragment_refs[0].key == "out/r-1/req-1/000000.bin"
    batch = RolloutBatch.from_bytes(s3.get_object(Bucket="policies", Key=result.fragment_refs[0].key)["Body"].read())
    assert batch.num_steps == 16 and (batch.policy_version == 3).all()
    marker = json.loads(s3.get_object(Bucket="policies", Key="out/r-1/req-1.json")["Body"].read())
    assert marker["rollout_id"] == "r-1" and len(marker["fragment_refs"]) == 3
    missing = parse_result(rollout_handler(rollout(policy={"kind": "s3", "bucket": "policies", "key": "nope"}),
                                           Context()))
    assert isinstance(missing, ErrorResult) and "cannot read policy s3://policies/nope" in missing.message


def test_a_result_over_6mb_goes_to_s3_automatically(aws_env: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="results")
    big = rollout(num_envs=64, steps=2000, fragment_length=500)  # ~64*2000*(2*16+...) bytes: over 6 MB
    no_bucket = parse_result(rollout_handler(rollout(result={"mode": "s3"}), Context()))
    assert isinstance(no_bucket, ErrorResult) and no_bucket.type == "EventError"
    assert "send result.s3_bucket or set STRATA_RESULT_BUCKET" in no_bucket.message
    monkeypatch.setenv("STRATA_RESULT_BUCKET", "results")
    result = parse_result(rollout_handler(big, Context()))
    assert isinstance(result, RolloutResult) and len(result.fragment_refs) == 4 and result.transitions == 128_000


def test_the_handler_needs_neither_torch_nor_onnxruntime_nor_boto3(policy_model: bytes, signing: SigningKey,
                                                                   tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    data = bundle_bytes(policy_model, signing)
    event_path = tmp_path / "event.json"
    event_path.write_text(json.dumps(rollout(policy={"kind": "inline", "bundle_b64": base64.b64encode(data).decode()})))
    code = (
        "import sys, json\n"
        "for name in ('torch', 'onnxruntime', 'onnx', 'boto3', 'botocore'):\n"
        "    sys.modules[name] = None  # importing any of them now raises ImportError\n"
        "from functions._handlers import rollout_handler\n"
        f"result = rollout_handler(json.load(open({str(event_path)!r})), None)\n"
        "assert result['ok'], result\n"
        "print(result['policy_version'], result['transitions'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "STRATA_TRUSTED_KEYS": os.environ["STRATA_TRUSTED_KEYS"]})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "120"]
