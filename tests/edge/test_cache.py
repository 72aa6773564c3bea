"""The A/B policy cache: atomic swap, trial and revert, recovery after kill -9 at every step of a swap."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from device import Bundle, SigningKey, TrustStore, load_public_key
from edge import PolicyCache
from tests.edge._policies import cartpole_bundle, make_keys

REPO = Path(__file__).resolve().parents[2]
Keys = tuple[SigningKey, Path]


@pytest.fixture
def keys(tmp_path: Path) -> tuple[SigningKey, Path]:
    return make_keys(tmp_path / "keys")


def _cache(root: Path, pub: Path) -> PolicyCache:
    return PolicyCache(root, trust=TrustStore([load_public_key(pub)]))


def _install(cache: PolicyCache, bundle: Bundle) -> None:
    cache.stage(bundle)
    cache.commit()


def test_swap_commit_and_restart(tmp_path: Path, keys: Keys) -> None:
    key, pub = keys
    cache = _cache(tmp_path / "c", pub)
    assert cache.load() is None
    _install(cache, cartpole_bundle(key, 1))
    _install(cache, cartpole_bundle(key, 2))
    assert cache.pointer is not None and cache.pointer.version == 2
    again = _cache(tmp_path / "c", pub)
    loaded = again.load()
    assert loaded is not None and loaded.version == 2
    assert again.verifier.highest_accepted("cartpole") == 2


def test_discard_keeps_the_running_policy_and_remembers_the_rejection(tmp_path: Path, keys: Keys) -> None:
    key, pub = keys
    cache = _cache(tmp_path / "c", pub)
    _install(cache, cartpole_bundle(key, 1))
    bad = cartpole_bundle(key, 2)
    cache.reject(bad, "health check failed")  # (was stage + discard: a failed bundle no longer touches a slot)
    assert cache.is_rejected(bad)
    loaded = _cache(tmp_path / "c", pub).load()
    assert loaded is not None and loaded.version == 1
    # a failed update never blocks the next one
    _install(cache, cartpole_bundle(key, 3))
    loaded = _cache(tmp_path / "c", pub).load()
    assert loaded is not None and loaded.version == 3


def test_a_corrupted_active_slot_falls_back_to_the_previous_known_good_one(tmp_path: Path, keys: Keys) -> None:
    key, pub = keys
    cache = _cache(tmp_path / "c", pub)
    _install(cache, cartpole_bundle(key, 1))
    _install(cache, cartpole_bundle(key, 2))
    assert cache.pointer is not None
    slot = cache.slot_path(cache.pointer.active)
    slot.write_bytes(slot.read_bytes()[:-10])  # disk corruption: a truncated file
    again = _cache(tmp_path / "c", pub)
    loaded = again.load()
    assert loaded is not None and loaded.version == 1
    assert any("unusable" in e for e in again.events)


def test_an_unreadable_pointer_picks_the_newest_verified_slot(tmp_path: Path, keys: Keys) -> None:
    key, pub = keys
    cache = _cache(tmp_path / "c", pub)
    _install(cache, cartpole_bundle(key, 1))
    _install(cache, cartpole_bundle(key, 2))
    cache.pointer_path.write_text("{torn")
    loaded = _cache(tmp_path / "c", pub).load()
    assert loaded is not None and loaded.version == 2


_KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from device import Bundle, SigningKey, TrustStore, load_public_key, load_signing_key
    from edge import PolicyCache
    from tests.edge._policies import cartpole_bundle
    phase_to_die, root, pub, key = sys.argv[1:5]

    def on_phase(phase, bundle):
        if phase == phase_to_die and bundle.version == 2:
            os.kill(os.getpid(), signal.SIGKILL)

    cache = PolicyCache(Path(root), trust=TrustStore([load_public_key(pub)]), on_phase=on_phase)
    assert cache.load().version == 1
    cache.stage(cartpole_bundle(load_signing_key(key), 2))
    cache.commit()
""")


@pytest.mark.parametrize(("phase", "expected"), [("staged", 1), ("committed", 2)])
def test_kill_9_mid_swap_leaves_a_cache_that_starts_on_a_valid_policy(
        tmp_path: Path, keys: Keys, phase: str, expected: int) -> None:
    key, pub = keys
    root = tmp_path / "c"
    _install(_cache(root, pub), cartpole_bundle(key, 1))
    proc = subprocess.run([sys.executable, "-c", _KILLER.format(repo=str(REPO)), phase, str(root), str(pub),
                           str(tmp_path / "keys" / "fleet.key")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    cache = _cache(root, pub)
    loaded = cache.load()
    assert loaded is not None and loaded.version == expected
    pointer = json.loads(cache.pointer_path.read_text())
    assert pointer["state"] == "committed" and pointer["version"] == expected
    # and the next update installs cleanly on top
    _install(cache, cartpole_bundle(key, 3))
    reloaded = _cache(root, pub).load()
    assert reloaded is not None and reloaded.version == 3


def test_cached_bundles_are_verified_again_on_load(tmp_path: Path, keys: Keys) -> None:
    key, pub = keys
    cache = _cache(tmp_path / "c", pub)
    _install(cache, cartpole_bundle(key, 1))
    assert cache.pointer is not None
    slot = cache.slot_path(cache.pointer.active)
    data = bytearray(slot.read_bytes())
    data[-5] ^= 0xFF  # flip a model byte: digest no longer matches the signed manifest
    slot.write_bytes(bytes(data))
    again = _cache(tmp_path / "c", pub)
    assert again.load() is None
    assert any("TamperedBundle" in e or "sha256" in e for e in again.events)


def test_a_pointer_left_on_trial_resolves_to_its_previous_slot(tmp_path: Path, keys: Keys) -> None:
    key, pub = keys
    cache = _cache(tmp_path / "c", pub)
    _install(cache, cartpole_bundle(key, 1))
    _install(cache, cartpole_bundle(key, 2))
    pointer = json.loads(cache.pointer_path.read_text())
    cache.pointer_path.write_text(json.dumps({**pointer, "state": "trial"}))
    again = _cache(tmp_path / "c", pub)
    loaded = again.load()
    assert loaded is not None and loaded.version == 1
