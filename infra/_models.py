"""Pure resource models of a strata deployment: `DeployConfig` in, frozen resource records out (no AWS calls).

`desired_resources` is the only place that turns a config into resources, for `plan`/`apply` and for
`strata infra template` alike; each model's `attributes()` is the part the plan diffs against AWS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeAlias

from device import KeyFileError, is_identifier, mqtt_client_id, shown
from device._keys import parse_public_keys, read_public_key_file
from device._kinds import FLEET, STAGE, PublicKeyText
from device._options import (
    InputFolder,
    Integer,
    Many,
    Matching,
    Name,
    OutputFolder,
    check_fields,
    declared,
)
from infra._errors import DeployConfigError
from infra._iot import iot_fleet, policy_document
from infra.aws import REGION

# Lambda's limits (MEASURED.md): what `check_config` enforces before anything is built or called.
MIN_MEMORY_MB = 128
MAX_MEMORY_MB = 10240
MAX_TIMEOUT_S = 900
RUNTIME = "python3.12"
"""The Lambda runtime; `PYTHON_VERSION` is the interpreter the dependency tree is built for."""
PYTHON_VERSION = "3.12"

Architecture: TypeAlias = Literal["x86_64", "arm64"]
PLATFORMS: dict[str, str] = {"x86_64": "manylinux2014_x86_64", "arm64": "manylinux2014_aarch64"}
"""pip ``--platform`` tag of each Lambda architecture."""

ENV_STAGE = "STRATA_STAGE"
ENV_BUCKET = "STRATA_RESULT_BUCKET"
"""The functions' default bucket for large results (``functions._handlers``); also where the zips live."""
ENV_TRUSTED_PUBLIC_KEY = "STRATA_TRUSTED_KEYS"
"""PEM of the Ed25519 key(s) bundles must be signed with (``functions._handlers``)."""

_STAGE = re.compile(STAGE.pattern)
"""A stage (`device._kinds.STAGE`): the identifier rule (``device._names``) narrowed to what S3 bucket names take
(no capitals, ``_`` or ``.``) and short enough for ``strata-{stage}-{account}-{region}`` to stay within S3's 63
characters."""
STAGE_FORM = "1-20 lowercase letters, digits or '-', starting with a letter or digit"
BUCKET = Matching(pattern=r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", empty=True, example="my-bucket",
                  words="an S3 bucket name: 3-63 lowercase letters, digits, '.' or '-'")
REQUIREMENT = Matching(pattern=r"[A-Za-z0-9][^\x00-\x1f\x7f]{0,299}", example="numpy",
                       words="a pip requirement such as numpy or numpy>=2")

DEFAULT_ROLLOUT_CONCURRENCY = 32
"""Reserved concurrency of the rollout function unless `DeployConfig.reserved_concurrency` says otherwise."""
ASYNC_RETRIES = 2
"""Lambda's retries of a failed asynchronous (Event) rollout before it goes to the failure queue."""
ASYNC_MAX_EVENT_AGE_S = 3600
"""An Event rollout older than this is not retried but sent to the failure queue (Lambda's default is 6 h; a
rollout an hour old is stale for any learner)."""
FAILURE_RETENTION_S = 14 * 24 * 3600
"""How long the failure queue keeps a record (SQS's maximum)."""


@dataclass(frozen=True, kw_only=True)
class FunctionSpec:
    """One Lambda function strata deploys from the functions tier."""

    name: str
    """Short name; the deployed function is ``strata-{stage}-{name}``."""
    handler: str
    """Dotted ``module.function`` inside the package."""
    concurrency_cap: int | None = None
    """Most reserved concurrency this function gets (None: `DeployConfig.reserved_concurrency` itself)."""
    failure_queue: bool = False
    """Whether failed asynchronous invocations of its stage alias go to the stage's failure queue."""


FUNCTIONS: tuple[FunctionSpec, ...] = (
    FunctionSpec(name="rollout", handler="functions._handlers.rollout_handler", failure_queue=True),
    FunctionSpec(name="ping", handler="functions._handlers.ping_handler", concurrency_cap=2),
)
"""The functions tier's Lambda handlers (``functions/_handlers.py``)."""
SOURCE_PACKAGES: tuple[str, ...] = ("functions", "device")
"""strata packages copied into every function zip (the handler's tier and what it imports)."""


