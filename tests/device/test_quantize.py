"""fp16/int8 weight storage: smaller models that onnxruntime and the numpy executor still run alike."""

from __future__ import annotations

import re

import numpy as np
import pytest

from device import ModelError, NumpyExecutor, SigningKey, quantization_error, quantize_model
from tests.device._bundles import make_bundle
from tests.device._models import mlp_policy

ort = pytest.importorskip("onnxruntime")

OBS = (np.random.default_rng(0).normal(size=(500, 4)) * 2).astype(np.float32)


@pytest.fixture(scope="module")
def model() -> bytes:
    import torch

    torch.set_num_threads(1)
    return mlp_policy(seed=0)


@pytest.mark.parametrize(("weights", "max_error", "min_agreement", "max_bytes"),
                         [("fp16", 2e-3, 0.99, 12_000), ("int8", 3e-2, 0.97, 8_500)])
def test_quantized_models_are_smaller_and_close(model: bytes, weights: str, max_error: float,
                                                 min_agreement: float, max_bytes: int) -> None:
    q = quantize_model(model, weights)  # type: ignore[arg-type]
    assert len(q) < max_bytes < len(model)
    cost = quantization_error(model, q, OBS)
    assert cost["max_abs_error"] < max_error
    assert cost["argmax_agreement"] >= min_agreement
    # Still standard ONNX: onnxruntime runs the quantized model and agrees with the numpy executor.
    ref = ort.InferenceSession(q, providers=["CPUExecutionProvider"]).run(None, {"obs": OBS})
    ours = NumpyExecutor(q).run({"obs": OBS})
    np.testing.assert_allclose(ours["logits"], ref[1], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(ours["action"], ref[0])


def test_dequantization_is_folded_at_load(model: bytes) -> None:
    for weights in ("fp16", "int8"):
        executor = NumpyExecutor(quantize_model(model, weights))  # type: ignore[arg-type]
        assert executor.num_steps == NumpyExecutor(model).num_steps
        assert "Dequantize" not in executor.source


def test_box_policy_and_fp32_passthrough() -> None:
    box = mlp_policy(n_actions=None, act_dim=2, seed=1)
    assert quantize_model(box, "fp32") == box
    cost = quantization_error(box, quantize_model(box, "int8"), OBS, output="action")
    assert cost["max_abs_error"] < 3e-2


def test_quantized_bundle_is_small(model: bytes) -> None:
    key = SigningKey.generate()
    sizes = {w: len(make_bundle(key, model=quantize_model(model, w)).to_bytes())  # type: ignore[arg-type]
             for w in ("fp32", "fp16", "int8")}
    assert sizes["int8"] < sizes["fp16"] < sizes["fp32"] < 32 * 1024


def test_bad_storage_is_refused(model: bytes) -> None:
    with pytest.raises(ModelError, match=re.escape("weights must be one of ['fp32', 'fp16', 'int8'], got 'int4'")):
        quantize_model(model, "int4")  # type: ignore[arg-type]


def test_quantized_storage_is_chosen_only_when_smaller() -> None:
    """Issue 21: int8 and fp16 micro bundles were larger than fp32 (1,783 / 1,549 vs 1,561 B)."""
    from device import smallest_storage

    tiny = mlp_policy(seed=0, hidden=(16,))
    for asked in ("fp16", "int8"):
        stored, used, note = smallest_storage(tiny, asked)  # type: ignore[arg-type]
        assert len(stored) <= len(tiny)
        if used == "fp32":
            assert stored == tiny and note is not None and note.startswith(f"{asked} weights do not make")
        if used != asked:
            assert note is not None and f"{asked} weights" in note
    big = mlp_policy(seed=0, hidden=(64, 64))
    for asked in ("fp16", "int8"):
        stored, used, note = smallest_storage(big, asked)  # type: ignore[arg-type]
        assert (used, note) == (asked, None) and len(stored) < len(big)
    assert smallest_storage(tiny, "fp32") == (tiny, "fp32", None)
