"""The deploy pipeline of one stage, in Chalice's stages: models -> plan -> executor -> state file.

    DeployConfig ──check_config──> build_artifacts (apply only: pip for Lambda's platform, cached;
         │                                          reproducible zip; size guards; plan hashes read-only)
         └──> desired_resources (pure frozen models: bucket, role, functions, aliases, IoT per node)
                 └──> plan_apply(desired, recorded state, live AWS)   read-only; frozen `Step` records with
                         │                                            field diffs, drift marked
                         └──> executor.execute(step) for each step    `AwsExecutor` is the only code that
                                 │                                    changes AWS; `DryRunExecutor` prints
                                 └──> StateStore.save after every step (JSON, schema version, atomic)

`apply` re-plans from live state every time, so a second apply finds nothing to do and a failed one
finishes on the next run. `destroy` plans deletes for everything recorded plus everything found by exact
name or stage tag, never by a name prefix (empty buckets first, versions included), and `rollback` moves
each stage alias back to the version it pointed at before the last apply. Resource kinds live in registries
(`infra._live.READERS`, `infra._executor.OPERATIONS`) that raise on a kind they do not know.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from device._names import inside
from infra._errors import StateError
from infra._executor import AwsExecutor, Executor
from infra._live import function_version_attributes, reader_for
from infra._models import (
    FUNCTIONS,
    PENDING_CODE,
    Alias,
    Artifact,
    DeployConfig,
    Names,
    check_config,
    check_stage,
    desired_resources,
)
from infra._package import build_dependencies, build_package, cached_dependencies, package_digest
from infra._plan import FieldChange, Plan, Step, plan_apply, plan_destroy
from infra._state import Record, State, StateStore
from infra.aws import Clients, or_none

AfterStep = Callable[[Step], None]


def config_to_dict(config: DeployConfig) -> dict[str, Any]:
    """`config` as JSON-ready data (recorded in the state file)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def config_from_dict(data: dict[str, Any], **overrides: Any) -> DeployConfig:
    """A `DeployConfig` from recorded data plus `overrides` (unknown recorded keys are ignored)."""
    known = {f.name for f in dataclasses.fields(DeployConfig)}
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
    values.update(overrides)
    return DeployConfig(**values)


def build_dir(state_dir: Path, stage: str) -> Path:
    """Where a stage's built zips go (inside `state_dir`, whatever `stage` holds)."""
    return inside(state_dir, check_stage(stage), "build", what="build folder")


def build_artifacts(config: DeployConfig, *, state_dir: Path) -> dict[str, Artifact]:
    """Build (or reuse) the zip of every function of the functions tier."""
    deps = build_dependencies(config.requirements, cache_dir=config.cache_path(), architecture=config.architecture)
    artifact = build_package(deps, build_dir(state_dir, config.stage) / f"functions-{config.architecture}.zip",
                             what="+".join(f.name for f in FUNCTIONS),
                             source_dir=Path(config.source_dir).expanduser() if config.source_dir else None)
    return {spec.name: artifact for spec in FUNCTIONS}  # every handler lives in the same package


def planned_artifacts(config: DeployConfig, *, state_dir: Path) -> dict[str, Artifact]:
    """What `build_artifacts` would make, read-only: no pip, no zip written.

    With the dependency tree cached, the code hash is exact (the last zip, or one made in memory); without
    it, apply has yet to build it and the code shows as `PENDING_CODE`.
    """
    deps = cached_dependencies(config.requirements, cache_dir=config.cache_path(), architecture=config.architecture)
    if deps is None and not config.requirements:
        deps = config.cache_path() / "(no requirements)"  # an empty tree: nothing to build, nothing to read
    out = build_dir(state_dir, config.stage) / f"functions-{config.architecture}.zip"
    if deps is None:
        artifact = Artifact(path=out, sha256_b64=PENDING_CODE, sha256_hex="", zipped_bytes=0, unzipped_bytes=0)
    else:
        artifact = package_digest(deps, out, source_dir=Path(config.source_dir).expanduser()
                                  if config.source_dir else None)
    return {spec.name: artifact for spec in FUNCTIONS}


def _clients(config: DeployConfig, aws: Clients | None) -> Clients:
    return aws if aws is not None else Clients(region=config.region)


def check_region(store: StateStore, state: State, aws: Clients) -> None:
    """Refuse to act on a stage in another region than the one its state file says it is deployed in.

    Raises:
        StateError: the state records another region (the run would build a second copy of the stage there,
            or miss every resource of it).
    """
    if state.region and state.region != aws.region:
        raise StateError(f"stage {state.stage!r} is deployed in {state.region} ({store.path}), but this run "
                         f"resolves region {aws.region} ({aws.region_reason}); pass --region {state.region}, "
                         "or destroy the stage there before deploying it elsewhere")


