"""What the fuzz tests share: real fixtures (made once per session) and a sandbox per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz import _fixtures, _values


@pytest.fixture(scope="session")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Keys, bundles, configs, a kit, an edge cache and a trained run dir (made once, never written to again)."""
    return _fixtures.build(tmp_path_factory.mktemp("fixtures"))


@pytest.fixture
def places(fixtures: dict[str, Path], tmp_path: Path) -> Iterator[_values.Places]:
    """The sandbox of a test's cases (emptied before each case) and the fixtures."""
    yield _values.Places(root=tmp_path / "case", fixtures=fixtures, fixtures_root=fixtures["bundle"].parent)
