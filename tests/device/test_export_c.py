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
    """The harness's rows: action and outputs; a refused (non-finite) observation's row is -1 then NaN."""
    text = "\n".join(" ".join(format(float(v), ".9g") for v in row) for row in obs)
    out = subprocess.run([str(exe)], input=text + "\n", capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.strip().splitlines()]
    width = max(len(r) for r in rows)
    return np.array([[float(x) for x in r] if r[1:] != ["refused"] else [-1.0] + [np.nan] * (width - 1)
                     for r in rows])


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

    key, pub = generate_keypair(tmp_path / "keys")
    bundle = build_bundle(mlp_policy(hidden=(16,), activation="elu"), policy="p", version=1, parent_version=None,
                          observation_space={"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4,
                                             "high": ["inf"] * 4},
                          action_space={"type": "Discrete", "n": 2}, signing_key=load_signing_key(key),
                          output_names=("action", "logits"))
    path = tmp_path / "p.bundle"
    path.write_bytes(bundle.to_bytes())
    proc = run_strata("device", "export-c", "--bundle", str(path), "--out", str(tmp_path / "c"), "--trust", str(pub),
                      timeout=60)  # export-c verifies the bundle first
    assert proc.returncode == 2
    assert "strata device export-c: operator 'Elu'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "c" / "strata_policy.c").exists()


def _with_non_finite_rows(obs: np.ndarray) -> np.ndarray:
    bad = obs[:6].copy()
    bad[0, 0], bad[1, 2], bad[2, 3], bad[3, :] = np.nan, np.inf, -np.inf, np.nan
    bad[4, 1], bad[5, 0] = np.float32(3e38), -np.float32(3e38)  # finite, but far outside the clip range
    return np.concatenate([obs, bad])


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_non_finite_observations_are_refused_and_finite_ones_match(tmp_path: Path, kind: str) -> None:
    """Issue 21: a NaN observation got a finite action from `fmaxf`/`fminf` and `x > 0 ? x : 0`. Now a NaN or
    inf observation is refused (-1, documented); every finite row, extreme ones included, matches onnxruntime."""
    model = mlp_policy(hidden=(16,), activation="relu") if kind == "discrete" else \
        mlp_policy(n_actions=None, act_dim=2, hidden=(16,))
    obs = _with_non_finite_rows(OBS)
    got = run_harness(build(model, tmp_path), obs)
    finite = np.isfinite(obs).all(axis=1)
    assert (got[~finite, 0] == -1).all() and int((~finite).sum()) == 4
    ref = reference(model, obs[finite])
    if kind == "discrete":
        np.testing.assert_array_equal(got[finite, 0].astype(np.int64), ref["action"])
        np.testing.assert_allclose(got[finite, 1:], ref["logits"], atol=1e-4, rtol=0)
    else:
        np.testing.assert_allclose(got[finite, 1:], ref["action"], atol=1e-4, rtol=0)


def test_nan_inside_the_graph_follows_onnxruntime() -> None:
    """Max/Min/Clip/Relu keep NaN as onnxruntime does; Clip without bounds clamps to the float range."""
    policy = generate_c(mlp_policy(hidden=(16,), activation="relu"))
    assert "fmaxf" not in policy.source and "fminf" not in policy.source
    assert "STRATA_POLICY_NONFINITE" in policy.header


@pytest.mark.parametrize(("text", "message"), [
    ("0.1 0.2 zebra 0.4\n", "observation 1, value 3: not a number"),
    ("0.1 0.2 0.3 0.4\n0.5 0.6\n", "observation 2, value 3: input ended"),
    ("", "observation 1, value 1: input ended"),
])
def test_the_harness_fails_loudly_on_bad_input(tmp_path: Path, text: str, message: str) -> None:
    exe = build(mlp_policy(hidden=(16,)), tmp_path)
    proc = subprocess.run([str(exe)], input=text, capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr
