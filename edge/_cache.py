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
crash anywhere leaves a cache that `load` resolves to a verified, committed policy.

The cache never leaves the node without a policy while a verified one is on disk:

- `load` verifies every slot again (signature, digest, expiry, tier) and takes the pointer's active slot when
  it verifies, else the other slot (the best verified bundle on disk), never one that failed its health check.
  A bundle in a slot got there only after passing the network verifier's anti-rollback check, so an older one
  is a known-good previous policy, not a rollback. A torn pointer, a corrupt slot or an unreadable
  anti-rollback state (rebuilt from the verified slots) are repaired on the spot, never deleted into "empty".
- `verify` (for bundles from the network) passes versions newer than the highest accepted, and also the
  highest accepted version itself while the cache does not hold it: re-installing the version it already
  trusts repairs a cache that fell back after corruption (the signature must still verify).
- `commit` records the version as accepted first, then swaps the pointer: a crash between the two restarts
  on the old slot, and the repair rule above lets the same version in again.
- A write that fails raises `CacheError`; the caller reports the install as failed and keeps (or goes back
  to) what the pointer says runs.

(A pointer in the ``trial`` state, which no current writer produces, is resolved to its previous slot.)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from device import Bundle, BundleError, RollbackError, TrustStore, Verifier, VerifierStateError, write_atomic
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
        self.events: list[str] = []
        try:
            (self.root / "slots").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"PolicyCache: cannot create {self.root / 'slots'}: {exc.strerror or exc}; pass a "
                             "writable cache folder") from None
        state = self.root / "verifier.json"
        try:
            self.verifier = Verifier(trust=trust, tier=tier, state_path=state, clock=clock)
        except VerifierStateError as exc:
            # The verified slots hold every version this cache committed: `load` rebuilds the floor from them.
            self.events.append(f"anti-rollback state unreadable, rebuilt from the verified slots: {exc}")
            log.warning("policy cache %s: %s", self.root, self.events[-1])
            try:
                state.replace(state.with_name("verifier.json.corrupt"))
            except OSError as move_exc:
                raise CacheError(f"PolicyCache: {exc}; and it cannot be moved aside: {move_exc}") from None
            self.verifier = Verifier(trust=trust, tier=tier, state_path=state, clock=clock)
        # Integrity-only verifier for loading from disk (no rollback state: `load` applies its own rule).
        self._integrity = Verifier(trust=trust, tier=tier, clock=clock)
        self._on_phase = on_phase
        self._pointer: Pointer | None = None
        self._staged: tuple[Slot, Bundle] | None = None
        self._rejected_cache: dict[str, str] | None = None
        self._active: Bundle | None = None

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

    @property
    def active(self) -> Bundle | None:
        """The bundle the pointer names (after `load` or `commit`), None when the cache is empty."""
        return self._active

    def _write_pointer(self, pointer: Pointer) -> None:
        try:
            write_atomic(self.pointer_path, pointer.to_json())
        except OSError as exc:
            raise CacheError(f"PolicyCache: cannot write {self.pointer_path}: {exc.strerror or exc}; check the "
                             "cache folder's free space and permissions") from None
        self._pointer = pointer

    # ------------------------------------------------------------------------------------------ loading

    def _read_slot(self, slot: Slot) -> Bundle | None:
        path = self.slot_path(slot)
        try:
            data = path.read_bytes()
            bundle = self._integrity.verify(data)
        except FileNotFoundError:
            return None
        except (OSError, BundleError) as exc:
            self.events.append(f"slot {slot} unusable: {exc}")
            log.warning("policy cache %s: slot %s unusable: %s", self.root, slot, exc)
            return None
        if self.is_rejected(bundle):
            self.events.append(f"slot {slot} holds {bundle.policy} v{bundle.version}, which failed its health check")
            return None
        return bundle

    def load(self) -> Bundle | None:
        """Resolve the pointer after a (re)start and return the best verified bundle, or None when none verifies.

        The pointer's active slot when it verifies, else the other slot; the pointer is rewritten to match.
        """
        try:
            pointer: Pointer | None = Pointer.from_json(self.pointer_path.read_bytes())
        except FileNotFoundError:
            pointer = None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self.events.append(f"pointer unreadable: {exc}")
            pointer = None
        preferred: Slot | None = None if pointer is None else pointer.active
        excluded: Slot | None = None
        if pointer is not None and pointer.state == "trial":
            self.events.append(f"pointer was on trial of v{pointer.version}: reverting")
            preferred, excluded = pointer.previous, pointer.active
        found: dict[Slot, Bundle] = {}
        for s in ("a", "b"):
            if s != excluded and (bundle := self._read_slot(s)) is not None:
                found[s] = bundle
        if not found:
            self._pointer, self._active = pointer, None
            return None
        if preferred in found:
            slot: Slot = preferred
        else:
            slot = max(found, key=lambda k: found[k].version)
            if pointer is not None:
                self.events.append(f"active slot {pointer.active} unusable: fell back to slot {slot} "
                                   f"({found[slot].policy} v{found[slot].version})")
        bundle = found[slot]
        other: Slot = "b" if slot == "a" else "a"
        keep_previous = pointer is not None and pointer.previous == other and other in found
        resolved = Pointer(slot, other if keep_previous else None, "committed", bundle.version,
                           found[other].version if keep_previous else None)
        try:  # a read-only cache still runs its verified bundle; the repair waits for a writable disk
            if resolved != pointer:
                self._write_pointer(resolved)
            if bundle.version > self.verifier.highest_accepted(bundle.policy):
                self._accept(bundle)
        except CacheError as exc:
            self.events.append(str(exc))
            log.warning("policy cache %s: %s", self.root, exc)
        self._pointer, self._active = resolved, bundle
        return bundle

    def verify(self, data: bytes) -> Bundle:
        """Verify a bundle from the network (raise the `BundleError` naming the refusal).

        Passes a version newer than the highest accepted, and the highest accepted version itself while the
        cache does not hold it (it fell back after corruption, or a crash came between accept and swap).
        """
        bundle = self.verifier.verify(data, allow_current=True)
        highest = self.verifier.highest_accepted(bundle.policy)
        active = self._active
        if bundle.version == highest and active is not None and active.policy == bundle.policy and (
                active.version >= highest):
            raise RollbackError(f"PolicyCache.verify: bundle {bundle.policy!r} v{bundle.version} is not newer than "
                                f"the highest accepted version {highest}, which the cache holds (rollback refused)")
        return bundle

    def _accept(self, bundle: Bundle) -> None:
        try:
            self.verifier.accept(bundle)
        except VerifierStateError as exc:
            raise CacheError(f"PolicyCache: {exc}") from None

    # ------------------------------------------------------------------------------------------ updating

    def is_rejected(self, bundle: Bundle) -> bool:
        """Whether this exact bundle failed a health check before."""
        return f"{bundle.policy}:{bundle.version}:{bundle.manifest.model_sha256}" in self._rejected()

    def _rejected(self) -> dict[str, str]:
        if self._rejected_cache is None:  # read once; `discard` keeps the copy and the file in step
            try:
                obj = json.loads((self.root / "rejected.json").read_bytes())
                found = {str(k): str(v) for k, v in obj.items()} if isinstance(obj, dict) else {}
            except (OSError, ValueError, RecursionError):
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
        self._accept(bundle)
        self._write_pointer(Pointer(slot, old.active if old else None, "committed", bundle.version,
                                    old.version if old else None))
        self._active = bundle
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
        self._rejected_cache = kept
        self._staged = None
        try:
            write_atomic(self.root / "rejected.json", json.dumps(kept).encode())
        except OSError as exc:  # remembered in memory; only a restart would try it again
            self.events.append(f"cannot write rejected.json: {exc}")
        self._phase("discarded", bundle)

    def describe(self) -> dict[str, Any]:
        """Pointer and events, for status output."""
        p = self._pointer
        return {"pointer": None if p is None else json.loads(p.to_json()), "events": self.events[-20:]}
