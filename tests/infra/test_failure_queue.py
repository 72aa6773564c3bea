"""Failed async rollouts have somewhere to go: an on-failure SQS queue made and destroyed with the stage.

Against a moto server over HTTP, read back with boto3 and with the AWS CLI; then the deployment is served by the
local runtime, which sends a failed Event invocation of the stage alias to that same queue.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import boto3

from infra._deploy import apply, destroy, plan
from infra._models import ASYNC_MAX_EVENT_AGE_S, ASYNC_RETRIES, DEFAULT_ROLLOUT_CONCURRENCY, DeployConfig
from infra._readback import DeployedFunctions
from tests._aws_cli import aws, aws_json
from tests._services import MotoServer
from tests.infra.conftest import MakeConfig

QUEUE = "strata-test-rollout-failures"
QUEUE_ARN = f"arn:aws:sqs:us-east-1:123456789012:{QUEUE}"


def c(service: str) -> Any:
    return boto3.client(service, region_name="us-east-1")


def test_apply_makes_the_queue_and_the_alias_destination_and_destroy_removes_them(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    apply(make_config(edge_nodes=()), state_dir=state_dir)
    url = c("sqs").get_queue_url(QueueName=QUEUE)["QueueUrl"]
    attrs = aws_json(aws_env.url, "sqs", "get-queue-attributes", "--queue-url", url, "--attribute-names", "All")
    assert attrs["Attributes"]["QueueArn"] == QUEUE_ARN
    assert attrs["Attributes"]["MessageRetentionPeriod"] == str(14 * 24 * 3600)
    assert attrs["Attributes"]["SqsManagedSseEnabled"] == "true"
    assert c("sqs").list_queue_tags(QueueUrl=url)["Tags"] == {"strata:stage": "test", "strata:managed-by": "strata"}
    config = aws_json(aws_env.url, "lambda", "get-function-event-invoke-config", "--function-name",
                      "strata-test-rollout", "--qualifier", "test")
    assert config["DestinationConfig"]["OnFailure"]["Destination"] == QUEUE_ARN
    assert (config["MaximumRetryAttempts"], config["MaximumEventAgeInSeconds"]) == (ASYNC_RETRIES,
                                                                                     ASYNC_MAX_EVENT_AGE_S)
    role = c("iam").get_role_policy(RoleName="strata-test-lambda", PolicyName="strata-test-lambda-access")
    grants = {s["Sid"]: s for s in role["PolicyDocument"]["Statement"]}
    assert (grants["RolloutFailureQueue"]["Action"], grants["RolloutFailureQueue"]["Resource"]) == (
        "sqs:SendMessage", QUEUE_ARN)
    assert plan(make_config(edge_nodes=()), state_dir=state_dir).changes == ()  # read back as applied
    destroy("test", state_dir=state_dir)
    assert c("sqs").list_queues().get("QueueUrls", []) == []
    gone = aws(aws_env.url, "lambda", "get-function-event-invoke-config", "--function-name", "strata-test-rollout",
               check=False)
    assert gone.returncode != 0 and "ResourceNotFoundException" in gone.stderr


def test_a_destination_changed_outside_strata_is_drift_that_apply_repairs(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    config = make_config(edge_nodes=())
    apply(config, state_dir=state_dir)
    lam = c("lambda")
    lam.delete_function_event_invoke_config(FunctionName="strata-test-rollout", Qualifier="test")
    lam.put_function_event_invoke_config(FunctionName="strata-test-rollout", Qualifier="test", MaximumRetryAttempts=0)
    step = next(s for s in plan(config, state_dir=state_dir).steps if s.kind == "lambda_event_invoke_config")
    assert {(ch.field, ch.drift) for ch in step.changes} == {("on_failure", True), ("max_retries", True),
                                                             ("max_event_age_s", True)}
    apply(config, state_dir=state_dir)
    got = lam.get_function_event_invoke_config(FunctionName="strata-test-rollout", Qualifier="test")
    assert got["DestinationConfig"]["OnFailure"]["Destination"] == QUEUE_ARN and got["MaximumRetryAttempts"] == 2
    assert plan(config, state_dir=state_dir).changes == ()


def test_the_rollout_function_has_a_reserved_concurrency_by_default_and_zero_leaves_it_unreserved(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path) -> None:
    assert DeployConfig().reserved_concurrency == DEFAULT_ROLLOUT_CONCURRENCY == 32
    apply(make_config(edge_nodes=(), reserved_concurrency=DEFAULT_ROLLOUT_CONCURRENCY), state_dir=state_dir)
    lam = c("lambda")
    assert lam.get_function_concurrency(FunctionName="strata-test-rollout")["ReservedConcurrentExecutions"] == 32
    assert lam.get_function_concurrency(FunctionName="strata-test-ping")["ReservedConcurrentExecutions"] == 2
    apply(make_config(edge_nodes=(), reserved_concurrency=0), state_dir=state_dir)
    for name in ("strata-test-rollout", "strata-test-ping"):
        assert "ReservedConcurrentExecutions" not in lam.get_function_concurrency(FunctionName=name)
    assert plan(make_config(edge_nodes=(), reserved_concurrency=0), state_dir=state_dir).changes == ()


def test_the_served_deployment_sends_a_failed_event_invocation_to_the_stages_queue(
        aws_env: MotoServer, make_config: MakeConfig, state_dir: Path, tmp_path: Path) -> None:
    from functions._runtime import FaultConfig, LocalRuntime, RuntimeConfig

    apply(make_config(edge_nodes=()), state_dir=state_dir)
    source = DeployedFunctions(stage="test", endpoint_url=aws_env.url, work_dir=tmp_path / "served")
    spec = source.get("strata-test-rollout")
    assert spec is not None and (spec.on_failure, spec.async_retries) == (QUEUE_ARN, ASYNC_RETRIES)
    # Every invocation's worker is killed mid-run (Runtime.ExitError): each try fails, as a crashing rollout would.
    runtime = LocalRuntime(source, config=RuntimeConfig(port=0, enforce_memory=False, async_retry_delay_s=0.0),
                           faults=FaultConfig(crash_rate=1.0)).start()
    try:
        lam = boto3.client("lambda", endpoint_url=runtime.url, region_name="us-east-1")
        event = {"rollout_id": "r-crash", "env": {"id": "CartPole-v1"}, "steps": 4, "policy": {"kind": "random"}}
        sent = lam.invoke(FunctionName="strata-test-rollout", Qualifier="test", InvocationType="Event",
                          Payload=json.dumps(event).encode())
        assert sent["StatusCode"] == 202
        sqs = c("sqs")
        url = sqs.get_queue_url(QueueName=QUEUE)["QueueUrl"]
        messages: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while not messages and time.monotonic() < deadline:
            messages = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", [])
        record = json.loads(messages[0]["Body"])
        assert record["requestPayload"]["rollout_id"] == "r-crash"
        assert record["responsePayload"]["errorType"] == "Runtime.ExitError"
        assert record["requestContext"]["approximateInvokeCount"] == 1 + ASYNC_RETRIES
        assert record["requestContext"]["functionArn"].endswith(":function:strata-test-rollout:test")
    finally:
        runtime.stop()
        source.close()
