"""Fuzzing strata's ONNX reader: random and mutated model bytes load, or fail with the typed error."""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device import BundleError, ModelError, NumpyExecutor
from tests.device._models import mlp_policy

MODEL = mlp_policy(seed=0, hidden=(8,))


def load_and_run(data: bytes) -> None:
    """Construct and run; only the typed errors may escape."""
    try:
        executor = NumpyExecutor(data)
    except ModelError:
        return
    with contextlib.suppress(BundleError):
        executor.run({name: np.ones((1, 4), np.float32) for name in executor.input_names})
    with contextlib.suppress(BundleError):
        executor.act(np.ones(4, np.float32))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    load_and_run(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(MODEL) - 1), st.integers(1, 255)), min_size=1, max_size=3))
def test_mutated_models(flips: list[tuple[int, int]]) -> None:
    data = bytearray(MODEL)
    for position, xor in flips:
        data[position] ^= xor
    load_and_run(bytes(data))


@settings(deadline=None)  # a loaded CI machine can stall one example past the default 200 ms
@given(st.integers(0, len(MODEL)))
def test_truncated_models(cut: int) -> None:
    load_and_run(MODEL[:cut])
