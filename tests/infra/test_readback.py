"""The deployed zip runs: read the deployment back from moto (config + code) and invoke it locally."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from infra._deploy import apply
from infra._errors import InfraError
from infra._readback import DeployedFunctions, read_back
from infra._state import StateStore
from tests._services import MotoServer
from tests.infra.conftest import MakeConfig

EVENT = {"rollout_id": "r-deployed-1", "env": {"id": "CartPole-v1"}, "steps": 8, "policy": {"kind": "random"}}


def test_the_deployed_zip_is_read_back_verified_and_its_handler_runs(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path, tmp_path: Path) -> None:
    apply(make_config(edge_nodes=()), state_dir=state_dir)
    code = read_back("strata-test-rollout", qualifier="test", work_dir=tmp_path / "deployed")
    assert code.version == "1" and code.aliases == {"test": "1"}
    assert code.configuration["Handler"] == "functions._handlers.rollout_handler"
    assert (code.code_dir / "functions" / "_handlers.py").is_file()
    # Run the handler from the unpacked zip (not the source tree) in a clean interpreter.
    script = ("import json, sys, functions; from functions._handlers import rollout_handler; "
              "result = rollout_handler(json.loads(sys.argv[1]), None); "
              "print(json.dumps({'file': functions.__file__, 'result': result}))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script, json.dumps(EVENT)], cwd=code.code_dir, capture_output=True,
                          text=True, timeout=120, env={**env, "PYTHONPATH": str(code.code_dir),
                                                       **code.configuration["Environment"]["Variables"]})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(code.code_dir))
    assert out["result"]["ok"] is True and out["result"]["transitions"] == 8


def test_a_zip_that_does_not_match_codesha256_is_refused(aws_env: MotoServer, make_config: MakeConfig,
                                                         state_dir: Path, tmp_path: Path) -> None:
    apply(make_config(edge_nodes=()), state_dir=state_dir)
    record = StateStore(state_dir, "test").load().get("s3_bucket", next(
        r.name for r in StateStore(state_dir, "test").load().resources.values() if r.kind == "s3_bucket"))
    assert record is not None
    s3 = boto3.client("s3", region_name="us-east-1")
    key = next(o["Key"] for o in s3.list_objects_v2(Bucket=record.name)["Contents"])
    s3.put_object(Bucket=record.name, Key=key, Body=b"not the deployed zip")
    with pytest.raises(InfraError, match=re.escape("read_back('strata-test-rollout'): the downloaded zip has sha256")):
        read_back("strata-test-rollout", work_dir=tmp_path)


def test_the_local_runtime_serves_the_deployment_read_back_from_moto(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path, tmp_path: Path) -> None:
    from functions._runtime import LocalRuntime, RuntimeConfig

    apply(make_config(edge_nodes=()), state_dir=state_dir)
    source = DeployedFunctions(stage="test", endpoint_url=aws_env.url, work_dir=tmp_path)
    assert source.names() == ["strata-test-ping", "strata-test-rollout"]
    assert source.get("strata-other-rollout") is None
    spec = source.get("strata-test-rollout")
    assert spec is not None and spec.memory_mb == 512 and spec.timeout_s == 30 and spec.aliases == {"test": "1"}
    assert spec.code_dir is not None and Path(spec.code_dir).is_relative_to(tmp_path)
    runtime = LocalRuntime(source, config=RuntimeConfig(port=0, enforce_memory=False)).start()
    try:
        lam = boto3.client("lambda", endpoint_url=runtime.url, region_name="us-east-1")
        r = lam.invoke(FunctionName="strata-test-rollout", Qualifier="test", Payload=json.dumps(EVENT).encode())
        assert "FunctionError" not in r
        result = json.loads(r["Payload"].read())
        assert result["ok"] is True and result["rollout_id"] == "r-deployed-1" and result["transitions"] == 8
        assert r["ExecutedVersion"] == "1"
    finally:
        runtime.stop()


def test_a_served_deployment_serves_every_version_and_follows_apply_and_rollback_without_a_restart(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path, tmp_path: Path,
        source_snapshot: Path) -> None:
    import shutil

    from functions._runtime import LocalRuntime, RuntimeConfig
    from infra._deploy import rollback

    sources = tmp_path / "sources"
    shutil.copytree(source_snapshot, sources)
    handlers = sources / "functions" / "_handlers.py"
    config = make_config(edge_nodes=(), source_dir=str(sources))
    apply(config, state_dir=state_dir)  # version 1: ping answers {"ok": true, "echo": ...}
    source = DeployedFunctions(stage="test", endpoint_url=aws_env.url)
    runtime = LocalRuntime(source, config=RuntimeConfig(port=0, enforce_memory=False)).start()
    try:
        lam = boto3.client("lambda", endpoint_url=runtime.url, region_name="us-east-1")

        def ping(**kwargs: str) -> tuple[str, dict[str, object]]:
            r = lam.invoke(FunctionName="strata-test-ping", Payload=b'{"n": 1}', **kwargs)
            assert "FunctionError" not in r, r["Payload"].read()
            return r["ExecutedVersion"], json.loads(r["Payload"].read())

        assert ping(Qualifier="test") == ("1", {"ok": True, "echo": {"n": 1}})
        # New code, applied while the server runs: version 2 behind the alias, $LATEST the newest code.
        handlers.write_text(handlers.read_text().replace('return {"ok": True, "echo": event}',
                                                         'return {"ok": True, "echo": event, "v": 2}'))
        apply(config, state_dir=state_dir)
        assert ping(Qualifier="test") == ("2", {"ok": True, "echo": {"n": 1}, "v": 2})
        assert ping() == ("$LATEST", {"ok": True, "echo": {"n": 1}, "v": 2})
        assert ping(Qualifier="1") == ("1", {"ok": True, "echo": {"n": 1}})  # every published version
        rollback("test", state_dir=state_dir)
        assert ping(Qualifier="test") == ("1", {"ok": True, "echo": {"n": 1}})  # no restart needed
        assert ping() == ("$LATEST", {"ok": True, "echo": {"n": 1}, "v": 2})
        versions = lam.list_versions_by_function(FunctionName="strata-test-ping")["Versions"]
        assert [v["Version"] for v in versions] == ["$LATEST", "1", "2"]
        assert len({v["CodeSha256"] for v in versions}) == 2
    finally:
        runtime.stop()
        source.close()
    assert not source.work_dir.exists()  # the unpacked trees are gone
