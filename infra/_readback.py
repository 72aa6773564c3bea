"""Reading a deployment back from an AWS endpoint: function configuration plus the deployed zip, unpacked.

    GetFunction(name, Qualifier=stage alias) ─> Configuration (handler, memory, timeout, environment)
                                             └> Code.Location ─> download ─> sha256 == CodeSha256? ─> unzip

`DeployedFunctions` is the functions tier's `FunctionSource` seam for ``strata functions serve
--from-endpoint URL --stage S``: the local runtime then runs exactly the zip that was deployed, at the
version the stage alias points to. `register` plugs it into the runtime (called by the infra CLI).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tempfile
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra._errors import InfraError
from infra._models import ENV_BUCKET, FUNCTIONS, Names
from infra.aws import client, or_none

if TYPE_CHECKING:
    from functions._runtime import FunctionSpec

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


def read_back(name: str, *, qualifier: str | None = None, endpoint_url: str | None = None,
              region: str | None = None, work_dir: Path | None = None) -> DeployedCode:
    """Fetch function `name` (at `qualifier`, e.g. the stage alias) and unpack its verified zip.

    Raises:
        FunctionNotFoundError-like `InfraError`: no such function or qualifier.
        InfraError: the downloaded zip does not match CodeSha256.
    """
    lam = client("lambda", region=region, endpoint_url=endpoint_url)
    s3 = client("s3", region=region, endpoint_url=endpoint_url)
    kwargs: dict[str, Any] = {"FunctionName": name}
    if qualifier:
        kwargs["Qualifier"] = qualifier
    got = or_none(lam.get_function, **kwargs)
    if got is None:
        raise InfraError(f"read_back({name!r}, qualifier={qualifier!r}): no such function at the endpoint; "
                         "deploy it with `strata infra apply` or check --stage")
    configuration = got["Configuration"]
    data = _download(got["Code"]["Location"], lambda_endpoint=_endpoint_configured(endpoint_url), s3=s3,
                     configuration=configuration)
    sha = base64.b64encode(hashlib.sha256(data).digest()).decode()
    if sha != configuration.get("CodeSha256"):
        raise InfraError(f"read_back({name!r}): the downloaded zip has sha256 {sha}, but Lambda deployed "
                         f"{configuration.get('CodeSha256')}; refusing to run it")
    base = work_dir or Path(tempfile.mkdtemp(prefix="strata-deployed-"))
    base.mkdir(parents=True, exist_ok=True)
    code_dir = base / f"{name}-{base64.b64decode(sha).hex()[:16]}"
    if not code_dir.exists():
        tmp = Path(tempfile.mkdtemp(dir=base, prefix=".unzip-"))
        _unzip(data, tmp)
        os.replace(tmp, code_dir)
    aliases = {a["Name"]: str(a["FunctionVersion"]) for a in lam.list_aliases(FunctionName=name).get("Aliases", [])}
    reserved = got.get("Concurrency", {}).get("ReservedConcurrentExecutions")
    return DeployedCode(name=name, version=str(configuration.get("Version", "$LATEST")),
                        configuration=configuration, aliases=aliases, code_dir=code_dir, reserved_concurrency=reserved)


class DeployedFunctions:
    """A `functions` `FunctionSource` serving the functions of one deployed stage, as deployed.

    Args:
        stage: The stage whose functions (``strata-{stage}-{rollout,ping}``, exactly) are served.
        endpoint_url: The AWS endpoint (None: the standard chain and ``AWS_ENDPOINT_URL*``).
        region: AWS region.
        work_dir: Where zips are unpacked (default: a new temp folder).
    """

    def __init__(self, *, stage: str, endpoint_url: str | None = None, region: str | None = None,
                 work_dir: Path | None = None) -> None:
        self.stage = stage
        self.endpoint_url = endpoint_url
        self.region = region
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="strata-deployed-"))
        self._specs: dict[str, FunctionSpec] = {}

    def _stage_names(self) -> list[str]:
        """The exact function names of the stage (never a ``strata-{stage}-`` prefix: stage ``dev-x`` has it too)."""
        names = Names(stage=self.stage, account="", region="")
        return sorted(names.function(spec.name) for spec in FUNCTIONS)

    def names(self) -> list[str]:
        """Every function of the stage that exists at the endpoint."""
        lam = client("lambda", region=self.region, endpoint_url=self.endpoint_url)
        return [n for n in self._stage_names() if or_none(lam.get_function_configuration, FunctionName=n)]

    def get(self, name: str) -> FunctionSpec | None:
        """The runtime's ``FunctionSpec`` of `name` at the stage alias (its code unpacked), or None."""
        if name in self._specs:
            return self._specs[name]
        from functions._runtime import FunctionSpec

        if name not in self._stage_names():
            return None
        lam = client("lambda", region=self.region, endpoint_url=self.endpoint_url)
        has_alias = or_none(lam.get_alias, FunctionName=name, Name=self.stage) is not None
        if or_none(lam.get_function_configuration, FunctionName=name) is None:
            return None
        code = read_back(name, qualifier=self.stage if has_alias else None, endpoint_url=self.endpoint_url,
                         region=self.region, work_dir=self.work_dir)
        config = code.configuration
        versions = tuple(sorted({v for v in code.aliases.values() if v != "$LATEST"}))
        spec = FunctionSpec(
            name=name, handler=config["Handler"], timeout_s=float(config.get("Timeout", 3)),
            memory_mb=int(config.get("MemorySize", 128)),
            reserved_concurrency=max(1, min(code.reserved_concurrency or _LOCAL_WORKERS, _LOCAL_WORKERS)),
            environment=dict(config.get("Environment", {}).get("Variables", {})),
            versions=versions, aliases=dict(code.aliases), code_dir=str(code.code_dir))
        self._specs[name] = spec
        return spec


def register() -> None:
    """Make ``strata functions serve --from-endpoint URL --stage S`` read deployments through this module."""
    from functions._runtime import register_endpoint_source

    register_endpoint_source(lambda url, stage: DeployedFunctions(stage=stage, endpoint_url=url))
