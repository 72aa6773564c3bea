"""Lambda's on-failure destination for the local runtime: the record of a failed Event invocation, sent to SQS.

When an Event invocation has failed and its retries are spent, Lambda sends its destination a record
(https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-retain-records.html):

    {"version": "1.0", "timestamp": ...,
     "requestContext": {"requestId", "functionArn", "condition": "RetriesExhausted", "approximateInvokeCount"},
     "requestPayload": <the event>,
     "responseContext": {"statusCode": 200, "executedVersion", "functionError": "Unhandled"},
     "responsePayload": <the function's error>}

The local runtime sends the same record to the function's SQS queue (``FunctionSpec.on_failure``) through
boto3, which honours ``AWS_ENDPOINT_URL_SQS`` / ``AWS_ENDPOINT_URL`` (a moto server in the tests). boto3 is
imported on first use: a runtime with no destination never needs it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

_clients: dict[tuple[str, ...], Any] = {}
_lock = threading.Lock()


def failure_record(*, request_id: str, function_arn: str, attempts: int, payload: bytes, executed_version: str,
                   function_error: str, response: bytes) -> dict[str, Any]:
    """Lambda's destination record of an Event invocation that failed `attempts` times."""

    def as_json(data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError:  # a torn or non-JSON reply still reaches the queue, as text
            return data.decode("utf-8", errors="replace")

    return {
        "version": "1.0",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        "requestContext": {"requestId": request_id, "functionArn": function_arn, "condition": "RetriesExhausted",
                           "approximateInvokeCount": attempts},
        "requestPayload": as_json(payload),
        "responseContext": {"statusCode": 200, "executedVersion": executed_version, "functionError": function_error},
        "responsePayload": as_json(response),
    }


def send_to_queue(queue_arn: str, record: dict[str, Any], *, region: str) -> None:
    """Send `record` to the SQS queue `queue_arn` (``arn:aws:sqs:REGION:ACCOUNT:NAME``).

    Raises:
        Exception: whatever boto3 raises (no such queue, no endpoint, no credentials); the runtime counts it.
    """
    _, _, _, queue_region, account, name = queue_arn.split(":", 5)
    sqs = _client(queue_region or region)
    url = sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(record))


def _client(region: str) -> Any:
    """An SQS client for `region`, one per region and endpoint setting (botocore reads the endpoint once)."""
    key = (region, os.environ.get("AWS_ENDPOINT_URL_SQS", ""), os.environ.get("AWS_ENDPOINT_URL", ""))
    with _lock:
        if key not in _clients:
            from device import require

            boto3 = require("boto3", extra="infra", purpose="sending failed Event invocations to their SQS queue")
            _clients[key] = boto3.client("sqs", region_name=region)
        return _clients[key]
