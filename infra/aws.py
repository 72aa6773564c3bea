"""The one module that wraps boto3: client construction and a Lambda invoker with honest retries.

Every AWS call strata makes goes through `client()`, so endpoint overrides, timeouts and retry policy
are decided in one place (Chalice's `TypedAWSClient` is the model). botocore itself honours
``AWS_ENDPOINT_URL`` and the per-service ``AWS_ENDPOINT_URL_<SERVICE>`` variables (e.g.
``AWS_ENDPOINT_URL_LAMBDA`` pointing at `strata functions serve` while S3 goes to moto), so nothing
here reads them; an explicit ``endpoint_url`` wins over both.

`LambdaInvoker` is the Invoke path shared by the local function runtime and AWS Lambda:

    invoke(name, payload) ─> one HTTP request (SDK retries off) ─> 2xx: typed `InvokeResult`
                                   │ 429 / 5xx / connect failure: strata's own backoff, then again
                                   └ ResourceNotFound / RequestEntityTooLarge (413) / other 4xx: typed `InfraError`

The SDK's own retries are off for Invoke because boto3's defaults replay a slow invocation up to 5
times (legacy mode) and each replay runs the function again; strata retries only errors where the
function did not run to a result, and its callers de-duplicate results by rollout id anyway.
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra._errors import FunctionNotFoundError, InfraError, PayloadTooLargeError, ThrottledError

_EXTRA = "infra"

#: Lambda's longest function timeout, seconds.
LAMBDA_MAX_TIMEOUT_S = 900.0

InvocationType = str  # "RequestResponse" | "Event" | "DryRun"
_INVOCATION_TYPES = ("RequestResponse", "Event", "DryRun")


def client(service: str, *, region: str | None = None, endpoint_url: str | None = None,
           read_timeout: float | None = None, connect_timeout: float | None = None,
           max_pool_connections: int | None = None, max_attempts: int | None = None,
           unsigned: bool = False, sleep: Callable[[float], None] = time.sleep) -> Any:
    """Return a boto3 client for `service` configured in strata's one way.

    Args:
        service: boto3 service name, e.g. ``"lambda"`` or ``"s3"``.
        region: AWS region; ``None`` resolves it as `resolve_region` does (``AWS_REGION``,
            ``AWS_DEFAULT_REGION``, the profile's region), falling back to ``us-east-1`` so a local endpoint
            works with no AWS configuration.
        endpoint_url: Explicit endpoint; ``None`` lets botocore honour ``AWS_ENDPOINT_URL_<SERVICE>``
            and ``AWS_ENDPOINT_URL``.
        read_timeout: Socket read timeout, seconds (botocore's default is 60).
        connect_timeout: Socket connect timeout, seconds (botocore's default is 60).
        max_pool_connections: HTTP connection pool size; size it to the caller's fan-out (default 10).
        max_attempts: Total attempts the SDK makes per call, first one included (``1`` turns SDK
            retries off); ``None`` keeps botocore's standard retry mode defaults.
        unsigned: Send requests unsigned, needing no credentials: for strata's own local endpoints
            (the local function runtime), never for AWS.
        sleep: Kept so every factory in this module has the same injectable-sleep signature; boto3's
            own retry sleeps are internal to botocore and cannot be injected.
    """
    del sleep  # botocore's retry sleeps are not injectable; see the docstring.
    from device import require

    boto3 = require("boto3", extra=_EXTRA, purpose="talking to AWS")
    botocore_config = require("botocore.config", extra=_EXTRA, purpose="talking to AWS")
    options: dict[str, Any] = {"retries": {"mode": "standard"}}
    if max_attempts is not None:
        if max_attempts < 1:
            raise ValueError(f"infra.aws.client: max_attempts must be >= 1, got {max_attempts}")
        options["retries"]["total_max_attempts"] = max_attempts
    if read_timeout is not None:
        options["read_timeout"] = read_timeout
    if connect_timeout is not None:
        options["connect_timeout"] = connect_timeout
    if max_pool_connections is not None:
        options["max_pool_connections"] = max_pool_connections
    if unsigned:
        options["signature_version"] = require("botocore", extra=_EXTRA, purpose="talking to AWS").UNSIGNED
    session = boto3.session.Session(botocore_session=_botocore_session())
    resolved_region = region or resolve_region(None, session=session)[0]
    return session.client(service, region_name=resolved_region, endpoint_url=endpoint_url,
                          config=botocore_config.Config(**options))


DEFAULT_REGION = "us-east-1"
"""Where strata deploys when nothing names a region (announced, never silent: see `resolve_region`)."""


def resolve_region(region: str | None, *, session: Any = None) -> tuple[str, str]:
    """``(region, why)``: the region strata acts in, and why (for the line the infra commands print first).

    `region` if given, else ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile's region, else `DEFAULT_REGION`.
    ``AWS_REGION`` is read here because botocore itself reads only ``AWS_DEFAULT_REGION``: a shell (or a Lambda
    function) with only ``AWS_REGION`` set would otherwise deploy to ``us-east-1`` while the user expects their
    region. ``AWS_REGION`` wins, as in the AWS CLI v2 and the other SDKs.
    """
    if region:
        return region, "--region"
    for variable in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if os.environ.get(variable):
            return os.environ[variable], f"from {variable}"
    if session is None:
        import boto3

        session = boto3.session.Session(botocore_session=_botocore_session())
    if session.region_name:
        return str(session.region_name), f"the region of AWS profile {session.profile_name!r}"
    return DEFAULT_REGION, "no --region, AWS_REGION or profile region set"


_shared_loader: list[Any] = []


def _botocore_session() -> Any:
    """A fresh botocore session (credentials and config re-read) sharing one data loader.

    Each new session would otherwise parse botocore's service and endpoint JSON again (~0.3 s per
    client on a loaded 2-core machine); the loader only caches those read-only model files.
    """
    import botocore.session

    session = botocore.session.get_session()
    if _shared_loader:
        session.register_component("data_loader", _shared_loader[0])
    else:
        _shared_loader.append(session.get_component("data_loader"))
    return session


@dataclass(frozen=True, kw_only=True)
class InvokeResult:
    """What one Lambda Invoke returned (after strata's retries)."""

    status_code: int
    """HTTP status of the successful attempt: 200 RequestResponse, 202 Event, 204 DryRun."""
    payload: bytes
    """The function's response bytes (empty for Event and DryRun)."""
    function_error: str | None
    """``X-Amz-Function-Error`` (``"Unhandled"`` when the handler raised or the worker died), else None."""
    log_tail: str | None
    """The last 4 KB of the function's log, decoded, when ``log_tail=True`` was asked for."""
    executed_version: str | None
    """``X-Amz-Executed-Version``: the function version that ran (RequestResponse only)."""
    attempts: int
    """HTTP attempts made, 1 when the first one succeeded."""
    duration_s: float
    """Wall time of the whole call, retries and backoff included."""

    @property
    def ok(self) -> bool:
        """True when the function ran and did not report an error."""
        return self.function_error is None


class LambdaInvoker:
    """Invoke Lambda functions (AWS or `strata functions serve`) with SDK retries off and strata's own backoff.

    Args:
        function_timeout_s: The longest the invoked functions may run; the read timeout is set above it
            so the SDK never gives up on (and replays) an invocation that is still running.
        region: AWS region (see `client`).
        endpoint_url: Explicit Lambda endpoint (see `client`).
        max_pool_connections: Connection pool size; set it to the number of concurrent invocations.
        max_retries: Retries after the first attempt for retryable errors (429, 5xx, connect failures).
        base_backoff_s: First backoff; doubles per retry, with full jitter.
        max_backoff_s: Cap of one backoff (and of a server's ``Retry-After``).
        sleep: Injectable sleep, so tests need not wait.
        lambda_client: A ready boto3 Lambda client to use instead of building one.
    """

    def __init__(self, *, function_timeout_s: float = 60.0, region: str | None = None,
                 endpoint_url: str | None = None, max_pool_connections: int = 10, max_retries: int = 6,
                 base_backoff_s: float = 0.05, max_backoff_s: float = 5.0,
                 sleep: Callable[[float], None] = time.sleep, lambda_client: Any = None,
                 unsigned: bool = False) -> None:
        if not 0 < function_timeout_s <= LAMBDA_MAX_TIMEOUT_S:
            raise ValueError(f"LambdaInvoker: function_timeout_s must be in (0, {LAMBDA_MAX_TIMEOUT_S:g}], "
                             f"got {function_timeout_s}")
        if max_retries < 0:
            raise ValueError(f"LambdaInvoker: max_retries must be >= 0, got {max_retries}")
        self.function_timeout_s = function_timeout_s
        self.max_retries = max_retries
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._rng = random.Random()
        # Read timeout above the function timeout: the service answers only when the function ends.
        self.client = lambda_client if lambda_client is not None else client(
            "lambda", region=region, endpoint_url=endpoint_url, read_timeout=function_timeout_s + 15.0,
            connect_timeout=10.0, max_pool_connections=max_pool_connections, max_attempts=1, unsigned=unsigned)

    def invoke(self, function_name: str, payload: bytes, *, invocation_type: InvocationType = "RequestResponse",
               qualifier: str | None = None, log_tail: bool = False) -> InvokeResult:
        """Invoke `function_name` once (plus retries of retryable failures) and return a typed result.

        Raises:
            FunctionNotFoundError: No such function or qualifier at the endpoint.
            PayloadTooLargeError: The payload is over the invocation type's limit.
            ThrottledError: Still throttled after ``max_retries`` retries.
            InfraError: Any other service error, or 5xx / connection failures that outlived the retries.
        """
        if invocation_type not in _INVOCATION_TYPES:
            raise ValueError(f"LambdaInvoker.invoke: invocation_type must be one of {_INVOCATION_TYPES}, "
                             f"got {invocation_type!r}")
        from botocore.exceptions import ClientError, EndpointConnectionError

        kwargs: dict[str, Any] = {"FunctionName": function_name, "InvocationType": invocation_type,
                                  "Payload": payload, "LogType": "Tail" if log_tail else "None"}
        if qualifier is not None:
            kwargs["Qualifier"] = qualifier
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self.client.invoke(**kwargs)
            except EndpointConnectionError as exc:
                # Retryable: the connection was never established, so the function did not start.
                if attempt > self.max_retries:
                    raise InfraError(f"LambdaInvoker.invoke({function_name!r}): cannot connect to the Lambda "
                                     f"endpoint after {attempt} attempts ({exc}); check endpoint_url / "
                                     "AWS_ENDPOINT_URL_LAMBDA and that the runtime is running") from exc
                self._sleep(self._backoff(attempt, None))
                continue
            except ClientError as exc:
                error = exc.response.get("Error", {})
                code = str(error.get("Code", ""))
                message = str(error.get("Message", exc))
                meta = exc.response.get("ResponseMetadata", {})
                status = int(meta.get("HTTPStatusCode", 0))
                headers = {str(k).lower(): str(v) for k, v in meta.get("HTTPHeaders", {}).items()}
                where = f"LambdaInvoker.invoke({function_name!r}"
                where += f", qualifier={qualifier!r})" if qualifier else ")"
                if code == "ResourceNotFoundException":
                    raise FunctionNotFoundError(f"{where}: no such function ({message}); deploy it or check "
                                                "the name, qualifier and endpoint") from exc
                # AWS sends RequestEntityTooLargeException; botocore's model names RequestTooLargeException.
                if code in ("RequestEntityTooLargeException", "RequestTooLargeException") or status == 413:
                    raise PayloadTooLargeError(f"{where}: payload of {len(payload)} bytes is over the "
                                               f"{invocation_type} limit ({message}); pass large inputs "
                                               "by S3 reference") from exc
                if status == 429:
                    # Retryable: throttling (concurrency cap or scaling rate) is transient by definition and
                    # the function did not run; Lambda may tell us when to come back (Retry-After).
                    if attempt > self.max_retries:
                        raise ThrottledError(f"{where}: still throttled ({code}) after {attempt} attempts; "
                                             "lower the concurrency or raise the function's limit") from exc
                    self._sleep(self._backoff(attempt, headers.get("retry-after")))
                    continue
                if status >= 500:
                    # Retryable: a service-side failure (ServiceException, ENI/EC2 trouble) produced no
                    # function result; a rerun may repeat work, which callers de-duplicate by rollout id.
                    if attempt > self.max_retries:
                        raise InfraError(f"{where}: service error {code} ({status}) after {attempt} "
                                         f"attempts: {message}") from exc
                    self._sleep(self._backoff(attempt, headers.get("retry-after")))
                    continue
                raise InfraError(f"{where}: {code or status}: {message}") from exc
            break
        body = response.get("Payload")
        data = body.read() if body is not None else b""
        log_result = response.get("LogResult")
        log_text = None
        if log_result:
            log_text = base64.b64decode(log_result).decode("utf-8", errors="replace")
        return InvokeResult(status_code=int(response.get("StatusCode", 0)), payload=data,
                            function_error=response.get("FunctionError"), log_tail=log_text,
                            executed_version=response.get("ExecutedVersion"), attempts=attempt,
                            duration_s=time.monotonic() - started)

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before retry number `attempt` (full jitter, capped; ``Retry-After`` is a floor)."""
        delay = self._rng.uniform(0.0, min(self.max_backoff_s, self.base_backoff_s * 2 ** (attempt - 1)))
        if retry_after:
            with contextlib.suppress(ValueError):  # an HTTP-date Retry-After is ignored; jitter still applies
                delay = max(delay, min(float(retry_after), self.max_backoff_s))
        return delay


# --- control-plane helpers used by the deploy pipeline (infra/_deploy.py) --------------------------

#: Error codes that mean "this resource does not exist": readers turn them into ``None``.
NOT_FOUND_CODES = frozenset({
    "ResourceNotFoundException",  # Lambda, IoT
    "NoSuchEntity",  # IAM
    "NoSuchBucket", "404", "NotFound", "NoSuchKey",  # S3 (HEAD answers a bare 404)
    "NoSuchTagSet", "NoSuchPublicAccessBlockConfiguration",  # S3 sub-resources that were never set
    "NoSuchBucketPolicy", "ServerSideEncryptionConfigurationNotFoundError",
    "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist",  # SQS (query and JSON protocols)
})


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError``, else None."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None


def is_not_found(exc: BaseException) -> bool:
    """Whether `exc` is a ``ClientError`` saying the resource does not exist."""
    return error_code(exc) in NOT_FOUND_CODES


def or_none(call: Callable[..., Any], /, **kwargs: Any) -> Any:
    """Return ``call(**kwargs)``, or None when AWS answers that the resource does not exist."""
    from botocore.exceptions import ClientError

    try:
        return call(**kwargs)
    except ClientError as exc:
        if is_not_found(exc):
            return None
        raise


def retry_while(call: Callable[..., Any], /, *, codes: frozenset[str], message_part: str = "",
                attempts: int = 10, delay_s: float = 2.0, sleep: Callable[[float], None] = time.sleep,
                **kwargs: Any) -> Any:
    """Call `call(**kwargs)`, retrying while AWS answers one of `codes` (and `message_part` is in the message).

    For eventual consistency only: e.g. a Lambda create right after its IAM role was created fails with
    ``InvalidParameterValueException`` ("cannot be assumed by Lambda") for some seconds, until IAM has
    propagated the role; the request did nothing, so repeating it is safe.
    """
    from botocore.exceptions import ClientError

    for attempt in range(1, attempts + 1):
        try:
            return call(**kwargs)
        except ClientError as exc:
            message = str(getattr(exc, "response", {}).get("Error", {}).get("Message", ""))
            if error_code(exc) not in codes or message_part not in message or attempt == attempts:
                raise
            sleep(delay_s)
    raise AssertionError("unreachable")  # pragma: no cover


class Clients:
    """The boto3 clients of one deployment (one region), built on first use through `client`.

    Args:
        region: The region every client talks to.
        sleep: Injectable sleep for waits and eventual-consistency retries.
    """

    def __init__(self, *, region: str | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.sleep = sleep
        self._account: str | None = None
        resolved, reason = resolve_region(region)
        self.region_reason: str = reason
        """Why `region` is the region (`resolve_region`), for the line the commands print."""
        sts = client("sts", region=resolved)
        self.region: str = str(sts.meta.region_name)
        """The resolved region (`resolve_region`: the argument, AWS_REGION, AWS_DEFAULT_REGION, the profile)."""
        self._clients: dict[str, Any] = {"sts": sts}

    def get(self, service: str) -> Any:
        """The client for `service` (``"s3"``, ``"iam"``, ``"lambda"``, ``"iot"``, ``"sts"``)."""
        if service not in self._clients:
            self._clients[service] = client(service, region=self.region)
        return self._clients[service]

    def account_id(self) -> str:
        """The caller's AWS account id (STS GetCallerIdentity), fetched once."""
        if self._account is None:
            self._account = str(self.get("sts").get_caller_identity()["Account"])
        return self._account

    def s3_over_tls(self) -> bool:
        """Whether S3 is reached over HTTPS (always on AWS; plain HTTP for a local emulator such as moto)."""
        return str(self.get("s3").meta.endpoint_url).startswith("https://")

__all__ = ["DEFAULT_REGION", "LAMBDA_MAX_TIMEOUT_S", "NOT_FOUND_CODES", "Clients", "InvokeResult", "LambdaInvoker",
           "client", "error_code", "is_not_found", "or_none", "resolve_region", "retry_while"]
