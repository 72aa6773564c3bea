"""The function-event contract: validation names the field and the fix; requests and results round-trip."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functions._errors import EventError
from functions._events import (
    ENCODING,
    EnvSpec,
    ErrorResult,
    InlinePolicy,
    ParameterServerPolicy,
    RandomPolicy,
    ResultSink,
    RolloutRequest,
    RolloutResult,
    S3Object,
    S3Policy,
    parse_result,
    parse_rollout_event,
)


def event(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"rollout_id": "r-1", "env": {"id": "CartPole-v1"}, "steps": 8,
                            "policy": {"kind": "random"}}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def test_a_minimal_event_gets_the_documented_defaults() -> None:
    r = parse_rollout_event(event())
    assert r == RolloutRequest(rollout_id="r-1", env=EnvSpec(id="CartPole-v1", kwargs={}), policy=RandomPolicy(),
                               steps=8)
    assert r.seeds == (0,) and r.source == "functions" and r.result == ResultSink()


@pytest.mark.parametrize("policy", [
    InlinePolicy(bundle=b"\x00bundle"), S3Policy(bucket="b", key="k", version_id="v1"),
    ParameterServerPolicy(address="127.0.0.1:50051", version=3), RandomPolicy(),
])
def test_requests_round_trip_through_their_event(policy: Any) -> None:
    request = RolloutRequest(rollout_id="r-9", env=EnvSpec(id="Pendulum-v1", kwargs={"g": 9.8}), policy=policy,
                             num_envs=3, seeds=(5, 6, 9), episodes=2, max_steps=50, fragment_length=10,
                             source="src", stream_base=30, result=ResultSink(mode="s3", s3_bucket="out"))
    assert parse_rollout_event(request.to_event()) == request


@pytest.mark.parametrize(("bad", "field", "message"), [
    ([1, 2], "<event>", "event field '<event>': must be a JSON object, got list"),
    (event(rollout_id=None), "rollout_id", "event field 'rollout_id': is missing; send a unique id per rollout"),
    (event(env=None), "env", "event field 'env': is missing; send {\"id\": \"CartPole-v1\", \"kwargs\": {}}"),
    (event(env={"id": 3}), "env.id", "event field 'env.id': must be a non-empty string"),
    (event(env={"id": "CartPole-v1", "kwargs": [1]}), "env.kwargs", "event field 'env.kwargs': must be a JSON object"),
    (event(steps="8"), "steps", "event field 'steps': must be an integer, got '8' (str); send an integer in [1, "),
    (event(steps=0), "steps", "event field 'steps': must be in [1, 1000000], got 0"),
    (event(steps=True), "steps", "event field 'steps': must be an integer, got True (bool)"),
    (event(episodes=3), "steps", "exactly one of 'steps' and 'episodes' must be sent, got both"),
    (event(steps=None), "steps", "exactly one of 'steps' and 'episodes' must be sent, got neither"),
    (event(num_envs=2000), "num_envs", "event field 'num_envs': must be in [1, 1024], got 2000"),
    (event(num_envs=2, seeds=[1]), "seeds", "must be a list of num_envs=2 non-negative integers"),
    (event(seed=1, seeds=[1]), "seeds", "both 'seed' and 'seeds' were sent"),
    (event(policy=None), "policy", "event field 'policy': is missing"),
    (event(policy={"kind": "torch"}), "policy.kind", "must be one of ['inline', 's3', 'parameter_server', 'random']"),
    (event(policy={"kind": "inline"}), "policy.bundle_b64", "is missing or not a string"),
    (event(policy={"kind": "inline", "bundle_b64": "@@@"}), "policy.bundle_b64", "is not valid base64"),
    (event(policy={"kind": "s3", "bucket": "b"}), "policy.key", "event field 'policy.key': is missing"),
    (event(policy={"kind": "parameter_server", "address": "h:1"}), "policy.version", "is missing"),
    (event(result={"mode": "email"}), "result.mode", "must be one of ['auto', 'inline', 's3'], got 'email'"),
    (event(colour="red"), "colour", "event field 'colour': is not a rollout event field (unknown: ['colour'])"),
    (event(kind="train"), "kind", "event field 'kind': must be 'rollout', got 'train'"),
    (event(steps=None, episodes=2, num_envs=100, max_steps=100_000), "max_steps", "max_steps * num_envs = 10000000"),
])
def test_malformed_events_name_the_field_and_the_fix(bad: Any, field: str, message: str) -> None:
    with pytest.raises(EventError, match=re.escape(message)) as info:
        parse_rollout_event(bad)
    assert info.value.field == field and info.value.fix


def test_an_oversized_inline_bundle_points_to_s3() -> None:
    with pytest.raises(EventError, match=re.escape('upload the bundle to S3 and send {"kind": "s3", ...}')):
        parse_rollout_event(event(policy={"kind": "inline", "bundle_b64": "A" * (4 * 1024 * 1024 + 4)}))


def test_results_round_trip() -> None:
    ok = RolloutResult(rollout_id="r", request_id="q", policy_version=2, num_envs=1, steps=3, transitions=3,
                       episodes=1, episode_returns=(3.0,), duration_s=0.5, fragments=(b"abc", b"de"))
    assert parse_result(ok.to_dict()) == ok
    assert ok.to_dict()["encoding"] == ENCODING and ok.to_dict()["fragments"][0] == base64.b64encode(b"abc").decode()
    by_ref = RolloutResult(rollout_id="r", request_id="q", policy_version=2, num_envs=1, steps=3, transitions=3,
                           episodes=0, episode_returns=(), duration_s=0.5,
                           fragment_refs=(S3Object(bucket="b", key="k"),))
    assert parse_result(by_ref.to_dict()) == by_ref
    err = ErrorResult(type="EventError", message="m", fix="f", field="steps", rollout_id="r")
    assert err.to_dict() == {"ok": False, "rollout_id": "r",
                             "error": {"type": "EventError", "message": "m", "field": "steps", "fix": "f"}}
    assert parse_result(err.to_dict()) == err


@pytest.mark.parametrize("payload", [{"errorMessage": "boom"}, {"ok": True, "encoding": "pickle"}, "text"])
def test_a_payload_that_is_not_a_result_is_refused(payload: Any) -> None:
    with pytest.raises(EventError, match=re.escape("event field '<result>'")):
        parse_result(payload)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
FIELDS = ["rollout_id", "env", "num_envs", "seed", "seeds", "steps", "episodes", "max_steps", "fragment_length",
          "policy", "source", "stream_base", "result"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8) | json_values)
def test_any_json_is_a_request_or_an_event_error(payload: Any) -> None:
    try:
        parse_rollout_event(payload)
    except EventError as exc:
        assert isinstance(exc.field, str) and exc.fix
