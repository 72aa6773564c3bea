"""Subprocess smoke test of `strata functions serve`, driven by boto3."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import boto3
import pytest
from botocore.config import Config

from device import RolloutBatch
from functions import RolloutResult, parse_result
from tests._cli import STRATA, run_strata


def test_functions_serve_answers_boto3_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen([STRATA, "functions", "serve", "--port", "0", "--function",
                             "ping=functions._handlers.ping_handler,timeout=5,concurrency=1",
                             "--function", "roll=functions._handlers.rollout_handler,memory=512"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        assert line["event"] == "serving" and line["functions"] == ["ping", "roll"]
        client = boto3.client("lambda", endpoint_url=line["url"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing",
                              config=Config(retries={"total_max_attempts": 1}))
        r = client.invoke(FunctionName="ping", Payload=b'{"n": 1}')
        assert json.loads(r["Payload"].read()) == {"ok": True, "echo": {"n": 1}}
        event = {"rollout_id": "smoke", "env": {"id": "CartPole-v1"}, "steps": 5, "policy": {"kind": "random"}}
        result = parse_result(json.loads(client.invoke(FunctionName="roll", Payload=json.dumps(event).encode())
                                         ["Payload"].read()))
        assert isinstance(result, RolloutResult)
        assert RolloutBatch.from_bytes(result.fragments[0]).num_steps == 5
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr


def test_functions_serve_refuses_a_bad_function_option() -> None:
    result = run_strata("functions", "serve", "--port", "0", "--function", "broken")
    assert result.returncode == 2
    assert "error: --function 'broken': must be NAME=module.handler" in result.stderr


def test_functions_serve_injects_throttles_from_flags() -> None:
    proc = subprocess.Popen([STRATA, "functions", "serve", "--port", "0", "--throttle-rate", "1.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        assert line["functions"] == ["strata-ping", "strata-rollout"]
        client = boto3.client("lambda", endpoint_url=line["url"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing",
                              config=Config(retries={"total_max_attempts": 1}))
        with pytest.raises(client.exceptions.TooManyRequestsException):
            client.invoke(FunctionName="strata-ping", Payload=b"{}")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
