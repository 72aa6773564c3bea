"""Case 4 of issue 34: a bad update never poisons the edge cache; damage lowers availability, never the floor's truth.

Before: a trusted-signed bundle whose model failed the health check was written over the fallback slot (the last
good policy) while pointer.json still named that slot as the previous one; a damaged rejected.json and a torn
pointer.json then made the node adopt the rejected version and raise its anti-rollback floor to it, so it had
no working policy and refused every legitimate version below it, forever.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from device import Bundle, TrustStore, load_public_key
from edge import EdgeAgent, PolicyCache, Publisher
from tests._services import Mosquitto
from tests.edge._agents import agent_config, running_agents, wait_until
from tests.edge._policies import cartpole_bundle, cartpole_model, make_keys


def _slot_versions(cache_dir: Path) -> set[int]:
    return {Bundle.from_bytes(p.read_bytes()).version for p in (cache_dir / "slots").glob("*.bundle")}


def test_a_bundle_that_fails_its_health_check_never_poisons_the_cache(tmp_path: Path, mosquitto: Mosquitto) -> None:
    key, pub = make_keys(tmp_path / "keys")
    fleet = "poison"
    config = agent_config(tmp_path, "n1", pub, mosquitto.url, fleet=fleet)
    cache_dir = Path(config.cache_dir)
    bad = cartpole_bundle(key, 3, model=cartpole_model(nan=True))  # trusted-signed, fails the health check
    with Publisher(broker=mosquitto.url, fleet=fleet) as publisher, running_agents([config]) as (agent,):
        for version in (1, 2):
            publisher.publish(cartpole_bundle(key, version))
            wait_until(lambda v=version: agent.version == v, what=f"v{version}")  # type: ignore[misc]
        publisher.publish(bad)
        wait_until(lambda: len(agent.counters.health_failures) == 1, what="the health failure of v3")
        assert agent.version == 2
    # The failed v3 touched no slot: the running v2 and its fallback v1 are both still on disk.
    assert _slot_versions(cache_dir) == {1, 2}
    # Damage: rejected.json is garbage and the pointer is torn.
    (cache_dir / "rejected.json").write_bytes(b"\x00\xffnot json")
    (cache_dir / "pointer.json").write_text('{"format": 1, "acti')
    offline = EdgeAgent(dataclasses.replace(config, broker=None)).start()
    try:
        assert offline.version == 2
        assert offline.cache.verifier.highest_accepted("cartpole") == 2
        assert offline.last_error is not None and "pointer.json unreadable" in offline.last_error
        status = offline.status()
        assert status.cache_repairs is not None and "rejected.json unreadable" in status.cache_repairs
    finally:
        offline.close()
    # Back online, the retained v3 is checked again (its rejection was lost with rejected.json) and refused again.
    with running_agents([config]) as (agent,):
        wait_until(lambda: len(agent.counters.health_failures) == 1, what="v3 checked again")
        assert agent.version == 2 and agent.cache.verifier.highest_accepted("cartpole") == 2
        with Publisher(broker=mosquitto.url, fleet=fleet) as publisher:  # the next good version still installs
            publisher.publish(cartpole_bundle(key, 4))
            wait_until(lambda: agent.version == 4, what="v4")


DAMAGES = ("torn pointer", "rejected.json garbage", "verifier.json garbage", "verifier.json deleted",
           "active slot rotten", "rejected bundle planted")


def _damage(cache: PolicyCache, rejected: bytes, which: tuple[str, ...]) -> None:
    root = cache.root
    assert cache.pointer is not None
    active = cache.slot_path(cache.pointer.active)
    other = cache.slot_path("b" if cache.pointer.active == "a" else "a")
    if "rejected bundle planted" in which:  # what the old strata wrote over the fallback slot
        other.write_bytes(rejected)
    if "active slot rotten" in which:
        active.write_bytes(active.read_bytes()[:100])
    if "torn pointer" in which:
        cache.pointer_path.write_bytes(cache.pointer_path.read_bytes()[:20])
    if "rejected.json garbage" in which:
        (root / "rejected.json").write_bytes(b"[" * 50_000)
    if "verifier.json garbage" in which:
        (root / "verifier.json").write_bytes(b"\x00")
    if "verifier.json deleted" in which:
        (root / "verifier.json").unlink()


def test_no_damage_to_the_cache_activates_an_unchecked_version_or_raises_the_floor(tmp_path: Path) -> None:
    """A hostile probe: every combination of damage to every cache file, with the rejected bundle planted."""
    key, pub = make_keys(tmp_path / "keys")
    trust = TrustStore([load_public_key(pub)])
    rejected = cartpole_bundle(key, 3, model=cartpole_model(nan=True))
    for n in range(1, len(DAMAGES) + 1):
        for which in itertools.combinations(DAMAGES, n):
            if {"verifier.json garbage", "verifier.json deleted"} <= set(which):
                continue
            root = tmp_path / "-".join(str(DAMAGES.index(w)) for w in which) / "c"
            cache = PolicyCache(root, trust=trust)
            for version in (1, 2):
                cache.stage(cartpole_bundle(key, version))
                cache.commit()
            cache.reject(rejected, "health check failed: outputs are not finite")
            _damage(cache, rejected.to_bytes(), which)
            restarted = PolicyCache(root, trust=trust)
            loaded = restarted.load()
            floor = restarted.verifier.highest_accepted("cartpole")
            assert loaded is None or loaded.version in (1, 2), (which, restarted.events)
            assert floor <= 2, (which, floor, restarted.events)
            assert restarted.repairs, (which, "damage must be reported")
            if "active slot rotten" not in which and not (
                    "torn pointer" in which and {"verifier.json garbage", "verifier.json deleted"} & set(which)):
                assert loaded is not None and loaded.version == 2, (which, restarted.events)
            # and the fleet's next version still installs on top of whatever survived
            restarted.stage(restarted.verify(cartpole_bundle(key, 4).to_bytes()))
            restarted.commit()
            again = PolicyCache(root, trust=trust).load()
            assert again is not None and again.version == 4, which
