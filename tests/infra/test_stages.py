"""Two stages whose names are prefixes of each other: every command on one leaves the other untouched.

``dev`` and ``dev-x`` share the name prefix ``strata-dev-``; ``dev``'s node ``x-n1`` and ``dev-x``'s node ``n1``
would even share a name if IoT names were ``strata-{stage}-{node}``. Run against a moto server over HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3

from infra._deploy import apply, destroy, rollback
from infra._readback import DeployedFunctions
from infra._state import StateStore
from tests._services import MotoServer
from tests.infra.conftest import MakeConfig


def c(service: str) -> Any:
    return boto3.client(service, region_name="us-east-1")


def snapshot(stage: str, state_dir: Path) -> dict[str, Any]:
    """Everything AWS holds for `stage`, read through its recorded state (names, alias versions, certificates)."""
    lam, iot = c("lambda"), c("iot")
    state = StateStore(state_dir, stage).load()
    out: dict[str, Any] = {}
    for record in state.resources.values():
        if record.kind == "lambda_function":
            out[record.key] = lam.get_function_configuration(FunctionName=record.name)["CodeSha256"]
        elif record.kind == "lambda_alias":
            fn, alias = record.name.split(":")
            out[record.key] = lam.get_alias(FunctionName=fn, Name=alias)["FunctionVersion"]
        elif record.kind == "iot_policy":
            out[record.key] = json.loads(iot.get_policy(policyName=record.name)["policyDocument"])
        elif record.kind == "iot_thing":
            out[record.key] = iot.describe_thing(thingName=record.name)["attributes"]
        elif record.kind == "iot_certificate":
            arn = record.ids["certificate_arn"]
            desc = iot.describe_certificate(certificateId=record.ids["certificate_id"])["certificateDescription"]
            out[record.key] = (desc["status"], iot.list_principal_things(principal=arn)["things"],
                               [p["policyName"] for p in iot.list_attached_policies(target=arn)["policies"]])
        elif record.kind == "s3_bucket":
            out[record.key] = c("s3").head_bucket(Bucket=record.name)["ResponseMetadata"]["HTTPStatusCode"]
        elif record.kind == "iam_role":
            out[record.key] = c("iam").get_role(RoleName=record.name)["Role"]["Arn"]
        elif record.kind == "sqs_queue":
            out[record.key] = c("sqs").get_queue_url(QueueName=record.name)["QueueUrl"]
        elif record.kind == "lambda_event_invoke_config":
            fn, alias = record.name.split(":")
            got = lam.get_function_event_invoke_config(FunctionName=fn, Qualifier=alias)
            out[record.key] = got["DestinationConfig"]["OnFailure"]["Destination"]
    return out


def two_stages(make_config: MakeConfig, state_dir: Path) -> dict[str, Any]:
    """Apply ``dev`` (node x-n1) and ``dev-x`` (node n1), each twice so each alias has a version to go back to."""
    for stage, node in (("dev", "x-n1"), ("dev-x", "n1")):
        apply(make_config(stage=stage, edge_nodes=(node,)), state_dir=state_dir)
        apply(make_config(stage=stage, edge_nodes=(node,), memory_mb=640), state_dir=state_dir)
    other = snapshot("dev-x", state_dir)
    assert len(other) == 11 and other["lambda_alias/strata-dev-x-rollout:dev-x"] == "2"
    assert other["sqs_queue/strata-dev-x-rollout-failures"].endswith("/strata-dev-x-rollout-failures")
    assert other["iot_certificate/strata-dev-x_n1"] == ("ACTIVE", ["strata-dev-x_n1"], ["strata-dev-x_n1"])
    return other


def test_destroying_a_stage_leaves_the_stage_whose_name_it_prefixes_untouched(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    other = two_stages(make_config, state_dir)
    assert c("iot").describe_thing(thingName="strata-dev_x-n1")["attributes"]["strata_stage"] == "dev"
    done = destroy("dev", state_dir=state_dir)
    assert not any("dev-x" in s.name for s in done.steps), [s.key for s in done.steps]
    assert snapshot("dev-x", state_dir) == other
    names = [f["FunctionName"] for f in c("lambda").list_functions()["Functions"]]
    assert sorted(names) == ["strata-dev-x-ping", "strata-dev-x-rollout"]


def test_destroy_without_a_state_file_finds_only_its_own_stage_by_exact_names_and_tags(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    other = two_stages(make_config, state_dir)
    (state_dir / "dev.json").unlink()  # discovery only: exact names, thing attributes, function tags
    done = destroy("dev", state_dir=state_dir, config=make_config(stage="dev", edge_nodes=()))
    deleted = sorted(s.key for s in done.changes)
    assert "iot_thing/strata-dev_x-n1" in deleted and "iot_policy/strata-dev_x-n1" in deleted
    assert not any("dev-x" in key for key in deleted), deleted
    assert snapshot("dev-x", state_dir) == other
    assert [t["thingName"] for t in c("iot").list_things()["things"]] == ["strata-dev-x_n1"]


def test_rollback_of_a_stage_leaves_the_other_stage_untouched(aws_env: MotoServer, make_config: MakeConfig,
                                                              state_dir: Path) -> None:
    other = two_stages(make_config, state_dir)
    back = rollback("dev", state_dir=state_dir)
    assert sorted(s.name for s in back.steps) == ["strata-dev-ping:dev", "strata-dev-rollout:dev"]
    assert c("lambda").get_alias(FunctionName="strata-dev-rollout", Name="dev")["FunctionVersion"] == "1"
    assert snapshot("dev-x", state_dir) == other


def test_serving_a_stage_reads_back_only_its_own_functions(aws_env: MotoServer, make_config: MakeConfig,
                                                           state_dir: Path, tmp_path: Path) -> None:
    two_stages(make_config, state_dir)
    dev = DeployedFunctions(stage="dev", work_dir=tmp_path / "served")
    assert dev.names() == ["strata-dev-ping", "strata-dev-rollout"]
    assert dev.get("strata-dev-x-rollout") is None
    spec = dev.get("strata-dev-rollout")
    assert spec is not None and spec.environment["STRATA_STAGE"] == "dev"
