"""Fuzzing the bundle parser and verifier: junk and mutated bundles never crash and never pass."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device import BundleError, SigningKey, TrustStore, Verifier
from tests.device._bundles import NOW, make_bundle

KEY = SigningKey.generate()
GOOD = make_bundle(KEY, version=5, ttl_s=3600).to_bytes()


def verifier() -> Verifier:
    return Verifier(trust=TrustStore([KEY.public_key]), tier="device", clock=lambda: NOW)


def test_the_fuzz_seed_passes() -> None:
    assert verifier().verify(GOOD).version == 5


@settings(deadline=None)  # a loaded CI machine can stall one example past the default 200 ms
@given(st.binary(max_size=512))
def test_random_bytes_give_the_typed_error(data: bytes) -> None:
    with pytest.raises(BundleError):
        verifier().verify(data)


@settings(deadline=None)  # a loaded CI machine can stall one example past the default 200 ms
@given(st.binary(max_size=64))
def test_random_bytes_behind_a_valid_header_give_the_typed_error(tail: bytes) -> None:
    with pytest.raises(BundleError):
        verifier().verify(GOOD[:24 + 64] + tail)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(1, 255)), min_size=1, max_size=4))
def test_mutated_bundles_never_pass(flips: list[tuple[int, int]]) -> None:
    data = bytearray(GOOD)
    for position, xor in flips:
        data[position] ^= xor
    if bytes(data) == GOOD:  # two flips may cancel out
        return
    with pytest.raises(BundleError):
        verifier().verify(bytes(data))


@settings(deadline=None)  # a loaded CI machine can stall one example past the default 200 ms
@given(st.integers(0, len(GOOD)), st.integers(0, 40), st.binary(max_size=40))
def test_spliced_bundles_never_pass(position: int, cut: int, insert: bytes) -> None:
    data = GOOD[:position] + insert + GOOD[position + cut:]
    if data == GOOD:
        return
    with pytest.raises(BundleError):
        verifier().verify(data)
