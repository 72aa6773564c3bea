"""Lambda's read operations and qualifier rules for the local runtime, in the shapes of botocore's Lambda model.

    GET /2015-03-31/functions/                          ListFunctions          {"Functions": [FunctionConfiguration]}
    GET /2015-03-31/functions/{name}                    GetFunction            {"Configuration", "Code", "Tags", ...}
    GET /2015-03-31/functions/{name}/configuration      GetFunctionConfiguration   FunctionConfiguration
    GET /2015-03-31/functions/{name}/versions           ListVersionsByFunction {"Versions": [...]}  ($LATEST first)
    GET /2015-03-31/functions/{name}/aliases            ListAliases            {"Aliases": [AliasConfiguration]}
    GET /2015-03-31/functions/{name}/aliases/{alias}    GetAlias               AliasConfiguration

``{name}`` is a name, ``name:qualifier`` or a (partial) ARN, as in Lambda; a ``Qualifier`` query parameter that
disagrees with the one in the name is a 400 ``InvalidParameterValueException`` (`split_qualifier`), an unknown
function, version or alias a 404 ``ResourceNotFoundException``. Every response is checked against botocore's
own service model in the tests (``tests/functions/test_runtime_api.py``).
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

from functions._errors import RuntimeConfigError

ACCOUNT_ID = "000000000000"
FUNCTIONS_PATH = "/2015-03-31/functions"
LOCAL_RUNTIME = f"python{sys.version_info.major}.{sys.version_info.minor}"
"""What ``Runtime`` reports: the workers run on this interpreter."""
_STARTED = time.strftime("%Y-%m-%dT%H:%M:%S.000+0000", time.gmtime())


@dataclass(frozen=True, kw_only=True)
class FunctionSpec:
    """One function the runtime serves."""

    name: str
    """Function name, as in ``FunctionName``."""
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
    """Alias name -> version."""
    code_dir: str | None = None
    """Directory prepended to the workers' PYTHONPATH (an unpacked deployment package); None: the source tree."""
    code_sha256: str = ""
    """``CodeSha256`` the read operations report (a deployment's); empty: a stand-in hash of handler and code."""
    code_size: int = 0
    """``CodeSize`` in bytes the read operations report."""

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s <= 900:
            raise RuntimeConfigError(f"FunctionSpec({self.name!r}): timeout_s must be in (0, 900], "
                                     f"got {self.timeout_s}")
        if not 128 <= self.memory_mb <= 10240:
            raise RuntimeConfigError(f"FunctionSpec({self.name!r}): memory_mb must be in [128, 10240], "
                                     f"got {self.memory_mb}")
        if self.reserved_concurrency < 1:
            raise RuntimeConfigError(f"FunctionSpec({self.name!r}): reserved_concurrency must be >= 1, "
                                     f"got {self.reserved_concurrency}")
        if "." not in self.handler:
            raise RuntimeConfigError(f"FunctionSpec({self.name!r}): handler must be 'module.attribute', "
                                     f"got {self.handler!r}")

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
        ApiError: 400 when both name a qualifier and they differ.
    """
    name, derived = split_function_name(function)
    given = (query.get("Qualifier") or [""])[0] or None
    if derived is not None and given is not None and derived != given:
        raise ApiError(400, "InvalidParameterValueException", {
            "Type": "User", "message": "The derived qualifier from the function name does not match the "
                                       "specified qualifier."})
    return name, given or derived


def not_found(region: str, name: str, qualifier: str | None = None) -> ApiError:
    """Lambda's 404 for an unknown function (or an unknown version or alias of it)."""
    return ApiError(404, "ResourceNotFoundException", {
        "Type": "User", "Message": f"Function not found: {function_arn(region, name, qualifier)}"})


def code_sha256(spec: FunctionSpec) -> str:
    """The spec's ``CodeSha256``, or a stable stand-in made from its handler and code folder."""
    if spec.code_sha256:
        return spec.code_sha256
    import base64

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


def handle_get(source: Source, region: str, path: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
    """Answer one read operation (see the module docstring); raises `ApiError` for AWS's error shapes."""
    rest = path[len(FUNCTIONS_PATH):].strip("/")
    if not rest:
        listed = []
        for name in source.names():
            spec = source.get(name)
            if spec is None:
                continue
            listed.append(function_configuration(spec, "$LATEST", region=region, arn_qualifier=None))
            if (query.get("FunctionVersion") or [""])[0] == "ALL":
                listed += [function_configuration(v, version, region=region, arn_qualifier=version)
                           for version in _versions(spec)[1:] if (v := source.version_spec(name, version))]
        return {"Functions": listed}
    parts = rest.split("/")
    function, tail = parts[0], parts[1:]
    if tail in ([], ["configuration"]):
        name, qualifier = split_qualifier(function, query)
        spec, version = _function(source, region, name, qualifier)
        config = function_configuration(spec, version, region=region,
                                        arn_qualifier=None if qualifier == "$LATEST" else qualifier)
        if tail:
            return config
        return {"Configuration": config, "Code": {"RepositoryType": "S3"}, "Tags": {}}
    name, qualifier = split_function_name(function)
    if qualifier is not None:
        raise ApiError(400, "InvalidParameterValueException", {
            "Type": "User", "message": f"{'/'.join(tail)} takes an unqualified function name, got {function!r}"})
    spec = source.get(name)
    if spec is None:
        raise not_found(region, name)
    if tail == ["versions"]:
        versions = [function_configuration(spec, "$LATEST", region=region, arn_qualifier="$LATEST")]
        versions += [function_configuration(v, version, region=region, arn_qualifier=version)
                     for version in _versions(spec)[1:] if (v := source.version_spec(name, version))]
        return {"Versions": versions}
    if tail == ["aliases"]:
        wanted = (query.get("FunctionVersion") or [""])[0] or None
        return {"Aliases": [alias_configuration(spec, a, region=region) for a in sorted(spec.aliases)
                            if wanted in (None, spec.aliases[a])]}
    if len(tail) == 2 and tail[0] == "aliases":
        if tail[1] not in spec.aliases:
            raise ApiError(404, "ResourceNotFoundException", {
                "Type": "User", "Message": f"Cannot find alias arn: {function_arn(region, name, tail[1])}"})
        return alias_configuration(spec, tail[1], region=region)
    raise ApiError(404, "UnknownOperationException", {"Type": "User", "message": "Unknown operation"})
