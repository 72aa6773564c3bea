"""Fixtures of the infra tests: a deployment config that needs no pip download, and a state folder."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra._models import SOURCE_PACKAGES, DeployConfig
from infra._package import deps_key

REPO = Path(__file__).resolve().parents[2]
DEFAULT_REQUIREMENTS = DeployConfig().requirements


def prebuilt_cache(cache_dir: Path, requirements: tuple[str, ...] = DEFAULT_REQUIREMENTS,
                   architecture: str = "x86_64") -> Path:
    """A dependency cache entry made by hand, so the default requirement set needs no pip run.

    The tree is empty: the tests run the deployed zip with the host interpreter, whose numpy and
    gymnasium are already importable (a Lambda-built cp312 numpy would not import under 3.11 anyway).
    """
    entry = cache_dir / deps_key(requirements, architecture=architecture)
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "strata-deps.json").write_text(json.dumps({"requirements": list(requirements), "prebuilt": True}))
    return entry


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    prebuilt_cache(path)
    return path


@pytest.fixture(scope="session")
def source_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A frozen copy of the packages a function zip holds: other engineers edit the tree while tests run."""
    root = tmp_path_factory.mktemp("sources")
    for package in SOURCE_PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


MakeConfig = Callable[..., DeployConfig]


@pytest.fixture
def make_config(cache_dir: Path, source_snapshot: Path) -> MakeConfig:
    """`DeployConfig` for tests: no pip (empty requirement set), two edge nodes, reserved concurrency."""

    def make(**overrides: Any) -> DeployConfig:
        values: dict[str, Any] = {"stage": "test", "requirements": (), "cache_dir": str(cache_dir),
                                  "source_dir": str(source_snapshot),
                                  "edge_nodes": ("node-a", "node-b"), "fleet": "lab", "reserved_concurrency": 5,
                                  "memory_mb": 512, "timeout_s": 30}
        values.update(overrides)
        return DeployConfig(**values)

    return make
