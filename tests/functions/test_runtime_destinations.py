"""The local runtime sends an Event invocation whose retries are spent to its on-failure SQS queue (moto over HTTP)."""

from __future__ import annotations

import json
import time
from typing import Any

import boto3

from functions._lambda_api import FunctionSpec
from functions._runtime import LocalRuntime, RuntimeConfig, SourceTreeFunctions, parse_function_option
from tests._services import MotoServer
from tests.functions.test_runtime import H, lambda_client


def receive(sqs: Any, url: str, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Wait (long-polling) until `count` messages were received from `url`."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    return got


def test_a_failed_event_invocation_reaches_the_on_failure_queue_as_lambdas_record(aws_env: MotoServer) -> None:
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="failures")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    spec = parse_function_option(f"boom={H}boom,retries=1,on-failure={arn}")
    assert (spec.on_failure, spec.async_retries) == (arn, 1)
    specs = [spec, FunctionSpec(name="echo", handler=H + "echo", on_failure=arn)]
    config = RuntimeConfig(port=0, async_retry_delay_s=0.0)
    with LocalRuntime(SourceTreeFunctions(specs), config=config) as rt:
        client = lambda_client(rt.url)
        sent = client.invoke(FunctionName="boom", InvocationType="Event", Payload=b'{"why": "async"}')
        assert sent["StatusCode"] == 202
        assert client.invoke(FunctionName="echo", InvocationType="Event", Payload=b"{}")["StatusCode"] == 202
        (message,) = receive(sqs, url, 1)
        record = json.loads(message["Body"])
        assert record["requestContext"]["condition"] == "RetriesExhausted"
        assert record["requestContext"]["approximateInvokeCount"] == 2  # the first try and one retry
        assert record["requestContext"]["requestId"] == sent["ResponseMetadata"]["RequestId"]
        assert record["requestContext"]["functionArn"].endswith(":function:boom:$LATEST")
        assert record["requestPayload"] == {"why": "async"}
        assert record["responseContext"]["functionError"] == "Unhandled"
        assert record["responsePayload"]["errorMessage"] == "boom: async"
        assert (rt.stats["boom"].async_deliveries, rt.stats["boom"].async_failures) == (2, 1)
        assert rt.stats["echo"].async_failures == 0  # a success sends nothing
        assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", []) == []
        configured = client.get_function_event_invoke_config(FunctionName="boom")
        assert configured["DestinationConfig"]["OnFailure"]["Destination"] == arn


def test_a_queue_that_is_gone_is_counted_and_said_not_a_dead_dispatcher(aws_env: MotoServer,
                                                                         capfd: Any) -> None:
    gone = "arn:aws:sqs:us-east-1:123456789012:no-such-queue"
    specs = [FunctionSpec(name="boom", handler=H + "boom", async_retries=0, on_failure=gone)]
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0)) as rt:
        client = lambda_client(rt.url)
        for _ in range(2):
            client.invoke(FunctionName="boom", InvocationType="Event", Payload=b"{}")
        deadline = time.monotonic() + 60
        while rt.stats["boom"].destination_errors < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rt.stats["boom"].destination_errors == 2  # the dispatcher lived on to handle the second one
    assert "could not send the failure record of boom request" in capfd.readouterr().err