@dataclass(frozen=True, kw_only=True)
class DeployConfig:
    """Everything a stage's deployment is made of; `strata infra plan|apply` flags are these fields."""

    # Where
    stage: str = declared(STAGE, "dev")
    """Stage name (1-20 lowercase letters, digits or '-'); it names every resource and the Lambda alias."""
    region: str | None = declared(REGION, None)
    """AWS region; default: where the stage's last apply deployed it, else AWS_REGION / AWS_DEFAULT_REGION / the
    profile's region, else us-east-1 (each command prints which and why)."""
    bucket: str = declared(BUCKET, "")
    """Bucket name override; default strata-{stage}-{account}-{region}."""

    # Functions
    memory_mb: int = declared(Integer(min=MIN_MEMORY_MB, max=MAX_MEMORY_MB, unit="MB"), 1024)
    """Lambda memory in MB (128-10240; 1769 MB is one vCPU)."""
    timeout_s: int = declared(Integer(min=1, max=MAX_TIMEOUT_S, unit="seconds"), 60)
    """Lambda timeout in seconds (at most 900)."""
    reserved_concurrency: int | None = declared(Integer(min=0, max=100_000), DEFAULT_ROLLOUT_CONCURRENCY)
    """Reserved concurrent executions of the rollout function: at most this many rollouts run at once (a cap on
    what a runaway trainer spends) and no other function takes them (ping gets at most 2). 0 leaves the functions
    in the account's unreserved pool, for accounts too small to reserve any (AWS keeps 100 unreserved)."""
    architecture: Literal["x86_64", "arm64"] = "x86_64"
    """Lambda architecture; the dependency wheels are built for it."""
    requirements: tuple[str, ...] = declared(Many(item=REQUIREMENT, max_items=200, unique=True),
                                             ("numpy", "gymnasium", "cryptography"))
    """pip requirements installed into each function zip (built for Lambda's platform, no Docker)."""
    cache_dir: str = declared(OutputFolder(what="build cache folder", parents=True, empty=True), "")
    """Where built dependency trees are cached by a hash of the requirement set; default ~/.cache/strata/lambda."""
    source_dir: str = declared(InputFolder(what="source folder", empty=True), "")
    """Folder holding the strata packages to deploy (functions/, device/); default: the installed strata."""
    trusted_public_key: str = declared(PublicKeyText(), "")
    """PEM of the Ed25519 public key(s) bundles must be signed with (or a .pub file's path), set as
    STRATA_TRUSTED_KEYS; a private key is refused."""

    # Edge nodes (AWS IoT Core)
    fleet: str = declared(FLEET, "default")
    """Fleet name; on AWS IoT Core the stage's MQTT topic root is strata/{stage}.{fleet}/."""
    edge_nodes: tuple[str, ...] = declared(Many(item=Name(), max_items=10_000, unique=True), ())
    """Edge node ids; each gets an IoT thing, a certificate and a policy granting what its clients do on MQTT."""

    def __post_init__(self) -> None:
        check_fields(self, error=DeployConfigError)

    def cache_path(self) -> Path:
        """The dependency cache folder (`cache_dir` or the default)."""
        return Path(self.cache_dir).expanduser() if self.cache_dir else Path.home() / ".cache" / "strata" / "lambda"


