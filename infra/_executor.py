"""Executors of a plan: `AwsExecutor`, the only code in strata that changes AWS, and a printing `DryRunExecutor`.

Each resource kind has a create / update / delete triple in `OPERATIONS`; a kind without one raises
`UnknownResourceKindError` instead of being skipped. An executor returns the `Record` to keep in the state
file (None after a delete), and the pipeline saves the state after every step, so an apply that fails
half-way is completed by running it again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from infra._errors import AwsCallError, UnknownResourceKindError
from infra._iot import credentials_path, remove_credentials, write_credentials
from infra._live import function_version_attributes
from infra._models import (
    BUCKET_ENCRYPTION,
    RUNTIME,
    Alias,
    Bucket,
    EventInvokeConfig,
    Function,
    IotCertificate,
    IotPolicy,
    IotThing,
    Queue,
    Role,
)
from infra._plan import Step
from infra._state import Record
from infra.aws import Clients, is_not_found, or_none, retry_while


class Executor(Protocol):
    """Carries out one step and says what to record."""

    dry_run: bool

    def execute(self, step: Step) -> Record | None:
        """Carry out `step`; return the resource's new record, or None when it no longer exists."""
        ...


@dataclass(frozen=True)
class _Ops:
    create: Callable[[AwsExecutor, Step], dict[str, Any]]
    update: Callable[[AwsExecutor, Step], dict[str, Any]]
    delete: Callable[[AwsExecutor, Step], None]


def operations_for(kind: str) -> _Ops:
    """The create/update/delete operations of `kind`; raises `UnknownResourceKindError` for an unknown kind."""
    try:
        return OPERATIONS[kind]
    except KeyError:
        raise UnknownResourceKindError(f"operations_for: no executor operations for resource kind {kind!r} "
                                       f"(known: {sorted(OPERATIONS)}); upgrade strata") from None


class AwsExecutor:
    """Applies steps to AWS through boto3 (via `infra.aws.Clients`).

    Args:
        aws: The deployment's clients.
        state_dir: The state folder (node credentials files are written under it).
        stage: The stage being changed.
    """

    dry_run = False

    def __init__(self, aws: Clients, *, state_dir: Path, stage: str) -> None:
        self.aws = aws
        self.state_dir = state_dir
        self.stage = stage

    def execute(self, step: Step) -> Record | None:
        """Carry out `step` on AWS."""
        ops = operations_for(step.kind)
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if step.action == "delete":
                ops.delete(self, step)
                return None
            if step.action == "no-op":
                return _noop_record(step)
            assert step.resource is not None, f"{step.action} step without a resource: {step.key}"
            ids = (ops.create if step.action == "create" else ops.update)(self, step)
        except (ClientError, BotoCoreError) as exc:
            raise AwsCallError(f"{step.action} {step.key} failed: {exc}; fix the cause and run "
                               "`strata infra apply` again: finished steps are recorded and are not repeated"
                               ) from exc
        return Record(kind=step.kind, name=step.name, attributes=step.resource.attributes(), ids=ids)

    # -- waits ------------------------------------------------------------------------------------

    def wait_function_ready(self, name: str, *, attempts: int = 120) -> dict[str, Any]:
        """Poll until the function is Active and its last update finished; return its configuration."""
        lam = self.aws.get("lambda")
        for _ in range(attempts):
            config: dict[str, Any] = lam.get_function_configuration(FunctionName=name)
            state, update = config.get("State", "Active"), config.get("LastUpdateStatus", "Successful")
            if state == "Failed" or update == "Failed":
                raise AwsCallError(f"Lambda function {name!r} is in state {state}/{update}: "
                                   f"{config.get('StateReason') or config.get('LastUpdateStatusReason')}")
            if state == "Active" and update == "Successful":
                return config
            self.aws.sleep(1.0)
        raise AwsCallError(f"Lambda function {name!r} did not become ready after {attempts} polls; "
                           "run `strata infra apply` again")


def _noop_record(step: Step) -> Record | None:
    if step.resource is None:
        return None
    ids = dict(step.live.ids) if step.live is not None else dict(step.record.ids if step.record else {})
    return Record(kind=step.kind, name=step.name, attributes=step.resource.attributes(), ids=ids)


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def _stale_tag_keys(step: Step, desired: dict[str, str]) -> list[str]:
    live_tags = step.live.attributes.get("tags", {}) if step.live else {}
    return sorted(set(live_tags) - set(desired))


