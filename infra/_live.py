"""Read-only views of live AWS resources, one reader per resource kind, in a registry that refuses unknown kinds.

A reader returns the resource's attributes in the same shape as the model's ``attributes()`` (so the plan
can diff them field by field) plus the ids AWS assigned, or None when the resource does not exist.
Nothing here changes AWS: only ``Get*``, ``Describe*``, ``List*`` and ``Head*`` calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra._errors import UnknownResourceKindError
from infra._models import RUNTIME
from infra._state import Record
from infra.aws import Clients, or_none


@dataclass(frozen=True, kw_only=True)
class Live:
    """A live resource as AWS reports it."""

    attributes: dict[str, Any] = field(hash=False)
    ids: dict[str, Any] = field(hash=False)


Reader = Callable[[Clients, str, "Record | None"], "Live | None"]


def _json(doc: Any) -> Any:
    """IAM and IoT hand policy documents back as strings or dicts; normalise to dicts."""
    return json.loads(doc) if isinstance(doc, str) else doc


def read_bucket(aws: Clients, name: str, record: Record | None) -> Live | None:
    """The bucket's versioning, public-access block, default encryption, policy and tags."""
    s3 = aws.get("s3")
    if or_none(s3.head_bucket, Bucket=name) is None:
        return None
    versioning = s3.get_bucket_versioning(Bucket=name).get("Status", "Disabled")
    block = or_none(s3.get_public_access_block, Bucket=name)
    flags = block["PublicAccessBlockConfiguration"] if block else {}
    tagging = or_none(s3.get_bucket_tagging, Bucket=name)
    tags = {t["Key"]: t["Value"] for t in tagging["TagSet"]} if tagging else {}
    blocked = bool(flags) and all(flags.get(k) for k in ("BlockPublicAcls", "IgnorePublicAcls",
                                                          "BlockPublicPolicy", "RestrictPublicBuckets"))
    got = or_none(s3.get_bucket_encryption, Bucket=name)
    rules = got["ServerSideEncryptionConfiguration"]["Rules"] if got else []
    encryption = rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] if rules else None
    policy = or_none(s3.get_bucket_policy, Bucket=name)
    return Live(attributes={"versioning": versioning, "block_public_access": blocked, "encryption": encryption,
                            "policy": _json(policy["Policy"]) if policy else None, "tags": tags},
                ids={"arn": f"arn:aws:s3:::{name}"})


def read_queue(aws: Clients, name: str, record: Record | None) -> Live | None:
    """The queue's retention, encryption and tags."""
    sqs = aws.get("sqs")
    got = or_none(sqs.get_queue_url, QueueName=name)
    if got is None:
        return None
    url = got["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]).get("Attributes", {})
    tags = sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
    encrypted = str(attrs.get("SqsManagedSseEnabled", "false")).lower() == "true"
    return Live(attributes={"retention_s": int(attrs.get("MessageRetentionPeriod", 0)),
                            "encryption": "SQS-SSE" if encrypted else None, "tags": dict(tags)},
                ids={"url": url, "arn": attrs.get("QueueArn", "")})


def read_role(aws: Clients, name: str, record: Record | None) -> Live | None:
    """The role's trust policy, its one inline policy and its tags."""
    iam = aws.get("iam")
    got = or_none(iam.get_role, RoleName=name)
    if got is None:
        return None
    role = got["Role"]
    policy_name = (record.ids.get("policy_name") if record else None) or f"{name}-access"
    inline = or_none(iam.get_role_policy, RoleName=name, PolicyName=policy_name)
    tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name).get("Tags", [])}
    return Live(attributes={"assume_role_policy": _json(role["AssumeRolePolicyDocument"]),
                            "policy": _json(inline["PolicyDocument"]) if inline else None, "tags": tags},
                ids={"arn": role["Arn"], "policy_name": policy_name})


def function_version_attributes(config: dict[str, Any]) -> dict[str, Any]:
    """`Function.version_attributes` of a Lambda ``FunctionConfiguration``."""
    return {
        "runtime": config.get("Runtime", RUNTIME),
        "handler": config.get("Handler"),
        "memory_mb": config.get("MemorySize"),
        "timeout_s": config.get("Timeout"),
        "architecture": (config.get("Architectures") or ["x86_64"])[0],
        "role": config.get("Role"),
        "environment": dict(config.get("Environment", {}).get("Variables", {})),
        "code_sha256": config.get("CodeSha256"),
    }


