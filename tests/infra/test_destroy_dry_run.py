"""`destroy --dry-run` lists exactly what `destroy` deletes, with the state file and without it (moto over HTTP)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import boto3

from infra._deploy import apply, destroy, destroy_plan
from infra._plan import Step
from tests._aws_cli import aws_json
from tests._cli import run_strata
from tests._services import MotoServer
from tests.infra.conftest import MakeConfig
from tests.infra.test_cli import flags


def would_delete(plan: Any) -> set[str]:
    return {s.key for s in plan.steps if s.action == "delete"}


def destroyed(stage: str, state_dir: Path, **kwargs: Any) -> set[str]:
    """What a real destroy deletes, step by step as it does it."""
    deleted: list[str] = []

    def note(step: Step) -> None:
        if step.action == "delete":
            deleted.append(step.key)

    destroy(stage, state_dir=state_dir, after_step=note, **kwargs)
    return set(deleted)


def certificates() -> set[str]:
    iot = boto3.client("iot", region_name="us-east-1")
    return {c["certificateId"] for c in iot.list_certificates()["certificates"]}


def test_the_dry_run_is_the_destroy_with_and_without_the_state_file(aws_env: MotoServer, make_config: MakeConfig,
                                                                      state_dir: Path) -> None:
    config = make_config()
    apply(config, state_dir=state_dir)
    with_state = would_delete(destroy_plan("test", state_dir=state_dir))
    assert {k for k in with_state if k.startswith("iot_certificate/")} == {
        "iot_certificate/strata-test_node-a", "iot_certificate/strata-test_node-b"}
    (state_dir / "test.json").rename(state_dir / "kept.json")
    lost = make_config(edge_nodes=())  # without the state file the nodes are not known: they are found
    without_state = would_delete(destroy_plan("test", state_dir=state_dir, config=lost))
    assert without_state == with_state and len(with_state) == 14
    (state_dir / "kept.json").rename(state_dir / "test.json")
    assert destroyed("test", state_dir) == with_state
    assert certificates() == set()

    apply(config, state_dir=state_dir)
    (state_dir / "test.json").unlink()
    planned = would_delete(destroy_plan("test", state_dir=state_dir, config=lost))
    assert planned == with_state
    assert destroyed("test", state_dir, config=lost) == planned
    assert certificates() == set()


def test_a_certificate_attached_outside_strata_is_listed_and_deleted_too(aws_env: MotoServer, make_config: MakeConfig,
                                                                         state_dir: Path) -> None:
    apply(make_config(edge_nodes=("node-a",)), state_dir=state_dir)
    iot = boto3.client("iot", region_name="us-east-1")
    extra = iot.create_keys_and_certificate(setAsActive=True)
    iot.attach_thing_principal(thingName="strata-test_node-a", principal=extra["certificateArn"])
    planned = destroy_plan("test", state_dir=state_dir)
    assert f"iot_certificate/strata-test_node-a#{extra['certificateId']}" in would_delete(planned)
    assert destroyed("test", state_dir) == would_delete(planned)
    assert certificates() == set()


def test_the_cli_dry_run_prints_what_destroy_then_deletes(aws_env: MotoServer, tmp_path: Path, cache_dir: Path,
                                                          source_snapshot: Path) -> None:
    state = tmp_path / "state"
    r = run_strata("infra", "apply", *flags(state, cache_dir, source_snapshot, "--edge-nodes", "n1", "n2"))
    assert r.returncode == 0, r.stderr
    (state / "smoke.json").unlink()  # the state file is lost; the IoT certificates must still be listed
    dry = run_strata("infra", "destroy", "--stage", "smoke", "--state-dir", str(state), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    listed = set(re.findall(r"^would delete (\S+ \S+)$", dry.stdout, re.M))
    assert {"iot_certificate strata-smoke_n1", "iot_certificate strata-smoke_n2"} <= listed
    # as the AWS CLI sees the account: every certificate there is one the dry run lists
    live = aws_json(aws_env.url, "iot", "list-certificates")["certificates"]
    assert len(live) == sum(1 for item in listed if item.startswith("iot_certificate ")) == 2
    real = run_strata("infra", "destroy", "--stage", "smoke", "--state-dir", str(state), "--yes")
    assert real.returncode == 0, real.stderr
    assert set(re.findall(r"^done: delete (\S+ \S+)$", real.stdout, re.M)) == listed
    assert f"destroy: would delete {len(listed)} resource(s)" in dry.stdout
    assert f"destroy: deleted {len(listed)} resource(s)" in real.stdout
    assert certificates() == set() and aws_json(aws_env.url, "iot", "list-certificates")["certificates"] == []
