"""The local function runtime driven end to end by unmodified boto3 over HTTP (real awslambdaric workers)."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from functions._errors import RuntimeConfigError
from functions._runtime import (
    FaultConfig,
    FunctionSpec,
    LocalRuntime,
    RuntimeConfig,
    SourceTreeFunctions,
    parse_function_option,
)
from infra import FunctionNotFoundError, PayloadTooLargeError, ThrottledError
from infra.aws import LambdaInvoker

H = "tests.functions.test_runtime_handlers."

SPECS = [
    FunctionSpec(name="echo", handler=H + "echo", memory_mb=256, versions=("1", "2"), aliases={"live": "2"}),
    FunctionSpec(name="boom", handler=H + "boom"),
    FunctionSpec(name="sleepy", handler=H + "sleepy", timeout_s=1.0, reserved_concurrency=1),
    FunctionSpec(name="hold", handler=H + "hold", timeout_s=120.0, reserved_concurrency=1),
    FunctionSpec(name="exit", handler=H + "exit_now"),
    FunctionSpec(name="big", handler=H + "big_response"),
    FunctionSpec(name="missing-module", handler="tests.functions.no_such_module.handler"),
    FunctionSpec(name="alloc", handler=H + "alloc", memory_mb=128),
]


def lambda_client(url: str) -> Any:
    return boto3.client("lambda", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing",
                        config=Config(retries={"total_max_attempts": 1}, read_timeout=30))


@pytest.fixture(scope="module")
def runtime() -> Iterator[LocalRuntime]:
    # 256 MB of address-space slack: these handlers import nothing heavy, so a small RLIMIT_AS is testable.
    rt = LocalRuntime(SourceTreeFunctions(SPECS), config=RuntimeConfig(port=0, address_space_slack_mb=256)).start()
    yield rt
    rt.stop()


@pytest.fixture(scope="module")
def client(runtime: LocalRuntime) -> Any:
    return lambda_client(runtime.url)


def test_request_response_returns_the_handler_result_with_a_real_context(client: Any) -> None:
    r = client.invoke(FunctionName="echo", Payload=json.dumps({"a": 1}).encode())
    assert r["StatusCode"] == 200
    assert r["ExecutedVersion"] == "$LATEST"
    assert "FunctionError" not in r
    body = json.loads(r["Payload"].read())
    assert body["event"] == {"a": 1}
    assert body["function"] == "echo" and body["memory"] == "256"
    assert 0 < body["remaining_ms"] <= 30_000
    assert re.fullmatch(r"[0-9a-f-]{36}", body["request_id"])


def test_event_and_dry_run_status_codes(client: Any) -> None:
    assert client.invoke(FunctionName="echo", InvocationType="Event", Payload=b"{}")["StatusCode"] == 202
    assert client.invoke(FunctionName="echo", InvocationType="DryRun", Payload=b"{}")["StatusCode"] == 204


def test_log_tail_is_the_last_4kb_of_the_invocation_log(client: Any) -> None:
    r = client.invoke(FunctionName="echo", Payload=b'{"say": "hi"}', LogType="Tail")
    log = base64.b64decode(r["LogResult"]).decode()
    assert "echo handler saw {'say': 'hi'}" in log
    assert log.startswith("START RequestId:") and "REPORT RequestId:" in log
    assert len(base64.b64decode(r["LogResult"])) <= 4096


def test_qualifier_alias_and_arn_resolve_the_executed_version(client: Any) -> None:
    assert client.invoke(FunctionName="echo", Qualifier="1", Payload=b"{}")["ExecutedVersion"] == "1"
    assert client.invoke(FunctionName="echo:live", Payload=b"{}")["ExecutedVersion"] == "2"
    arn = "arn:aws:lambda:us-east-1:000000000000:function:echo"
    r = client.invoke(FunctionName=arn, Payload=b"{}")
    assert r["ExecutedVersion"] == "$LATEST"
    assert json.loads(r["Payload"].read())["arn"] == arn


def test_unknown_function_and_qualifier_are_resource_not_found(client: Any) -> None:
    with pytest.raises(client.exceptions.ResourceNotFoundException) as info:
        client.invoke(FunctionName="nope", Payload=b"{}")
    err = info.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert err["Error"]["Message"] == "Function not found: arn:aws:lambda:us-east-1:000000000000:function:nope"
    assert err["ResponseMetadata"]["HTTPHeaders"]["x-amzn-errortype"] == "ResourceNotFoundException"
    with pytest.raises(client.exceptions.ResourceNotFoundException, match=re.escape("function:echo:9")):
        client.invoke(FunctionName="echo", Qualifier="9", Payload=b"{}")


def test_handler_exception_is_an_unhandled_function_error(client: Any) -> None:
    r = client.invoke(FunctionName="boom", Payload=b'{"why": "testing"}', LogType="Tail")
    assert r["StatusCode"] == 200 and r["FunctionError"] == "Unhandled"
    body = json.loads(r["Payload"].read())
    assert body["errorType"] == "ValueError" and body["errorMessage"] == "boom: testing"
    assert body["stackTrace"]
    assert "about to fail" in base64.b64decode(r["LogResult"]).decode()


def test_payload_limits_are_413_with_the_code_aws_sends(client: Any) -> None:
    # AWS answers RequestEntityTooLargeException (not the modelled RequestTooLargeException): a plain ClientError.
    from botocore.exceptions import ClientError

    big = json.dumps({"x": "a" * (6 * 1024 * 1024)}).encode()
    with pytest.raises(ClientError, match=re.escape("Request must be smaller than 6291456 bytes for the "
                                                    "InvokeFunction")) as info:
        client.invoke(FunctionName="echo", Payload=big)
    assert info.value.response["Error"]["Code"] == "RequestEntityTooLargeException"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 413
    with pytest.raises(ClientError, match=re.escape("smaller than 1048576 bytes")) as info:
        client.invoke(FunctionName="echo", InvocationType="Event", Payload=json.dumps({"x": "a" * 1100_000}).encode())
    assert info.value.response["Error"]["Code"] == "RequestEntityTooLargeException"


def test_response_over_6mb_is_a_function_error(client: Any) -> None:
    r = client.invoke(FunctionName="big", Payload=b"{}")
    assert r["FunctionError"] == "Unhandled"
    assert json.loads(r["Payload"].read())["errorType"] == "Function.ResponseSizeTooLarge"


def test_malformed_json_payload_is_invalid_request_content(client: Any) -> None:
    with pytest.raises(client.exceptions.InvalidRequestContentException, match="Could not parse request body"):
        client.invoke(FunctionName="echo", Payload=b"{not json")


def test_warm_worker_is_reused_across_invocations(client: Any, runtime: LocalRuntime) -> None:
    client.invoke(FunctionName="echo", Payload=b"{}")
    cold_before = runtime.stats["echo"].cold_starts
    pids = {json.loads(client.invoke(FunctionName="echo", Payload=b"{}")["Payload"].read())["pid"] for _ in range(5)}
    assert len(pids) == 1
    assert runtime.stats["echo"].cold_starts == cold_before


def _holding(client: Any, function: str, tmp_path: Path) -> tuple[threading.Event, Path]:
    """Invoke the `hold` handler as `function` on a thread; return once it runs. Touch the path to release it."""
    done, started, release = threading.Event(), tmp_path / "started", tmp_path / "release"
    event = json.dumps({"started": str(started), "release": str(release)}).encode()

    def occupy() -> None:
        client.invoke(FunctionName=function, Payload=event)
        done.set()

    threading.Thread(target=occupy, daemon=True).start()
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline, "the holding invocation never started"
        time.sleep(0.01)
    return done, release


def test_concurrency_cap_is_429_with_retry_after(client: Any, tmp_path: Path) -> None:
    done, release = _holding(client, "hold", tmp_path)
    with pytest.raises(client.exceptions.TooManyRequestsException) as info:
        client.invoke(FunctionName="hold", Payload=b'{}')
    release.touch()
    err = info.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert err["Reason"] == "ReservedFunctionConcurrentInvocationLimitExceeded"
    assert err["retryAfterSeconds"] == "1"
    assert done.wait(60)


def test_timeout_kills_the_worker_and_the_next_call_gets_a_fresh_one(client: Any, runtime: LocalRuntime) -> None:
    first = json.loads(client.invoke(FunctionName="sleepy", Payload=b'{"s": 0.01}')["Payload"].read())["pid"]
    t0 = time.monotonic()
    r = client.invoke(FunctionName="sleepy", Payload=b'{"s": 600}')
    assert time.monotonic() - t0 < 120  # stopped at its 1 s timeout, not after the 600 s it asked for
    assert r["FunctionError"] == "Unhandled"
    body = json.loads(r["Payload"].read())
    assert body["errorType"] == "Sandbox.Timedout"
    assert "Task timed out after 1.00 seconds" in body["errorMessage"]
    again = json.loads(client.invoke(FunctionName="sleepy", Payload=b'{"s": 0.01}')["Payload"].read())["pid"]
    assert again != first
    assert runtime.stats["sleepy"].timeouts == 1


def test_a_worker_that_exits_is_a_runtime_exit_error(client: Any) -> None:
    r = client.invoke(FunctionName="exit", Payload=b"{}")
    assert r["FunctionError"] == "Unhandled"
    body = json.loads(r["Payload"].read())
    assert body["errorType"] == "Runtime.ExitError"
    assert "exit status 3" in body["errorMessage"]


def test_init_error_is_reported_like_lambda(client: Any) -> None:
    r = client.invoke(FunctionName="missing-module", Payload=b"{}")
    assert r["FunctionError"] == "Unhandled"
    assert json.loads(r["Payload"].read())["errorType"] == "Runtime.ImportModuleError"


def test_memory_limit_turns_a_large_allocation_into_an_error(client: Any) -> None:
    ok = client.invoke(FunctionName="alloc", Payload=b'{"mb": 16}')
    assert "FunctionError" not in ok
    r = client.invoke(FunctionName="alloc", Payload=b'{"mb": 1024}')
    assert r["FunctionError"] == "Unhandled"
    assert json.loads(r["Payload"].read())["errorType"] == "MemoryError"


def test_aws_endpoint_url_lambda_is_honoured(runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", runtime.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    invoker = LambdaInvoker(region="us-east-1", function_timeout_s=5)
    result = invoker.invoke("echo", b'{"via": "env"}', log_tail=True)
    assert result.status_code == 200 and result.ok and result.executed_version == "$LATEST"
    assert json.loads(result.payload)["event"] == {"via": "env"}
    assert result.log_tail is not None and "echo handler saw" in result.log_tail
    with pytest.raises(FunctionNotFoundError, match=re.escape("LambdaInvoker.invoke('nope'): no such function")):
        invoker.invoke("nope", b"{}")
    with pytest.raises(PayloadTooLargeError, match=re.escape("over the Event limit")):
        invoker.invoke("echo", b'"' + b"a" * 1100_000 + b'"', invocation_type="Event")


def test_invoker_backs_off_on_injected_throttles_and_gives_up_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    specs = [FunctionSpec(name="echo", handler=H + "echo")]
    faults = FaultConfig(throttle_rate=0.5, service_error_rate=0.2, seed=3)
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0), faults=faults) as rt:
        sleeps: list[float] = []
        invoker = LambdaInvoker(endpoint_url=rt.url, region="us-east-1", function_timeout_s=5, max_retries=20,
                                sleep=sleeps.append, lambda_client=None)
        results = [invoker.invoke("echo", b"{}") for _ in range(10)]
        assert all(r.ok for r in results)
        assert sum(r.attempts for r in results) > 10 and len(sleeps) == sum(r.attempts - 1 for r in results)
        assert rt.stats["echo"].throttles > 0
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0),
                      faults=FaultConfig(throttle_rate=1.0)) as rt:
        invoker = LambdaInvoker(endpoint_url=rt.url, region="us-east-1", function_timeout_s=5, max_retries=2,
                                sleep=lambda s: None)
        with pytest.raises(ThrottledError, match=re.escape("still throttled (TooManyRequestsException) after 3")):
            invoker.invoke("echo", b"{}")


def test_crash_fault_kills_the_worker_mid_invocation() -> None:
    specs = [FunctionSpec(name="sleepy", handler=H + "sleepy")]
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0),
                      faults=FaultConfig(crash_rate=1.0)) as rt:
        r = lambda_client(rt.url).invoke(FunctionName="sleepy", Payload=b'{"s": 0.5}')
        assert r["FunctionError"] == "Unhandled"
        assert json.loads(r["Payload"].read())["errorType"] == "Runtime.ExitError"


@pytest.mark.parametrize(("text", "message"), [
    ("noequals", "--function 'noequals': expected NAME=module.handler"),
    ("f=mod.h,colour=red", "--function 'f=mod.h,colour=red': unknown option 'colour'"),
    ("f=mod.h,timeout=abc", "--function 'f=mod.h,timeout=abc': could not convert string to float"),
    ("f=mod.h,timeout=901", "FunctionSpec('f'): timeout_s must be in (0, 900], got 901.0"),
])
def test_bad_function_options_are_refused(text: str, message: str) -> None:
    with pytest.raises(RuntimeConfigError, match=re.escape(message)):
        parse_function_option(text)


def test_function_option_parses_every_setting() -> None:
    spec = parse_function_option("f=mod.h,timeout=5,memory=512,concurrency=3,versions=1+2,alias=live:2")
    assert (spec.timeout_s, spec.memory_mb, spec.reserved_concurrency) == (5.0, 512, 3)
    assert spec.resolve("live") == "2" and spec.resolve("1") == "1" and spec.resolve("3") is None


def test_bad_fault_rates_are_refused() -> None:
    with pytest.raises(RuntimeConfigError, match=re.escape("FaultConfig: throttle_rate must be in [0, 1], got 2")):
        FaultConfig(throttle_rate=2)


def test_client_context_reaches_the_handler(client: Any) -> None:
    ctx = base64.b64encode(json.dumps({"custom": {"run": "r7"}}).encode()).decode()
    r = client.invoke(FunctionName="echo", Payload=b"{}", ClientContext=ctx)
    assert json.loads(r["Payload"].read())["client_context"] == {"run": "r7"}


def test_failed_event_invocations_are_retried_twice_like_lambda(client: Any, runtime: LocalRuntime) -> None:
    before = runtime.stats["boom"].async_deliveries
    assert client.invoke(FunctionName="boom", InvocationType="Event", Payload=b"{}")["StatusCode"] == 202
    deadline = time.monotonic() + 60
    while runtime.stats["boom"].async_deliveries < before + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert runtime.stats["boom"].async_deliveries == before + 3


def test_cold_start_delay_fault_slows_only_the_first_invocation() -> None:
    specs = [FunctionSpec(name="echo", handler=H + "echo")]
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0),
                      faults=FaultConfig(cold_start_delay_s=2.0)) as rt:
        c = lambda_client(rt.url)
        t0 = time.monotonic()
        c.invoke(FunctionName="echo", Payload=b"{}")
        cold = time.monotonic() - t0
        t0 = time.monotonic()
        c.invoke(FunctionName="echo", Payload=b"{}")
        warm = time.monotonic() - t0
    assert cold >= 2.0 > warm and rt.stats["echo"].cold_starts == 1


def test_a_worker_that_cannot_start_is_a_service_exception(tmp_path: Any) -> None:
    specs = [FunctionSpec(name="echo", handler=H + "echo", code_dir=str(tmp_path / "missing"))]
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0)) as rt:
        client = lambda_client(rt.url)
        with pytest.raises(client.exceptions.ServiceException, match=re.escape("local runtime failed: ")):
            client.invoke(FunctionName="echo", Payload=b"{}")


def test_log_tail_stays_right_when_the_log_buffer_is_trimmed(client: Any) -> None:
    for i in range(4):  # ~400 KB of log: the runtime keeps the last 64 KB and must still find this call's lines
        r = client.invoke(FunctionName="echo", Payload=json.dumps({"i": i, "pad": "x" * 100_000}).encode(),
                          LogType="Tail")
        log = base64.b64decode(r["LogResult"]).decode()
        assert log.endswith(" MB\n") and "REPORT RequestId:" in log
        assert "x" * 1000 in log


def test_account_concurrency_cap_is_429_with_lambdas_reason(tmp_path: Path) -> None:
    specs = [FunctionSpec(name="hold", handler=H + "hold"), FunctionSpec(name="echo", handler=H + "echo")]
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0, account_concurrency=1)) as rt:
        client = lambda_client(rt.url)
        done, release = _holding(client, "hold", tmp_path)
        with pytest.raises(client.exceptions.TooManyRequestsException) as info:
            lambda_client(rt.url).invoke(FunctionName="echo", Payload=b"{}")
        assert info.value.response["Reason"] == "ConcurrentInvocationLimitExceeded"
        release.touch()
        assert done.wait(60)


def test_idle_workers_are_reclaimed_after_the_idle_timeout() -> None:
    specs = [FunctionSpec(name="echo", handler=H + "echo")]
    with LocalRuntime(SourceTreeFunctions(specs), config=RuntimeConfig(port=0, idle_timeout_s=2.0)) as rt:
        client = lambda_client(rt.url)
        first = json.loads(client.invoke(FunctionName="echo", Payload=b"{}")["Payload"].read())["pid"]
        assert json.loads(client.invoke(FunctionName="echo", Payload=b"{}")["Payload"].read())["pid"] == first
        time.sleep(2.5)  # idle past idle_timeout_s: the waiting is what is tested
        again = json.loads(client.invoke(FunctionName="echo", Payload=b"{}")["Payload"].read())["pid"]
        assert again != first and rt.stats["echo"].cold_starts == 2
