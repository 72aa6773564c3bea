"""plan / apply / apply again / drift / rollback / destroy against a moto server over HTTP, with real boto3."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra._deploy import apply, destroy, destroy_plan, plan, rollback, rollback_plan
from infra._errors import AwsCallError, StateError, UnknownResourceKindError
from infra._executor import OPERATIONS, DryRunExecutor, operations_for
from infra._live import READERS, reader_for
from infra._models import KIND_ORDER
from infra._plan import Step
from infra._state import SCHEMA_VERSION, StateStore
from infra._template import WRITERS, writer_for
from tests._services import MotoServer
from tests.infra.conftest import MakeConfig

ALL_KINDS = {"s3_bucket", "sqs_queue", "iam_role", "lambda_function", "lambda_alias", "lambda_event_invoke_config",
             "iot_policy", "iot_thing", "iot_certificate"}


def c(service: str) -> Any:
    return boto3.client(service, region_name="us-east-1")


def steps_by_key(p: Any) -> dict[str, Step]:
    return {s.key: s for s in p.steps}


def leftovers() -> dict[str, list[str]]:
    """Everything strata could have left behind in the account."""
    iot, lam, iam, s3 = c("iot"), c("lambda"), c("iam"), c("s3")
    return {
        "buckets": [b["Name"] for b in s3.list_buckets().get("Buckets", [])],
        "functions": [f["FunctionName"] for f in lam.list_functions()["Functions"]],
        "roles": [r["RoleName"] for r in iam.list_roles()["Roles"]],
        "things": [t["thingName"] for t in iot.list_things()["things"]],
        "certificates": [x["certificateId"] for x in iot.list_certificates()["certificates"]],
        "policies": [p["policyName"] for p in iot.list_policies()["policies"]],
        "queues": c("sqs").list_queues().get("QueueUrls", []),
    }


def test_every_kind_is_registered_everywhere() -> None:
    assert set(KIND_ORDER) == ALL_KINDS == set(READERS) == set(OPERATIONS) == set(WRITERS)


@pytest.mark.parametrize("lookup", [reader_for, operations_for, writer_for])
def test_an_unknown_kind_raises_instead_of_being_skipped(lookup: Any) -> None:
    with pytest.raises(UnknownResourceKindError, match=re.escape("resource kind 'sns_topic'")):
        lookup("sns_topic")


def test_plan_on_an_empty_account_creates_everything_in_dependency_order(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    p = plan(make_config(), state_dir=state_dir)
    assert [s.action for s in p.steps] == ["create"] * len(p.steps)
    kinds = [s.kind for s in p.steps]
    assert kinds == sorted(kinds, key=KIND_ORDER.index)
    assert kinds.count("iot_certificate") == 2 and kinds.count("lambda_function") == 2
    assert "14 to create, 0 to update, 0 to delete, 0 unchanged" in p.render()
    assert not state_dir.joinpath("test.json").exists()  # planning records nothing
    assert leftovers()["buckets"] == []  # and creates nothing


def test_apply_is_idempotent_and_records_a_versioned_state(aws_env: MotoServer, make_config: MakeConfig,
                                                           state_dir: Path) -> None:
    config = make_config()
    first = apply(config, state_dir=state_dir)
    assert len(first.changes) == 14
    again = apply(config, state_dir=state_dir)
    assert again.changes == ()
    assert "No changes" in again.render()
    state = json.loads((state_dir / "test.json").read_text())
    assert state["schema_version"] == SCHEMA_VERSION
    assert state["config"]["edge_nodes"] == ["node-a", "node-b"]
    assert len(state["resources"]) == 14
    fn = c("lambda").get_function(FunctionName="strata-test-rollout")
    assert fn["Configuration"]["MemorySize"] == 512 and fn["Configuration"]["Timeout"] == 30
    assert fn["Configuration"]["Handler"] == "functions._handlers.rollout_handler"
    assert fn["Concurrency"]["ReservedConcurrentExecutions"] == 5
    env = fn["Configuration"]["Environment"]["Variables"]
    assert env["STRATA_STAGE"] == "test" and env["STRATA_RESULT_BUCKET"].startswith("strata-test-")
    alias = c("lambda").get_alias(FunctionName="strata-test-rollout", Name="test")
    assert alias["FunctionVersion"] == "1"


def test_drift_made_outside_strata_shows_in_the_plan_and_apply_repairs_it(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    config = make_config()
    apply(config, state_dir=state_dir)
    c("lambda").update_function_configuration(FunctionName="strata-test-rollout", MemorySize=2048)
    bucket = c("s3").list_buckets()["Buckets"][0]["Name"]
    c("s3").put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": "strata:stage", "Value": "test"}]})
    p = plan(config, state_dir=state_dir)
    steps = steps_by_key(p)
    fn = steps["lambda_function/strata-test-rollout"]
    assert fn.action == "update"
    assert [(ch.field, ch.live, ch.desired, ch.drift) for ch in fn.changes] == [("memory_mb", 2048, 512, True)]
    tag = steps[f"s3_bucket/{bucket}"].changes
    assert [(ch.field, ch.desired, ch.drift) for ch in tag] == [("tags.strata:managed-by", "strata", True)]
    text = p.render()
    assert "memory_mb: 2048 -> 512   <- drift: changed outside strata (strata applied 512)" in text
    assert 'tags.strata:managed-by: (absent) -> "strata"   <- drift' in text
    apply(config, state_dir=state_dir)
    assert plan(config, state_dir=state_dir).changes == ()


def test_a_resource_deleted_outside_strata_is_recreated(aws_env: MotoServer, make_config: MakeConfig,
                                                        state_dir: Path) -> None:
    config = make_config()
    apply(config, state_dir=state_dir)
    c("lambda").delete_function(FunctionName="strata-test-ping")
    step = steps_by_key(plan(config, state_dir=state_dir))["lambda_function/strata-test-ping"]
    assert step.action == "create" and "deleted outside strata" in step.note
    apply(config, state_dir=state_dir)
    assert plan(config, state_dir=state_dir).changes == ()


def test_a_config_change_publishes_a_version_and_rollback_moves_the_alias_back(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    apply(make_config(), state_dir=state_dir)
    with pytest.raises(StateError, match=re.escape("no alias of stage 'test' has an earlier version")):
        rollback_plan("test", state_dir=state_dir)
    bigger = make_config(memory_mb=1024)
    p = apply(bigger, state_dir=state_dir)
    assert steps_by_key(p)["lambda_alias/strata-test-rollout:test"].action == "update"
    lam = c("lambda")
    assert lam.get_alias(FunctionName="strata-test-rollout", Name="test")["FunctionVersion"] == "2"
    back = rollback("test", state_dir=state_dir)
    assert [s.note for s in back.steps] == ["rollback: version 2 -> 1", "rollback: version 2 -> 1"]
    assert lam.get_alias(FunctionName="strata-test-rollout", Name="test")["FunctionVersion"] == "1"
    # $LATEST keeps the new configuration; the plan says apply would move the alias forward again.
    forward = steps_by_key(plan(bigger, state_dir=state_dir))["lambda_alias/strata-test-rollout:test"]
    assert [(ch.field, ch.live, ch.desired) for ch in forward.changes] == [("target.memory_mb", 512, 1024)]
    apply(bigger, state_dir=state_dir)
    assert lam.get_alias(FunctionName="strata-test-rollout", Name="test")["FunctionVersion"] == "2"
    assert plan(bigger, state_dir=state_dir).changes == ()


def test_a_failed_apply_completes_when_run_again(aws_env: MotoServer, make_config: MakeConfig,
                                                 state_dir: Path) -> None:
    config = make_config()
    done: list[str] = []

    def crash_after_three(step: Step) -> None:
        done.append(step.key)
        if len(done) == 3:
            raise KeyboardInterrupt("simulated crash mid-apply")

    with pytest.raises(KeyboardInterrupt):
        apply(config, state_dir=state_dir, after_step=crash_after_three)
    assert len(StateStore(state_dir, "test").load().resources) == 3
    resumed = apply(config, state_dir=state_dir)
    assert len(resumed.changes) == 11  # only what was not done yet
    assert plan(config, state_dir=state_dir).changes == ()


def test_an_aws_error_names_the_step_and_says_to_rerun(aws_env: MotoServer, make_config: MakeConfig,
                                                       state_dir: Path) -> None:
    config = make_config()
    apply(config, state_dir=state_dir)
    # Break the next step from outside: the function vanishes between plan and execute.
    p = plan(make_config(memory_mb=640), state_dir=state_dir)
    c("lambda").delete_function(FunctionName="strata-test-rollout")
    from infra._executor import AwsExecutor
    from infra.aws import Clients

    ex = AwsExecutor(Clients(), state_dir=state_dir, stage="test")
    step = steps_by_key(p)["lambda_function/strata-test-rollout"]
    with pytest.raises(AwsCallError, match=re.escape("update lambda_function/strata-test-rollout failed:")):
        ex.execute(step)


def test_dry_run_prints_and_changes_nothing(aws_env: MotoServer, make_config: MakeConfig, state_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    apply(make_config(), state_dir=state_dir, executor=DryRunExecutor(sys.stdout))
    out = capsys.readouterr().out
    assert "would create lambda_function strata-test-rollout" in out
    assert leftovers()["functions"] == [] and not (state_dir / "test.json").exists()


def test_the_execution_role_is_least_privilege(aws_env: MotoServer, make_config: MakeConfig,
                                               state_dir: Path) -> None:
    apply(make_config(), state_dir=state_dir)
    iam = c("iam")
    doc = iam.get_role_policy(RoleName="strata-test-lambda", PolicyName="strata-test-lambda-access")["PolicyDocument"]
    bucket = c("s3").list_buckets()["Buckets"][0]["Name"]
    for statement in doc["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert all("*" not in a for a in actions), actions
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        groups = [f"arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/strata-test-{f}" for f in
                  ("rollout", "ping")]
        for resource in resources:  # exact names: no strata-test-* that would cover stage test-x's logs
            assert resource in (f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*", *groups,
                                *(f"{g}:log-stream:*" for g in groups),
                                "arn:aws:sqs:us-east-1:123456789012:strata-test-rollout-failures"), resource
    assert iam.list_attached_role_policies(RoleName="strata-test-lambda")["AttachedPolicies"] == []


def test_each_node_gets_a_thing_a_certificate_and_a_policy_scoped_to_its_stage(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    from edge._topics import FleetTopics

    apply(make_config(), state_dir=state_dir)
    iot = c("iot")
    doc = json.loads(iot.get_policy(policyName="strata-test_node-a")["policyDocument"])
    by_action = {s["Action"]: s["Resource"] for s in doc["Statement"]}
    arn = "arn:aws:iot:us-east-1:123456789012"
    topics = FleetTopics("test.lab")  # the stage's MQTT fleet: {stage}.{fleet}
    assert by_action["iot:Connect"] == [f"{arn}:client/test.lab.node-a", f"{arn}:client/test.lab.node-a.device.*",
                                        f"{arn}:client/test.lab.node-a.gateway"]
    assert f"{arn}:topic/{topics.node('node-a', 'status')}" in by_action["iot:RetainPublish"]
    assert f"{arn}:topic/{topics.node('node-a', 'telemetry')}" not in by_action["iot:RetainPublish"]
    readable = by_action["iot:Receive"]
    for topic in (topics.announce, topics.control, topics.node("node-a", "control")):
        assert f"{arn}:topic/{topic}" in readable
    assert f"{arn}:topic/{topics.root}/policies/*/latest" in readable
    assert not any("node-b" in r for rs in by_action.values() for r in rs)

    record = StateStore(state_dir, "test").load().get("iot_certificate", "strata-test_node-a")
    assert record is not None
    creds_path = Path(record.ids["credentials_file"])
    creds = json.loads(creds_path.read_text())
    assert stat.S_IMODE(creds_path.stat().st_mode) == 0o600
    assert creds["endpoint"].endswith("-ats.iot.us-east-1.amazonaws.com")  # moto makes up a new one per call
    assert creds["client_id"] == "test.lab.node-a" and creds["fleet"] == "test.lab" and creds["port"] == 8883
    assert "BEGIN RSA PRIVATE KEY" in creds["private_key_pem"] or "PRIVATE KEY" in creds["private_key_pem"]
    assert creds["certificate_file"] == "certificate.pem.crt"  # relative to the credentials file's folder
    assert (creds_path.parent / creds["certificate_file"]).read_text() == creds["certificate_pem"]
    cert_arn = creds["certificate_arn"]
    assert iot.list_principal_things(principal=cert_arn)["things"] == ["strata-test_node-a"]
    assert [p["policyName"] for p in iot.list_attached_policies(target=cert_arn)["policies"]] == [
        "strata-test_node-a"]


def test_removing_a_node_from_the_config_deletes_its_resources(aws_env: MotoServer, make_config: MakeConfig,
                                                               state_dir: Path) -> None:
    apply(make_config(), state_dir=state_dir)
    p = apply(make_config(edge_nodes=("node-a",)), state_dir=state_dir)
    assert sorted(s.kind for s in p.changes) == ["iot_certificate", "iot_policy", "iot_thing"]
    assert all(s.action == "delete" for s in p.changes)
    assert leftovers()["things"] == ["strata-test_node-a"] and len(leftovers()["certificates"]) == 1


def test_destroy_leaves_nothing_behind_even_a_versioned_non_empty_bucket(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    apply(make_config(), state_dir=state_dir)
    apply(make_config(memory_mb=1024), state_dir=state_dir)  # a second version and alias move
    s3 = c("s3")
    bucket = s3.list_buckets()["Buckets"][0]["Name"]
    for body in (b"one", b"two"):  # two versions of one key, then a delete marker
        s3.put_object(Bucket=bucket, Key="rollouts/r-1/000000.bin", Body=body)
    s3.delete_object(Bucket=bucket, Key="rollouts/r-1/000000.bin")
    s3.put_object(Bucket=bucket, Key="bundles/cartpole/000000001.bundle", Body=b"x")
    p = destroy_plan("test", state_dir=state_dir)
    assert len(p.changes) == 14 and all(s.action == "delete" for s in p.changes)
    destroy("test", state_dir=state_dir)
    assert leftovers() == {"buckets": [], "functions": [], "roles": [], "things": [], "certificates": [],
                           "policies": [], "queues": []}
    assert not (state_dir / "test.json").exists() and not (state_dir / "test").exists()  # credentials too
    assert destroy_plan("test", state_dir=state_dir).changes == ()


def test_destroy_finds_resources_by_name_when_the_state_file_is_lost(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    apply(make_config(), state_dir=state_dir)
    (state_dir / "test.json").unlink()
    destroy("test", state_dir=state_dir, config=make_config(edge_nodes=()))
    assert leftovers() == {"buckets": [], "functions": [], "roles": [], "things": [], "certificates": [],
                           "policies": [], "queues": []}


def test_a_state_file_from_a_newer_strata_is_refused(state_dir: Path) -> None:
    state_dir.mkdir(parents=True)
    (state_dir / "dev.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "stage": "dev"}))
    with pytest.raises(StateError, match=re.escape(f"has schema_version={SCHEMA_VERSION + 1}, newer than this "
                                                   f"strata's {SCHEMA_VERSION}; upgrade strata")):
        StateStore(state_dir, "dev").load()


def test_the_state_file_is_replaced_atomically(state_dir: Path) -> None:
    store = StateStore(state_dir, "dev")
    state = store.load()
    store.save(state)
    store.save(state)
    assert sorted(p.name for p in state_dir.iterdir()) == ["dev.json"]  # no temp files left
    assert json.loads((state_dir / "dev.json").read_text())["schema_version"] == SCHEMA_VERSION


def test_a_recorded_kind_this_strata_does_not_know_stops_the_plan(aws_env: MotoServer, make_config: MakeConfig,
                                                                  state_dir: Path) -> None:
    from infra._state import Record

    store = StateStore(state_dir, "test")
    state = store.load()
    state.put(Record(kind="sns_topic", name="q", attributes={}, ids={}))
    store.save(state)
    with pytest.raises(UnknownResourceKindError, match=re.escape("reader_for: no reader for resource kind "
                                                                 "'sns_topic'")):
        plan(make_config(), state_dir=state_dir)


def test_plans_are_frozen_records(aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    import dataclasses

    p = plan(make_config(edge_nodes=()), state_dir=state_dir)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.steps[0].action = "delete"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.steps = ()  # type: ignore[misc]


def test_a_lost_credentials_file_shows_in_the_plan_and_apply_issues_a_new_certificate(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    config = make_config(edge_nodes=("node-a",))
    apply(config, state_dir=state_dir)
    old = StateStore(state_dir, "test").load().get("iot_certificate", "strata-test_node-a")
    assert old is not None
    Path(old.ids["credentials_file"]).unlink()
    step = steps_by_key(plan(config, state_dir=state_dir))["iot_certificate/strata-test_node-a"]
    assert [(ch.field, ch.live, ch.desired, ch.drift) for ch in step.changes] == [
        ("credentials_file", "missing", "present", True)]
    apply(config, state_dir=state_dir)
    new = StateStore(state_dir, "test").load().get("iot_certificate", "strata-test_node-a")
    assert new is not None and new.ids["certificate_id"] != old.ids["certificate_id"]
    assert Path(new.ids["credentials_file"]).is_file()
    assert [x["certificateId"] for x in c("iot").list_certificates()["certificates"]] == [new.ids["certificate_id"]]
    assert plan(config, state_dir=state_dir).changes == ()


def test_the_bucket_is_encrypted_by_default_and_its_tls_only_policy_round_trips(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    from infra._executor import AwsExecutor, _configure_bucket
    from infra._live import read_bucket
    from infra._models import Bucket, desired_resources
    from infra.aws import Clients

    config = make_config(edge_nodes=())
    p = apply(config, state_dir=state_dir)
    s3 = c("s3")
    bucket = s3.list_buckets()["Buckets"][0]["Name"]
    rules = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    # moto is plain HTTP: the policy would refuse strata's own requests, so the plan says it is left out.
    assert "no TLS-only bucket policy: S3 is reached over plain HTTP" in steps_by_key(p)[f"s3_bucket/{bucket}"].note
    # On AWS (HTTPS) the bucket carries it; the executor writes it and the reader reads the same thing back.
    model = next(r for r in desired_resources(config, account="123456789012", region="us-east-1", artifacts=None)
                 if isinstance(r, Bucket))
    assert model.policy is not None
    (statement,) = model.policy["Statement"]
    assert (statement["Effect"], statement["Principal"], statement["Action"]) == ("Deny", "*", "s3:*")
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert sorted(statement["Resource"]) == [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]
    aws = Clients()
    _configure_bucket(AwsExecutor(aws, state_dir=state_dir, stage="test"), model)
    try:
        live = read_bucket(aws, bucket, None)
        assert live is not None and live.attributes == model.attributes()  # a plan on AWS shows no change
        from botocore.exceptions import ClientError

        with pytest.raises(ClientError, match=r"\(403\)|AccessDenied"):  # plain HTTP is refused
            s3.put_object(Bucket=bucket, Key="x", Body=b"x")
    finally:
        s3.delete_bucket_policy(Bucket=bucket)
