"""The policy cache never strands a node: corruption of every cache file, repair by re-install, kill -9 anywhere."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from device import Bundle, RollbackError, SigningKey, TrustStore, load_public_key
from edge import CacheError, PolicyCache
from tests.edge._policies import cartpole_bundle, make_keys

REPO = Path(__file__).resolve().parents[2]
Keys = tuple[SigningKey, Path]


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return make_keys(tmp_path / "keys")


def _cache(root: Path, pub: Path) -> PolicyCache:
    return PolicyCache(root, trust=TrustStore([load_public_key(pub)]))


def _install(cache: PolicyCache, bundle: Bundle) -> None:
    cache.stage(bundle)
    cache.commit()


def _loaded_version(cache: PolicyCache) -> int | None:
    bundle = cache.load()
    return None if bundle is None else bundle.version


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "garbage": lambda p: p.write_bytes(b"\x00\xff" * 300),
    "empty": lambda p: p.write_bytes(b""),
    "deleted": lambda p: p.unlink(),
    "deep-json": lambda p: p.write_bytes(b"[" * 30_000 + b"]" * 30_000),
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
@pytest.mark.parametrize("which", ["active slot", "previous slot", "pointer.json", "verifier.json", "rejected.json"])
def test_corruption_of_any_cache_file_restarts_on_the_best_verified_bundle(tmp_path: Path, keys: Keys, which: str,
                                                                          how: str) -> None:
    key, pub = keys
    root = tmp_path / "c"
    cache = _cache(root, pub)
    _install(cache, cartpole_bundle(key, 1))
    _install(cache, cartpole_bundle(key, 2))
    assert cache.pointer is not None
    path = {"active slot": cache.slot_path(cache.pointer.active),
            "previous slot": cache.slot_path("b" if cache.pointer.active == "a" else "a"),
            "pointer.json": cache.pointer_path, "verifier.json": root / "verifier.json",
            "rejected.json": root / "rejected.json"}[which]
    if not path.exists():
        path.write_bytes(b"{}")
    CORRUPTIONS[how](path)
    expected = 1 if which == "active slot" else 2
    restarted = _cache(root, pub)
    assert _loaded_version(restarted) == expected, restarted.events
    # a second restart comes back on the same bundle: the fallback is never refused as a "rollback"
    again = _cache(root, pub)
    assert _loaded_version(again) == expected, again.events
    assert again.pointer is not None and json.loads(again.pointer_path.read_text())["version"] == expected
    # the fleet's current version (v2) repairs a fallen-back cache; a cache holding v2 refuses it again
    current = cartpole_bundle(key, 2)
    if expected == 1:
        repaired = again.verify(current.to_bytes())
        again.stage(repaired)
        again.commit()
        assert _loaded_version(_cache(root, pub)) == 2
    else:
        with pytest.raises(RollbackError, match="which the cache holds"):
            again.verify(current.to_bytes())
    with pytest.raises(RollbackError):
        again.verify(cartpole_bundle(key, 1).to_bytes())
    # and the next version installs cleanly on top
    _install(again, again.verify(cartpole_bundle(key, 3).to_bytes()))
    assert _loaded_version(_cache(root, pub)) == 3


def test_reinstalling_the_trusted_version_repairs_a_corrupt_slot_but_needs_a_valid_signature(
        tmp_path: Path, keys: Keys) -> None:
    key, pub = keys
    other_key, _ = make_keys(tmp_path / "other")
    root = tmp_path / "c"
    cache = _cache(root, pub)
    _install(cache, cartpole_bundle(key, 1))
    _install(cache, cartpole_bundle(key, 2))
    assert cache.pointer is not None
    cache.slot_path(cache.pointer.active).write_bytes(b"rot")
    fallen = _cache(root, pub)
    assert _loaded_version(fallen) == 1 and fallen.verifier.highest_accepted("cartpole") == 2
    with pytest.raises(Exception, match="not in the"):  # UnknownKeyError: a foreign key cannot "repair"
        fallen.verify(cartpole_bundle(other_key, 2).to_bytes())
    tampered = bytearray(cartpole_bundle(key, 2).to_bytes())
    tampered[-5] ^= 0xFF
    with pytest.raises(Exception, match="sha256"):
        fallen.verify(bytes(tampered))
    with pytest.raises(RollbackError):
        fallen.verify(cartpole_bundle(key, 1).to_bytes())
    _install(fallen, fallen.verify(cartpole_bundle(key, 2).to_bytes()))
    assert _loaded_version(_cache(root, pub)) == 2


def test_a_crash_between_accept_and_swap_lets_the_same_version_in_again(tmp_path: Path, keys: Keys) -> None:
    key, pub = keys
    root = tmp_path / "c"
    cache = _cache(root, pub)
    _install(cache, cartpole_bundle(key, 1))
    cache.verifier.accept(cartpole_bundle(key, 2))  # what `commit` does first; the pointer swap never happened
    restarted = _cache(root, pub)
    assert _loaded_version(restarted) == 1
    _install(restarted, restarted.verify(cartpole_bundle(key, 2).to_bytes()))
    assert _loaded_version(_cache(root, pub)) == 2


def test_a_slot_holding_a_bundle_that_failed_its_health_check_is_never_loaded(tmp_path: Path, keys: Keys) -> None:
    key, pub = keys
    root = tmp_path / "c"
    cache = _cache(root, pub)
    _install(cache, cartpole_bundle(key, 1))
    bad = cartpole_bundle(key, 2)
    cache.reject(bad, "health check failed")  # no slot is written for a rejected bundle
    assert not cache.slot_path("b").exists()
    # Planted in a slot anyway (as an older strata did), with the pointer gone: still never loaded.
    cache.slot_path("b").write_bytes(bad.to_bytes())
    cache.pointer_path.unlink()
    restarted = _cache(root, pub)
    assert _loaded_version(restarted) == 1
    assert any("failed its health check" in e for e in restarted.events)
    assert restarted.verifier.highest_accepted("cartpole") == 1


def test_an_unwritable_cache_reports_the_failed_install_and_keeps_the_committed_policy(tmp_path: Path,
                                                                                      keys: Keys) -> None:
    key, pub = keys
    root = tmp_path / "c"
    cache = _cache(root, pub)
    _install(cache, cartpole_bundle(key, 1))
    (root / "slots").rename(root / "slots.moved")
    (root / "slots").write_bytes(b"")  # a regular file where the folder was: every write fails (also as root)
    with pytest.raises(CacheError, match="cannot write"):
        cache.stage(cartpole_bundle(key, 2))
    assert cache.active is not None and cache.active.version == 1
    assert cache.pointer is not None and cache.pointer.version == 1


_KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from device import TrustStore, load_public_key, load_signing_key
    from edge import PolicyCache
    from tests.edge._policies import cartpole_bundle
    phase_to_die, root, pub, key = sys.argv[1:5]

    def on_phase(phase, bundle):
        if phase == phase_to_die and bundle.version == 3:
            os.kill(os.getpid(), signal.SIGKILL)

    cache = PolicyCache(Path(root), trust=TrustStore([load_public_key(pub)]), on_phase=on_phase)
    assert cache.load().version == 2
    if phase_to_die == "discarded":
        cache.reject(cartpole_bundle(load_signing_key(key), 3), "health check failed")
    else:
        cache.stage(cartpole_bundle(load_signing_key(key), 3))
        cache.commit()
""")


