"""Run the AWS CLI (``aws``) against a local endpoint, as a user would; tests that need it skip when it is absent.

The CLI is not a dependency of strata (it pins its own botocore release, which would fight the project's); it is
found on PATH, where the machines that run these tests have it. Every call is pinned to the endpoint given, dummy
credentials and us-east-1, with the CLI's own retries off, so a refusal shows as it is sent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pytest

AWS = shutil.which("aws")


def aws(endpoint: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``aws ARGS --endpoint-url ENDPOINT --output json``; with `check`, a non-zero exit fails the test."""
    if AWS is None:
        pytest.skip("the AWS CLI (aws) is not on PATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard", "AWS_PAGER": ""})
    done = subprocess.run([AWS, *args, "--endpoint-url", endpoint, "--output", "json"], capture_output=True, text=True,
                          timeout=120, env=env)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def aws_json(endpoint: str, *args: str) -> Any:
    """The JSON the CLI prints for a call that succeeds."""
    return json.loads(aws(endpoint, *args).stdout or "null")
