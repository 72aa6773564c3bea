"""The recorded state of one stage: a JSON file with a schema version, written atomically after every step.

    {"schema_version": 1, "stage": "dev", "region": "us-east-1", "account": "123456789012",
     "config": {...DeployConfig fields...},
     "resources": {"lambda_function/strata-dev-rollout": {"kind": ..., "name": ..., "attributes": {...},
                                                        "ids": {...}}, ...}}

``attributes`` is what strata last applied (the plan compares it with the live value to tell drift
from a change of config); ``ids`` holds what AWS assigned (ARNs, certificate ids, alias version history).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device._names import inside
from infra._errors import StateError
from infra._models import check_stage

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Record:
    """One resource as strata last left it."""

    kind: str
    name: str
    attributes: dict[str, Any] = field(hash=False)
    ids: dict[str, Any] = field(hash=False)

    @property
    def key(self) -> str:
        """``kind/name``: the record's key in the state file."""
        return f"{self.kind}/{self.name}"


@dataclass(kw_only=True)
class State:
    """The state of one stage (mutable while a command runs; saved by `StateStore.save`)."""

    stage: str
    region: str = ""
    account: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Record] = field(default_factory=dict)

    def get(self, kind: str, name: str) -> Record | None:
        """The record of ``kind/name``, if any."""
        return self.resources.get(f"{kind}/{name}")

    def put(self, record: Record) -> None:
        """Record `record` (replacing an older one)."""
        self.resources[record.key] = record

    def drop(self, kind: str, name: str) -> None:
        """Forget ``kind/name``."""
        self.resources.pop(f"{kind}/{name}", None)


class StateStore:
    """The state file of `stage` under `state_dir` (``{state_dir}/{stage}.json``).

    Raises:
        DeployConfigError: `stage` is not a stage name (``''``, ``../x``): no path is ever built from one.
    """

    def __init__(self, state_dir: Path, stage: str) -> None:
        self.state_dir = state_dir
        self.stage = check_stage(stage)
        self.path = inside(state_dir, f"{stage}.json", what="state file")

    def load(self) -> State:
        """The recorded state, or an empty one when the stage was never applied.

        Raises:
            StateError: The file is not valid JSON, not a strata state file, or from a newer schema.
        """
        if not self.path.exists():
            return State(stage=self.stage)
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise StateError(f"StateStore.load: {self.path} is not readable JSON ({exc}); restore it from a "
                             "backup or delete it (the next plan then rediscovers resources by name)") from exc
        version = data.get("schema_version") if isinstance(data, dict) else None
        if not isinstance(version, int):
            raise StateError(f"StateStore.load: {self.path} has no integer schema_version; it is not a strata "
                             "state file")
        if version > SCHEMA_VERSION:
            raise StateError(f"StateStore.load: {self.path} has schema_version={version}, newer than this "
                             f"strata's {SCHEMA_VERSION}; upgrade strata to read it")
        if data.get("stage") != self.stage:
            raise StateError(f"StateStore.load: {self.path} records stage {data.get('stage')!r}, not "
                             f"{self.stage!r}; use the matching --stage or --state-dir")
        resources = {}
        for key, raw in data.get("resources", {}).items():
            record = Record(kind=raw["kind"], name=raw["name"], attributes=raw.get("attributes", {}),
                            ids=raw.get("ids", {}))
            resources[key] = record
        return State(stage=self.stage, region=data.get("region", ""), account=data.get("account", ""),
                     config=data.get("config", {}), resources=resources)

    def save(self, state: State) -> None:
        """Write `state` to a temp file and rename it into place (a crash leaves the old or the new file)."""
        payload = {
            "schema_version": SCHEMA_VERSION,
            "stage": state.stage,
            "region": state.region,
            "account": state.account,
            "config": state.config,
            "resources": {key: {"kind": r.kind, "name": r.name, "attributes": r.attributes, "ids": r.ids}
                          for key, r in sorted(state.resources.items())},
        }
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.state_dir, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(payload, f, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def delete(self) -> None:
        """Remove the state file (after a complete destroy)."""
        self.path.unlink(missing_ok=True)
