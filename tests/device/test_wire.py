"""The raw-buffer wire format and the rollout-batch contract round-trip and refuse bad input."""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from device import RolloutBatch, WireError, pack_arrays, unpack_arrays


def make_batch(t: int = 3, n: int = 2) -> RolloutBatch:
    rng = np.random.default_rng(0)
    return RolloutBatch(
        source="colocated",
        obs=rng.normal(size=(t, n, 4)).astype(np.float32),
        actions=rng.integers(0, 2, size=(t, n)),
        rewards=np.ones((t, n), np.float32),
        terminations=np.zeros((t, n), bool),
        truncations=np.zeros((t, n), bool),
        final_obs=np.zeros((t, n, 4), np.float32),
        next_obs=np.zeros((n, 4), np.float32),
        policy_version=np.full((t, n), 7, np.int64),
        worker=np.arange(n, dtype=np.int64),
        seq=np.arange(t * n, dtype=np.int64).reshape(t, n),
        logprobs=np.zeros((t, n), np.float32),
    )


def test_arrays_round_trip_with_meta() -> None:
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([True, False])}
    meta, out = unpack_arrays(pack_arrays({"x": 1}, arrays))
    assert meta == {"x": 1}
    for name, value in arrays.items():
        np.testing.assert_array_equal(out[name], value)
        assert out[name].dtype == value.dtype


def test_object_arrays_are_refused() -> None:
    with pytest.raises(WireError, match=re.escape("array 'o' has dtype object")):
        pack_arrays({}, {"o": np.array([object()])})


def test_rollout_batch_round_trips_and_counts_ids() -> None:
    batch = make_batch()
    back = RolloutBatch.from_bytes(batch.to_bytes())
    np.testing.assert_array_equal(back.obs, batch.obs)
    assert back.values is None
    assert len(set(back.transition_ids())) == batch.size == 6


def test_rollout_batch_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match=re.escape("terminations must have shape (3, 2)")):
        RolloutBatch(**{**make_batch().__dict__, "terminations": np.zeros((3, 3), bool)})


def test_concat_envs_joins_streams() -> None:
    joined = RolloutBatch.concat_envs([make_batch(n=2), make_batch(n=3)])
    assert joined.num_envs == 5 and joined.next_obs.shape == (5, 4)


@given(st.binary(max_size=256))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    with contextlib.suppress(WireError):
        RolloutBatch.from_bytes(data)


@given(st.integers(0, 400), st.integers(0, 255))
def test_mutated_batches_fail_cleanly_or_decode(position: int, value: int) -> None:
    data = bytearray(make_batch().to_bytes())
    data[position % len(data)] = value
    with contextlib.suppress(WireError):
        RolloutBatch.from_bytes(bytes(data))
