"""The same deployment as a CloudFormation template, built from the same resource models as `plan`/`apply`.

The models are made with ``${AWS::AccountId}`` / ``${AWS::Region}`` / ``${AWS::Partition}`` placeholders,
and every string holding one becomes an ``Fn::Sub``. The function zip is not inlined: the template takes
``CodeBucket`` / ``CodeKey`` parameters (upload the zip `strata infra template --package` writes), and each
edge node's certificate is issued from a CSR parameter, so no private key ever passes through CloudFormation.
A kind with no template writer raises `UnknownResourceKindError`.

Logical ids are alphanumeric, so names that differ only in punctuation or case (``node-1``, ``node1``,
``node_1``, ``Node1``) would collapse into one id and CloudFormation would keep only the last resource. Every
id built from a node's name therefore ends in a hash of the exact name (`node_id`), and every id is written
through `_put`, which raises rather than overwrite one: N nodes in, N things, N certificates, N CSR
parameters out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra._errors import InfraError, UnknownResourceKindError
from infra._models import (
    BUCKET_ENCRYPTION,
    FUNCTIONS,
    RUNTIME,
    Alias,
    Artifact,
    Bucket,
    DeployConfig,
    EventInvokeConfig,
    Function,
    IotCertificate,
    IotPolicy,
    IotThing,
    Queue,
    Resource,
    Role,
    desired_resources,
)

_ACCOUNT = "${AWS::AccountId}"
_REGION = "${AWS::Region}"


def logical_id(prefix: str, name: str) -> str:
    """A CloudFormation logical id: `prefix` plus the alphanumeric CamelCase of `name`.

    Only for names from a fixed set that cannot collide (the stage's two functions); ids of user-given names
    go through `node_id`.
    """
    return prefix + "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part)


def node_id(prefix: str, name: str) -> str:
    """`logical_id` plus the first 10 hex digits of the SHA-256 of the exact `name`: distinct names, distinct ids."""
    return logical_id(prefix, name) + hashlib.sha256(name.encode()).hexdigest()[:10]


def _put(t: dict[str, Any], section: str, key: str, value: dict[str, Any]) -> None:
    """``t[section][key] = value``, refusing to replace an entry (a silently dropped resource)."""
    if key in t[section]:
        raise InfraError(f"template: two {section} entries would share the logical id {key!r}; "
                                       "one would be dropped")
    t[section][key] = value


def _sub(value: Any) -> Any:
    """Wrap every string that holds a ``${...}`` placeholder in ``Fn::Sub`` (recursively)."""
    if isinstance(value, str):
        value = value.replace("arn:aws:", "arn:${AWS::Partition}:")
        return {"Fn::Sub": value} if "${" in value else value
    if isinstance(value, dict):
        return {k: _sub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_sub(v) for v in value]
    return value


def _tags(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


Writer = Callable[[Resource, dict[str, Any]], None]


def _bucket(r: Resource, t: dict[str, Any]) -> None:
    assert isinstance(r, Bucket)
    _put(t, "Resources", "StageBucket", {"Type": "AWS::S3::Bucket", "Properties": {
        "BucketName": _sub(r.name), "VersioningConfiguration": {"Status": "Enabled"},
        "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "IgnorePublicAcls": True,
                                           "BlockPublicPolicy": True, "RestrictPublicBuckets": True},
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [
            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": BUCKET_ENCRYPTION}}]},
        "Tags": _tags(r.tags)}})
    if r.policy is not None:
        _put(t, "Resources", "StageBucketPolicy", {"Type": "AWS::S3::BucketPolicy", "Properties": {
            "Bucket": {"Ref": "StageBucket"}, "PolicyDocument": _sub(r.policy)}})
    _put(t, "Outputs", "BucketName", {"Value": {"Ref": "StageBucket"}})


def _queue(r: Resource, t: dict[str, Any]) -> None:
    assert isinstance(r, Queue)
    _put(t, "Resources", "FailureQueue", {"Type": "AWS::SQS::Queue", "Properties": {
        "QueueName": r.name, "MessageRetentionPeriod": r.retention_s, "SqsManagedSseEnabled": True,
        "Tags": _tags(r.tags)}})
    _put(t, "Outputs", "FailureQueueUrl", {"Value": {"Ref": "FailureQueue"}})


def _role(r: Resource, t: dict[str, Any]) -> None:
    assert isinstance(r, Role)
    _put(t, "Resources", "ExecutionRole", {"Type": "AWS::IAM::Role", "Properties": {
        "RoleName": _sub(r.name), "AssumeRolePolicyDocument": r.assume_role_policy,
        "Policies": [{"PolicyName": _sub(r.policy_name), "PolicyDocument": _sub(r.policy)}],
        "Tags": _tags(r.tags)}})


def _function(r: Resource, t: dict[str, Any]) -> None:
    assert isinstance(r, Function)
    props: dict[str, Any] = {
        "FunctionName": r.name, "Runtime": RUNTIME, "Handler": r.handler, "MemorySize": r.memory_mb,
        "Timeout": r.timeout_s, "Architectures": [r.architecture], "Role": {"Fn::GetAtt": ["ExecutionRole", "Arn"]},
        "Code": {"S3Bucket": {"Ref": "CodeBucket"}, "S3Key": {"Ref": "CodeKey"}},
        "Environment": {"Variables": _sub(dict(r.environment))}, "Tags": _tags(r.tags)}
    if r.reserved_concurrency is not None:
        props["ReservedConcurrentExecutions"] = r.reserved_concurrency
    _put(t, "Resources", logical_id("Function", r.name), {"Type": "AWS::Lambda::Function", "Properties": props})


def _alias(r: Resource, t: dict[str, Any]) -> None:
    assert isinstance(r, Alias)
    fn = logical_id("Function", r.function)
    # CloudFormation publishes a version only when a new AWS::Lambda::Version resource appears, so its logical
    # id carries a hash of everything a version freezes (code and configuration): new code or settings give a
    # new id, a new version, and the alias moves; the old version resource is deleted on the stack update.
    frozen = hashlib.sha256(json.dumps(r.target, sort_keys=True, default=str).encode()).hexdigest()[:12]
    version = logical_id("Version", r.function) + frozen
    props: dict[str, Any] = {"FunctionName": {"Ref": fn}, "Description": f"strata stage {r.alias}"}
    if r.target.get("code_sha256"):
        props["CodeSha256"] = r.target["code_sha256"]  # CloudFormation refuses the version if the code differs
    _put(t, "Resources", version, {"Type": "AWS::Lambda::Version", "Properties": props})
    alias = logical_id("Alias", r.function)
    _put(t, "Resources", alias, {"Type": "AWS::Lambda::Alias", "Properties": {
        "FunctionName": {"Ref": fn}, "FunctionVersion": {"Fn::GetAtt": [version, "Version"]}, "Name": r.alias}})
    _put(t, "Outputs", alias + "Arn", {"Value": {"Ref": alias}})


def _event_invoke_config(r: Resource, t: dict[str, Any]) -> None:
    assert isinstance(r, EventInvokeConfig)
    # The qualifier is the stage alias (the one callers invoke), which must exist first.
    _put(t, "Resources", logical_id("EventInvokeConfig", r.function), {
        "Type": "AWS::Lambda::EventInvokeConfig", "DependsOn": [logical_id("Alias", r.function)],
        "Properties": {
            "FunctionName": {"Ref": logical_id("Function", r.function)}, "Qualifier": r.alias,
            "MaximumRetryAttempts": r.max_retries, "MaximumEventAgeInSeconds": r.max_event_age_s,
            "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": ["FailureQueue", "Arn"]}}}}})


def _iot_policy(r: Resource, t: dict[str, Any]) -> None:
    assert isinstance(r, IotPolicy)
    _put(t, "Resources", node_id("IotPolicy", r.name), {"Type": "AWS::IoT::Policy", "Properties": {
        "PolicyName": r.name, "PolicyDocument": _sub(r.document)}})


def _iot_thing(r: Resource, t: dict[str, Any]) -> None:
    assert isinstance(r, IotThing)
    _put(t, "Resources", node_id("Thing", r.name), {"Type": "AWS::IoT::Thing", "Properties": {
        "ThingName": r.name, "AttributePayload": {"Attributes": dict(r.thing_attributes)}}})


def _iot_certificate(r: Resource, t: dict[str, Any]) -> None:
    assert isinstance(r, IotCertificate)
    csr = node_id("Csr", r.node)
    cert = node_id("Certificate", r.name)
    _put(t, "Parameters", csr, {"Type": "String", "Description": f"PEM certificate signing request of edge node "
                                f"{r.node} (openssl req -new -key node.key -subj /CN={r.node})"})
    _put(t, "Resources", cert, {"Type": "AWS::IoT::Certificate", "Properties": {
        "CertificateSigningRequest": {"Ref": csr}, "Status": "ACTIVE"}})
    _put(t, "Resources", node_id("PolicyAttachment", r.name), {
        "Type": "AWS::IoT::PolicyPrincipalAttachment", "Properties": {
            "PolicyName": {"Ref": node_id("IotPolicy", r.policy)}, "Principal": {"Fn::GetAtt": [cert, "Arn"]}}})
    _put(t, "Resources", node_id("ThingAttachment", r.name), {
        "Type": "AWS::IoT::ThingPrincipalAttachment", "Properties": {
            "ThingName": {"Ref": node_id("Thing", r.thing)}, "Principal": {"Fn::GetAtt": [cert, "Arn"]}}})
    _put(t, "Outputs", cert + "Id", {"Value": {"Ref": cert}})


WRITERS: dict[str, Writer] = {
    "s3_bucket": _bucket,
    "sqs_queue": _queue,
    "iam_role": _role,
    "lambda_function": _function,
    "lambda_alias": _alias,
    "lambda_event_invoke_config": _event_invoke_config,
    "iot_policy": _iot_policy,
    "iot_thing": _iot_thing,
    "iot_certificate": _iot_certificate,
}


def writer_for(kind: str) -> Writer:
    """The template writer of `kind`; raises `UnknownResourceKindError` rather than leaving a resource out."""
    try:
        return WRITERS[kind]
    except KeyError:
        raise UnknownResourceKindError(f"writer_for: no CloudFormation writer for resource kind {kind!r} "
                                       f"(known: {sorted(WRITERS)})") from None


def template(config: DeployConfig, artifact: Artifact | None = None) -> dict[str, Any]:
    """The CloudFormation template (as a dict) of the deployment `config` describes.

    With the built package `artifact` each ``AWS::Lambda::Version`` carries its ``CodeSha256`` and a logical id
    that changes with the code, and ``CodeKey`` defaults to the zip's content-addressed key; without it the
    versions change only with the configuration (the CLI always passes it).
    """
    t: dict[str, Any] = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": f"strata stage {config.stage}: bucket, execution role, functions with a stage alias, "
                       f"{len(config.edge_nodes)} edge node(s) on AWS IoT Core",
        "Parameters": {
            "CodeBucket": {"Type": "String", "Description": "Bucket holding the functions zip (not the stage "
                           "bucket, which this stack creates)"},
            "CodeKey": {"Type": "String", "Description": "Key of the zip written by `strata infra template "
                        "--package`"},
        },
        "Resources": {},
        "Outputs": {},
    }
    if artifact is not None:
        t["Parameters"]["CodeKey"]["Default"] = artifact.key
    artifacts = None if artifact is None else {spec.name: artifact for spec in FUNCTIONS}
    for resource in desired_resources(config, account=_ACCOUNT, region=_REGION, artifacts=artifacts):
        writer_for(resource.kind)(resource, t)
    return t


def write_template(config: DeployConfig, out: Path, artifact: Artifact | None = None) -> Path:
    """Write the template of `config` (and `artifact`, see `template`) to `out` as JSON (temp file renamed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(template(config, artifact), indent=2) + "\n")
    tmp.replace(out)
    return out