@pytest.mark.parametrize(("phase", "expected"), [("staged", 2), ("committed", 3), ("discarded", 2)])
def test_kill_9_at_every_step_then_corruption_still_starts_on_a_verified_policy(
        tmp_path: Path, keys: Keys, phase: str, expected: int) -> None:
    key, pub = keys
    root = tmp_path / "c"
    cache = _cache(root, pub)
    _install(cache, cartpole_bundle(key, 1))
    _install(cache, cartpole_bundle(key, 2))
    proc = subprocess.run([sys.executable, "-c", _KILLER.format(repo=str(REPO)), phase, str(root), str(pub),
                           str(tmp_path / "keys" / "fleet.key")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    restarted = _cache(root, pub)
    assert _loaded_version(restarted) == expected, restarted.events
    # then the active slot rots: the node starts on a committed bundle, never on a rejected or uncommitted one.
    # "staged": v3 was written but never committed (the floor is still 2), so it is not activated (it was 3
    # before the cache knew which slots were committed); "discarded": the rejected v3 never overwrote the
    # fallback v1, which the node now falls back to (it had no policy at all before).
    assert restarted.pointer is not None
    restarted.slot_path(restarted.pointer.active).write_bytes(b"rot")
    fallen = _cache(root, pub)
    version = _loaded_version(fallen)
    assert version == {"staged": None, "committed": 2, "discarded": 1}[phase], fallen.events
    assert fallen.verifier.highest_accepted("cartpole") == {"staged": 2, "committed": 3, "discarded": 2}[phase]
