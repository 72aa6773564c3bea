"""strata never deploys to a region silently: every command names the region it acts in and why, and a stage stays
in the region its last apply deployed it to (moto server over HTTP, the real CLI in a subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from infra.aws import resolve_region
from tests._aws_cli import aws_json
from tests._cli import run_strata
from tests._services import MotoServer
from tests.infra.test_cli import flags


@pytest.fixture
def no_region(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No region anywhere: no variable, and config files that do not exist."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


def test_the_region_and_why(no_region: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert resolve_region(None) == ("us-east-1", "no --region, AWS_REGION or profile region set")
    assert resolve_region("eu-central-1") == ("eu-central-1", "--region")
    config = tmp_path / "config"
    config.write_text("[default]\nregion = ap-south-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert resolve_region(None) == ("ap-south-1", "the region of AWS profile 'default'")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-1")
    assert resolve_region(None) == ("us-west-1", "from AWS_DEFAULT_REGION")
    # botocore reads only AWS_DEFAULT_REGION; strata honours AWS_REGION too, first, as the AWS CLI v2 does.
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert resolve_region(None) == ("eu-west-1", "from AWS_REGION")


def test_every_command_announces_where_it_acts_and_a_stage_stays_in_its_region(
        aws_env: MotoServer, no_region: None, tmp_path: Path, cache_dir: Path, source_snapshot: Path) -> None:
    state = tmp_path / "state"
    base = flags(state, cache_dir, source_snapshot)
    r = run_strata("infra", "plan", *base)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == ("infra: planning stage 'smoke' in us-east-1 (no --region, AWS_REGION or "
                                        "profile region set)")
    r = run_strata("infra", "apply", *base, env={"AWS_REGION": "eu-west-1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "infra: deploying stage 'smoke' to eu-west-1 (from AWS_REGION)"
    s3 = boto3.client("s3", region_name="eu-west-1")
    bucket = next(b["Name"] for b in s3.list_buckets()["Buckets"] if b["Name"].startswith("strata-smoke-"))
    assert bucket.endswith("-eu-west-1")
    assert s3.get_bucket_location(Bucket=bucket)["LocationConstraint"] == "eu-west-1"
    assert aws_json(aws_env.url, "s3api", "get-bucket-location", "--bucket", bucket) == {
        "LocationConstraint": "eu-west-1"}
    assert json.loads((state / "smoke.json").read_text())["region"] == "eu-west-1"
    # Another region in the environment now: the stage is still where it is deployed, and the line says why.
    r = run_strata("infra", "apply", "--stage", "smoke", "--state-dir", str(state), env={"AWS_REGION": "us-west-2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == (f"infra: deploying stage 'smoke' to eu-west-1 (where the stage's last apply "
                                        f"deployed it, recorded in {(state / 'smoke.json').resolve()})")
    assert "apply: nothing to do" in r.stdout
    # Asking for another region explicitly would build a second copy there: refused, one line.
    r = run_strata("infra", "apply", "--stage", "smoke", "--state-dir", str(state), "--region", "us-west-2")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("strata infra apply: error: stage 'smoke' is deployed in eu-west-1 (")
    assert "but this run resolves region us-west-2 (--region); pass --region eu-west-1" in r.stderr
    r = run_strata("infra", "destroy", "--stage", "smoke", "--state-dir", str(state), "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("infra: destroying stage 'smoke' in eu-west-1 (where the stage's")
    assert not [b for b in s3.list_buckets()["Buckets"] if b["Name"] == bucket]