def plan(config: DeployConfig, *, state_dir: Path, aws: Clients | None = None,
         artifacts: dict[str, Artifact] | None = None) -> Plan:
    """The plan `apply` would carry out now. Read-only: nothing is built, written or changed in AWS.

    Args:
        config: The desired deployment.
        state_dir: Folder of the state files.
        aws: Clients to use.
        artifacts: Built packages (apply passes them); default: `planned_artifacts`, which builds nothing.
    """
    check_config(config)
    aws = _clients(config, aws)
    store = StateStore(state_dir, config.stage)
    state = store.load()
    check_region(store, state, aws)
    account = aws.account_id()  # fails fast on missing credentials
    if artifacts is None:
        artifacts = planned_artifacts(config, state_dir=state_dir)
    tls = aws.s3_over_tls()
    desired = desired_resources(config, account=account, region=aws.region, artifacts=artifacts, tls_endpoint=tls)
    planned = plan_apply(desired, state, aws)
    if tls:
        return planned
    note = "no TLS-only bucket policy: S3 is reached over plain HTTP here, which the policy would refuse"
    return dataclasses.replace(planned, steps=tuple(
        dataclasses.replace(s, note="; ".join(n for n in (s.note, note) if n)) if s.kind == "s3_bucket" else s
        for s in planned.steps))


def execute(plan_: Plan, executor: Executor, store: StateStore, state: State, *,
            after_step: AfterStep | None = None) -> int:
    """Carry out `plan_` step by step, saving the state after each; return how many steps changed AWS."""
    changed = 0
    for step in plan_.steps:
        record = executor.execute(step)
        if step.action != "no-op":
            changed += 1
        if executor.dry_run:
            continue
        if record is None:
            state.drop(step.kind, step.name)
        else:
            state.put(record)
        store.save(state)
        if after_step is not None:
            after_step(step)
    return changed


def apply(config: DeployConfig, *, state_dir: Path, aws: Clients | None = None, executor: Executor | None = None,
          after_step: AfterStep | None = None, before: Callable[[Plan], None] | None = None) -> Plan:
    """Plan and carry out the deployment of `config`; return the plan that was executed.

    Args:
        config: The desired deployment.
        state_dir: Folder of the state files (``{stage}.json``) and node credentials.
        aws: Clients to use (default: built from ``config.region`` and the standard chain).
        executor: Default `AwsExecutor`; pass a `DryRunExecutor` to print instead.
        after_step: Called after each step is recorded (progress output).
        before: Called with the plan before any step runs (to print it).
    """
    aws = _clients(config, aws)
    store = StateStore(state_dir, config.stage)
    executor = executor or AwsExecutor(aws, state_dir=state_dir, stage=config.stage)
    check_config(config)
    check_region(store, store.load(), aws)  # before a pip build, like the credentials below
    aws.account_id()  # fails fast on missing credentials, before a pip build
    # Building is apply's (plan and a dry run only read): the packages exist before any step needs them.
    artifacts = None if executor.dry_run else build_artifacts(config, state_dir=state_dir)
    the_plan = plan(config, state_dir=state_dir, aws=aws, artifacts=artifacts)
    if before is not None:
        before(the_plan)
    state = store.load()
    if not executor.dry_run:
        state.region, state.account, state.config = aws.region, aws.account_id(), config_to_dict(config)
        store.save(state)
    execute(the_plan, executor, store, state, after_step=after_step)
    return the_plan


def recorded_config(state_dir: Path, stage: str, **overrides: Any) -> DeployConfig:
    """The config last applied to `stage` (defaults when it never was), with `overrides` on top."""
    state = StateStore(state_dir, stage).load()
    return config_from_dict(state.config, **{"stage": stage, **overrides})


def _discover(config: DeployConfig, aws: Clients, state: State) -> list[Record]:
    """Resources of the stage found by exact name or tag, so destroy also removes what the state file lost.

    Never by a name prefix: ``strata-dev-`` also starts every name of stage ``dev-x``. What counts is the
    exact names `desired_resources` gives, the ``strata_stage`` attribute of IoT things (and the policy named
    after each such thing), every certificate attached to such a thing, and the ``strata:stage`` tag of Lambda
    functions. A certificate has no name: it is listed under its thing's name, as the state file records it
    (``{thing}#{certificate id}`` for any further one), so a dry run shows every certificate the real destroy
    deletes, with or without the state file.
    """
    found = [(r.kind, r.name) for r in desired_resources(config, account=aws.account_id(), region=aws.region,
                                                           artifacts=None) if r.kind != "iot_certificate"]
    tags = Names(stage=config.stage, account=aws.account_id(), region=aws.region).tags()
    iot = aws.get("iot")
    for page in iot.get_paginator("list_things").paginate(attributeName="strata_stage", attributeValue=config.stage):
        for thing in page.get("things", []):
            if thing.get("attributes", {}).get("strata_stage") == config.stage:
                found += [("iot_thing", thing["thingName"]), ("iot_policy", thing["thingName"])]
    lam = aws.get("lambda")
    for page in lam.get_paginator("list_functions").paginate():
        for fn in page.get("Functions", []):
            got = or_none(lam.list_tags, Resource=fn["FunctionArn"]) or {}
            if all(got.get("Tags", {}).get(k) == v for k, v in tags.items()):
                found.append(("lambda_function", fn["FunctionName"]))
    records = [Record(kind=kind, name=name, attributes={}, ids={}) for kind, name in dict.fromkeys(found)]
    things = sorted({name for kind, name in found if kind == "iot_thing"}
                    | {r.name for r in state.resources.values() if r.kind == "iot_thing"})
    certificates = [r for r in state.resources.values() if r.kind == "iot_certificate"]
    recorded = {str(r.ids.get("certificate_arn")) for r in certificates}
    taken = {r.name for r in certificates}
    for thing in things:
        principals = or_none(iot.list_thing_principals, thingName=thing) or {}
        for arn in sorted(p for p in principals.get("principals", []) if ":cert/" in p and p not in recorded):
            cert_id = arn.rsplit("/", 1)[-1]
            name = thing if thing not in taken else f"{thing}#{cert_id}"
            taken.add(name)
            records.append(Record(kind="iot_certificate", name=name, attributes={},
                                  ids={"certificate_id": cert_id, "certificate_arn": arn}))
    return records


