"""The read-only plan: desired models vs the recorded state and the live resources, as frozen step records.

Each desired resource is read live (so a change made outside strata shows) and compared field by field;
a field whose live value differs from what strata recorded is marked as drift. Recorded resources that
are no longer desired become deletes. Planning never changes AWS; only `infra._executor` does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from infra._live import Live, reader_for
from infra._models import KIND_ORDER, Resource
from infra._state import Record, State
from infra.aws import Clients

Action: TypeAlias = Literal["create", "update", "delete", "no-op"]
_SYMBOL: dict[str, str] = {"create": "+", "update": "~", "delete": "-", "no-op": "="}


class _Absent:
    """Marks a field or key that one side does not have."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT: Any = _Absent()
"""The value of a `FieldChange` side that lacks the field (e.g. a tag deleted outside strata)."""


@dataclass(frozen=True, kw_only=True)
class FieldChange:
    """One field that differs between AWS and the desired deployment."""

    field: str
    """Attribute name; ``parent.key`` for one entry of a mapping attribute (tags, environment, target)."""
    live: Any = dataclasses.field(hash=False)
    desired: Any = dataclasses.field(hash=False)
    drift: bool
    """True when the live value is not what strata last applied: it was changed outside strata."""
    recorded: Any = dataclasses.field(default=None, hash=False)


@dataclass(frozen=True, kw_only=True)
class Step:
    """One planned action on one resource."""

    action: Action
    kind: str
    name: str
    changes: tuple[FieldChange, ...] = ()
    resource: Resource | None = None
    """The desired model (None for deletes)."""
    record: Record | None = None
    """What the state file says about it, if anything."""
    live: Live | None = None
    """What AWS reported while planning (None when it does not exist)."""
    note: str = ""

    @property
    def key(self) -> str:
        """``kind/name``."""
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Every step of one command on one stage, in execution order."""

    stage: str
    region: str
    account: str
    steps: tuple[Step, ...]
    purpose: Literal["apply", "destroy", "rollback"] = "apply"

    @property
    def changes(self) -> tuple[Step, ...]:
        """The steps that change AWS (not no-ops)."""
        return tuple(s for s in self.steps if s.action != "no-op")

    def counts(self) -> dict[str, int]:
        """Steps per action."""
        return {a: sum(1 for s in self.steps if s.action == a) for a in ("create", "update", "delete", "no-op")}

    def render(self) -> str:
        """The human-readable diff `strata infra plan` prints."""
        c = self.counts()
        lines = [f"Plan ({self.purpose}) for stage {self.stage!r} in {self.region} (account {self.account}): "
                 f"{c['create']} to create, {c['update']} to update, {c['delete']} to delete, "
                 f"{c['no-op']} unchanged"]
        for step in self.steps:
            note = f"   ({step.note})" if step.note else ""
            lines.append(f"{_SYMBOL[step.action]} {step.kind} {step.name}{note}")
            for ch in step.changes:
                drift = ""
                if ch.drift:
                    drift = f"   <- drift: changed outside strata (strata applied {_show(ch.recorded)})"
                lines.append(f"    {ch.field}: {_show(ch.live)} -> {_show(ch.desired)}{drift}")
        if not self.changes:
            lines.append("No changes: AWS matches the desired deployment.")
        return "\n".join(lines)


def _show(value: Any) -> str:
    if value is ABSENT:
        return "(absent)"
    text: str = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


def diff(desired: dict[str, Any], live: dict[str, Any], recorded: dict[str, Any] | None) -> tuple[FieldChange, ...]:
    """Field-level differences; mapping attributes are compared key by key (one level)."""
    changes: list[FieldChange] = []
    for name in sorted(set(desired) | set(live)):
        want = desired.get(name, ABSENT)
        have = live.get(name, ABSENT)
        was = recorded.get(name, ABSENT) if recorded is not None else ABSENT
        if want == have:
            continue
        if isinstance(want, dict) and isinstance(have, dict) and not _is_document(want):
            was_map = was if isinstance(was, dict) else {}
            for key in sorted(set(want) | set(have)):
                w, h = want.get(key, ABSENT), have.get(key, ABSENT)
                if w != h:
                    r = was_map.get(key, ABSENT)
                    changes.append(FieldChange(field=f"{name}.{key}", live=h, desired=w, recorded=r,
                                               drift=recorded is not None and r != h))
            continue
        changes.append(FieldChange(field=name, live=have, desired=want, recorded=was,
                                   drift=recorded is not None and was != have))
    return tuple(changes)


def _is_document(value: dict[str, Any]) -> bool:
    """Policy documents are diffed whole: key-by-key output of a nested document would not read."""
    return "Statement" in value


def _order(kind: str) -> int:
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def plan_apply(desired: Sequence[Resource], state: State, aws: Clients) -> Plan:
    """Plan bringing AWS to `desired`, given what strata recorded in `state` and what is live."""
    steps: list[Step] = []
    wanted = {f"{r.kind}/{r.name}" for r in desired}
    for resource in desired:
        record = state.get(resource.kind, resource.name)
        live = reader_for(resource.kind)(aws, resource.name, record)
        if live is None:
            note = "recorded by strata but missing: deleted outside strata" if record else ""
            steps.append(Step(action="create", kind=resource.kind, name=resource.name, resource=resource,
                              record=record, note=note))
            continue
        changes = diff(resource.attributes(), live.attributes, record.attributes if record else None)
        note = "" if record else "exists but was not recorded: strata adopts it"
        steps.append(Step(action="update" if changes else "no-op", kind=resource.kind, name=resource.name,
                          changes=changes, resource=resource, record=record, live=live, note=note))
    leftovers = [r for key, r in state.resources.items() if key not in wanted]
    steps += _deletes(leftovers, aws, note="no longer in the desired deployment")
    return Plan(stage=state.stage, region=aws.region, account=aws.account_id(), steps=tuple(steps))


def plan_destroy(state: State, aws: Clients, discovered: Iterable[Record] = ()) -> Plan:
    """Plan deleting every recorded resource plus the `discovered` ones (found by name, tag or attachment)."""
    records = dict(state.resources)
    for record in discovered:
        records.setdefault(record.key, record)
    steps = _deletes(list(records.values()), aws, note="")
    return Plan(stage=state.stage, region=aws.region, account=aws.account_id(), steps=tuple(steps),
                purpose="destroy")


def _deletes(records: Sequence[Record], aws: Clients, *, note: str) -> list[Step]:
    steps: list[Step] = []
    for record in sorted(records, key=lambda r: (-_order(r.kind), r.name)):
        live = reader_for(record.kind)(aws, record.name, record)
        if live is None:
            steps.append(Step(action="no-op", kind=record.kind, name=record.name, record=record,
                              note="already gone; strata forgets it"))
        else:
            steps.append(Step(action="delete", kind=record.kind, name=record.name, record=record, live=live,
                              note=note))
    return steps
