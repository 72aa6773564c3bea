"""The fuzz harness over files strata wrote and reads back: checkpoints, metrics, the switch log, the control file,
the edge cache, kits, anti-rollback and infra state.

Each case damages one real file (cut short, bytes flipped, replaced, or a JSON value swapped for another) in a copy
of a real run dir, cache or kit, then runs the command that reads it. A damaged file is one line naming it and what
to do, never a traceback. Commands run to their end where that is cheap: a resume whose budget is already spent
(it loads, trims the logs and writes the final checkpoint), `runs`, `status`, `edge run --steps 3` on the cache,
`edge install --dry-run`, `bundle verify --state`; `export` runs its check (checkpoint loaded, policy rebuilt).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import _harness, _values

QUICK = _harness.quick(10)
LONG = _harness.long(200)

RESUME = ["train", "--env", "CartPole-v1", "--run-dir", "run", "--total-steps", "256", "--resume", "--env-mode",
          "sync", "--preset", "none", "--confirm-episodes", "0", "--no-control"]
"""A resume whose budget is spent: it reads everything a resume reads, then stops at once."""

# (file in the sandbox, the fixture it is a copy of, commands that read it, whether the command runs to its end)
TARGETS: dict[str, tuple[str, str, list[tuple[list[str], bool]]]] = {
    "checkpoint": ("run/checkpoints/000000002.pt", "run-dir", [
        (RESUME, True), (["export", "--run", "run", "--out", "out.bundle"], False),
        (["export", "--run", "run", "--out", "out.bundle", "--tier", "device"], False),
        (["runs", "--root", "."], True)]),
    "metrics": ("run/metrics.jsonl", "run-dir", [(RESUME, True), (["runs", "--root", "."], True)]),
    "switches": ("run/switches.jsonl", "run-dir", [(RESUME, True), (["runs", "--root", "."], True)]),
    "control": ("run/control.json", "run-dir", [(["status", "run"], True), (["runs", "--root", "."], True),
                                                (["switch", "run", "--to", "sync", "--timeout", "1"], True)]),
    "pointer": ("cache/pointer.json", "edge-cache", []),
    "floor": ("cache/verifier.json", "edge-cache", []),
    "slot": ("cache/slots/a.bundle", "edge-cache", []),
    "rejected": ("cache/rejected.json", "edge-cache", []),
    "kit": ("kit/edge.toml", "kit", [(["edge", "install", "--kit", "kit", "--prefix", "stage", "--dry-run"], True)]),
    "state": ("state.json", "state", []),
    "infra state": (".strata/infra/dev.json", "", [(["infra", "plan", "--stage", "dev", "--region", "us-east-1"],
                                                    False)]),
}


def _edge_commands(places: _values.Places) -> list[tuple[list[str], bool]]:
    pub = str(places.fixture("public-key"))
    base = ["--fleet", "fleet", "--node-id", "node-1", "--cache-dir", "cache", "--trust", pub]
    return [(["edge", "config", "check", *base], True), (["edge", "run", *base, "--steps", "3"], True)]


def _state_commands(places: _values.Places) -> list[tuple[list[str], bool]]:
    return [(["bundle", "verify", str(places.fixture("bundle")), "--trust", str(places.fixture("public-key")),
              "--state", "state.json", "--accept"], True)]


JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                              st.text(max_size=20)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)


@st.composite
def damaged(draw: st.DrawFn, good: bytes) -> bytes:
    """`good` damaged: cut short, bytes flipped, replaced by noise, or (JSON) one value swapped for another."""
    how = draw(st.sampled_from(["cut", "flip", "noise", "empty", "json"]))
    if how == "cut" and good:
        return good[: draw(st.integers(min_value=0, max_value=len(good) - 1))]
    if how == "flip" and good:
        data = bytearray(good)
        for _ in range(draw(st.integers(min_value=1, max_value=8))):
            i = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[i] ^= draw(st.integers(min_value=1, max_value=255))
        return bytes(data)
    if how == "noise":
        return draw(st.binary(max_size=300))
    if how == "json":
        lines = good.decode(errors="replace").splitlines() or ["{}"]
        i = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        try:
            record: Any = json.loads(lines[i])
        except ValueError:
            record = {}
        if isinstance(record, dict) and record and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(record)))
            record[key] = draw(JSON)
        else:
            record = draw(JSON)
        lines[i] = json.dumps(record)
        return ("\n".join(lines) + "\n").encode()
    return b""


@st.composite
def torch_damaged(draw: st.DrawFn, good: bytes) -> bytes:
    """A checkpoint that loads as a dict but holds a wrong value or misses a key (what bytes damage rarely makes)."""
    import io

    import torch

    state = torch.load(io.BytesIO(good), map_location="cpu", weights_only=True)
    key = draw(st.sampled_from(sorted(state)))
    if draw(st.booleans()):
        del state[key]
    else:
        state[key] = draw(st.one_of(JSON, st.just(torch.zeros(3)), st.just({"x": torch.ones(2, 2)})))
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _fuzz(target: str, places: _values.Places, data: st.DataObject) -> None:
    rel, content, commands = TARGETS[target]
    if target in ("pointer", "floor", "slot", "rejected"):
        commands = _edge_commands(places)
    if target == "state":
        commands = _state_commands(places)
    argv, full = data.draw(st.sampled_from(commands), label="command")
    name = next(c.name for c in _harness.commands() if argv[: len(c.name.split())] == c.name.split())
    command = next(c for c in _harness.commands() if c.name == name)
    source = places.fixture(content) if content else None
    copies = {"run-dir": "run", "edge-cache": "cache", "kit": "kit"}
    good = b""
    if content in copies and source is not None:
        original = source / Path(rel).relative_to(copies[content]) if content != "state" else source
        good = original.read_bytes() if original.exists() else b""
    elif content == "state" and source is not None:
        good = source.read_bytes()
    elif target == "infra state":
        good = json.dumps({"schema_version": 1, "stage": "dev", "region": "us-east-1", "account": "123456789012",
                           "config": {"stage": "dev", "memory_mb": 1024}, "resources": {}}).encode()
    if target == "checkpoint":
        bad = data.draw(st.one_of(damaged(good), torch_damaged(good)), label="file")
    else:
        bad = data.draw(damaged(good or b'{"format": 1}'), label="file")
    env = _harness.AWS_ENV if name.startswith("infra") else {}

    def prepare() -> None:
        if content in copies and source is not None:
            shutil.copytree(source, places.root / copies[content], symlinks=True)
        (places.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (places.root / rel).write_bytes(bad)

    outcome = _harness.run_case(argv, places, check_only=not full, env=env, setup=prepare)
    allowed = {"run", "cache", "stage", "state.json"}  # what a resume, an agent and an accept may write
    outcome.created = [p for p in outcome.created if p.split("/")[0] not in allowed]
    _harness.check_outcome(command, argv, outcome, places, check_only=not full)


@pytest.mark.parametrize("target", sorted(TARGETS))
@QUICK
@given(data=st.data())
def test_damaged_files_strata_wrote_are_one_line_naming_the_file(target: str, places: _values.Places,
                                                                 data: st.DataObject) -> None:
    _fuzz(target, places, data)


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
@LONG
@given(data=st.data())
def test_damaged_files_strata_wrote_are_one_line_naming_the_file_long(target: str, places: _values.Places,
                                                                      data: st.DataObject) -> None:
    _fuzz(target, places, data)


def test_a_metrics_line_with_a_null_policy_version_does_not_stop_a_resume(places: _values.Places) -> None:
    """The issue's example: ``"policy_version": null`` in metrics.jsonl was a TypeError on --resume."""
    run = places.fixture("run-dir")
    assert run is not None
    lines = (run / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[0]) | {"policy_version": None}

    def prepare() -> None:
        shutil.copytree(run, places.root / "run")
        (places.root / "run" / "metrics.jsonl").write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")

    outcome = _harness.run_case(RESUME, places, check_only=False, setup=prepare)
    assert outcome.code == 0, outcome.stderr
    assert "Traceback" not in outcome.stderr