def destroy_plan(stage: str, *, state_dir: Path, aws: Clients | None = None,
                 config: DeployConfig | None = None) -> Plan:
    """The plan that deletes everything of `stage` (recorded or found by name): what `destroy` deletes."""
    config = config or recorded_config(state_dir, stage)
    aws = _clients(config, aws)
    store = StateStore(state_dir, stage)
    state = store.load()
    check_region(store, state, aws)
    return plan_destroy(state, aws, _discover(config, aws, state))


def destroy(stage: str, *, state_dir: Path, aws: Clients | None = None, config: DeployConfig | None = None,
            executor: Executor | None = None, after_step: AfterStep | None = None) -> Plan:
    """Delete every resource of `stage`; on success remove its state file and build folder too."""
    config = config or recorded_config(state_dir, stage)
    aws = _clients(config, aws)
    store = StateStore(state_dir, stage)
    the_plan = destroy_plan(stage, state_dir=state_dir, aws=aws, config=config)
    executor = executor or AwsExecutor(aws, state_dir=state_dir, stage=stage)
    state = store.load()
    execute(the_plan, executor, store, state, after_step=after_step)
    if not executor.dry_run:
        store.delete()
        shutil.rmtree(inside(state_dir, stage, what="stage folder"), ignore_errors=True)
    return the_plan


def rollback_plan(stage: str, *, state_dir: Path, aws: Clients | None = None) -> Plan:
    """The plan that moves each stage alias back to the version before the last apply.

    Raises:
        StateError: The stage was never applied, or no alias has an earlier version to go back to.
    """
    store = StateStore(state_dir, stage)
    state = store.load()
    config = config_from_dict(state.config, stage=stage)
    aws = _clients(config, aws)
    check_region(store, state, aws)
    aliases = [r for r in state.resources.values() if r.kind == "lambda_alias"]
    if not aliases:
        raise StateError(f"rollback: stage {stage!r} has no recorded aliases in {store.path}; run "
                         "`strata infra apply` first (and check --stage / --state-dir)")
    steps: list[Step] = []
    lam = aws.get("lambda")
    for record in sorted(aliases, key=lambda r: r.name):
        live = reader_for("lambda_alias")(aws, record.name, record)
        history = [str(v) for v in (live.ids["history"] if live else record.ids.get("history", []))]
        if live is None or len(history) < 2:
            continue
        previous = history[-2]
        function, alias = record.name.split(":", 1)
        config_prev = or_none(lam.get_function_configuration, FunctionName=function, Qualifier=previous)
        if config_prev is None:
            raise StateError(f"rollback: version {previous} of {function} no longer exists; nothing to roll back to")
        target = function_version_attributes(config_prev)
        model = Alias(name=record.name, function=function, alias=alias, target=target, pin_version=previous)
        steps.append(Step(action="update", kind="lambda_alias", name=record.name, resource=model, record=record,
                          live=live, note=f"rollback: version {history[-1]} -> {previous}",
                          changes=(FieldChange(field="version", live=history[-1], desired=previous, drift=False,
                                               recorded=record.ids.get("version")),)))
    if not steps:
        raise StateError(f"rollback: no alias of stage {stage!r} has an earlier version to go back to; an alias "
                         "gets one when an apply publishes a changed function")
    return Plan(stage=stage, region=aws.region, account=aws.account_id(), steps=tuple(steps), purpose="rollback")


def rollback(stage: str, *, state_dir: Path, aws: Clients | None = None, executor: Executor | None = None,
             after_step: AfterStep | None = None) -> Plan:
    """Move each stage alias back one version (the next `apply` moves it forward again)."""
    store = StateStore(state_dir, stage)
    state = store.load()
    config = config_from_dict(state.config, stage=stage)
    aws = _clients(config, aws)
    the_plan = rollback_plan(stage, state_dir=state_dir, aws=aws)
    executor = executor or AwsExecutor(aws, state_dir=state_dir, stage=stage)
    execute(the_plan, executor, store, state, after_step=after_step)
    return the_plan
