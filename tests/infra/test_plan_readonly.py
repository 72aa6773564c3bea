"""`plan` reads only (no pip, no zip written); apply builds; dry runs say "would". Against a moto server."""

from __future__ import annotations

import shutil
from pathlib import Path

import boto3

from infra._deploy import apply, plan
from infra._models import PENDING_CODE
from tests._cli import run_strata
from tests._services import MotoServer
from tests.infra.conftest import MakeConfig


def tree(path: Path) -> dict[str, int]:
    """Every file under `path` with its modification time (empty when `path` does not exist)."""
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*")} if path.exists() else {}


def test_plan_without_a_built_dependency_tree_runs_no_pip_and_writes_nothing(
        aws_env: MotoServer, make_config: MakeConfig, tmp_path: Path, state_dir: Path) -> None:
    cache = tmp_path / "never-built"
    config = make_config(requirements=("numpy",), cache_dir=str(cache))
    p = plan(config, state_dir=state_dir)
    fn = next(s for s in p.steps if s.name == "strata-test-rollout")
    assert fn.action == "create" and fn.resource is not None
    assert fn.resource.attributes()["code_sha256"] == PENDING_CODE
    assert 'code_sha256: (absent) -> "(built by apply)"' not in p.render()  # a create lists no fields
    assert not cache.exists() and not state_dir.exists()


def test_plan_knows_the_exact_code_hash_without_writing_and_apply_deploys_that_hash(
        aws_env: MotoServer, make_config: MakeConfig, tmp_path: Path, state_dir: Path,
        source_snapshot: Path) -> None:
    sources = tmp_path / "sources"
    shutil.copytree(source_snapshot, sources)
    config = make_config(source_dir=str(sources))
    planned = next(s for s in plan(config, state_dir=state_dir).steps if s.name == "strata-test-rollout")
    assert not state_dir.exists()  # no zip, no state
    apply(config, state_dir=state_dir)
    live = boto3.client("lambda", region_name="us-east-1").get_function_configuration(
        FunctionName="strata-test-rollout")
    assert planned.resource is not None and planned.resource.attributes()["code_sha256"] == live["CodeSha256"]
    assert plan(config, state_dir=state_dir).changes == ()
    # A changed source shows as a code change, and planning it still writes nothing.
    (sources / "functions" / "_handlers.py").write_text((sources / "functions" / "_handlers.py").read_text()
                                                        + "\n# changed\n")
    before = tree(state_dir)
    step = next(s for s in plan(config, state_dir=state_dir).steps if s.name == "strata-test-rollout")
    assert [c.field for c in step.changes] == ["code_sha256"] and step.changes[0].live == live["CodeSha256"]
    assert tree(state_dir) == before


def test_destroy_dry_run_says_would_delete_and_deletes_nothing(
        aws_env: MotoServer, tmp_path: Path, cache_dir: Path, source_snapshot: Path) -> None:
    state = tmp_path / "state"
    base = ["--stage", "dry", "--state-dir", str(state), "--cache-dir", str(cache_dir), "--source-dir",
            str(source_snapshot)]
    assert run_strata("infra", "apply", *base).returncode == 0
    r = run_strata("infra", "destroy", "--stage", "dry", "--state-dir", str(state), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would delete lambda_function strata-dry-rollout" in r.stdout
    assert "destroy: would delete 8 resource(s)" in r.stdout and "deleted" not in r.stdout.replace(
        "would delete", "")
    names = [f["FunctionName"] for f in boto3.client("lambda", region_name="us-east-1").list_functions()["Functions"]]
    assert sorted(names) == ["strata-dry-ping", "strata-dry-rollout"] and (state / "dry.json").exists()