# -- S3 bucket ---------------------------------------------------------------------------------------


def _configure_bucket(ex: AwsExecutor, bucket: Bucket) -> None:
    s3 = ex.aws.get("s3")
    s3.put_bucket_versioning(Bucket=bucket.name, VersioningConfiguration={"Status": "Enabled"})
    s3.put_public_access_block(Bucket=bucket.name, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True})
    s3.put_bucket_encryption(Bucket=bucket.name, ServerSideEncryptionConfiguration={"Rules": [
        {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": BUCKET_ENCRYPTION}}]})
    if bucket.policy is not None:
        s3.put_bucket_policy(Bucket=bucket.name, Policy=json.dumps(bucket.policy))
    else:
        or_none(s3.delete_bucket_policy, Bucket=bucket.name)
    s3.put_bucket_tagging(Bucket=bucket.name, Tagging={"TagSet": _tag_list(bucket.tags)})


def _create_bucket(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    bucket = step.resource
    assert isinstance(bucket, Bucket)
    extra = {} if ex.aws.region == "us-east-1" else {
        "CreateBucketConfiguration": {"LocationConstraint": ex.aws.region}}
    ex.aws.get("s3").create_bucket(Bucket=bucket.name, **extra)
    _configure_bucket(ex, bucket)
    return {"arn": f"arn:aws:s3:::{bucket.name}"}


def _update_bucket(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    bucket = step.resource
    assert isinstance(bucket, Bucket)
    _configure_bucket(ex, bucket)
    return {"arn": f"arn:aws:s3:::{bucket.name}"}


def empty_bucket(s3: Any, name: str) -> int:
    """Delete every object version and delete marker in bucket `name`; return how many were deleted."""
    deleted = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
        batch = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                 for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        for start in range(0, len(batch), 1000):  # DeleteObjects takes at most 1000 keys
            s3.delete_objects(Bucket=name, Delete={"Objects": batch[start:start + 1000], "Quiet": True})
        deleted += len(batch)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):  # objects from before versioning
        batch = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if batch:
            s3.delete_objects(Bucket=name, Delete={"Objects": batch, "Quiet": True})
        deleted += len(batch)
    return deleted


def _delete_bucket(ex: AwsExecutor, step: Step) -> None:
    s3 = ex.aws.get("s3")
    empty_bucket(s3, step.name)
    or_none(s3.delete_bucket, Bucket=step.name)


# -- SQS queue (failed asynchronous rollouts) --------------------------------------------------------


def _queue_attributes(queue: Queue) -> dict[str, str]:
    return {"MessageRetentionPeriod": str(queue.retention_s), "SqsManagedSseEnabled": "true"}


def _queue_ids(ex: AwsExecutor, url: str) -> dict[str, Any]:
    attrs = ex.aws.get("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    return {"url": url, "arn": attrs["QueueArn"]}


def _create_queue(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    queue = step.resource
    assert isinstance(queue, Queue)
    url = ex.aws.get("sqs").create_queue(QueueName=queue.name, Attributes=_queue_attributes(queue),
                                         tags=dict(queue.tags))["QueueUrl"]
    return _queue_ids(ex, url)


def _update_queue(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    queue = step.resource
    assert isinstance(queue, Queue)
    sqs = ex.aws.get("sqs")
    url = sqs.get_queue_url(QueueName=queue.name)["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes=_queue_attributes(queue))
    sqs.tag_queue(QueueUrl=url, Tags=dict(queue.tags))
    stale = _stale_tag_keys(step, queue.tags)
    if stale:
        sqs.untag_queue(QueueUrl=url, TagKeys=stale)
    return _queue_ids(ex, url)


def _delete_queue(ex: AwsExecutor, step: Step) -> None:
    sqs = ex.aws.get("sqs")
    got = or_none(sqs.get_queue_url, QueueName=step.name)
    if got is not None:
        or_none(sqs.delete_queue, QueueUrl=got["QueueUrl"])


# -- IAM role ----------------------------------------------------------------------------------------


def _put_role_policy(ex: AwsExecutor, role: Role) -> None:
    ex.aws.get("iam").put_role_policy(RoleName=role.name, PolicyName=role.policy_name,
                                      PolicyDocument=json.dumps(role.policy))


def _create_role(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    role = step.resource
    assert isinstance(role, Role)
    got = ex.aws.get("iam").create_role(RoleName=role.name, AssumeRolePolicyDocument=json.dumps(
        role.assume_role_policy), Description="strata functions' execution role", Tags=_tag_list(role.tags))
    _put_role_policy(ex, role)
    return {"arn": got["Role"]["Arn"], "policy_name": role.policy_name}


def _update_role(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    role = step.resource
    assert isinstance(role, Role)
    iam = ex.aws.get("iam")
    fields = {c.field.split(".")[0] for c in step.changes}
    if "assume_role_policy" in fields:
        iam.update_assume_role_policy(RoleName=role.name, PolicyDocument=json.dumps(role.assume_role_policy))
    if "policy" in fields:
        _put_role_policy(ex, role)
    if "tags" in fields:
        iam.tag_role(RoleName=role.name, Tags=_tag_list(role.tags))
        stale = _stale_tag_keys(step, role.tags)
        if stale:
            iam.untag_role(RoleName=role.name, TagKeys=stale)
    arn = step.live.ids["arn"] if step.live else iam.get_role(RoleName=role.name)["Role"]["Arn"]
    return {"arn": arn, "policy_name": role.policy_name}


def _delete_role(ex: AwsExecutor, step: Step) -> None:
    iam = ex.aws.get("iam")
    for name in iam.list_role_policies(RoleName=step.name).get("PolicyNames", []):
        iam.delete_role_policy(RoleName=step.name, PolicyName=name)
    for attached in iam.list_attached_role_policies(RoleName=step.name).get("AttachedPolicies", []):
        iam.detach_role_policy(RoleName=step.name, PolicyArn=attached["PolicyArn"])
    or_none(iam.delete_role, RoleName=step.name)


# -- Lambda function ---------------------------------------------------------------------------------


def _upload_code(ex: AwsExecutor, fn: Function) -> dict[str, str]:
    """Upload the zip to the stage bucket (once per content hash); return Lambda's ``Code`` argument."""
    artifact = fn.artifact
    if artifact is None:
        raise AwsCallError(f"apply {fn.name}: no built package; plans for apply must be made with artifacts")
    s3 = ex.aws.get("s3")
    if or_none(s3.head_object, Bucket=fn.bucket, Key=artifact.key) is None:
        with artifact.path.open("rb") as body:
            s3.put_object(Bucket=fn.bucket, Key=artifact.key, Body=body, Metadata={"sha256": artifact.sha256_hex})
    return {"S3Bucket": fn.bucket, "S3Key": artifact.key}


def _lambda_config(fn: Function) -> dict[str, Any]:
    return {"Runtime": RUNTIME, "Role": fn.role_arn, "Handler": fn.handler, "Timeout": fn.timeout_s,
            "MemorySize": fn.memory_mb, "Environment": {"Variables": dict(fn.environment)}}


def _put_concurrency(ex: AwsExecutor, fn: Function) -> None:
    lam = ex.aws.get("lambda")
    if fn.reserved_concurrency is None:
        or_none(lam.delete_function_concurrency, FunctionName=fn.name)
    else:
        lam.put_function_concurrency(FunctionName=fn.name, ReservedConcurrentExecutions=fn.reserved_concurrency)


def _create_function(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    fn = step.resource
    assert isinstance(fn, Function)
    code = _upload_code(ex, fn)
    lam = ex.aws.get("lambda")
    # A role created seconds ago may not be assumable yet (IAM is eventually consistent): retry only that.
    got = retry_while(lam.create_function, codes=frozenset({"InvalidParameterValueException"}),
                      message_part="cannot be assumed", sleep=ex.aws.sleep, FunctionName=fn.name, Code=code,
                      Architectures=[fn.architecture], Tags=dict(fn.tags), Publish=False, PackageType="Zip",
                      **_lambda_config(fn))
    ex.wait_function_ready(fn.name)
    if fn.reserved_concurrency is not None:
        _put_concurrency(ex, fn)
    return {"arn": got["FunctionArn"]}


def _update_function(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    fn = step.resource
    assert isinstance(fn, Function)
    lam = ex.aws.get("lambda")
    fields = {c.field.split(".")[0] for c in step.changes}
    if fields & {"runtime", "handler", "memory_mb", "timeout_s", "role", "environment"}:
        lam.update_function_configuration(FunctionName=fn.name, **_lambda_config(fn))
        ex.wait_function_ready(fn.name)
    if fields & {"code_sha256", "architecture"}:
        lam.update_function_code(FunctionName=fn.name, Architectures=[fn.architecture], **_upload_code(ex, fn))
        ex.wait_function_ready(fn.name)
    if "reserved_concurrency" in fields:
        _put_concurrency(ex, fn)
    arn = step.live.ids["arn"] if step.live else lam.get_function(FunctionName=fn.name)["Configuration"][
        "FunctionArn"]
    if "tags" in fields:
        lam.tag_resource(Resource=arn, Tags=dict(fn.tags))
        stale = _stale_tag_keys(step, fn.tags)
        if stale:
            lam.untag_resource(Resource=arn, TagKeys=stale)
    return {"arn": arn}


def _delete_function(ex: AwsExecutor, step: Step) -> None:
    or_none(ex.aws.get("lambda").delete_function, FunctionName=step.name)


# -- Lambda alias (and the published version behind it) ---------------------------------------------


def _version_matching(ex: AwsExecutor, function: str, target: dict[str, Any]) -> str | None:
    """The newest published version whose frozen configuration equals `target`."""
    found: list[int] = []
    for page in ex.aws.get("lambda").get_paginator("list_versions_by_function").paginate(FunctionName=function):
        for v in page.get("Versions", []):
            if v["Version"] != "$LATEST" and function_version_attributes(v) == target:
                found.append(int(v["Version"]))
    return str(max(found)) if found else None


def _point_alias(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    alias = step.resource
    assert isinstance(alias, Alias)
    lam = ex.aws.get("lambda")
    version = alias.pin_version or _version_matching(ex, alias.function, alias.target)
    if version is None:
        latest = function_version_attributes(lam.get_function_configuration(FunctionName=alias.function))
        if latest != alias.target:
            raise AwsCallError(f"publish {alias.function}: $LATEST does not have the desired configuration yet "
                               "(the function step did not finish); run `strata infra apply` again")
        version = str(lam.publish_version(FunctionName=alias.function, CodeSha256=alias.target["code_sha256"],
                                          Description=f"strata stage {alias.alias}")["Version"])
    existing = or_none(lam.get_alias, FunctionName=alias.function, Name=alias.alias)
    if existing is None:
        got = lam.create_alias(FunctionName=alias.function, Name=alias.alias, FunctionVersion=version)
    else:
        got = lam.update_alias(FunctionName=alias.function, Name=alias.alias, FunctionVersion=version)
    history = [str(v) for v in (step.record.ids.get("history", []) if step.record else [])]
    live_version = step.live.ids.get("version") if step.live else None
    if live_version and (not history or history[-1] != live_version):
        history.append(str(live_version))  # the alias was moved outside strata: that is where it was
    if len(history) >= 2 and history[-2] == version:
        history.pop()  # moving back to the previous version is a rollback: unwind the history
    elif not history or history[-1] != version:
        history.append(version)
    return {"arn": got["AliasArn"], "version": version, "history": history}


def _delete_alias(ex: AwsExecutor, step: Step) -> None:
    function, alias = step.name.split(":", 1)
    or_none(ex.aws.get("lambda").delete_alias, FunctionName=function, Name=alias)


# -- asynchronous invocation of an alias: retries and the on-failure destination ----------------------


def _put_event_invoke_config(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    config = step.resource
    assert isinstance(config, EventInvokeConfig)
    lam = ex.aws.get("lambda")
    # Put replaces on AWS; moto appends and reads back the first one, so an old one is deleted first.
    or_none(lam.delete_function_event_invoke_config, FunctionName=config.function, Qualifier=config.alias)
    # The role's sqs:SendMessage grant may not have propagated yet (IAM is eventually consistent): Lambda
    # refuses the destination until it has; the request changed nothing, so it is repeated.
    got = retry_while(lam.put_function_event_invoke_config, codes=frozenset({"InvalidParameterValueException"}),
                      message_part="permission", sleep=ex.aws.sleep, FunctionName=config.function,
                      Qualifier=config.alias, MaximumRetryAttempts=config.max_retries,
                      MaximumEventAgeInSeconds=config.max_event_age_s,
                      DestinationConfig={"OnFailure": {"Destination": config.on_failure}})
    return {"function_arn": got.get("FunctionArn", "")}


def _delete_event_invoke_config(ex: AwsExecutor, step: Step) -> None:
    function, alias = step.name.split(":", 1)
    or_none(ex.aws.get("lambda").delete_function_event_invoke_config, FunctionName=function, Qualifier=alias)


# -- IoT policy, thing and certificate ---------------------------------------------------------------


def _create_iot_policy(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    policy = step.resource
    assert isinstance(policy, IotPolicy)
    got = ex.aws.get("iot").create_policy(policyName=policy.name, policyDocument=json.dumps(policy.document))
    return {"arn": got["policyArn"], "default_version": str(got.get("policyVersionId", "1"))}


def _update_iot_policy(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    policy = step.resource
    assert isinstance(policy, IotPolicy)
    iot = ex.aws.get("iot")
    versions = iot.list_policy_versions(policyName=policy.name).get("policyVersions", [])
    old = sorted((v for v in versions if not v.get("isDefaultVersion")), key=lambda v: int(v["versionId"]))
    if len(versions) >= 5 and old:  # IoT keeps at most 5 versions of a policy
        iot.delete_policy_version(policyName=policy.name, policyVersionId=old[0]["versionId"])
    got = iot.create_policy_version(policyName=policy.name, policyDocument=json.dumps(policy.document),
                                    setAsDefault=True)
    return {"arn": got["policyArn"], "default_version": str(got["policyVersionId"])}


def _delete_iot_policy(ex: AwsExecutor, step: Step) -> None:
    iot = ex.aws.get("iot")
    for target in iot.list_targets_for_policy(policyName=step.name).get("targets", []):
        iot.detach_policy(policyName=step.name, target=target)
    for v in iot.list_policy_versions(policyName=step.name).get("policyVersions", []):
        if not v.get("isDefaultVersion"):
            iot.delete_policy_version(policyName=step.name, policyVersionId=v["versionId"])
    or_none(iot.delete_policy, policyName=step.name)


def _thing_payload(thing: IotThing) -> dict[str, Any]:
    return {"attributes": dict(thing.thing_attributes)}


def _create_iot_thing(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    thing = step.resource
    assert isinstance(thing, IotThing)
    got = ex.aws.get("iot").create_thing(thingName=thing.name, attributePayload=_thing_payload(thing))
    return {"arn": got["thingArn"]}


def _update_iot_thing(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    thing = step.resource
    assert isinstance(thing, IotThing)
    iot = ex.aws.get("iot")
    iot.update_thing(thingName=thing.name, attributePayload={**_thing_payload(thing), "merge": False})
    return {"arn": iot.describe_thing(thingName=thing.name)["thingArn"]}


def _delete_iot_thing(ex: AwsExecutor, step: Step) -> None:
    iot = ex.aws.get("iot")
    for principal in iot.list_thing_principals(thingName=step.name).get("principals", []):
        iot.detach_thing_principal(thingName=step.name, principal=principal)
        # A certificate strata made for this thing and nothing else would be left behind: delete it too.
        if ":cert/" in principal and not iot.list_principal_things(principal=principal).get("things"):
            _delete_certificate(ex, principal)
    or_none(iot.delete_thing, thingName=step.name)


def _delete_certificate(ex: AwsExecutor, arn: str) -> None:
    iot = ex.aws.get("iot")
    cert_id = arn.rsplit("/", 1)[-1]
    for p in iot.list_attached_policies(target=arn).get("policies", []):
        iot.detach_policy(policyName=p["policyName"], target=arn)
    for thing in iot.list_principal_things(principal=arn).get("things", []):
        iot.detach_thing_principal(thingName=thing, principal=arn)
    try:
        iot.update_certificate(certificateId=cert_id, newStatus="INACTIVE")
        iot.delete_certificate(certificateId=cert_id, forceDelete=True)
    except Exception as exc:
        if not is_not_found(exc):
            raise


def _create_iot_certificate(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    cert = step.resource
    assert isinstance(cert, IotCertificate)
    iot = ex.aws.get("iot")
    endpoint = iot.describe_endpoint(endpointType="iot:Data-ATS")["endpointAddress"]
    made = iot.create_keys_and_certificate(setAsActive=True)
    arn, cert_id = made["certificateArn"], made["certificateId"]
    # The private key exists only in this response: write it first, then attach, so a crash after this
    # line leaves a usable file and a certificate that `destroy` finds through the thing.
    path = write_credentials(credentials_path(ex.state_dir, ex.stage, cert.node), endpoint=endpoint,
                             client_id=cert.client_id, fleet=cert.fleet, node=cert.node, stage=ex.stage,
                             certificate_arn=arn, certificate_pem=made["certificatePem"],
                             private_key_pem=made["keyPair"]["PrivateKey"])
    iot.attach_thing_principal(thingName=cert.thing, principal=arn)
    iot.attach_policy(policyName=cert.policy, target=arn)
    if step.record and step.record.ids.get("certificate_arn"):
        _delete_certificate(ex, str(step.record.ids["certificate_arn"]))  # a recorded one that went bad
    return {"certificate_id": cert_id, "certificate_arn": arn, "credentials_file": str(path), "endpoint": endpoint}


def _update_iot_certificate(ex: AwsExecutor, step: Step) -> dict[str, Any]:
    cert = step.resource
    assert isinstance(cert, IotCertificate) and step.live is not None
    if step.live.attributes.get("credentials_file") != "present":
        return _create_iot_certificate(ex, step)  # the key is lost: issue a new certificate, drop the old one
    iot = ex.aws.get("iot")
    arn = str(step.live.ids["certificate_arn"])
    if step.live.attributes["status"] != "ACTIVE":
        iot.update_certificate(certificateId=step.live.ids["certificate_id"], newStatus="ACTIVE")
    for thing in set(step.live.attributes["things"]) - {cert.thing}:
        iot.detach_thing_principal(thingName=thing, principal=arn)
    if cert.thing not in step.live.attributes["things"]:
        iot.attach_thing_principal(thingName=cert.thing, principal=arn)
    for policy in set(step.live.attributes["policies"]) - {cert.policy}:
        iot.detach_policy(policyName=policy, target=arn)
    if cert.policy not in step.live.attributes["policies"]:
        iot.attach_policy(policyName=cert.policy, target=arn)
    return dict(step.live.ids)


def _delete_iot_certificate(ex: AwsExecutor, step: Step) -> None:
    ids = step.live.ids if step.live else (step.record.ids if step.record else {})
    if ids.get("certificate_arn"):
        _delete_certificate(ex, str(ids["certificate_arn"]))
    if ids.get("credentials_file"):
        remove_credentials(Path(str(ids["credentials_file"])))


OPERATIONS: dict[str, _Ops] = {
    "s3_bucket": _Ops(_create_bucket, _update_bucket, _delete_bucket),
    "sqs_queue": _Ops(_create_queue, _update_queue, _delete_queue),
    "iam_role": _Ops(_create_role, _update_role, _delete_role),
    "lambda_function": _Ops(_create_function, _update_function, _delete_function),
    "lambda_alias": _Ops(_point_alias, _point_alias, _delete_alias),
    "lambda_event_invoke_config": _Ops(_put_event_invoke_config, _put_event_invoke_config,
                                       _delete_event_invoke_config),
    "iot_policy": _Ops(_create_iot_policy, _update_iot_policy, _delete_iot_policy),
    "iot_thing": _Ops(_create_iot_thing, _update_iot_thing, _delete_iot_thing),
    "iot_certificate": _Ops(_create_iot_certificate, _update_iot_certificate, _delete_iot_certificate),
}


class DryRunExecutor:
    """Prints what each step would do and changes nothing (the pipeline does not save state for it).

    Args:
        out: Where to print.
    """

    dry_run = True

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def execute(self, step: Step) -> Record | None:
        """Print `step`; return what the state would record (ids unknown, so the old ones)."""
        operations_for(step.kind)  # an unknown kind fails in a dry run too
        if step.action != "no-op":
            fields = ", ".join(c.field for c in step.changes)
            print(f"would {step.action} {step.kind} {step.name}" + (f" ({fields})" if fields else ""), file=self.out)
        if step.action == "delete" or step.resource is None:
            return None
        return Record(kind=step.kind, name=step.name, attributes=step.resource.attributes(),
                      ids=dict(step.record.ids) if step.record else {})

