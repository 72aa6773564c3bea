"""Every client mistake gets the code AWS sends for it, every List* pages, and unknown operations are JSON.

The table below is the runtime's error contract: one row per mistake, the operation, the code and the HTTP
status. Each code must be one botocore's Lambda model lists for that operation, with the model's status, or
one AWS is known to send although the model does not list it (`UNMODELLED_BUT_SENT_BY_AWS`). Requests are
raw HTTP (so mistakes boto3 would catch client-side still reach the runtime), and a sample goes through
unmodified boto3 with its standard retries on, to show a mistake is a 4xx that boto3 does not retry.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.validate import ParamValidator

from functions._lambda_api import (
    ALIAS_MAX,
    ALIAS_PATTERN,
    FUNCTION_NAME_MAX,
    FUNCTION_NAME_PATTERN,
    INVOCATION_TYPES,
    LOG_TYPES,
    MAX_ITEMS_RANGE,
    QUALIFIER_MAX,
    QUALIFIER_PATTERN,
    STREAM_INVOCATION_TYPES,
    VERSION_PATTERN,
    FunctionSpec,
)
from functions._runtime import LocalRuntime, RuntimeConfig, SourceTreeFunctions
from tests.functions.test_runtime import H

MODEL = botocore.session.get_session().get_service_model("lambda")
# What AWS sends although botocore's model does not list it for the operation: RequestEntityTooLargeException
# for an oversized payload (the model says RequestTooLargeException), and ValidationException, the answer of
# AWS's request validation to a value outside the model's own constraints ("1 validation error detected").
UNMODELLED_BUT_SENT_BY_AWS = {"RequestEntityTooLargeException": 413, "ValidationException": 400}
F = "/2015-03-31/functions"
NAMES = ["echo", "f1", "f2", "f3", "f4", "f5", "retried"]
SPECS = [FunctionSpec(name="echo", handler=H + "echo", versions=("1", "2", "3"),
                      aliases={"a1": "1", "a2": "2", "a3": "3", "latest": "$LATEST"}),
         *[FunctionSpec(name=f"f{i}", handler=H + "echo") for i in range(1, 6)],
         FunctionSpec(name="retried", handler=H + "boom", async_retries=1)]


def ctx(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def marker_of(key: str, offset: int) -> str:
    return base64.urlsafe_b64encode(f"{key}:{offset}".encode()).decode()


# operation, the mistake, method, path, headers, body, the code AWS sends, its status
ERRORS: list[tuple[str, str, str, str, dict[str, str], bytes, str, int]] = [
    ("Invoke", "unknown function", "POST", f"{F}/nope/invocations", {}, b"{}", "ResourceNotFoundException", 404),
    ("Invoke", "unknown version", "POST", f"{F}/echo/invocations?Qualifier=9", {}, b"{}",
     "ResourceNotFoundException", 404),
    ("Invoke", "unknown alias", "POST", f"{F}/echo:nope/invocations", {}, b"{}", "ResourceNotFoundException", 404),
    ("Invoke", "Qualifier disagrees with the name's", "POST", f"{F}/echo:1/invocations?Qualifier=2", {}, b"{}",
     "InvalidParameterValueException", 400),
    ("Invoke", "function name outside the model's pattern", "POST", f"{F}/bad%20name/invocations", {}, b"{}",
     "ValidationException", 400),
    ("Invoke", "function name over 256 characters", "POST", f"{F}/{'a' * 257}/invocations", {}, b"{}",
     "ValidationException", 400),
    ("Invoke", "Qualifier outside the pattern", "POST", f"{F}/echo/invocations?Qualifier=a.b", {}, b"{}",
     "ValidationException", 400),
    ("Invoke", "InvocationType outside the enum", "POST", f"{F}/echo/invocations",
     {"X-Amz-Invocation-Type": "Later"}, b"{}", "ValidationException", 400),
    ("Invoke", "LogType outside the enum", "POST", f"{F}/echo/invocations", {"X-Amz-Log-Type": "Head"}, b"{}",
     "ValidationException", 400),
    ("Invoke", "body that is not JSON", "POST", f"{F}/echo/invocations", {}, b"{not json",
     "InvalidRequestContentException", 400),
    ("Invoke", "JSON nested 100,000 deep", "POST", f"{F}/echo/invocations", {}, b"[" * 100_000 + b"]" * 100_000,
     "InvalidRequestContentException", 400),
    ("Invoke", "ClientContext that is not base64", "POST", f"{F}/echo/invocations",
     {"X-Amz-Client-Context": "not base64!"}, b"{}", "InvalidRequestContentException", 400),
    ("Invoke", "ClientContext of base64 that is not a JSON object", "POST", f"{F}/echo/invocations",
     {"X-Amz-Client-Context": ctx(b"[1, 2]")}, b"{}", "InvalidRequestContentException", 400),
    ("Invoke", "ClientContext over 3583 bytes", "POST", f"{F}/echo/invocations",
     {"X-Amz-Client-Context": ctx(json.dumps({"custom": {"x": "y" * 3000}}).encode())}, b"{}",
     "InvalidRequestContentException", 400),
    ("Invoke", "payload over 6 MB", "POST", f"{F}/echo/invocations", {}, b'"' + b"a" * (6 * 1024 * 1024) + b'"',
     "RequestEntityTooLargeException", 413),
    ("Invoke", "Event payload over 1 MB", "POST", f"{F}/echo/invocations", {"X-Amz-Invocation-Type": "Event"},
     b'"' + b"a" * (1024 * 1024) + b'"', "RequestEntityTooLargeException", 413),
    ("InvokeWithResponseStream", "InvocationType Event, which cannot stream", "POST",
     "/2021-11-15/functions/echo/response-streaming-invocations", {"X-Amz-Invocation-Type": "Event"}, b"{}",
     "ValidationException", 400),
    ("InvokeWithResponseStream", "unknown function", "POST",
     "/2021-11-15/functions/nope/response-streaming-invocations", {}, b"{}", "ResourceNotFoundException", 404),
    ("InvokeWithResponseStream", "body that is not JSON", "POST",
     "/2021-11-15/functions/echo/response-streaming-invocations", {}, b"nope", "InvalidRequestContentException", 400),
    ("InvokeAsync", "unknown function", "POST", "/2014-11-13/functions/nope/invoke-async/", {}, b"{}",
     "ResourceNotFoundException", 404),
    ("InvokeAsync", "body that is not JSON", "POST", "/2014-11-13/functions/echo/invoke-async/", {}, b"{x",
     "InvalidRequestContentException", 400),
    ("GetFunction", "unknown function", "GET", f"{F}/nope", {}, b"", "ResourceNotFoundException", 404),
    ("GetFunction", "Qualifier disagrees with the name's", "GET", f"{F}/echo:1?Qualifier=2", {}, b"",
     "InvalidParameterValueException", 400),
    ("GetFunctionConfiguration", "unknown version", "GET", f"{F}/echo/configuration?Qualifier=7", {}, b"",
     "ResourceNotFoundException", 404),
    ("ListFunctions", "MaxItems 0", "GET", f"{F}/?MaxItems=0", {}, b"", "ValidationException", 400),
    ("ListFunctions", "MaxItems 10001", "GET", f"{F}/?MaxItems=10001", {}, b"", "ValidationException", 400),
    ("ListFunctions", "MaxItems not a number", "GET", f"{F}/?MaxItems=ten", {}, b"",
     "InvalidParameterValueException", 400),
    ("ListFunctions", "a Marker it never handed out", "GET", f"{F}/?Marker=garbage", {}, b"",
     "InvalidParameterValueException", 400),
    ("ListFunctions", "another list's Marker", "GET", f"{F}/?Marker={marker_of('Aliases', 1)}", {}, b"",
     "InvalidParameterValueException", 400),
    ("ListFunctions", "a Marker past the end", "GET", f"{F}/?Marker={marker_of('Functions', 99)}", {}, b"",
     "InvalidParameterValueException", 400),
    ("ListFunctions", "FunctionVersion other than ALL", "GET", f"{F}/?FunctionVersion=SOME", {}, b"",
     "ValidationException", 400),
    ("ListVersionsByFunction", "a qualified name", "GET", f"{F}/echo:1/versions", {}, b"",
     "InvalidParameterValueException", 400),
    ("ListVersionsByFunction", "unknown function", "GET", f"{F}/nope/versions", {}, b"",
     "ResourceNotFoundException", 404),
    ("ListAliases", "FunctionVersion outside the pattern", "GET", f"{F}/echo/aliases?FunctionVersion=v1", {}, b"",
     "ValidationException", 400),
    ("ListAliases", "unknown function", "GET", f"{F}/nope/aliases", {}, b"", "ResourceNotFoundException", 404),
    ("GetAlias", "unknown alias", "GET", f"{F}/echo/aliases/nope", {}, b"", "ResourceNotFoundException", 404),
    ("GetAlias", "an alias name of digits only", "GET", f"{F}/echo/aliases/123", {}, b"", "ValidationException", 400),
    ("GetFunctionConcurrency", "unknown function", "GET", "/2019-09-30/functions/nope/concurrency", {}, b"",
     "ResourceNotFoundException", 404),
    ("GetFunctionEventInvokeConfig", "a function without one", "GET",
     "/2019-09-25/functions/echo/event-invoke-config", {}, b"", "ResourceNotFoundException", 404),
    ("ListFunctionEventInvokeConfigs", "MaxItems 51 (its model's most is 50)", "GET",
     "/2019-09-25/functions/retried/event-invoke-config/list?MaxItems=51", {}, b"", "ValidationException", 400),
    ("ListFunctionEventInvokeConfigs", "unknown function", "GET", "/2019-09-25/functions/nope/event-invoke-config/list",
     {}, b"", "ResourceNotFoundException", 404),
]


@pytest.fixture(scope="module")
def runtime() -> Iterator[LocalRuntime]:
    rt = LocalRuntime(SourceTreeFunctions(SPECS), config=RuntimeConfig(port=0, address_space_slack_mb=256,
                                                                       account_concurrency=50)).start()
    yield rt
    rt.stop()


@pytest.fixture(scope="module")
def client(runtime: LocalRuntime) -> Iterator[Any]:
    # boto3's standard retry mode on: a mistake answered with a retryable status would show as RetryAttempts > 0.
    lam = boto3.client("lambda", endpoint_url=runtime.url, region_name="us-east-1", aws_access_key_id="testing",
                       aws_secret_access_key="testing",
                       config=Config(retries={"mode": "standard", "max_attempts": 3}, read_timeout=30))
    yield lam
    lam.close()  # its pooled connections: left to the garbage collector they warn (ResourceWarning) in a later test


def request(runtime: LocalRuntime, method: str, path: str, headers: dict[str, str], body: bytes
            ) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(runtime.url + path, data=body if method == "POST" else None, method=method,
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def check(body: Any, operation: str) -> None:
    report = ParamValidator().validate(body, MODEL.operation_model(operation).output_shape)
    assert not report.has_errors(), report.generate_report()


@pytest.mark.parametrize(("operation", "mistake", "method", "path", "headers", "body", "code", "status"), ERRORS,
                         ids=[f"{row[0]}: {row[1]}" for row in ERRORS])
def test_a_client_mistake_gets_the_code_aws_sends(runtime: LocalRuntime, operation: str, mistake: str, method: str,
                                                  path: str, headers: dict[str, str], body: bytes, code: str,
                                                  status: int) -> None:
    got_status, got_headers, got_body = request(runtime, method, path, headers, body)
    assert (got_status, got_headers.get("x-amzn-ErrorType")) == (status, code), got_body[:300]
    assert got_headers["Content-Type"] == "application/json" and json.loads(got_body)  # never HTML, never a 500
    modelled = {s.name: s.metadata.get("error", {}).get("httpStatusCode") for s in
                MODEL.operation_model(operation).error_shapes}
    assert modelled.get(code, UNMODELLED_BUT_SENT_BY_AWS.get(code)) == status, (operation, code)
    assert MODEL.operation_model(operation).http["requestUri"].split("/")[1] == path.split("/")[1]


def test_the_constraints_the_runtime_checks_are_the_models() -> None:
    invoke = MODEL.operation_model("Invoke").input_shape.members
    assert invoke["FunctionName"].metadata == {"min": 1, "max": FUNCTION_NAME_MAX, "pattern": FUNCTION_NAME_PATTERN}
    assert invoke["Qualifier"].metadata == {"min": 1, "max": QUALIFIER_MAX, "pattern": QUALIFIER_PATTERN}
    assert tuple(invoke["InvocationType"].enum) == INVOCATION_TYPES and tuple(invoke["LogType"].enum) == LOG_TYPES
    stream = MODEL.operation_model("InvokeWithResponseStream").input_shape.members
    assert tuple(stream["InvocationType"].enum) == STREAM_INVOCATION_TYPES
    alias = MODEL.operation_model("GetAlias").input_shape.members["Name"].metadata
    assert (alias["max"], alias["pattern"]) == (ALIAS_MAX, ALIAS_PATTERN)
    assert MODEL.operation_model("ListAliases").input_shape.members["FunctionVersion"].metadata["pattern"] == \
        VERSION_PATTERN
    for operation in ("ListFunctions", "ListVersionsByFunction", "ListAliases", "ListFunctionEventInvokeConfigs"):
        members = MODEL.operation_model(operation).input_shape.members
        assert {"Marker", "MaxItems"} <= set(members), operation
        assert (members["MaxItems"].metadata["min"], members["MaxItems"].metadata["max"]) in (
            MAX_ITEMS_RANGE, (MAX_ITEMS_RANGE[0], 50)), operation


@pytest.mark.parametrize("kwargs", [
    {"ClientContext": "not base64!"},
    {"ClientContext": ctx(json.dumps({"custom": {"x": "y" * 3000}}).encode())},
    {"Payload": b"[" * 100_000 + b"]" * 100_000},
    {"LogType": "Head"},
])
def test_boto3_gets_a_4xx_it_does_not_retry(client: Any, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ClientError) as info:
        client.invoke(FunctionName="echo", **{"Payload": b"{}", **kwargs})
    meta = info.value.response["ResponseMetadata"]
    assert meta["HTTPStatusCode"] == 400 and meta["RetryAttempts"] == 0


def test_a_client_context_that_is_a_json_object_reaches_the_handler(client: Any) -> None:
    r = client.invoke(FunctionName="echo", Payload=b"{}", ClientContext=ctx(b'{"custom": {"run": "r1"}}'))
    assert json.loads(r["Payload"].read())["client_context"] == {"run": "r1"}


def test_every_list_call_pages_with_marker_and_max_items(client: Any) -> None:
    first = client.list_functions(MaxItems=3)
    check({k: v for k, v in first.items() if k != "ResponseMetadata"}, "ListFunctions")
    assert [f["FunctionName"] for f in first["Functions"]] == NAMES[:3] and "NextMarker" in first
    pages = list(client.get_paginator("list_functions").paginate(PaginationConfig={"PageSize": 2}))
    assert [len(p["Functions"]) for p in pages] == [2, 2, 2, 1]
    assert [f["FunctionName"] for p in pages for f in p["Functions"]] == NAMES
    assert "NextMarker" not in pages[-1]
    every = [(f["FunctionName"], f["Version"]) for p in client.get_paginator("list_functions").paginate(
        FunctionVersion="ALL", PaginationConfig={"PageSize": 3}) for f in p["Functions"]]
    assert every[:4] == [("echo", "$LATEST"), ("echo", "1"), ("echo", "2"), ("echo", "3")] and len(every) == 10
    versions = [v["Version"] for p in client.get_paginator("list_versions_by_function").paginate(
        FunctionName="echo", PaginationConfig={"PageSize": 1}) for v in p["Versions"]]
    assert versions == ["$LATEST", "1", "2", "3"]
    aliases = list(client.get_paginator("list_aliases").paginate(FunctionName="echo",
                                                                  PaginationConfig={"PageSize": 3}))
    assert [[a["Name"] for a in p["Aliases"]] for p in aliases] == [["a1", "a2", "a3"], ["latest"]]
    configs = client.list_function_event_invoke_configs(FunctionName="retried", MaxItems=1)
    check({k: v for k, v in configs.items() if k != "ResponseMetadata"}, "ListFunctionEventInvokeConfigs")
    assert [c["MaximumRetryAttempts"] for c in configs["FunctionEventInvokeConfigs"]] == [1]
    assert client.list_function_event_invoke_configs(FunctionName="f1")["FunctionEventInvokeConfigs"] == []


def test_aliases_are_checked_when_a_function_is_made_not_when_invoked() -> None:
    from functions._errors import RuntimeConfigError

    with pytest.raises(RuntimeConfigError, match="alias 'live' points at version '9', which is not published "
                                                 r"\(versions: 1, 2\)"):
        FunctionSpec(name="echo", handler=H + "echo", versions=("1", "2"), aliases={"live": "9"})
    with pytest.raises(RuntimeConfigError, match="alias '7' is not an alias name"):
        FunctionSpec(name="echo", handler=H + "echo", versions=("7",), aliases={"7": "7"})
    with pytest.raises(RuntimeConfigError, match="version 'v1' is not a version number"):
        FunctionSpec(name="echo", handler=H + "echo", versions=("v1",))
    with pytest.raises(RuntimeConfigError, match="is not an SQS queue ARN"):
        FunctionSpec(name="echo", handler=H + "echo", on_failure="arn:aws:sns:us-east-1:123456789012:topic")


def test_get_account_settings_concurrency_and_event_invoke_config_match_the_model(client: Any) -> None:
    settings = client.get_account_settings()
    check({k: v for k, v in settings.items() if k != "ResponseMetadata"}, "GetAccountSettings")
    assert settings["AccountLimit"]["ConcurrentExecutions"] == 50
    assert settings["AccountLimit"]["UnreservedConcurrentExecutions"] == 50 - 4 * len(SPECS)
    assert settings["AccountUsage"]["FunctionCount"] == len(SPECS)
    concurrency = client.get_function_concurrency(FunctionName="echo")
    assert concurrency["ReservedConcurrentExecutions"] == 4
    config = client.get_function_event_invoke_config(FunctionName="retried")
    check({k: v for k, v in config.items() if k != "ResponseMetadata"}, "GetFunctionEventInvokeConfig")
    assert config["MaximumRetryAttempts"] == 1 and config["DestinationConfig"]["OnFailure"] == {}


def test_invoke_with_response_stream_answers_lambdas_event_stream(client: Any) -> None:
    r = client.invoke_with_response_stream(FunctionName="echo", Qualifier="a2", Payload=b'{"n": 7}', LogType="Tail")
    assert (r["StatusCode"], r["ExecutedVersion"]) == (200, "2")
    events = list(r["EventStream"])
    assert [list(e) for e in events] == [["PayloadChunk"], ["InvokeComplete"]]
    assert json.loads(events[0]["PayloadChunk"]["Payload"])["event"] == {"n": 7}
    complete = events[1]["InvokeComplete"]
    assert "ErrorCode" not in complete and "END RequestId" in base64.b64decode(complete["LogResult"]).decode()
    failed = list(client.invoke_with_response_stream(FunctionName="retried", Payload=b"{}")["EventStream"])
    assert failed[1]["InvokeComplete"]["ErrorCode"] == "Unhandled"
    assert json.loads(failed[0]["PayloadChunk"]["Payload"])["errorType"] == "ValueError"
    assert client.invoke_with_response_stream(FunctionName="echo", InvocationType="DryRun",
                                              Payload=b"{}")["StatusCode"] == 204


def test_invoke_async_queues_an_event_invocation(client: Any, runtime: LocalRuntime) -> None:
    before = runtime.stats["f5"].async_deliveries
    r = client.invoke_async(FunctionName="f5", InvokeArgs=b'{"n": 1}')
    assert r["Status"] == 202
    import time

    deadline = time.monotonic() + 60
    while runtime.stats["f5"].async_deliveries == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runtime.stats["f5"].async_deliveries == before + 1


@pytest.mark.parametrize(("operation", "call"), [
    ("CreateFunction", lambda c: c.create_function(FunctionName="x", Role="arn:aws:iam::000000000000:role/r",
                                                   Code={"ZipFile": b"zip"})),
    ("DeleteFunction", lambda c: c.delete_function(FunctionName="echo")),
    ("UpdateFunctionConfiguration", lambda c: c.update_function_configuration(FunctionName="echo", MemorySize=256)),
    ("PutFunctionConcurrency", lambda c: c.put_function_concurrency(FunctionName="echo",
                                                                     ReservedConcurrentExecutions=1)),
    ("CreateAlias", lambda c: c.create_alias(FunctionName="echo", Name="x", FunctionVersion="1")),
    ("TagResource", lambda c: c.tag_resource(Resource="arn:aws:lambda:us-east-1:000000000000:function:echo",
                                             Tags={"a": "b"})),
    ("ListTags", lambda c: c.list_tags(Resource="arn:aws:lambda:us-east-1:000000000000:function:echo")),
    ("GetPolicy", lambda c: c.get_policy(FunctionName="echo")),
])
def test_an_operation_the_runtime_does_not_implement_is_a_json_unknown_operation(client: Any, operation: str,
                                                                                call: Any) -> None:
    with pytest.raises(ClientError) as info:
        call(client)
    response = info.value.response
    assert response["Error"]["Code"] == "UnknownOperationException", operation
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 404 and response["ResponseMetadata"]["RetryAttempts"] == 0
    assert response["ResponseMetadata"]["HTTPHeaders"]["content-type"] == "application/json"
    assert "the local runtime implements Invoke" in response["Error"]["Message"]


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
def test_every_http_method_gets_json_not_an_html_501(runtime: LocalRuntime, method: str) -> None:
    status, headers, body = request(runtime, method, f"{F}/echo", {}, b"")
    assert (status, headers["x-amzn-ErrorType"], headers["Content-Type"]) == (
        404, "UnknownOperationException", "application/json")
    assert body == b"" if method == "HEAD" else json.loads(body)["message"].startswith(f"Unknown operation {method}")


def test_the_aws_cli_pages_reads_and_gets_the_same_errors(runtime: LocalRuntime, tmp_path: Any) -> None:
    from tests._aws_cli import aws, aws_json

    # The CLI pages by itself (NextMarker -> Marker): a page size of 2 still lists every function.
    listed = aws_json(runtime.url, "lambda", "list-functions", "--page-size", "2")
    assert [f["FunctionName"] for f in listed["Functions"]] == NAMES
    first = aws_json(runtime.url, "lambda", "list-functions", "--max-items", "3")
    assert len(first["Functions"]) == 3 and first["NextToken"]
    rest = aws_json(runtime.url, "lambda", "list-functions", "--starting-token", first["NextToken"])
    assert [f["FunctionName"] for f in first["Functions"] + rest["Functions"]] == NAMES
    settings = aws_json(runtime.url, "lambda", "get-account-settings")
    assert settings["AccountLimit"]["ConcurrentExecutions"] == 50
    out = tmp_path / "out.json"
    done = aws_json(runtime.url, "lambda", "invoke", "--function-name", "echo", "--qualifier", "a1",
                    "--payload", '{"n": 1}', str(out))
    assert done["ExecutedVersion"] == "1" and json.loads(out.read_text())["event"] == {"n": 1}
    for args, code in [(["--client-context", "not base64!"], "InvalidRequestContentException"),
                       (["--log-type", "Head"], "ValidationException"),
                       (["--qualifier", "9"], "ResourceNotFoundException")]:
        refused = aws(runtime.url, "lambda", "invoke", "--function-name", "echo", *args, str(out), check=False)
        assert refused.returncode != 0 and f"An error occurred ({code}) when calling the Invoke operation" in \
            refused.stderr, refused.stderr
    refused = aws(runtime.url, "lambda", "delete-function", "--function-name", "echo", check=False)
    assert "An error occurred (UnknownOperationException) when calling the DeleteFunction operation" in refused.stderr


def raw_exchange(runtime: LocalRuntime, data: bytes) -> bytes:
    """Send `data` as is on a fresh connection and read until the runtime closes it."""
    import socket

    host, port = runtime.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(data)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(("data", "status", "code"), [
    (b"POST " + F.encode() + b"/echo/invocations HTTP/1.1\r\nHost: x\r\nX-Amz-Client-Context: " + b"a" * 70_000
     + b"\r\nContent-Length: 2\r\n\r\n{}", b"400", b"InvalidRequestContentException"),  # a header line over 64 KB
    (b"GARBAGE\r\n\r\n", b"400", b"InvalidRequestContentException"),
    (b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n", b"404", b"UnknownOperationException"),
    (b"POST " + F.encode() + b"/echo/invocations HTTP/1.1\r\nHost: x\r\nContent-Length: two\r\n\r\n{}", b"400",
     b"InvalidRequestContentException"),
])
def test_requests_http_server_itself_refuses_are_answered_in_json_and_closed(runtime: LocalRuntime, data: bytes,
                                                                             status: bytes, code: bytes) -> None:
    answer = raw_exchange(runtime, data)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status) and b"x-amzn-ErrorType: " + code in head, answer[:300]
    assert b"Content-Type: application/json" in head and json.loads(body)
