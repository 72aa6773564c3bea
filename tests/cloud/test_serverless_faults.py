"""The serverless source never lets a torn reply or a dead runtime reach the learner as a decode error."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from cloud.rollout._serverless import ServerlessConfig, ServerlessError, ServerlessRolloutSource, _decode, local_scaling


@pytest.mark.parametrize("payload", [b'{"ok": true, "rollout_id": "r-', b"\xff\xfe", b"", b'{"hello": 1}', b"[]"])
def test_a_torn_or_foreign_reply_is_a_function_error(payload: bytes) -> None:
    assert _decode(payload) is None  # re-issued and de-duplicated like any function error


def test_a_dead_runtime_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    cfg = local_scaling(dataclasses.replace(ServerlessConfig(), lambda_endpoint_url=url, region="us-east-1",
                                            unsigned=True, steps_per_invocation=16, envs_per_invocation=1))
    with ServerlessRolloutSource(cfg) as source, pytest.raises(ServerlessError) as info:
        list(source.fragments(count=1))
    assert "cannot connect" in str(info.value) and "that the runtime is running" in str(info.value)
    assert "credentials" not in str(info.value)
