"""Opt-in smoke test against a real AWS account: apply, invoke the deployed functions, destroy.

Runs only with ``STRATA_AWS_SMOKE=1`` (it creates billable resources for a minute or two and builds the
real dependency tree with pip). Credentials come from the standard chain: the AWS_* variables set when
pytest started (the suite's autouse fixture clears them, so they are captured at import), or a profile.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.aws,
    pytest.mark.skipif(os.environ.get("STRATA_AWS_SMOKE") != "1", reason="real AWS: set STRATA_AWS_SMOKE=1"),
]

_CALLER_AWS_ENV = {k: v for k, v in os.environ.items() if k.startswith("AWS_") and not k.startswith("AWS_ENDPOINT")}


def test_apply_invoke_and_destroy_on_real_aws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in _CALLER_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    from infra import DeployConfig, apply, destroy, plan
    from infra.aws import LambdaInvoker, client

    stage = f"smoke{uuid.uuid4().hex[:8]}"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    config = DeployConfig(stage=stage, region=region, edge_nodes=("smoke-node",), memory_mb=512, timeout_s=60,
                          cache_dir=str(Path.home() / ".cache" / "strata" / "lambda"))
    state_dir = tmp_path / "state"
    try:
        apply(config, state_dir=state_dir)
        assert plan(config, state_dir=state_dir).changes == ()
        invoker = LambdaInvoker(function_timeout_s=60, region=region)
        ping = invoker.invoke(f"strata-{stage}-ping", b'{"hi": 1}', qualifier=stage)
        assert ping.ok and json.loads(ping.payload) == {"ok": True, "echo": {"hi": 1}}
        event = {"rollout_id": "smoke-1", "env": {"id": "CartPole-v1"}, "steps": 16, "policy": {"kind": "random"}}
        rollout = invoker.invoke(f"strata-{stage}-rollout", json.dumps(event).encode(), qualifier=stage)
        assert rollout.ok, rollout.payload
        assert json.loads(rollout.payload)["transitions"] == 16
    finally:
        destroy(stage, state_dir=state_dir, config=config)
    lam = client("lambda", region=region)
    assert not [f for f in lam.list_functions()["Functions"] if f["FunctionName"].startswith(f"strata-{stage}-")]
