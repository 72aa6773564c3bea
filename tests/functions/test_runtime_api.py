"""The local runtime's Lambda API against botocore's own Lambda service model, and Lambda's qualifier rules.

Every read operation is fetched twice: as raw JSON over HTTP, validated against the operation's output shape
in the model that ships with botocore (members known, types right, required members present), and through
unmodified boto3. Invoke responses and every error code are checked against the same model.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ClientError
from botocore.validate import ParamValidator

from functions._lambda_api import FunctionSpec
from functions._runtime import LocalRuntime, RuntimeConfig, SourceTreeFunctions
from tests.functions.test_runtime import H, lambda_client

MODEL = botocore.session.get_session().get_service_model("lambda")
ARN = "arn:aws:lambda:us-east-1:000000000000:function:"
# AWS answers an oversized Invoke with RequestEntityTooLargeException, a code botocore's model does not list.
UNMODELLED_BUT_SENT_BY_AWS = {"RequestEntityTooLargeException", "ValidationException"}

SPECS = [
    FunctionSpec(name="echo", handler=H + "echo", memory_mb=256, timeout_s=2.5, versions=("1", "2"),
                 aliases={"live": "2", "old": "1"}, environment={"STAGE": "t"}),
    FunctionSpec(name="other", handler=H + "echo"),
]


def check(body: Any, operation: str) -> None:
    """`body` is a valid output of `operation` in botocore's Lambda model."""
    shape = MODEL.operation_model(operation).output_shape
    report = ParamValidator().validate(body, shape)
    assert not report.has_errors(), report.generate_report()


def check_error(exc: ClientError, operation: str, code: str, status: int) -> None:
    error = exc.response["Error"]
    assert (error["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"]) == (code, status)
    modelled = {s.name for s in MODEL.operation_model(operation).error_shapes}
    assert code in modelled | UNMODELLED_BUT_SENT_BY_AWS, code
    if code in modelled:
        assert MODEL.shape_for(code).metadata.get("error", {}).get("httpStatusCode", status) == status


@pytest.fixture(scope="module")
def runtime() -> Iterator[LocalRuntime]:
    rt = LocalRuntime(SourceTreeFunctions(SPECS), config=RuntimeConfig(port=0, address_space_slack_mb=256)).start()
    yield rt
    rt.stop()


@pytest.fixture(scope="module")
def client(runtime: LocalRuntime) -> Any:
    return lambda_client(runtime.url)


def raw(runtime: LocalRuntime, path: str) -> Any:
    with urllib.request.urlopen(runtime.url + path, timeout=30) as response:
        assert response.status == 200 and response.headers["Content-Type"] == "application/json"
        return json.loads(response.read())


@pytest.mark.parametrize(("operation", "path"), [
    ("ListFunctions", "/2015-03-31/functions/"),
    ("ListFunctions", "/2015-03-31/functions/?FunctionVersion=ALL"),
    ("GetFunction", "/2015-03-31/functions/echo"),
    ("GetFunction", "/2015-03-31/functions/echo?Qualifier=live"),
    ("GetFunctionConfiguration", "/2015-03-31/functions/echo/configuration"),
    ("GetFunctionConfiguration", f"/2015-03-31/functions/{ARN}echo:1/configuration".replace(":", "%3A")),
    ("ListVersionsByFunction", "/2015-03-31/functions/echo/versions"),
    ("ListAliases", "/2015-03-31/functions/echo/aliases"),
    ("GetAlias", "/2015-03-31/functions/echo/aliases/live"),
])
def test_every_read_operation_matches_botocores_model(runtime: LocalRuntime, operation: str, path: str) -> None:
    check(raw(runtime, path), operation)


def test_read_operations_through_boto3_say_what_is_served(client: Any) -> None:
    names = [f["FunctionName"] for f in client.list_functions()["Functions"]]
    assert names == ["echo", "other"]
    every = client.list_functions(FunctionVersion="ALL")["Functions"]
    assert [(f["FunctionName"], f["Version"]) for f in every] == [
        ("echo", "$LATEST"), ("echo", "1"), ("echo", "2"), ("other", "$LATEST")]
    fn = client.get_function(FunctionName="echo")
    config = fn["Configuration"]
    assert (config["FunctionArn"], config["Version"], config["Handler"]) == (ARN + "echo", "$LATEST", H + "echo")
    assert (config["MemorySize"], config["Timeout"], config["Environment"]) == (256, 3, {"Variables": {"STAGE": "t"}})
    assert config["State"] == "Active" and config["LastUpdateStatus"] == "Successful"
    at_alias = client.get_function_configuration(FunctionName="echo", Qualifier="live")
    assert (at_alias["Version"], at_alias["FunctionArn"]) == ("2", ARN + "echo:live")
    versions = client.list_versions_by_function(FunctionName="echo")["Versions"]
    assert [(v["Version"], v["FunctionArn"]) for v in versions] == [
        ("$LATEST", ARN + "echo:$LATEST"), ("1", ARN + "echo:1"), ("2", ARN + "echo:2")]
    aliases = client.list_aliases(FunctionName="echo")["Aliases"]
    assert [(a["Name"], a["FunctionVersion"], a["AliasArn"]) for a in aliases] == [
        ("live", "2", ARN + "echo:live"), ("old", "1", ARN + "echo:old")]
    assert [a["Name"] for a in client.list_aliases(FunctionName="echo", FunctionVersion="1")["Aliases"]] == ["old"]
    assert client.get_alias(FunctionName="echo", Name="old")["FunctionVersion"] == "1"


