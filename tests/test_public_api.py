"""Each tier's `__init__` is its public surface: an explicit, sorted `__all__` that matches its names."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

# Names a package module may hold that are plumbing, not API (typing helpers, the lazy-import table).
PLUMBING = {"annotations", "TYPE_CHECKING", "Any"}


@pytest.mark.parametrize("tier", ["device", "edge", "functions", "infra", "cloud", "cloud.rollout", "cloud.replay",
                                  "cloud.params", "cloud.learners", "cloud.switching", "cloud.runs", "cloud.hybrid"])
def test_all_is_sorted_and_complete(tier: str) -> None:
    module = importlib.import_module(tier)
    exported = list(module.__all__)
    assert exported == sorted(exported)
    for name in exported:  # every exported name resolves (a lazy package imports it on first use)
        getattr(module, name)
    public = {name for name in vars(module) if not name.startswith("_")}
    public -= {name for name, value in vars(module).items() if type(value).__name__ == "module"}
    public -= PLUMBING
    assert set(exported) == public


def test_importing_the_rollout_handler_does_not_load_grpc_or_the_runtime() -> None:
    # A Lambda cold start imports functions._handlers: the package must not drag in the env service or runtime.
    code = ("import sys, functions._handlers; "
            "print(sorted(m for m in sys.modules if m.startswith(('grpc', 'google.protobuf', 'functions._runtime', "
            "'functions._envservice'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
