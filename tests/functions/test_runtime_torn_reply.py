"""A worker that dies mid-reply gives an Unhandled function error, never a torn payload presented as a result."""

from __future__ import annotations

import json

import boto3
from botocore.config import Config

from functions._lambda_api import FunctionSpec
from functions._runtime import LocalRuntime, RuntimeConfig, SourceTreeFunctions


def test_a_reply_shorter_than_its_content_length_is_an_unhandled_error() -> None:
    specs = [FunctionSpec(name="torn", handler="tests.functions._torn_handler.torn_reply")]
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0)) as rt:
        client = boto3.client("lambda", endpoint_url=rt.url, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing",
                              config=Config(retries={"total_max_attempts": 1}, read_timeout=60))
        reply = client.invoke(FunctionName="torn", Payload=b"{}")
        assert reply["FunctionError"] == "Unhandled"
        error = json.loads(reply["Payload"].read())
        assert error["errorType"] == "Runtime.ExitError"
        assert "the runtime's reply was cut short (30 of 4096 bytes)" in error["errorMessage"]