def check_config(config: DeployConfig) -> DeployConfig:
    """Return `config` if AWS would accept it; raise `DeployConfigError` naming the value and the fix."""
    check_stage(config.stage, what="DeployConfig.stage")
    if not MIN_MEMORY_MB <= config.memory_mb <= MAX_MEMORY_MB:
        raise DeployConfigError(f"DeployConfig.memory_mb={config.memory_mb} is outside Lambda's range: set "
                                f"--memory-mb between {MIN_MEMORY_MB} and {MAX_MEMORY_MB}")
    if not 1 <= config.timeout_s <= MAX_TIMEOUT_S:
        raise DeployConfigError(f"DeployConfig.timeout_s={config.timeout_s} is outside Lambda's range: set "
                                f"--timeout-s between 1 and {MAX_TIMEOUT_S} (Lambda's maximum, 15 minutes)")
    if config.reserved_concurrency is not None and config.reserved_concurrency < 0:
        raise DeployConfigError(f"DeployConfig.reserved_concurrency={config.reserved_concurrency} is negative: "
                                "set --reserved-concurrency to 1 or more, or to 0 for the account's unreserved pool")
    if config.architecture not in PLATFORMS:
        raise DeployConfigError(f"DeployConfig.architecture={config.architecture!r} is not one of "
                                f"{sorted(PLATFORMS)}")
    longest = 63 - len(config.stage)  # the MQTT fleet on IoT Core is {stage}.{fleet}, one 64-character segment
    if not is_identifier(config.fleet) or len(config.fleet) > longest:
        raise DeployConfigError(f"DeployConfig.fleet={shown(config.fleet)} cannot be an MQTT topic segment: use 1-"
                                f"{longest} letters, digits, '_', '.' or '-' (with the stage, {config.stage}.FLEET "
                                "is one 64-character segment)")
    for node in config.edge_nodes:
        if not is_identifier(node) or "." in node:  # IoT thing names allow no '.'
            raise DeployConfigError(f"DeployConfig.edge_nodes: node id {shown(node)} cannot name an IoT thing: use "
                                    "1-64 letters, digits, '_' or '-', starting with a letter or digit")
    if len(set(config.edge_nodes)) != len(config.edge_nodes):
        raise DeployConfigError(f"DeployConfig.edge_nodes={list(config.edge_nodes)} lists a node twice")
    if config.bucket and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", config.bucket):
        raise DeployConfigError(f"DeployConfig.bucket={config.bucket!r} is not a valid S3 bucket name: use 3-63 "
                                "lowercase letters, digits, '.' or '-'")
    if config.trusted_public_key:  # a trust anchor: Ed25519 public keys only, never a private key
        try:
            parse_public_keys(config.trusted_public_key, source="DeployConfig.trusted_public_key")
        except KeyFileError as exc:
            raise DeployConfigError(str(exc)) from None
    return config


def check_stage(stage: object, *, what: str = "--stage") -> str:
    """`stage` if it is a stage name (`_STAGE`: the identifier rule, narrowed for S3); else one line naming it.

    Every command and path builder that takes a stage calls this first, so ``''`` or ``../x`` never names a
    resource or a file (state files are then built with ``device._names.inside`` as well).

    Raises:
        DeployConfigError: `stage` is not a stage name.
    """
    if not (is_identifier(stage) and isinstance(stage, str) and _STAGE.fullmatch(stage)):
        raise DeployConfigError(f"{what}={shown(stage)} is not a valid stage name: use {STAGE_FORM} (a stage "
                                "names S3 buckets, which take no capitals, '_' or '.')")
    return stage


def reserved_for(spec: FunctionSpec, reserved_concurrency: int | None) -> int | None:
    """The reserved concurrency of function `spec` (None: the account's unreserved pool)."""
    if not reserved_concurrency:
        return None
    return min(reserved_concurrency, spec.concurrency_cap) if spec.concurrency_cap else reserved_concurrency
def trusted_key_pem(value: str) -> str:
    """The PEM that `--trusted-public-key VALUE` deploys: VALUE's own PEM text, or the ``.pub`` file it names.

    Both are parsed by the one trust-anchor parser (`device._keys.parse_public_keys`) and written back as
    canonical PEM, so only Ed25519 public keys ever reach a function's environment or a template.

    Raises:
        DeployConfigError: VALUE (or the file) holds a private key, no public key, or a non-Ed25519 key; or the
            file cannot be read.
    """
    try:
        if "-----BEGIN" in value:
            keys = parse_public_keys(value, source="--trusted-public-key (inline PEM)")
        else:
            keys = read_public_key_file(Path(value).expanduser(), what="--trusted-public-key")[1]
    except KeyFileError as exc:
        raise DeployConfigError(str(exc)) from None
    return "".join(key.to_pem().decode() for key in keys)


