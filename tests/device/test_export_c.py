"""C export of micro policies: compiled with gcc and compared with onnxruntime through the harness."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from device import UnsupportedOperatorError, quantize_model
from device._export_c import export_c, generate_c
from tests.device._models import mlp_policy

GCC = shutil.which("gcc")
pytestmark = pytest.mark.skipif(GCC is None, reason="gcc is not installed")


def build(model: bytes, out: Path) -> Path:
    export_c(model, out)
    exe = out / "harness"
    subprocess.run([GCC, "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic", "-o", str(exe),
                    str(out / "strata_policy.c"), str(out / "strata_policy_main.c"), "-lm"], check=True,
                   capture_output=True, text=True)
    return exe


def run_harness(exe: Path, obs: np.ndarray) -> np.ndarray:
    text = "\n".join(" ".join(format(float(v), ".9g") for v in row) for row in obs)
    out = subprocess.run([str(exe)], input=text + "\n", capture_output=True, text=True, check=True).stdout
    return np.array([[float(x) for x in line.split()] for line in out.strip().splitlines()])


def reference(model: bytes, obs: np.ndarray) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"obs": obs}), strict=True))


OBS = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32) * 2


@pytest.mark.parametrize(("activation", "hidden"), [("tanh", (16,)), ("relu", (32, 16)), ("tanh", (64, 64))])
def test_discrete_policy_matches_onnxruntime(tmp_path: Path, activation: str, hidden: tuple[int, ...]) -> None:
    model = mlp_policy(hidden=hidden, activation=activation, n_actions=3)
    got = run_harness(build(model, tmp_path), OBS)
    ref = reference(model, OBS)
    np.testing.assert_array_equal(got[:, 0].astype(np.int64), ref["action"])
    np.testing.assert_allclose(got[:, 1:], ref["logits"], atol=1e-4, rtol=0)


def test_box_policy_matches_onnxruntime(tmp_path: Path) -> None:
    model = mlp_policy(n_actions=None, act_dim=2, hidden=(16,))
    got = run_harness(build(model, tmp_path), OBS)
    np.testing.assert_allclose(got[:, 1:], reference(model, OBS)["action"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("weights", ["fp16", "int8"])
def test_quantized_weights_are_folded_into_the_source(tmp_path: Path, weights: str) -> None:
    model = quantize_model(mlp_policy(hidden=(16,)), weights)  # type: ignore[arg-type]
    got = run_harness(build(model, tmp_path), OBS)
    np.testing.assert_allclose(got[:, 1:], reference(model, OBS)["logits"], atol=1e-4, rtol=0)


def test_generated_source_has_no_malloc_and_only_libm() -> None:
    policy = generate_c(mlp_policy(hidden=(16,)))
    includes = set(re.findall(r"#include [<\"]([^>\"]+)[>\"]", policy.source))
    assert includes == {"math.h", "stdint.h", "strata_policy.h"}
    assert "malloc" not in policy.source and "static const float" in policy.source
    assert policy.obs_dim == 4 and policy.out_dim == 2 and policy.discrete


def test_unsupported_operator_is_refused_by_name() -> None:
    model = mlp_policy(hidden=(16,), activation="elu")
    with pytest.raises(UnsupportedOperatorError, match=re.escape("strata device export-c: operator 'Elu'")):
        generate_c(model)


def test_strata_device_export_c_refuses_an_unsupported_graph(tmp_path: Path) -> None:
    from device import build_bundle, generate_keypair, load_signing_key
    from tests._cli import run_strata

    key, _ = generate_keypair(tmp_path / "keys")
    bundle = build_bundle(mlp_policy(hidden=(16,), activation="elu"), policy="p", version=1, parent_version=None,
                          observation_space={"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4,
                                             "high": ["inf"] * 4},
                          action_space={"type": "Discrete", "n": 2}, signing_key=load_signing_key(key),
                          output_names=("action", "logits"))
    path = tmp_path / "p.bundle"
    path.write_bytes(bundle.to_bytes())
    proc = run_strata("device", "export-c", "--bundle", str(path), "--out", str(tmp_path / "c"), timeout=60)
    assert proc.returncode == 2
    assert "strata device export-c: operator 'Elu'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "c" / "strata_policy.c").exists()
