"""The edge node's A/B policy cache on disk, with an atomic pointer swap and revert.

Layout of the cache folder::

    slots/a.bundle  slots/b.bundle   two slots; a new bundle always goes into the slot that is not active
    pointer.json                     {"active", "previous", "state": "committed" | "trial", versions}
    verifier.json                    anti-rollback state of `device.Verifier` (highest accepted version)
    rejected.json                    bundles that failed their health check (not tried again)

State machine of one update (each arrow is one atomic step: write a temp file, fsync, rename, fsync the folder):

    committed(A) --stage--> committed(A), B written in the other slot
        --commit--> committed(B, previous A)     (the verifier records B's version: no rollback below it)
        --discard--> committed(A)                 (B failed its health check; remembered as rejected)

The pointer moves only by an atomic rename, and only to a slot whose file is complete and fsynced, so a
crash anywhere leaves a cache that `load` resolves to a verified, committed policy. An unreadable or tampered
active slot falls back to the previous one. Loading verifies the bundle again (signature, digest, expiry,
tier); a version below the highest accepted is allowed only for the previous slot this cache itself
committed, because reverting to a known-good policy is not a rollback attack. (A pointer in the ``trial``
state, which no current writer produces, is resolved to its previous slot.)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from device import Bundle, BundleError, TrustStore, Verifier, fsync_dir, write_atomic
from edge._errors import CacheError

log = logging.getLogger("strata.edge.cache")

Slot = Literal["a", "b"]
Phase = Literal["staged", "committed", "discarded"]
MAX_REJECTED = 64


@dataclass(frozen=True)
class Pointer:
    """Which slot is active, which one to fall back to, and whether the active one is still on trial."""

    active: Slot
    previous: Slot | None
    state: Literal["committed", "trial"]
    version: int
    previous_version: int | None

    def to_json(self) -> bytes:
        """JSON form."""
        return json.dumps({"format": 1, "active": self.active, "previous": self.previous, "state": self.state,
                           "version": self.version, "previous_version": self.previous_version}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Pointer:
        """Parse; raise ValueError when malformed."""
        obj = json.loads(data)
        if obj.get("format") != 1 or obj.get("active") not in ("a", "b") or obj.get("previous") not in (
                "a", "b", None) or obj.get("state") not in ("committed", "trial"):
            raise ValueError(f"unexpected pointer {obj!r}")
        return cls(obj["active"], obj["previous"], obj["state"], int(obj["version"]),
                   None if obj["previous_version"] is None else int(obj["previous_version"]))


class PolicyCache:
    """The A/B cache of one edge node (see the module docstring).

    Args:
        root: Cache folder (created).
        trust: Keys whose bundles are accepted.
        tier: The verifying tier (``"edge"``).
        clock: Unix time for expiry checks.
        on_phase: Called as ``on_phase(phase, bundle)`` right after each durable step (observability; tests use
            it to kill the process at an exact point).
    """

    def __init__(self, root: Path, *, trust: TrustStore, tier: str = "edge", clock: Callable[[], float] = time.time,
                 on_phase: Callable[[Phase, Bundle], None] | None = None) -> None:
        self.root = Path(root)
        (self.root / "slots").mkdir(parents=True, exist_ok=True)
        self.verifier = Verifier(trust=trust, tier=tier, state_path=self.root / "verifier.json", clock=clock)
        # Integrity-only verifier for loading from disk (no rollback state: `load` applies its own rule).
        self._integrity = Verifier(trust=trust, tier=tier, clock=clock)
        self._on_phase = on_phase
        self._pointer: Pointer | None = None
        self._staged: tuple[Slot, Bundle] | None = None
        self._rejected_cache: dict[str, str] | None = None
        self.events: list[str] = []

    # ------------------------------------------------------------------------------------------ paths

    def slot_path(self, slot: Slot) -> Path:
        """File of one slot."""
        return self.root / "slots" / f"{slot}.bundle"

    @property
    def pointer_path(self) -> Path:
        """The pointer file."""
        return self.root / "pointer.json"

    @property
    def pointer(self) -> Pointer | None:
        """The pointer as last loaded or written."""
        return self._pointer

    def _phase(self, phase: Phase, bundle: Bundle) -> None:
        self.events.append(f"{phase} {bundle.policy} v{bundle.version}")
        if self._on_phase is not None:
            self._on_phase(phase, bundle)

    def _write_pointer(self, pointer: Pointer | None) -> None:
        if pointer is None:
            self.pointer_path.unlink(missing_ok=True)
            fsync_dir(self.root)
        else:
            write_atomic(self.pointer_path, pointer.to_json())
        self._pointer = pointer

    # ------------------------------------------------------------------------------------------ loading

    def _read_slot(self, slot: Slot, *, allow_older: bool) -> Bundle | None:
        try:
            data = self.slot_path(slot).read_bytes()
            bundle = self._integrity.verify(data)
        except (OSError, BundleError) as exc:
            self.events.append(f"slot {slot} unusable: {exc}")
            log.warning("policy cache %s: slot %s unusable: %s", self.root, slot, exc)
            return None
        highest = self.verifier.highest_accepted(bundle.policy)
        if bundle.version < highest and not allow_older:
            self.events.append(f"slot {slot} holds v{bundle.version} below the accepted v{highest}")
            return None
        return bundle

    def load(self) -> Bundle | None:
        """Resolve the pointer after a (re)start and return the verified active bundle, or None when empty."""
        try:
            pointer: Pointer | None = Pointer.from_json(self.pointer_path.read_bytes())
        except FileNotFoundError:
            pointer = None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.events.append(f"pointer unreadable: {exc}")
            pointer = None
        if pointer is None:
            # No (readable) pointer: take whichever slot verifies with the highest version.
            candidates: list[tuple[Slot, Bundle]] = []
            for s in ("a", "b"):
                found = self._read_slot(s, allow_older=False) if self.slot_path(s).exists() else None
                if found is not None:
                    candidates.append((s, found))
            if not candidates:
                self._pointer = None
                return None
            slot, best = max(candidates, key=lambda c: c[1].version)
            self._write_pointer(Pointer(slot, None, "committed", best.version, None))
            self.verifier.accept(best)
            return best
        reverted = pointer.state == "trial"
        if reverted:
            self.events.append(f"pointer was on trial of v{pointer.version}: reverting")
            if pointer.previous is None:
                self._write_pointer(None)
                return None
            pointer = Pointer(pointer.previous, None, "committed", pointer.previous_version or 0, None)
            self._write_pointer(pointer)
        bundle = self._read_slot(pointer.active, allow_older=reverted)
        if bundle is not None:
            self._pointer = pointer
            if bundle.version > self.verifier.highest_accepted(bundle.policy):
                self.verifier.accept(bundle)
            return bundle
        if pointer.previous is not None:
            fallback = self._read_slot(pointer.previous, allow_older=True)
            if fallback is not None:
                self._write_pointer(Pointer(pointer.previous, None, "committed", fallback.version, None))
                return fallback
        self._write_pointer(None)
        return None

    # ------------------------------------------------------------------------------------------ updating

    def is_rejected(self, bundle: Bundle) -> bool:
        """Whether this exact bundle failed a health check before."""
        return f"{bundle.policy}:{bundle.version}:{bundle.manifest.model_sha256}" in self._rejected()

    def _rejected(self) -> dict[str, str]:
        if self._rejected_cache is None:  # read once; `discard` keeps the copy and the file in step
            try:
                obj = json.loads((self.root / "rejected.json").read_bytes())
                found = {str(k): str(v) for k, v in obj.items()} if isinstance(obj, dict) else {}
            except (OSError, ValueError):
                found = {}
            self._rejected_cache = found
        return dict(self._rejected_cache)

    def stage(self, bundle: Bundle, *, data: bytes | None = None) -> Slot:
        """Write `bundle` into the inactive slot (the active one is untouched).

        Args:
            bundle: The verified bundle.
            data: The exact bytes `bundle` was verified from, written as they are (saves encoding it again);
                None encodes `bundle`.
        """
        active = self._pointer.active if self._pointer else None
        slot: Slot = "b" if active == "a" else "a"
        try:
            write_atomic(self.slot_path(slot), bundle.to_bytes() if data is None else data)
        except OSError as exc:
            raise CacheError(f"PolicyCache.stage: cannot write {self.slot_path(slot)}: {exc}; "
                             "check the cache folder's free space and permissions") from exc
        self._staged = (slot, bundle)
        self._phase("staged", bundle)
        return slot

    def commit(self) -> Bundle:
        """The staged bundle passed its health check: swap the pointer to it and accept its version."""
        if self._staged is None:
            raise CacheError("PolicyCache.commit: nothing staged; call stage(bundle) first")
        slot, bundle = self._staged
        old = self._pointer
        self._write_pointer(Pointer(slot, old.active if old else None, "committed", bundle.version,
                                    old.version if old else None))
        self.verifier.accept(bundle)
        self._staged = None
        self._phase("committed", bundle)
        return bundle

    def discard(self, reason: str) -> None:
        """The staged bundle failed: the pointer stays where it is, and the bundle is remembered as rejected."""
        if self._staged is None:
            raise CacheError("PolicyCache.discard: nothing staged")
        _, bundle = self._staged
        rejected = self._rejected()
        rejected[f"{bundle.policy}:{bundle.version}:{bundle.manifest.model_sha256}"] = reason[:500]
        kept = dict(list(rejected.items())[-MAX_REJECTED:])
        write_atomic(self.root / "rejected.json", json.dumps(kept).encode())
        self._rejected_cache = kept
        self._staged = None
        self._phase("discarded", bundle)

    def describe(self) -> dict[str, Any]:
        """Pointer and events, for status output."""
        p = self._pointer
        return {"pointer": None if p is None else json.loads(p.to_json()), "events": self.events[-20:]}