def partition_of(region: str) -> str:
    """The ARN partition of `region` (``aws``, ``aws-cn``, ``aws-us-gov``)."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


@dataclass(frozen=True, kw_only=True)
class Names:
    """Every AWS name of one stage, derived in this one place."""

    stage: str
    account: str
    region: str
    bucket_override: str = ""

    @property
    def prefix(self) -> str:
        """``strata-{stage}``: the start of every resource name."""
        return f"strata-{self.stage}"

    @property
    def bucket(self) -> str:
        """The stage's bucket."""
        return self.bucket_override or f"{self.prefix}-{self.account}-{self.region}"

    @property
    def role(self) -> str:
        """The functions' execution role."""
        return f"{self.prefix}-lambda"

    def function(self, short: str) -> str:
        """The deployed name of function `short`."""
        return f"{self.prefix}-{short}"

    @property
    def alias(self) -> str:
        """The alias every function's callers use: the stage name."""
        return self.stage

    @property
    def failure_queue(self) -> str:
        """The SQS queue failed asynchronous rollouts go to (the rollout alias's on-failure destination)."""
        return f"{self.prefix}-rollout-failures"

    def queue_arn(self, partition: str) -> str:
        """The failure queue's ARN."""
        return f"arn:{partition}:sqs:{self.region}:{self.account}:{self.failure_queue}"

    def iot(self, node: str) -> str:
        """The IoT thing and policy name of `node`: ``strata-{stage}_{node}``.

        A stage name has no ``_``, so the first ``_`` ends the stage: stage ``dev`` node ``x-n1`` and stage
        ``dev-x`` node ``n1`` get different names (with ``-`` both would be ``strata-dev-x-n1``).
        """
        return f"{self.prefix}_{node}"

    def tags(self) -> dict[str, str]:
        """Tags every taggable resource carries."""
        return {"strata:stage": self.stage, "strata:managed-by": "strata"}


PENDING_CODE = "(built by apply)"
"""`Artifact.sha256_b64` in a plan made before the dependency tree was ever built (plan builds nothing)."""


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """A built function zip (see `infra._package`)."""

    path: Path
    sha256_b64: str
    """base64 SHA-256 of the zip: what Lambda reports as CodeSha256."""
    sha256_hex: str
    zipped_bytes: int
    unzipped_bytes: int

    @property
    def key(self) -> str:
        """S3 key the zip is uploaded to (content-addressed, so old versions keep their code)."""
        return f"functions/{self.sha256_hex}.zip"


BUCKET_ENCRYPTION = "AES256"
"""The stage bucket's default encryption, set explicitly (SSE-S3)."""


def tls_only_policy(bucket_arn: str) -> dict[str, Any]:
    """The bucket policy that refuses every request not made over TLS."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "TlsOnly", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
         "Resource": [bucket_arn, f"{bucket_arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """The S3 bucket for function code, bundles and large rollout results (versioned, private, encrypted, TLS only)."""

    kind: ClassVar[str] = "s3_bucket"
    name: str
    tags: dict[str, str] = field(hash=False)
    policy: dict[str, Any] | None = field(hash=False)
    """The bucket policy (`tls_only_policy`); None only where S3 is reached over plain HTTP (a local emulator,
    which the policy would lock out of its own bucket: its requests really are not TLS)."""

    def attributes(self) -> dict[str, Any]:
        """Diffable desired state."""
        return {"versioning": "Enabled", "block_public_access": True, "encryption": BUCKET_ENCRYPTION,
                "policy": self.policy, "tags": dict(self.tags)}


@dataclass(frozen=True, kw_only=True)
class Queue:
    """The SQS queue of failed asynchronous rollouts (encrypted, 14 days): the stage alias's on-failure destination."""

    kind: ClassVar[str] = "sqs_queue"
    name: str
    retention_s: int
    tags: dict[str, str] = field(hash=False)

    def attributes(self) -> dict[str, Any]:
        """Diffable desired state."""
        return {"retention_s": self.retention_s, "encryption": "SQS-SSE", "tags": dict(self.tags)}


@dataclass(frozen=True, kw_only=True)
class Role:
    """The functions' least-privilege execution role: the stage bucket and the functions' own logs."""

    kind: ClassVar[str] = "iam_role"
    name: str
    policy_name: str
    assume_role_policy: dict[str, Any] = field(hash=False)
    policy: dict[str, Any] = field(hash=False)
    tags: dict[str, str] = field(hash=False)

    def attributes(self) -> dict[str, Any]:
        """Diffable desired state."""
        return {"assume_role_policy": self.assume_role_policy, "policy": self.policy, "tags": dict(self.tags)}


