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
