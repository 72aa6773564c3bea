"""Async rollouts that fail after Lambda's retries reach the on-failure queue; the source counts and re-issues them.

The local runtime plays Lambda (it sends the destination record to SQS on the moto server, as Lambda does to a
rollout alias's on-failure queue), so the source's reading of the queue is tested against the record's real shape.
"""

from __future__ import annotations

from pathlib import Path

import boto3

from cloud.rollout._serverless import ServerlessRolloutSource
from functions._lambda_api import FunctionSpec
from functions._runtime import LocalRuntime, RuntimeConfig, SourceTreeFunctions
from tests._services import MotoServer
from tests.cloud.test_serverless import assert_exactly_once, config


def test_failed_async_rollouts_are_counted_and_reissued_without_waiting_for_the_timeout(
        aws_env: MotoServer, tmp_path: Path) -> None:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="rollouts")
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="strata-t-rollout-failures")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    # Someone else's record in the same queue: the source must leave it there.
    sqs.send_message(QueueUrl=url, MessageBody='{"requestPayload": {"rollout_id": "other-run-00000001"}}')
    spec = FunctionSpec(name="strata-rollout", handler="tests.cloud._flaky_rollout.fail_once", async_retries=0,
                        on_failure=arn, reserved_concurrency=3, environment={"FLAKY_DIR": str(tmp_path)})
    with LocalRuntime(SourceTreeFunctions([spec]), config=RuntimeConfig(port=0)) as rt:
        # Without the queue each failed rollout would wait out async_result_timeout_s before it is re-issued.
        cfg = config(rt.url, invocation="async", result_bucket="rollouts", async_poll_s=0.02,
                     async_result_timeout_s=240.0, failure_queue_url=url)
        with ServerlessRolloutSource(cfg) as source:
            batches = list(source.fragments(count=8))
        assert_exactly_once(batches, 4, cfg)
        # Every rollout failed once, first; one still in flight when the source stopped may have failed too (how
        # many the source had issued ahead depends on the machine's speed).
        assert source.stats.async_failures == source.stats.reissued >= 4
        assert source.stats.summary()["async_failures"] == source.stats.async_failures
        assert rt.stats["strata-rollout"].async_failures >= source.stats.async_failures
    left = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    assert [m["Body"] for m in left] == ['{"requestPayload": {"rollout_id": "other-run-00000001"}}']