@dataclass(frozen=True, kw_only=True)
class Function:
    """One Lambda function: configuration plus the code artifact (uploaded to the stage bucket)."""

    kind: ClassVar[str] = "lambda_function"
    name: str
    handler: str
    memory_mb: int
    timeout_s: int
    architecture: str
    role: str
    """Role name (its ARN is resolved at apply time)."""
    role_arn: str
    bucket: str
    environment: dict[str, str] = field(hash=False)
    reserved_concurrency: int | None
    tags: dict[str, str] = field(hash=False)
    artifact: Artifact | None
    """None only for `strata infra template`, which references the zip through parameters."""

    def version_attributes(self) -> dict[str, Any]:
        """What a published version freezes: the alias step compares these."""
        return {
            "runtime": RUNTIME,
            "handler": self.handler,
            "memory_mb": self.memory_mb,
            "timeout_s": self.timeout_s,
            "architecture": self.architecture,
            "role": self.role_arn,
            "environment": dict(self.environment),
            "code_sha256": self.artifact.sha256_b64 if self.artifact else None,
        }

    def attributes(self) -> dict[str, Any]:
        """Diffable desired state."""
        return {**self.version_attributes(), "reserved_concurrency": self.reserved_concurrency,
                "tags": dict(self.tags)}


@dataclass(frozen=True, kw_only=True)
class Alias:
    """The stage alias of a function, pointing at a published version with the function's desired config."""

    kind: ClassVar[str] = "lambda_alias"
    name: str
    """``{function}:{alias}``."""
    function: str
    alias: str
    target: dict[str, Any] = field(hash=False)
    """The `Function.version_attributes` the version behind the alias must have."""
    pin_version: str | None = None
    """Point at exactly this version (rollback); None: the newest version matching `target`."""

    def attributes(self) -> dict[str, Any]:
        """Diffable desired state."""
        return {"target": dict(self.target)}


@dataclass(frozen=True, kw_only=True)
class EventInvokeConfig:
    """How Lambda handles a failed asynchronous invocation of a stage alias: retries, then the on-failure queue."""

    kind: ClassVar[str] = "lambda_event_invoke_config"
    name: str
    """``{function}:{alias}``, as the alias it configures."""
    function: str
    alias: str
    on_failure: str
    """ARN of the destination (the stage's failure queue)."""
    max_retries: int
    max_event_age_s: int

    def attributes(self) -> dict[str, Any]:
        """Diffable desired state."""
        return {"on_failure": self.on_failure, "max_retries": self.max_retries,
                "max_event_age_s": self.max_event_age_s}


@dataclass(frozen=True, kw_only=True)
class IotPolicy:
    """An edge node's IoT policy: exactly the MQTT operations of its agent, gateway and devices (`infra._iot`)."""

    kind: ClassVar[str] = "iot_policy"
    name: str
    document: dict[str, Any] = field(hash=False)

    def attributes(self) -> dict[str, Any]:
        """Diffable desired state."""
        return {"document": self.document}


@dataclass(frozen=True, kw_only=True)
class IotThing:
    """An edge node's IoT thing."""

    kind: ClassVar[str] = "iot_thing"
    name: str
    node: str
    thing_attributes: dict[str, str] = field(hash=False)

    def attributes(self) -> dict[str, Any]:
        """Diffable desired state."""
        return {"attributes": dict(self.thing_attributes)}


@dataclass(frozen=True, kw_only=True)
class IotCertificate:
    """An edge node's X.509 certificate, active, attached to its thing and policy; its key goes to a file."""

    kind: ClassVar[str] = "iot_certificate"
    name: str
    """The node's thing name (a certificate has no name of its own; its id is recorded in the state)."""
    node: str
    fleet: str
    thing: str
    policy: str
    client_id: str

    def attributes(self) -> dict[str, Any]:
        """Diffable desired state."""
        return {"status": "ACTIVE", "things": [self.thing], "policies": [self.policy], "credentials_file": "present"}


Resource: TypeAlias = (Bucket | Queue | Role | Function | Alias | EventInvokeConfig | IotPolicy | IotThing
                        | IotCertificate)
KIND_ORDER: tuple[str, ...] = ("s3_bucket", "sqs_queue", "iam_role", "lambda_function", "lambda_alias",
                               "lambda_event_invoke_config", "iot_policy", "iot_thing", "iot_certificate")
"""Creation order (dependencies first); deletion runs it backwards."""