def read_function(aws: Clients, name: str, record: Record | None) -> Live | None:
    """The function's ``$LATEST`` configuration, code hash, reserved concurrency and tags."""
    got = or_none(aws.get("lambda").get_function, FunctionName=name)
    if got is None:
        return None
    config = got["Configuration"]
    reserved = got.get("Concurrency", {}).get("ReservedConcurrentExecutions")
    return Live(attributes={**function_version_attributes(config), "reserved_concurrency": reserved,
                            "tags": dict(got.get("Tags", {}))},
                ids={"arn": config["FunctionArn"]})


def read_alias(aws: Clients, name: str, record: Record | None) -> Live | None:
    """The alias and the configuration of the version it points at."""
    function, alias = name.split(":", 1)
    lam = aws.get("lambda")
    got = or_none(lam.get_alias, FunctionName=function, Name=alias)
    if got is None:
        return None
    version = str(got["FunctionVersion"])
    config = or_none(lam.get_function_configuration, FunctionName=function, Qualifier=version)
    target = function_version_attributes(config) if config else {}
    history = list(record.ids.get("history", [])) if record else []
    if not history or history[-1] != version:
        history.append(version)
    return Live(attributes={"target": target}, ids={"arn": got["AliasArn"], "version": version, "history": history})


def read_event_invoke_config(aws: Clients, name: str, record: Record | None) -> Live | None:
    """The alias's asynchronous-invocation settings: retries, event age and on-failure destination."""
    function, alias = name.split(":", 1)
    got = or_none(aws.get("lambda").get_function_event_invoke_config, FunctionName=function, Qualifier=alias)
    if got is None:
        return None
    on_failure = got.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
    return Live(attributes={"on_failure": on_failure, "max_retries": got.get("MaximumRetryAttempts"),
                            "max_event_age_s": got.get("MaximumEventAgeInSeconds")},
                ids={"function_arn": got.get("FunctionArn", "")})


def read_iot_policy(aws: Clients, name: str, record: Record | None) -> Live | None:
    """The policy's default version document."""
    got = or_none(aws.get("iot").get_policy, policyName=name)
    if got is None:
        return None
    return Live(attributes={"document": _json(got["policyDocument"])},
                ids={"arn": got["policyArn"], "default_version": str(got.get("defaultVersionId", "1"))})


def read_iot_thing(aws: Clients, name: str, record: Record | None) -> Live | None:
    """The thing's attributes."""
    got = or_none(aws.get("iot").describe_thing, thingName=name)
    if got is None:
        return None
    return Live(attributes={"attributes": dict(got.get("attributes", {}))}, ids={"arn": got["thingArn"]})


def read_iot_certificate(aws: Clients, name: str, record: Record | None) -> Live | None:
    """The recorded certificate's status and what it is attached to (None without a recorded id)."""
    cert_id = record.ids.get("certificate_id") if record else None
    if not cert_id:
        return None
    iot = aws.get("iot")
    got = or_none(iot.describe_certificate, certificateId=cert_id)
    if got is None:
        return None
    desc = got["certificateDescription"]
    arn = desc["certificateArn"]
    things = sorted(iot.list_principal_things(principal=arn).get("things", []))
    policies = sorted(p["policyName"] for p in iot.list_attached_policies(target=arn).get("policies", []))
    assert record is not None
    # The private key exists only in the local credentials file: without it the certificate is useless,
    # so a lost file shows in the plan (and apply issues a new certificate).
    creds = record.ids.get("credentials_file")
    present = "present" if creds and Path(str(creds)).is_file() else "missing"
    return Live(attributes={"status": desc["status"], "things": things, "policies": policies,
                            "credentials_file": present},
                ids={**record.ids, "certificate_arn": arn})


READERS: dict[str, Reader] = {
    "s3_bucket": read_bucket,
    "sqs_queue": read_queue,
    "iam_role": read_role,
    "lambda_function": read_function,
    "lambda_alias": read_alias,
    "lambda_event_invoke_config": read_event_invoke_config,
    "iot_policy": read_iot_policy,
    "iot_thing": read_iot_thing,
    "iot_certificate": read_iot_certificate,
}


def reader_for(kind: str) -> Reader:
    """The reader of `kind`; raises `UnknownResourceKindError` rather than skipping a kind it does not know."""
    try:
        return READERS[kind]
    except KeyError:
        raise UnknownResourceKindError(f"reader_for: no reader for resource kind {kind!r} (known: "
                                       f"{sorted(READERS)}); the state file may come from a newer strata: "
                                       "upgrade strata") from None
