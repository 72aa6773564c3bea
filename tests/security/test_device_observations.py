"""Also seen in issue 34: a non-finite observation is one rule in Python and in the generated C, and nothing
non-standard goes on the wire.

Before: the Python device acted "confidently" on a +inf observation that the C export refuses, and escalated a NaN
as non-standard JSON (``NaN``) that every edge refuses, so it waited out its whole budget and then acted on garbage.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from device import EscalationReply, EscalationRequest, NumpyExecutor, TieredController
from device._device_run import NONFINITE_REASON, DeviceReport
from device._export_c import export_c
from tests.edge._policies import cartpole_model

# logits = (sum(obs), -sum(obs)): a +inf observation gives logits (inf, -inf), a "certain" argmax.
MODEL = cartpole_model(weights=np.array([[1.0, -1.0]] * 4, np.float32))
BROKEN = [[math.inf, 0, 0, 0], [0, -math.inf, 0, 0], [0, 0, math.nan, 0]]


def test_a_non_finite_observation_is_refused_decided_by_the_fallback_at_once_and_counted() -> None:
    asked: list[np.ndarray] = []

    def escalate(obs: np.ndarray, budget_s: float) -> EscalationReply | None:
        asked.append(obs)
        return None

    controller = TieredController(NumpyExecutor(MODEL), discrete=True, escalate=escalate, threshold=0.5,
                                  budget_ms=10_000.0)
    good = controller.decide(np.array([0.5, 0.5, 0.5, 0.5], np.float32))
    assert good.tier == "device"
    report = DeviceReport()
    for row in BROKEN:
        d = controller.decide(np.array(row, np.float32))
        report.record(d)
        assert (d.tier, d.reason, d.action, d.confidence) == ("device-fallback", NONFINITE_REASON, good.action, 0.0)
        assert d.latency_s < 1.0  # at once: the 10 s escalation budget is never waited out
    assert asked == [] and controller.nonfinite == 3
    assert report.summary()["nonfinite_observations"] == 3


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_python_and_the_generated_c_refuse_the_same_observations(tmp_path: Path) -> None:
    export_c(MODEL, tmp_path / "c", discrete=True)
    exe = tmp_path / "policy"
    subprocess.run(["gcc", "-std=c99", "-O2", "-o", str(exe), str(tmp_path / "c" / "strata_policy.c"),
                    str(tmp_path / "c" / "strata_policy_main.c"), "-lm"], check=True)
    text = "".join(" ".join(repr(float(v)) for v in row) + "\n" for row in BROKEN)
    out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["-1 refused"] * len(BROKEN)
    controller = TieredController(NumpyExecutor(MODEL), discrete=True, escalate=lambda o, b: None)
    assert [controller.decide(np.array(row, np.float32)).reason for row in BROKEN] == [NONFINITE_REASON] * 3


def test_nothing_non_standard_goes_on_the_wire() -> None:
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError):
            EscalationRequest(id="r1", obs=(0.0, bad), budget_ms=5.0).encode()
        with pytest.raises(ValueError):
            EscalationReply(id="r1", action=(bad,), policy_version=1).encode()
    assert b"NaN" not in EscalationRequest(id="r1", obs=(0.0, 1.0), budget_ms=5.0).encode()
