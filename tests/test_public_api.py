"""Each tier's `__init__` is its public surface: an explicit, sorted `__all__` that matches its names."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("tier", ["device", "edge", "functions", "infra", "cloud"])
def test_all_is_sorted_and_complete(tier: str) -> None:
    module = importlib.import_module(tier)
    exported = list(module.__all__)
    assert exported == sorted(exported)
    public = {name for name in vars(module) if not name.startswith("_")}
    public -= {name for name, value in vars(module).items() if type(value).__name__ == "module"}
    public -= {"annotations"}
    assert set(exported) == public