def role_policies(names: Names, partition: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(trust policy, permissions policy)`` of the execution role: the bucket, the functions' logs, the queue.

    Log groups are named exactly (no ``strata-{stage}-*`` wildcard, which would cover stage ``{stage}-x`` too).
    """
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
    log_groups = [f"arn:{partition}:logs:{names.region}:{names.account}:log-group:/aws/lambda/"
                  f"{names.function(spec.name)}" for spec in FUNCTIONS]
    bucket_arn = f"arn:{partition}:s3:::{names.bucket}"
    permissions = {"Version": "2012-10-17", "Statement": [
        {"Sid": "OwnLogGroups", "Effect": "Allow", "Action": "logs:CreateLogGroup", "Resource": log_groups},
        {"Sid": "OwnLogStreams", "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
         "Resource": [f"{group}:log-stream:*" for group in log_groups]},
        {"Sid": "StageBucketObjects", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": f"{bucket_arn}/*"},
        {"Sid": "StageBucketList", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn},
        # Lambda sends a failed asynchronous rollout to its on-failure destination with the function's role.
        {"Sid": "RolloutFailureQueue", "Effect": "Allow", "Action": "sqs:SendMessage",
         "Resource": names.queue_arn(partition)},
    ]}
    return trust, permissions


def desired_resources(config: DeployConfig, *, account: str, region: str, artifacts: dict[str, Artifact] | None,
                      tls_endpoint: bool = True) -> tuple[Resource, ...]:
    """Every resource of the stage, in `KIND_ORDER`; `artifacts` maps function short names to built zips.

    `tls_endpoint` is False only when S3 is reached over plain HTTP (moto on loopback): the bucket then gets no
    TLS-only policy, which would refuse every request strata makes there.
    """
    check_config(config)
    names = Names(stage=config.stage, account=account, region=region, bucket_override=config.bucket)
    partition = partition_of(region)
    tags = names.tags()
    trust, permissions = role_policies(names, partition)
    role_arn = f"arn:{partition}:iam::{account}:role/{names.role}"
    resources: list[Resource] = [
        Bucket(name=names.bucket, tags=tags,
               policy=tls_only_policy(f"arn:{partition}:s3:::{names.bucket}") if tls_endpoint else None),
        Queue(name=names.failure_queue, retention_s=FAILURE_RETENTION_S, tags=tags),
        Role(name=names.role, policy_name=f"{names.prefix}-lambda-access", assume_role_policy=trust,
             policy=permissions, tags=tags),
    ]
    environment = {ENV_STAGE: config.stage, ENV_BUCKET: names.bucket}
    if config.trusted_public_key:
        environment[ENV_TRUSTED_PUBLIC_KEY] = config.trusted_public_key
    functions: list[Function] = []
    for spec in FUNCTIONS:
        artifact = None if artifacts is None else artifacts[spec.name]
        functions.append(Function(
            name=names.function(spec.name), handler=spec.handler, memory_mb=config.memory_mb,
            timeout_s=config.timeout_s, architecture=config.architecture, role=names.role, role_arn=role_arn,
            bucket=names.bucket, environment=environment,
            reserved_concurrency=reserved_for(spec, config.reserved_concurrency), tags=tags, artifact=artifact))
    resources += functions
    resources += [Alias(name=f"{f.name}:{names.alias}", function=f.name, alias=names.alias,
                        target=f.version_attributes()) for f in functions]
    resources += [EventInvokeConfig(name=f"{names.function(spec.name)}:{names.alias}",
                                    function=names.function(spec.name), alias=names.alias,
                                    on_failure=names.queue_arn(partition), max_retries=ASYNC_RETRIES,
                                    max_event_age_s=ASYNC_MAX_EVENT_AGE_S)
                  for spec in FUNCTIONS if spec.failure_queue]
    fleet = iot_fleet(config.stage, config.fleet)
    for node in config.edge_nodes:
        thing = names.iot(node)
        resources.append(IotPolicy(name=thing, document=policy_document(
            partition=partition, region=region, account=account, fleet=fleet, node=node)))
    for node in config.edge_nodes:
        resources.append(IotThing(name=names.iot(node), node=node,
                                  thing_attributes={"strata_stage": config.stage, "strata_fleet": config.fleet}))
    for node in config.edge_nodes:
        thing = names.iot(node)
        resources.append(IotCertificate(name=thing, node=node, fleet=fleet, thing=thing, policy=thing,
                                        client_id=mqtt_client_id("agent", fleet=fleet, node=node)))
    return tuple(resources)
