"""Importing a lower tier must not drag in heavy libraries (device start-up, Lambda cold starts)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "boto3", "botocore", "gymnasium", "onnxruntime", "paho", "grpc", "onnx")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(json.loads(out)) & set(HEAVY)


@pytest.mark.parametrize("tier", ["device", "edge", "functions", "infra", "cloud", "cloud.cli", "cloud.rollout",
                                  "cloud.replay", "cloud.params", "cloud.learners", "cloud.switching", "cloud.runs"])
def test_importing_a_tier_loads_no_heavy_library(tier: str) -> None:
    assert loaded_after(f"import {tier}") == set()


def test_building_the_whole_cli_loads_no_heavy_library() -> None:
    assert loaded_after("from cloud.cli import build_parser; build_parser()") == set()