def test_read_errors_are_lambdas(client: Any) -> None:
    with pytest.raises(ClientError) as info:
        client.get_function(FunctionName="nope")
    check_error(info.value, "GetFunction", "ResourceNotFoundException", 404)
    assert info.value.response["Error"]["Message"] == f"Function not found: {ARN}nope"
    with pytest.raises(ClientError) as info:
        client.get_function_configuration(FunctionName="echo", Qualifier="7")
    check_error(info.value, "GetFunctionConfiguration", "ResourceNotFoundException", 404)
    with pytest.raises(ClientError) as info:
        client.get_alias(FunctionName="echo", Name="nope")
    check_error(info.value, "GetAlias", "ResourceNotFoundException", 404)
    with pytest.raises(ClientError) as info:
        client.get_function(FunctionName="echo:1", Qualifier="2")
    check_error(info.value, "GetFunction", "InvalidParameterValueException", 400)


def invoke(client: Any, **kwargs: Any) -> dict[str, Any]:
    r = client.invoke(Payload=b"{}", **kwargs)
    check({k: v for k, v in r.items() if k != "ResponseMetadata"}, "Invoke")
    body: dict[str, Any] = json.loads(r["Payload"].read())
    body["executed"] = r["ExecutedVersion"]
    return body


def test_an_alias_gives_the_handler_the_version_and_the_alias_arn(client: Any) -> None:
    by_name = invoke(client, FunctionName="echo:live")
    by_qualifier = invoke(client, FunctionName="echo", Qualifier="live")
    for body in (by_name, by_qualifier):
        assert (body["executed"], body["version"], body["arn"]) == ("2", "2", ARN + "echo:live")
    latest = invoke(client, FunctionName="echo")
    assert (latest["executed"], latest["version"], latest["arn"]) == ("$LATEST", "$LATEST", ARN + "echo")


def test_every_published_version_is_invokable_and_runs_as_itself(client: Any) -> None:
    for version in ("1", "2"):
        body = invoke(client, FunctionName=f"{ARN}echo", Qualifier=version)
        assert (body["executed"], body["version"], body["arn"]) == (version, version, f"{ARN}echo:{version}")
    assert invoke(client, FunctionName="echo:1", Qualifier="1")["version"] == "1"  # agreeing qualifiers are fine


def test_conflicting_qualifiers_are_400_like_lambda(client: Any) -> None:
    for kwargs in ({"FunctionName": "echo:1", "Qualifier": "2"}, {"FunctionName": f"{ARN}echo:live",
                                                                    "Qualifier": "1"}):
        with pytest.raises(ClientError, match="derived qualifier from the function name does not match") as info:
            client.invoke(Payload=b"{}", **kwargs)
        check_error(info.value, "Invoke", "InvalidParameterValueException", 400)


def test_invoke_errors_use_modelled_codes_or_the_one_aws_sends_unmodelled(client: Any) -> None:
    with pytest.raises(ClientError) as info:
        client.invoke(FunctionName="echo", Qualifier="9", Payload=b"{}")
    check_error(info.value, "Invoke", "ResourceNotFoundException", 404)
    with pytest.raises(ClientError) as info:
        client.invoke(FunctionName="echo", Payload=b"{not json")
    check_error(info.value, "Invoke", "InvalidRequestContentException", 400)
    with pytest.raises(ClientError) as info:
        client.invoke(FunctionName="echo", Payload=json.dumps({"x": "a" * (6 * 1024 * 1024)}).encode())
    check_error(info.value, "Invoke", "RequestEntityTooLargeException", 413)


def test_an_unknown_path_is_unknown_operation(runtime: LocalRuntime) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(runtime.url + "/2015-03-31/functions/echo/policy", timeout=30)
    with info.value as error:  # the error holds the open response: close it
        assert error.code == 404 and error.headers["x-amzn-ErrorType"] == "UnknownOperationException"
