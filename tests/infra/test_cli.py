"""Subprocess smoke tests of `strata infra ...` against the moto server, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import zipfile
from pathlib import Path

import boto3

from infra import DeployConfig, template
from tests._cli import STRATA, run_strata
from tests._services import MotoServer


def flags(state_dir: Path, cache_dir: Path, source_snapshot: Path, *extra: str) -> list[str]:
    return ["--stage", "smoke", "--state-dir", str(state_dir), "--cache-dir", str(cache_dir),
            "--source-dir", str(source_snapshot), *extra]


def test_plan_apply_apply_rollback_destroy(aws_env: MotoServer, tmp_path: Path, cache_dir: Path,
                                           source_snapshot: Path) -> None:
    state = tmp_path / "state"
    base = flags(state, cache_dir, source_snapshot)
    r = run_strata("infra", "plan", *base, "--edge-nodes", "n1", "--memory-mb", "256")
    assert r.returncode == 0, r.stderr
    assert "11 to create" in r.stdout and "+ lambda_function strata-smoke-rollout" in r.stdout
    r = run_strata("infra", "apply", *base, "--edge-nodes", "n1", "--memory-mb", "256")
    assert r.returncode == 0, r.stderr
    assert "apply: changed 11 resource(s)" in r.stdout
    creds = json.loads((state / "smoke" / "iot" / "n1" / "credentials.json").read_text())
    assert creds["node"] == "n1" and creds["kind"] == "strata-aws-iot-credentials"
    # No flags: the recorded config is reused, and nothing changes.
    r = run_strata("infra", "apply", "--stage", "smoke", "--state-dir", str(state))
    assert r.returncode == 0, r.stderr
    assert "apply: nothing to do" in r.stdout
    r = run_strata("infra", "apply", "--stage", "smoke", "--state-dir", str(state), "--memory-mb", "384")
    assert r.returncode == 0 and "target.memory_mb: 256 -> 384" in r.stdout, r.stdout + r.stderr
    r = run_strata("infra", "rollback", "--stage", "smoke", "--state-dir", str(state), "--yes")
    assert r.returncode == 0, r.stderr
    assert "rollback: version 2 -> 1" in r.stdout
    lam = boto3.client("lambda", region_name="us-east-1")
    assert lam.get_alias(FunctionName="strata-smoke-rollout", Name="smoke")["FunctionVersion"] == "1"
    r = run_strata("infra", "destroy", "--stage", "smoke", "--state-dir", str(state))  # stdin is not a terminal
    assert r.returncode == 2
    assert "strata infra: error: destroy --stage smoke: needs confirmation; pass --yes" in r.stderr
    r = run_strata("infra", "destroy", "--stage", "smoke", "--state-dir", str(state), "--yes")
    assert r.returncode == 0, r.stderr
    assert "destroy: deleted 11 resource(s)" in r.stdout
    assert lam.list_functions()["Functions"] == [] and not (state / "smoke.json").exists()


def test_a_bad_setting_is_one_clean_error_line(aws_env: MotoServer, tmp_path: Path) -> None:
    r = run_strata("infra", "plan", "--stage", "smoke", "--state-dir", str(tmp_path), "--timeout-s", "1200")
    assert r.returncode == 2
    assert re.search(r"^strata infra: error: DeployConfig.timeout_s=1200 is outside Lambda's range", r.stderr, re.M)
    assert "Traceback" not in r.stderr


def test_missing_credentials_are_one_clean_error_line(tmp_path: Path) -> None:
    from tests._services import free_port

    isolated = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
                "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                "AWS_DEFAULT_REGION": "us-east-1"}
    r = run_strata("infra", "plan", "--stage", "smoke", "--state-dir", str(tmp_path), env=isolated)
    assert r.returncode == 2
    assert "strata infra: error: plan: Unable to locate credentials; configure the standard AWS chain" in r.stderr
    assert "Traceback" not in r.stderr


def test_apply_dry_run_changes_nothing(aws_env: MotoServer, tmp_path: Path, cache_dir: Path,
                                       source_snapshot: Path) -> None:
    r = run_strata("infra", "apply", *flags(tmp_path / "state", cache_dir, source_snapshot), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would create s3_bucket strata-smoke-" in r.stdout and "apply: would change 8 resource(s)" in r.stdout
    assert boto3.client("lambda", region_name="us-east-1").list_functions()["Functions"] == []


def test_template_writes_a_cfn_lint_clean_template_and_the_zip(tmp_path: Path, cache_dir: Path,
                                                               source_snapshot: Path) -> None:
    out, zipped = tmp_path / "stack.json", tmp_path / "functions.zip"
    r = run_strata("infra", "template", "--stage", "prod", "--edge-nodes", "n1", "--out", str(out),
                   "--package", str(zipped), "--cache-dir", str(cache_dir), "--source-dir", str(source_snapshot))
    assert r.returncode == 0, r.stderr
    # The same template test_template.py lints with cfn-lint, for the zip that was written (CodeSha256).
    import base64
    import hashlib

    from infra._models import Artifact

    data = zipped.read_bytes()
    digest = hashlib.sha256(data)
    artifact = Artifact(path=zipped, sha256_b64=base64.b64encode(digest.digest()).decode(),
                        sha256_hex=digest.hexdigest(), zipped_bytes=len(data), unzipped_bytes=0)
    assert json.loads(out.read_text()) == template(DeployConfig(stage="prod", edge_nodes=("n1",)), artifact)
    with zipfile.ZipFile(zipped) as zf:
        assert "functions/_handlers.py" in zf.namelist()


def test_functions_serve_reads_the_deployment_back_through_infra(aws_env: MotoServer, tmp_path: Path,
                                                                 cache_dir: Path, source_snapshot: Path) -> None:
    state = tmp_path / "state"
    assert run_strata("infra", "apply", *flags(state, cache_dir, source_snapshot)).returncode == 0
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([STRATA, "functions", "serve", "--from-endpoint", aws_env.url, "--stage", "smoke",
                             "--port", "0", "--no-memory-limit"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TMPDIR": str(tmp)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        serving = json.loads(line)
        assert serving["functions"] == ["strata-smoke-ping", "strata-smoke-rollout"]
        lam = boto3.client("lambda", endpoint_url=serving["url"], region_name="us-east-1")
        r = lam.invoke(FunctionName="strata-smoke-ping", Qualifier="smoke", Payload=b'{"hello": 1}')
        assert json.loads(r["Payload"].read()) == {"ok": True, "echo": {"hello": 1}}
    finally:
        proc.terminate()
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == 0 and list(tmp.iterdir()) == []  # SIGTERM: the unpacked deployment is removed


def test_functions_serve_from_a_dead_endpoint_is_one_error_line(tmp_path: Path) -> None:
    from tests._services import free_port

    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "TMPDIR": str(tmp_path)}
    url = f"http://127.0.0.1:{free_port()}"
    r = run_strata("functions", "serve", "--from-endpoint", url, "--stage", "dev", "--port", "0", env=env)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"strata functions: error: stage dev: strata-dev-ping: cannot read the deployment "
                               f"from {url}")
    assert "check --from-endpoint and that the endpoint is running" in r.stderr
    assert not any(p.name.startswith("strata-deployed-") for p in tmp_path.iterdir())


def test_a_trusted_key_file_is_read_into_the_config(tmp_path: Path) -> None:
    from cloud.cli import build_parser
    from device import generate_keypair
    from infra._cli import _overrides

    # A real key: the value is parsed as an Ed25519 public key now (a truncated PEM is refused).
    _, pub = generate_keypair(tmp_path, name="signer")
    pem = pub.read_text()
    args = build_parser().parse_args(["infra", "plan", "--stage", "s", "--trusted-public-key",
                                      str(tmp_path / "signer.pub"), "--edge-nodes", "a", "b"])
    assert _overrides(args) == {"stage": "s", "trusted_public_key": pem, "edge_nodes": ("a", "b")}
