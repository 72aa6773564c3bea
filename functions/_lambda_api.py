"""Lambda's API rules for the local runtime: the read operations, input checks and errors, as AWS answers them.

Read operations (``{name}`` is a name, ``name:qualifier`` or a full or partial ARN, as in Lambda):

    GET /2015-03-31/functions/                          ListFunctions                paginated, FunctionVersion=ALL
    GET /2015-03-31/functions/{name}                    GetFunction                  {"Configuration", "Code", ...}
    GET /2015-03-31/functions/{name}/configuration      GetFunctionConfiguration     FunctionConfiguration
    GET /2015-03-31/functions/{name}/versions           ListVersionsByFunction       paginated, $LATEST first
    GET /2015-03-31/functions/{name}/aliases            ListAliases                  paginated, FunctionVersion=N
    GET /2015-03-31/functions/{name}/aliases/{alias}    GetAlias                     AliasConfiguration
    GET /2019-09-30/functions/{name}/concurrency        GetFunctionConcurrency       the worker cap
    GET /2019-09-25/functions/{name}/event-invoke-config[/list]   Get/ListFunctionEventInvokeConfig(s)
    GET /2016-08-19/account-settings/                   GetAccountSettings           limits and usage

Every List* call pages with ``Marker`` / ``MaxItems`` (1-10000, default 50) and answers ``NextMarker`` while
more follow. A client mistake gets the error AWS sends for it (the table is in
``tests/functions/test_runtime_api.py`` and docs/aws.md):

    a value outside the model's constraints (enum, pattern, range)     400 ValidationException
                                                                        ("1 validation error detected: ...")
    a Qualifier disagreeing with the name's, a bad Marker               400 InvalidParameterValueException
    a body that is not JSON (nested too deep included), a ClientContext
    that is not base64 JSON or is over 3583 bytes                      400 InvalidRequestContentException
    an unknown function, version or alias                              404 ResourceNotFoundException
    an operation the runtime does not implement (writes)               404 UnknownOperationException

``ValidationException`` (like ``RequestEntityTooLargeException`` for an oversized Invoke) is what AWS sends
although botocore's model does not list it; every other code is one the model lists for the operation,
with the model's HTTP status.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

from device._names import shown
from functions._errors import RuntimeConfigError

ACCOUNT_ID = "000000000000"
FUNCTIONS_PATH = "/2015-03-31/functions"
LOCAL_RUNTIME = f"python{sys.version_info.major}.{sys.version_info.minor}"
"""What ``Runtime`` reports: the workers run on this interpreter."""
_STARTED = time.strftime("%Y-%m-%dT%H:%M:%S.000+0000", time.gmtime())
_STARTED_EPOCH = float(int(time.time()))

# Constraints of botocore's Lambda model (tests/functions/test_runtime_api.py checks them against it).
FUNCTION_NAME_PATTERN = (r"(arn:(aws[a-zA-Z-]*)?:lambda:)?((eusc-)?[a-z]{2}((-gov)|(-iso([a-z]?)))?-[a-z]+-\d{1}:)?"
                         r"(\d{12}:)?(function:)?([a-zA-Z0-9-_\.]+)(:(\$LATEST(\.PUBLISHED)?|[a-zA-Z0-9-_]+))?")
FUNCTION_NAME_MAX = 256
QUALIFIER_PATTERN = r"\$(LATEST(\.PUBLISHED)?)|[a-zA-Z0-9-_$]+"
QUALIFIER_MAX = 128
ALIAS_PATTERN = r"(?!^[0-9]+$)([a-zA-Z0-9-_]+)"
ALIAS_MAX = 128
VERSION_PATTERN = r"(\$LATEST(\.PUBLISHED)?|[0-9]+)"
INVOCATION_TYPES = ("Event", "RequestResponse", "DryRun")
STREAM_INVOCATION_TYPES = ("RequestResponse", "DryRun")
LOG_TYPES = ("None", "Tail")
MAX_ITEMS_RANGE = (1, 10000)
DEFAULT_PAGE_SIZE = 50
"""Items per List* page when ``MaxItems`` is not given (Lambda's page size)."""
CLIENT_CONTEXT_LIMIT = 3583
"""Most bytes of base64 ``ClientContext`` an invocation may carry (Lambda's documented limit)."""
MAX_RETRY_ATTEMPTS = 2
"""Lambda's most retries of a failed asynchronous invocation (``MaximumRetryAttempts``)."""

_PLAIN_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_SQS_ARN = re.compile(r"arn:aws[a-zA-Z-]*:sqs:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,80}")


@dataclass(frozen=True, kw_only=True)
class FunctionSpec:
    """One function the runtime serves; checked like Lambda checks a function's configuration."""

    name: str
    """Function name, as in ``FunctionName`` (1-64 letters, digits, '-' or '_')."""
    handler: str
    """``module.attribute`` of the handler, e.g. ``functions._handlers.rollout_handler``."""
    timeout_s: float = 30.0
    """Longest one invocation may run (Lambda: 1-900 s); past it the worker is killed."""
    memory_mb: int = 1024
    """Memory size (Lambda: 128-10240 MB), reported to the handler and enforced as RLIMIT_AS (see module doc)."""
    reserved_concurrency: int = 4
    """Most concurrent invocations (= warm workers); one more synchronous invocation gets 429."""
    environment: Mapping[str, str] = field(default_factory=dict)
    """Environment variables of the function (Lambda's function configuration)."""
    versions: tuple[str, ...] = ()
    """Published version numbers a ``Qualifier`` may name, besides ``$LATEST`` (all run the same code here)."""
    aliases: Mapping[str, str] = field(default_factory=dict)
    """Alias name -> version (a published one or ``$LATEST``); checked when the spec is made, as Lambda checks."""
    code_dir: str | None = None
    """Directory prepended to the workers' PYTHONPATH (an unpacked deployment package); None: the source tree."""
    code_sha256: str = ""
    """``CodeSha256`` the read operations report (a deployment's); empty: a stand-in hash of handler and code."""
    code_size: int = 0
    """``CodeSize`` in bytes the read operations report."""
    on_failure: str = ""
    """ARN of the SQS queue a failed Event invocation goes to once its retries are spent (Lambda's on-failure
    destination); empty: none."""
    async_retries: int | None = None
    """Retries of a failed Event invocation (Lambda's ``MaximumRetryAttempts``, 0-2); None: the runtime's."""

    def __post_init__(self) -> None:
        where = f"FunctionSpec({shown(self.name)})"
        if not isinstance(self.name, str) or not _PLAIN_NAME.fullmatch(self.name):
            raise RuntimeConfigError(f"{where}: a function name is 1-64 letters, digits, '-' or '_'")
        if not 0 < self.timeout_s <= 900:
            raise RuntimeConfigError(f"{where}: timeout_s must be in (0, 900], got {self.timeout_s}")
        if not 128 <= self.memory_mb <= 10240:
            raise RuntimeConfigError(f"{where}: memory_mb must be in [128, 10240], got {self.memory_mb}")
        if self.reserved_concurrency < 1:
            raise RuntimeConfigError(f"{where}: reserved_concurrency must be >= 1, got {self.reserved_concurrency}")
        if "." not in self.handler:
            raise RuntimeConfigError(f"{where}: handler must be 'module.attribute', got {shown(self.handler)}")
        for version in self.versions:
            if not re.fullmatch(r"[1-9][0-9]{0,9}", version):
                raise RuntimeConfigError(f"{where}: version {shown(version)} is not a version number (1, 2, ...)")
        if len(set(self.versions)) != len(self.versions):
            raise RuntimeConfigError(f"{where}: versions {list(self.versions)} list a version twice")
        for alias, version in self.aliases.items():
            if not (isinstance(alias, str) and len(alias) <= ALIAS_MAX and re.fullmatch(ALIAS_PATTERN, alias)):
                raise RuntimeConfigError(f"{where}: alias {shown(alias)} is not an alias name: 1-128 letters, "
                                         "digits, '-' or '_', not all digits")
            if version != "$LATEST" and version not in self.versions:
                published = ", ".join(self.versions) or "none"
                raise RuntimeConfigError(f"{where}: alias {alias!r} points at version {shown(version)}, which is "
                                         f"not published (versions: {published}); add it with versions=... or "
                                         "point the alias at one of them or at $LATEST")
        if self.on_failure and not _SQS_ARN.fullmatch(self.on_failure):
            raise RuntimeConfigError(f"{where}: on_failure {shown(self.on_failure)} is not an SQS queue ARN "
                                     "(arn:aws:sqs:REGION:ACCOUNT:NAME), the one destination the runtime sends to")
        if self.async_retries is not None and not 0 <= self.async_retries <= MAX_RETRY_ATTEMPTS:
            raise RuntimeConfigError(f"{where}: async_retries must be 0, 1 or 2 (Lambda's MaximumRetryAttempts), "
                                     f"got {self.async_retries}")

    def resolve(self, qualifier: str | None) -> str | None:
        """The version a qualifier names (``$LATEST``, a version or an alias), or None when unknown."""
        if qualifier in (None, "", "$LATEST"):
            return "$LATEST"
        if qualifier in self.versions:
            return qualifier
        return self.aliases.get(qualifier) if qualifier is not None else None


class ApiError(Exception):
    """An AWS error response: HTTP status, ``x-amzn-ErrorType`` and the JSON body."""

    def __init__(self, status: int, error_type: str, body: Mapping[str, Any],
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(error_type)
        self.status, self.error_type, self.body, self.headers = status, error_type, body, dict(headers or {})


class Source(Protocol):
    """What the read API needs of the runtime's `FunctionSource`."""

    def get(self, name: str) -> FunctionSpec | None: ...

    def names(self) -> list[str]: ...

    def version_spec(self, name: str, version: str) -> FunctionSpec | None: ...


@dataclass(frozen=True, kw_only=True)
class Account:
    """What GetAccountSettings and the event-invoke-config reads report of the runtime itself."""

    region: str
    concurrency: int
    """``RuntimeConfig.account_concurrency``."""
    async_retries: int
    """``RuntimeConfig.async_retries``: a function's retries when its spec does not set them."""


# ---- errors ---------------------------------------------------------------------------------------------------

def validation_error(member: str, value: object, constraint: str) -> ApiError:
    """AWS's 400 ``ValidationException`` for a value outside the model's constraints on `member`."""
    text = value if isinstance(value, str) else str(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return ApiError(400, "ValidationException", {"message": f"1 validation error detected: Value '{text}' at "
                                                            f"'{member}' failed to satisfy constraint: {constraint}"})


def invalid_parameter(message: str) -> ApiError:
    """Lambda's 400 ``InvalidParameterValueException``."""
    return ApiError(400, "InvalidParameterValueException", {"Type": "User", "message": message})


def invalid_content(message: str) -> ApiError:
    """Lambda's 400 ``InvalidRequestContentException`` (a body that is not JSON, or an invalid request header)."""
    return ApiError(400, "InvalidRequestContentException", {"Type": "User", "message": message})


def unknown_operation(method: str, path: str) -> ApiError:
    """The 404 ``UnknownOperationException`` for anything the runtime does not implement (every write API)."""
    return ApiError(404, "UnknownOperationException", {
        "Type": "User", "message": f"Unknown operation {method} {shown(path, 120)[1:-1]}: the local runtime "
                                   "implements Invoke, InvokeAsync, InvokeWithResponseStream and the read operations "
                                   "(docs/aws.md); it changes no function"})


def check_enum(member: str, value: str, allowed: Sequence[str]) -> str:
    """`value` if it is one of `allowed`, else a `validation_error`."""
    if value not in allowed:
        raise validation_error(member, value, f"Member must satisfy enum value set: [{', '.join(allowed)}]")
    return value


def check_pattern(member: str, value: str, pattern: str, longest: int) -> str:
    """`value` if it is 1-`longest` characters matching `pattern` in full, else a `validation_error`."""
    if len(value) > longest:
        raise validation_error(member, value, f"Member must have length less than or equal to {longest}")
    if not value or not re.fullmatch(pattern, value):
        raise validation_error(member, value, f"Member must satisfy regular expression pattern: {pattern}")
    return value


def _param(query: Mapping[str, list[str]], name: str) -> str | None:
    """The first value of query parameter `name`, or None."""
    values = query.get(name)
    return values[0] if values else None


def function_arn(region: str, name: str, qualifier: str | None = None) -> str:
    """``arn:aws:lambda:{region}:{account}:function:{name}[:{qualifier}]``."""
    arn = f"arn:aws:lambda:{region}:{ACCOUNT_ID}:function:{name}"
    return f"{arn}:{qualifier}" if qualifier else arn


def split_function_name(text: str) -> tuple[str, str | None]:
    """``name``, ``name:qualifier`` or an ARN (full or partial) -> ``(name, qualifier)``."""
    parts = unquote(text).split(":")
    if "function" in parts:
        parts = parts[parts.index("function") + 1:]
    return parts[0], (parts[1] if len(parts) > 1 else None)


def split_qualifier(function: str, query: Mapping[str, list[str]]) -> tuple[str, str | None]:
    """``(name, qualifier)`` from the path's function name and the ``Qualifier`` parameter (Lambda's rules).

    Raises:
        ApiError: 400 ``ValidationException`` for a name or qualifier outside the model's pattern, 400
            ``InvalidParameterValueException`` when both name a qualifier and they differ.
    """
    check_pattern("functionName", unquote(function), FUNCTION_NAME_PATTERN, FUNCTION_NAME_MAX)
    name, derived = split_function_name(function)
    given = _param(query, "Qualifier")
    if given is not None:
        check_pattern("qualifier", given, QUALIFIER_PATTERN, QUALIFIER_MAX)
    if derived is not None and given is not None and derived != given:
        raise invalid_parameter("The derived qualifier from the function name does not match the specified "
                                "qualifier.")
    return name, given or derived


def not_found(region: str, name: str, qualifier: str | None = None) -> ApiError:
    """Lambda's 404 for an unknown function (or an unknown version or alias of it)."""
    return ApiError(404, "ResourceNotFoundException", {
        "Type": "User", "Message": f"Function not found: {function_arn(region, name, qualifier)}"})


def decode_client_context(header: str | None) -> str | None:
    """The JSON text of an ``X-Amz-Client-Context`` header (base64 of a JSON object, at most 3583 bytes).

    Raises:
        ApiError: 400 ``InvalidRequestContentException``, which Lambda's model documents for an invalid request
            header, and which AWS sends for a context that is not base64-encoded JSON.
    """
    if not header:
        return None
    if len(header) > CLIENT_CONTEXT_LIMIT:
        raise invalid_content(f"Client context must be at most {CLIENT_CONTEXT_LIMIT} bytes of base64-encoded "
                              f"data; got {len(header)} bytes")
    try:
        text = base64.b64decode(header, validate=True).decode("utf-8")
        ok = isinstance(json.loads(text), dict)
    except (binascii.Error, ValueError, RecursionError):
        ok = False
    if not ok:
        raise invalid_content("Client context must be a valid Base64-encoded JSON object.")
    return text


def parse_payload(payload: bytes) -> bytes:
    """`payload` (``{}`` when empty) if it is JSON; else Lambda's 400, never a 500 (a RecursionError included)."""
    if not payload:
        return b"{}"
    try:
        json.loads(payload)
    except RecursionError:
        raise invalid_content("Could not parse request body into json: the document is nested too deeply") from None
    except ValueError as exc:
        raise invalid_content(f"Could not parse request body into json: {exc}") from exc
    return payload


# ---- pagination -----------------------------------------------------------------------------------------------

def page(items: list[dict[str, Any]], query: Mapping[str, list[str]], *, key: str,
         most: int = MAX_ITEMS_RANGE[1]) -> dict[str, Any]:
    """One page of `items` under `key`, as every Lambda List* call pages: ``Marker`` in, ``NextMarker`` out.

    Raises:
        ApiError: ``MaxItems`` outside 1-`most` (400 ValidationException; 10000, or 50 for event-invoke configs,
            as in the model) or not a number, or a ``Marker`` this
            list did not hand out (400 InvalidParameterValueException).
    """
    text = _param(query, "MaxItems")
    size = DEFAULT_PAGE_SIZE
    if text is not None:
        try:
            size = int(text)
        except ValueError:
            raise invalid_parameter(f"MaxItems {shown(text)} is not an integer") from None
        low, high = MAX_ITEMS_RANGE[0], most
        if size < low:
            raise validation_error("maxItems", text, f"Member must have value greater than or equal to {low}")
        if size > high:
            raise validation_error("maxItems", text, f"Member must have value less than or equal to {high}")
    start = 0
    marker = _param(query, "Marker")
    if marker is not None:
        start = _marker_offset(marker, key)
        if start > len(items):
            raise invalid_parameter(f"Marker {shown(marker)} is past the end of the list; list again from the start")
    out: dict[str, Any] = {key: items[start:start + size]}
    if start + size < len(items):
        out["NextMarker"] = base64.urlsafe_b64encode(f"{key}:{start + size}".encode()).decode()
    return out


def _marker_offset(marker: str, key: str) -> int:
    try:
        what, _, offset = base64.urlsafe_b64decode(marker.encode()).decode().partition(":")
        if what == key and offset.isdigit():
            return int(offset)
    except (binascii.Error, ValueError):
        pass
    raise invalid_parameter(f"Marker {shown(marker)} is not a marker of this list; pass the NextMarker it returned")


# ---- shapes ---------------------------------------------------------------------------------------------------

def code_sha256(spec: FunctionSpec) -> str:
    """The spec's ``CodeSha256``, or a stable stand-in made from its handler and code folder."""
    if spec.code_sha256:
        return spec.code_sha256
    return base64.b64encode(hashlib.sha256(f"{spec.handler}\0{spec.code_dir}".encode()).digest()).decode()


def function_configuration(spec: FunctionSpec, version: str, *, region: str,
                           arn_qualifier: str | None) -> dict[str, Any]:
    """Lambda's ``FunctionConfiguration`` of `spec` at `version`; the ARN carries `arn_qualifier` as asked."""
    return {
        "FunctionName": spec.name,
        "FunctionArn": function_arn(region, spec.name, arn_qualifier),
        "Runtime": LOCAL_RUNTIME,
        "Role": f"arn:aws:iam::{ACCOUNT_ID}:role/strata-local-runtime",
        "Handler": spec.handler,
        "CodeSize": int(spec.code_size),
        "Description": "",
        "Timeout": max(1, int(-(-spec.timeout_s // 1))),
        "MemorySize": int(spec.memory_mb),
        "LastModified": _STARTED,
        "CodeSha256": code_sha256(spec),
        "Version": version,
        "Environment": {"Variables": dict(spec.environment)},
        "TracingConfig": {"Mode": "PassThrough"},
        "RevisionId": hashlib.sha256(f"{spec.name}:{version}:{code_sha256(spec)}".encode()).hexdigest()[:36],
        "State": "Active",
        "LastUpdateStatus": "Successful",
        "PackageType": "Zip",
        "Architectures": ["x86_64"],
        "EphemeralStorage": {"Size": 512},
    }


def alias_configuration(spec: FunctionSpec, alias: str, *, region: str) -> dict[str, Any]:
    """Lambda's ``AliasConfiguration`` of `alias` of `spec`."""
    version = spec.aliases[alias]
    return {"AliasArn": function_arn(region, spec.name, alias), "Name": alias, "FunctionVersion": version,
            "Description": "", "RevisionId": hashlib.sha256(f"{spec.name}:{alias}:{version}".encode()).hexdigest()[:36]}


def event_invoke_config(spec: FunctionSpec, qualifier: str | None, account: Account) -> dict[str, Any]:
    """Lambda's ``FunctionEventInvokeConfig`` of `spec`: its retries and on-failure destination."""
    retries = account.async_retries if spec.async_retries is None else spec.async_retries
    destination = {"OnSuccess": {}, "OnFailure": {"Destination": spec.on_failure} if spec.on_failure else {}}
    return {"LastModified": _STARTED_EPOCH, "FunctionArn": function_arn(account.region, spec.name, qualifier),
            "MaximumRetryAttempts": retries, "MaximumEventAgeInSeconds": 21600, "DestinationConfig": destination}


def _versions(spec: FunctionSpec) -> list[str]:
    return ["$LATEST", *sorted(spec.versions, key=lambda v: (len(v), v))]


def _function(source: Source, region: str, name: str, qualifier: str | None) -> tuple[FunctionSpec, str]:
    """The spec of the version `qualifier` names (resolving an alias), and that version."""
    spec = source.get(name)
    version = spec.resolve(qualifier) if spec is not None else None
    if spec is None or version is None:
        raise not_found(region, name, qualifier)
    at_version = spec if version == "$LATEST" else source.version_spec(name, version)
    if at_version is None:
        raise not_found(region, name, qualifier)
    return at_version, version


def _unqualified(source: Source, region: str, function: str, operation: str) -> FunctionSpec:
    """The spec of an operation that takes an unqualified name (List*, GetAlias, concurrency)."""
    check_pattern("functionName", unquote(function), FUNCTION_NAME_PATTERN, FUNCTION_NAME_MAX)
    name, qualifier = split_function_name(function)
    if qualifier is not None:
        raise invalid_parameter(f"{operation} takes an unqualified function name, got {shown(unquote(function))}")
    spec = source.get(name)
    if spec is None:
        raise not_found(region, name)
    return spec


# ---- the read operations --------------------------------------------------------------------------------------

def handle_get(source: Source, account: Account, path: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
    """Answer one read operation (see the module docstring); raises `ApiError` with AWS's error shapes."""
    region = account.region
    if path.rstrip("/") == "/2016-08-19/account-settings":
        return _account_settings(source, account)
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 4 and parts[:2] == ["2019-09-30", "functions"] and parts[3:] == ["concurrency"]:
        spec = _unqualified(source, region, parts[2], "GetFunctionConcurrency")
        return {"ReservedConcurrentExecutions": spec.reserved_concurrency}
    if len(parts) >= 4 and parts[:2] == ["2019-09-25", "functions"] and parts[3] == "event-invoke-config":
        return _event_invoke_configs(source, account, parts[2], parts[4:], query)
    if not path.startswith(FUNCTIONS_PATH):
        raise unknown_operation("GET", path)
    rest = path[len(FUNCTIONS_PATH):].strip("/")
    if not rest:
        return _list_functions(source, region, query)
    parts = rest.split("/")
    function, tail = parts[0], parts[1:]
    if tail in ([], ["configuration"]):
        name, qualifier = split_qualifier(function, query)
        spec, version = _function(source, region, name, qualifier)
        config = function_configuration(spec, version, region=region,
                                        arn_qualifier=None if qualifier == "$LATEST" else qualifier)
        if tail:
            return config
        return {"Configuration": config, "Code": {"RepositoryType": "S3"}, "Tags": {},
                "Concurrency": {"ReservedConcurrentExecutions": spec.reserved_concurrency}}
    if tail == ["versions"]:
        spec = _unqualified(source, region, function, "ListVersionsByFunction")
        versions = [function_configuration(spec, "$LATEST", region=region, arn_qualifier="$LATEST")]
        versions += [function_configuration(v, version, region=region, arn_qualifier=version)
                     for version in _versions(spec)[1:] if (v := source.version_spec(spec.name, version))]
        return page(versions, query, key="Versions")
    if tail == ["aliases"]:
        spec = _unqualified(source, region, function, "ListAliases")
        wanted = _param(query, "FunctionVersion")
        if wanted is not None:
            check_pattern("functionVersion", wanted, VERSION_PATTERN, 1024)
        return page([alias_configuration(spec, a, region=region) for a in sorted(spec.aliases)
                     if wanted in (None, spec.aliases[a])], query, key="Aliases")
    if len(tail) == 2 and tail[0] == "aliases":
        spec = _unqualified(source, region, function, "GetAlias")
        alias = unquote(tail[1])
        check_pattern("name", alias, ALIAS_PATTERN, ALIAS_MAX)
        if alias not in spec.aliases:
            raise ApiError(404, "ResourceNotFoundException", {
                "Type": "User", "Message": f"Cannot find alias arn: {function_arn(region, spec.name, alias)}"})
        return alias_configuration(spec, alias, region=region)
    raise unknown_operation("GET", path)


def _list_functions(source: Source, region: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
    every = _param(query, "FunctionVersion")
    if every is not None:
        check_enum("functionVersion", every, ["ALL"])
    listed = []
    for name in source.names():
        spec = source.get(name)
        if spec is None:
            continue
        listed.append(function_configuration(spec, "$LATEST", region=region, arn_qualifier=None))
        if every == "ALL":
            listed += [function_configuration(v, version, region=region, arn_qualifier=version)
                       for version in _versions(spec)[1:] if (v := source.version_spec(name, version))]
    return page(listed, query, key="Functions")


def _event_invoke_configs(source: Source, account: Account, function: str, tail: list[str],
                          query: Mapping[str, list[str]]) -> dict[str, Any]:
    if tail == ["list"]:
        spec = _unqualified(source, account.region, function, "ListFunctionEventInvokeConfigs")
        configured = spec.on_failure or spec.async_retries is not None
        return page([event_invoke_config(spec, None, account)] if configured else [], query,
                    key="FunctionEventInvokeConfigs", most=50)
    if tail:
        raise unknown_operation("GET", f"/2019-09-25/functions/{function}/event-invoke-config/{'/'.join(tail)}")
    name, qualifier = split_qualifier(function, query)
    spec, _ = _function(source, account.region, name, qualifier)
    if not spec.on_failure and spec.async_retries is None:
        raise ApiError(404, "ResourceNotFoundException", {
            "Type": "User", "Message": f"The function {function_arn(account.region, name, qualifier)} doesn't have "
                                       "an EventInvokeConfig"})
    return event_invoke_config(spec, qualifier, account)


def _account_settings(source: Source, account: Account) -> dict[str, Any]:
    specs = [s for s in (source.get(n) for n in source.names()) if s is not None]
    reserved = sum(s.reserved_concurrency for s in specs)
    return {"AccountLimit": {"TotalCodeSize": 80 * 1024 ** 3, "CodeSizeUnzipped": 250 * 1024 ** 2,
                             "CodeSizeZipped": 50 * 1024 ** 2, "ConcurrentExecutions": account.concurrency,
                             "UnreservedConcurrentExecutions": max(account.concurrency - reserved, 0)},
            "AccountUsage": {"TotalCodeSize": sum(s.code_size for s in specs), "FunctionCount": len(specs)}}
