"""Reading a deployment back from an AWS endpoint: function configuration plus the deployed zip, unpacked.

    GetFunction(name, Qualifier=stage alias) ─> Configuration (handler, memory, timeout, environment)
                                             └> Code.Location ─> download ─> sha256 == CodeSha256? ─> unzip

`DeployedFunctions` is the functions tier's `FunctionSource` seam for ``strata functions serve
--from-endpoint URL --stage S``: the local runtime then runs exactly the zips that were deployed, every
published version with its own code, ``$LATEST`` with the newest, and it follows rollbacks and applies
without a restart. `register` plugs it into the runtime (called by the infra CLI).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import os
import shutil
import tempfile
import threading
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra._errors import InfraError
from infra._models import ENV_BUCKET, FUNCTIONS, Names, check_stage
from infra.aws import client, or_none

if TYPE_CHECKING:
    from functions._lambda_api import FunctionSpec

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_LOCAL_WORKERS = 4
"""Warm workers per function in the local runtime (a deployment's reserved concurrency is for AWS)."""


@dataclass(frozen=True, kw_only=True)
class DeployedCode:
    """One deployed function version, read back."""

    name: str
    version: str
    configuration: dict[str, Any] = field(hash=False)
    """Lambda's ``FunctionConfiguration`` of that version."""
    aliases: dict[str, str] = field(hash=False)
    """Alias name -> version, for every alias of the function."""
    code_dir: Path
    """The zip, verified against CodeSha256 and unpacked."""
    reserved_concurrency: int | None


def _endpoint_configured(endpoint_url: str | None) -> bool:
    return bool(endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_LAMBDA"))


def _download(location: str, *, lambda_endpoint: bool, s3: Any, configuration: dict[str, Any]) -> bytes:
    host = urllib.parse.urlparse(location).hostname or ""
    if host in _LOOPBACK or not lambda_endpoint:
        with urllib.request.urlopen(location, timeout=60) as response:  # a presigned S3 URL on AWS
            data: bytes = response.read()
            return data
    # --- moto workaround -------------------------------------------------------------------------------
    # moto answers GetFunction with a Code.Location on awslambda-<region>-tasks.s3.<region>.amazonaws.com,
    # a host it does not serve (moto/awslambda/models.py, LambdaFunction.get_code), and strata must not
    # reach public hosts from a local setup. strata uploads every zip to the stage bucket under its
    # content hash before creating the function, so fetch that object from the same endpoint instead;
    # the CodeSha256 check below still ties the bytes to what Lambda says it deployed.
    bucket = configuration.get("Environment", {}).get("Variables", {}).get(ENV_BUCKET)
    sha = configuration.get("CodeSha256", "")
    if not bucket or not sha:
        raise InfraError(f"read back {configuration.get('FunctionName')}: the code location {location} is not "
                         f"on the configured endpoint and the function has no {ENV_BUCKET} to fetch it from")
    key = f"functions/{base64.b64decode(sha).hex()}.zip"
    got = or_none(s3.get_object, Bucket=bucket, Key=key)
    if got is None:
        raise InfraError(f"read back {configuration.get('FunctionName')}: s3://{bucket}/{key} is missing; "
                         "run `strata infra apply` to upload the package again")
    body: bytes = got["Body"].read()
    return body


def _unzip(data: bytes, target: Path) -> None:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for member in zf.namelist():
            path = Path(member)
            if path.is_absolute() or ".." in path.parts:
                raise InfraError(f"read back: the zip holds an unsafe path {member!r}; refusing to unpack it")
        zf.extractall(target)


def _client_error(what: str, exc: Exception, endpoint_url: str | None) -> InfraError:
    where = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_LAMBDA") or os.environ.get("AWS_ENDPOINT_URL") or "AWS"
    return InfraError(f"{what}: cannot read the deployment from {where} ({type(exc).__name__}: {exc}); check "
                      "--from-endpoint and that the endpoint is running")


def read_back(name: str, *, qualifier: str | None = None, endpoint_url: str | None = None,
              region: str | None = None, work_dir: Path | None = None) -> DeployedCode:
    """Fetch function `name` (at `qualifier`: the stage alias, a version, None for ``$LATEST``), unpack its zip.

    The zip is downloaded once per ``CodeSha256``: a folder already unpacked for that hash is reused.

    Raises:
        InfraError: no such function or qualifier, the endpoint cannot be reached, or the downloaded zip does
            not match CodeSha256.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return _read_back(name, qualifier=qualifier, endpoint_url=endpoint_url, region=region, work_dir=work_dir)
    except (BotoCoreError, ClientError) as exc:
        raise _client_error(f"read_back({name!r}, qualifier={qualifier!r})", exc, endpoint_url) from exc


def _read_back(name: str, *, qualifier: str | None, endpoint_url: str | None, region: str | None,
               work_dir: Path | None) -> DeployedCode:
    lam = client("lambda", region=region, endpoint_url=endpoint_url)
    kwargs: dict[str, Any] = {"FunctionName": name}
    if qualifier:
        kwargs["Qualifier"] = qualifier
    got = or_none(lam.get_function, **kwargs)
    if got is None:
        raise InfraError(f"read_back({name!r}, qualifier={qualifier!r}): no such function at the endpoint; "
                         "deploy it with `strata infra apply` or check --stage")
    configuration = got["Configuration"]
    expected = str(configuration.get("CodeSha256", ""))
    base = work_dir or Path(tempfile.mkdtemp(prefix="strata-deployed-"))
    base.mkdir(parents=True, exist_ok=True)
    code_dir = base / f"{name}-{base64.b64decode(expected).hex()[:16]}"
    if not code_dir.exists():
        s3 = client("s3", region=region, endpoint_url=endpoint_url)
        data = _download(got["Code"]["Location"], lambda_endpoint=_endpoint_configured(endpoint_url), s3=s3,
                         configuration=configuration)
        sha = base64.b64encode(hashlib.sha256(data).digest()).decode()
        if sha != expected:
            raise InfraError(f"read_back({name!r}): the downloaded zip has sha256 {sha}, but Lambda deployed "
                             f"{expected}; refusing to run it")
        tmp = Path(tempfile.mkdtemp(dir=base, prefix=".unzip-"))
        try:
            _unzip(data, tmp)
            os.replace(tmp, code_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    aliases = {a["Name"]: str(a["FunctionVersion"]) for page in lam.get_paginator("list_aliases").paginate(
        FunctionName=name) for a in page.get("Aliases", [])}
    reserved = got.get("Concurrency", {}).get("ReservedConcurrentExecutions")
    return DeployedCode(name=name, version=str(configuration.get("Version", "$LATEST")),
                        configuration=configuration, aliases=aliases, code_dir=code_dir, reserved_concurrency=reserved)


def _spec(code: DeployedCode, *, aliases: dict[str, str], versions: tuple[str, ...]) -> FunctionSpec:
    """The local runtime's ``FunctionSpec`` of one deployed version."""
    from functions._lambda_api import FunctionSpec

    config = code.configuration
    return FunctionSpec(
        name=code.name, handler=config["Handler"], timeout_s=float(config.get("Timeout", 3)),
        memory_mb=int(config.get("MemorySize", 128)),
        reserved_concurrency=max(1, min(code.reserved_concurrency or _LOCAL_WORKERS, _LOCAL_WORKERS)),
        environment=dict(config.get("Environment", {}).get("Variables", {})), versions=versions,
        aliases=aliases, code_dir=str(code.code_dir), code_sha256=str(config.get("CodeSha256", "")),
        code_size=int(config.get("CodeSize", 0)))


class DeployedFunctions:
    """A `functions` `FunctionSource` serving the functions of one deployed stage, as deployed, as they change.

    Every published version is served with its own code and settings (versions are immutable, so each is
    read once); ``$LATEST`` is the newest code; aliases (the stage alias included) are read on every request,
    so a rollback or an apply shows at once, without a restart. Only the stage's exact function names are
    served (``strata-{stage}-{rollout,ping}``), never another stage's that shares a prefix. `close` removes
    the unpacked trees (the CLI calls it on every exit).

    Args:
        stage: The stage whose functions are served.
        endpoint_url: The AWS endpoint (None: the standard chain and ``AWS_ENDPOINT_URL*``).
        region: AWS region.
        work_dir: Where zips are unpacked (default: a new temp folder, removed by `close`).
    """

    def __init__(self, *, stage: str, endpoint_url: str | None = None, region: str | None = None,
                 work_dir: Path | None = None) -> None:
        self.stage = check_stage(stage)
        self.endpoint_url = endpoint_url
        self.region = region
        self._owns_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="strata-deployed-"))
        self._lock = threading.Lock()
        self._published: dict[tuple[str, str], FunctionSpec] = {}
        self._latest: dict[str, tuple[str, FunctionSpec]] = {}

    def _lambda(self) -> Any:
        return client("lambda", region=self.region, endpoint_url=self.endpoint_url)

    def _stage_names(self) -> list[str]:
        """The exact function names of the stage (never a ``strata-{stage}-`` prefix: stage ``dev-x`` has it too)."""
        names = Names(stage=self.stage, account="", region="")
        return sorted(names.function(spec.name) for spec in FUNCTIONS)

    def _call(self, what: str, call: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call()
        except (BotoCoreError, ClientError) as exc:
            raise _client_error(what, exc, self.endpoint_url) from exc

    def names(self) -> list[str]:
        """Every function of the stage that exists at the endpoint."""
        lam = self._lambda()
        return [n for n in self._stage_names()
                if self._call(f"stage {self.stage}: {n}", lambda n=n: or_none(lam.get_function_configuration,
                                                                              FunctionName=n))]

    def get(self, name: str) -> FunctionSpec | None:
        """`name` at ``$LATEST`` (its newest code), with the versions and aliases it has now; None if unknown."""
        if name not in self._stage_names():
            return None
        lam = self._lambda()

        def read() -> tuple[dict[str, Any] | None, dict[str, str], tuple[str, ...], dict[str, Any]]:
            latest = or_none(lam.get_function_configuration, FunctionName=name)
            if latest is None:
                return None, {}, (), {}
            aliases = {a["Name"]: str(a["FunctionVersion"])
                       for page in lam.get_paginator("list_aliases").paginate(FunctionName=name)
                       for a in page.get("Aliases", [])}
            versions = tuple(str(v["Version"])
                             for page in lam.get_paginator("list_versions_by_function").paginate(FunctionName=name)
                             for v in page.get("Versions", []) if v["Version"] != "$LATEST")
            # The stage alias's asynchronous settings (retries, on-failure queue): the runtime applies them to
            # every Event invocation of the function, as callers invoke the stage alias.
            invoke = or_none(lam.get_function_event_invoke_config, FunctionName=name, Qualifier=self.stage) or {}
            return latest, aliases, versions, invoke

        latest, aliases, versions, invoke = self._call(f"stage {self.stage}: {name}", read)
        if latest is None:
            return None
        fingerprint = json.dumps(latest, sort_keys=True, default=str)
        with self._lock:
            known = self._latest.get(name)
        if known is not None and known[0] == fingerprint:
            spec = known[1]
        else:
            spec = _spec(read_back(name, endpoint_url=self.endpoint_url, region=self.region,
                                   work_dir=self.work_dir), aliases=aliases, versions=versions)
            with self._lock:
                self._latest[name] = (fingerprint, spec)
        destination = str(invoke.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination") or "")
        return dataclasses.replace(spec, aliases=aliases, versions=versions,
                                   on_failure=destination if ":sqs:" in destination else "",
                                   async_retries=invoke.get("MaximumRetryAttempts"))

    def version_spec(self, name: str, version: str) -> FunctionSpec | None:
        """`name` as published at `version`, with that version's own code and settings (read once)."""
        if name not in self._stage_names():
            return None
        with self._lock:
            known = self._published.get((name, version))
        if known is not None:
            return known
        try:
            code = read_back(name, qualifier=version, endpoint_url=self.endpoint_url, region=self.region,
                             work_dir=self.work_dir)
        except InfraError:
            return None
        spec = _spec(code, aliases={}, versions=(version,))
        with self._lock:
            self._published[(name, version)] = spec
        return spec

    def close(self) -> None:
        """Remove the unpacked code (when this object made the folder)."""
        if self._owns_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


def register() -> None:
    """Make ``strata functions serve --from-endpoint URL --stage S`` read deployments through this module."""
    from functions._runtime import register_endpoint_source

    register_endpoint_source(lambda url, stage: DeployedFunctions(stage=stage, endpoint_url=url))
