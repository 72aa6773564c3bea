"""Weight deltas and hashes (`functions._codec`): every delta form rebuilds exactly what it claims."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device import pack_arrays
from functions._codec import CodecError, apply_delta, encode_delta, weights_sha256


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal((64, 4)).astype(np.float32), "b1": np.zeros(64, np.float32),
            "w2": rng.standard_normal((2, 64)).astype(np.float32), "steps": np.array([7], dtype=np.int64)}


def _kinds(delta: bytes) -> dict[str, str]:
    from device import unpack_arrays

    return dict(unpack_arrays(delta)[0]["tensors"])


def test_hash_is_canonical_and_sensitive() -> None:
    w = _weights()
    assert weights_sha256(w) == weights_sha256(dict(reversed(list(w.items()))))
    changed = {**w, "b1": w["b1"].copy()}
    changed["b1"][3] = np.float32(1e-30)
    assert weights_sha256(changed) != weights_sha256(w)
    assert weights_sha256({"a": np.zeros(4, np.float32)}) != weights_sha256({"a": np.zeros((2, 2), np.float32)})


def test_each_lossless_form_is_picked_where_it_is_smallest_and_rebuilds_exactly() -> None:
    base = _weights()
    target = {k: v.copy() for k, v in base.items()}
    target["w1"] += np.float32(1e-4) * np.random.default_rng(1).standard_normal((64, 4)).astype(np.float32)
    target["b1"][[1, 5]] = [0.5, -0.25]
    target["w2"] = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    delta = encode_delta(target, base)
    assert _kinds(delta) == {"b1": "sparse", "steps": "same", "w1": "xor", "w2": "dense"}
    rebuilt = apply_delta(base, delta)
    assert weights_sha256(rebuilt) == weights_sha256(target)
    assert len(delta) < len(pack_arrays({}, target))


def test_lossy_delta_is_int8_and_close() -> None:
    base = _weights()
    step = 1e-3 * np.random.default_rng(3).standard_normal((64, 4)).astype(np.float32)
    target = {**base, "w1": base["w1"] + step}
    delta = encode_delta(target, base, lossy=True)
    assert _kinds(delta)["w1"] == "q8"
    rebuilt = apply_delta(base, delta)
    err = np.abs(rebuilt["w1"] - target["w1"]).max()
    assert 0 < err <= np.abs(step).max() / 127 * 0.51 + 1e-7
    assert apply_delta(base, delta)["w1"].tobytes() == rebuilt["w1"].tobytes()  # deterministic


def test_delta_against_other_weights_is_refused() -> None:
    base = _weights()
    with pytest.raises(CodecError, match=re.escape("encode_delta: tensor 'b1' is float32[64] in target but "
                                                   "float32[32] in base")):
        encode_delta(base, {**base, "b1": np.zeros(32, np.float32)})
    delta = encode_delta(base, base)
    with pytest.raises(CodecError, match=re.escape("apply_delta: delta covers")):
        apply_delta({"other": np.zeros(1, np.float32)}, delta)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(1e-8, 10.0), st.floats(0.0, 1.0))
def test_lossless_delta_round_trips(seed: int, scale: float, frac: float) -> None:
    rng = np.random.default_rng(seed)
    base = {"a": rng.standard_normal((8, 8)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
    mask = rng.random((8, 8)) < frac
    target = {"a": np.where(mask, base["a"] + np.float32(scale), base["a"]).astype(np.float32), "b": base["b"]}
    assert weights_sha256(apply_delta(base, encode_delta(target, base))) == weights_sha256(target)
