"""The dependency direction of ARCHITECTURE.md, checked on every import statement of every tier.

    cloud ──> infra ──> functions ──> device
      └─────> edge ───────────────────^

A tier may import itself, the tiers below it, the standard library and its own third-party
allowlist; nothing else. Imports inside functions count too: lazy imports still need the extra.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

TIERS = ("device", "functions", "infra", "edge", "cloud")
BELOW: dict[str, set[str]] = {
    "device": set(),
    "functions": {"device"},
    "infra": {"functions", "device"},
    "edge": {"device"},
    "cloud": {"infra", "functions", "edge", "device"},
}
THIRD_PARTY: dict[str, set[str]] = {
    "device": {"numpy", "cryptography", "paho"},
    "functions": {"numpy", "cryptography", "paho", "gymnasium", "grpc", "grpc_health", "google", "awslambdaric", "lz4"},
    "infra": {"numpy", "cryptography", "paho", "gymnasium", "grpc", "google", "boto3", "botocore", "certifi"},
    "edge": {"numpy", "cryptography", "paho", "onnxruntime", "gymnasium", "amqtt"},
    "cloud": {"numpy", "cryptography", "paho", "onnxruntime", "gymnasium", "grpc", "google", "boto3",
              "botocore", "torch", "onnx", "rich", "matplotlib", "amqtt", "tensorboard"},
}
STDLIB = set(sys.stdlib_module_names)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Top-level module names imported anywhere in the file (absolute imports only)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def violations(tier: str, root: Path = REPO) -> list[str]:
    """Every import in `tier` that breaks the layering, as ``file:line imports X`` lines."""
    allowed = {tier} | BELOW[tier] | THIRD_PARTY[tier] | STDLIB
    bad = []
    for path in sorted((root / tier).rglob("*.py")):
        for lineno, name in imports_of(path):
            if name not in allowed:
                bad.append(f"{path.relative_to(root)}:{lineno} imports {name!r}")
    return bad


@pytest.mark.parametrize("tier", TIERS)
def test_tier_imports_only_what_it_may(tier: str) -> None:
    assert violations(tier) == []


def test_a_planted_violation_is_caught(tmp_path: Path) -> None:
    (tmp_path / "device").mkdir()
    (tmp_path / "device" / "bad.py").write_text("import edge\nfrom torch import nn\nimport numpy\n")
    assert violations("device", tmp_path) == ["device/bad.py:1 imports 'edge'", "device/bad.py:2 imports 'torch'"]


# ---- the module import graph: no circles anywhere, and cloud's subpackages in their written order -------------

CLOUD_ORDER: tuple[tuple[str, ...], ...] = (
    ("cloud._errors",),
    ("cloud.rollout", "cloud.replay", "cloud.params"),
    ("cloud.learners",),
    ("cloud.switching",),
    ("cloud.runs",),
    ("cloud.hybrid",),
)
"""cloud's stages, earliest first: a module may import its own subpackage and earlier stages, never a later stage
or another subpackage of its own stage. docs/architecture.md states the same order (checked below)."""

CLOUD_TOP = ("cloud", "cloud._cli", "cloud._demo", "cloud.cli")
"""The last stage, one group: the tier's public surface, the demo and the CLI."""


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Every import statement between strata's own modules (lazy and TYPE_CHECKING ones too), as module edges.

    ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (its __init__).
    """
    files = {module_name(p, root): p for tier in TIERS for p in sorted((root / tier).rglob("*.py"))}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in targets:
                found = known(target)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def stage_of(module: str) -> tuple[int, str]:
    """(stage index, the group it belongs to) of a cloud module."""
    if module in CLOUD_TOP:
        return len(CLOUD_ORDER), "top"
    for i, stage in enumerate(CLOUD_ORDER):
        for group in stage:
            if module == group or module.startswith(group + "."):
                return i, group
    raise AssertionError(f"{module} is in no stage of CLOUD_ORDER; add its subpackage there and to the docs")


def order_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src in sorted(m for m in graph if m == "cloud" or m.startswith("cloud.")):
        src_stage, src_group = stage_of(src)
        for dst in sorted(d for d in graph[src] if d == "cloud" or d.startswith("cloud.")):
            dst_stage, dst_group = stage_of(dst)
            if dst_group != src_group and dst_stage >= src_stage:
                bad.append(f"{src} imports {dst} ({src_group} may import only earlier stages)")
    return bad


def test_no_module_import_circle_anywhere() -> None:
    assert cycles(import_graph()) == []


def test_cloud_subpackages_import_only_earlier_stages() -> None:
    assert order_violations(import_graph()) == []


def test_every_cloud_module_has_a_stage() -> None:
    for module in import_graph():
        if module == "cloud" or module.startswith("cloud."):
            stage_of(module)


def test_the_docs_state_the_same_order() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    written = " -> ".join(", ".join(f"`{g.removeprefix('cloud.')}`" for g in stage) for stage in CLOUD_ORDER[1:])
    assert written in text, f"docs/architecture.md should state the order: {written}"


def test_a_planted_circle_and_a_backward_edge_are_caught(tmp_path: Path) -> None:
    for tier in TIERS:
        (tmp_path / tier).mkdir()
    (tmp_path / "cloud" / "__init__.py").write_text("")
    (tmp_path / "cloud" / "rollout").mkdir()
    (tmp_path / "cloud" / "rollout" / "__init__.py").write_text("")
    (tmp_path / "cloud" / "rollout" / "_a.py").write_text("from cloud.runs import _b\n")
    (tmp_path / "cloud" / "runs").mkdir()
    (tmp_path / "cloud" / "runs" / "__init__.py").write_text("")
    (tmp_path / "cloud" / "runs" / "_b.py").write_text("if False:\n    from cloud.rollout._a import x\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["cloud.rollout._a", "cloud.runs._b"]]
    assert order_violations(graph) == [
        "cloud.rollout._a imports cloud.runs._b (cloud.rollout may import only earlier stages)"]
