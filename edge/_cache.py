"""The edge node's A/B policy cache on disk, with an atomic pointer swap and revert.

Layout of the cache folder::

    slots/a.bundle  slots/b.bundle   two slots; a new bundle always goes into the slot that is not active
    pointer.json                     {"active", "previous", "state": "committed" | "trial", versions}
    verifier.json                    anti-rollback state of `device.Verifier` (the floor: highest committed version)
    rejected.json                    bundles that failed their health check (not tried again)

State machine of one update (each arrow is one atomic step: write a temp file, fsync, rename, fsync the folder):

    committed(A) --stage--> committed(A), B written in the other slot     (only after B passed its health check)
        --commit--> committed(B, previous A)     (the floor rises to B's version first, then the pointer swaps)
    committed(A) --reject--> committed(A)         (B failed its health check: recorded in rejected.json only;
                                                   no slot is written, so the fallback A' in the other slot stays)

Trust rules (what a damaged or hostile cache folder can and cannot do):

- A slot is written only with a bundle that passed its health check; a failed one never touches a slot, so the
  last policy that passed (the active one, and the previous one as its fallback) is never overwritten by one
  that has not.
- The anti-rollback floor rises only in `commit`, after the health check passed. `load` activates only a slot
  it knows was committed: its version is at most the floor of its policy (commit raises the floor before it
  swaps the pointer), or, when the floor itself was lost, the pointer names that slot with that version (the
  pointer is written only by commit). So `load` never raises the floor above a committed version, and a staged
  but uncommitted bundle, or a rejected one planted in a slot, is never activated.
- Damage only lowers availability: a torn pointer falls back to the newest known-committed slot; a corrupt slot
  to the other one; an unreadable rejected.json is moved aside (a failed bundle is health-checked again, never
  activated unchecked); an unreadable or missing floor is rebuilt from the pointer's committed versions, and with
  the pointer gone too, no slot is known committed: the node waits for the fleet's latest bundle, which goes
  through verify, health check and commit. Every repair and fallback is listed in `repairs` (the agent puts it
  in its ``last_error`` and status).
- `verify` (for bundles from the network) passes versions newer than the highest accepted, and also the
  highest accepted version itself while the cache does not hold it: re-installing the version it already
  trusts repairs a cache that fell back after corruption (the signature must still verify).
- A write that fails raises `CacheError`; the caller reports the install as failed and keeps (or goes back
  to) what the pointer says runs.

(A pointer in the ``trial`` state, which no current writer produces, is resolved to its previous slot.)
"""

from __future__ import annotations

import contextlib
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
        self.repairs: list[str] = []
        """What the last `load` (and later writes) found damaged and how the cache fell back, newest last."""
        try:
            (self.root / "slots").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"PolicyCache: cannot create {self.root / 'slots'}: {exc.strerror or exc}; pass a "
                             "writable cache folder") from None
        state = self.root / "verifier.json"
        # The floor is lost when its file is unreadable, or missing from a cache that holds a pointer or a slot.
        self._floor_lost = not state.exists() and (self.pointer_path.exists() or any(
            self.slot_path(s).exists() for s in ("a", "b")))
        try:
            self.verifier = Verifier(trust=trust, tier=tier, state_path=state, clock=clock)
        except VerifierStateError as exc:
            self._floor_lost = True
            self._note(f"anti-rollback state unreadable ({exc}); moved to verifier.json.corrupt and rebuilt from "
                       "the versions the pointer says were committed")
            try:
                state.replace(state.with_name("verifier.json.corrupt"))
            except OSError as move_exc:
                raise CacheError(f"PolicyCache: {exc}; and it cannot be moved aside: {move_exc}") from None
            self.verifier = Verifier(trust=trust, tier=tier, state_path=state, clock=clock)
        else:
            if self._floor_lost:
                self._note("anti-rollback state missing beside cached bundles; rebuilt from the versions the "
                           "pointer says were committed")
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

    def _note(self, message: str) -> None:
        """Record a repair or fallback: in `events`, in `repairs` (status) and in the log."""
        self.events.append(message)
        self.repairs.append(message)
        del self.repairs[:-20]
        log.warning("policy cache %s: %s", self.root, message)

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
            self._note(f"slot {slot} unusable: {exc}")
            return None
        if self.is_rejected(bundle):
            self._note(f"slot {slot} holds {bundle.policy} v{bundle.version}, which failed its health check: ignored")
            return None
        return bundle

    def _read_pointer(self) -> Pointer | None:
        try:
            return Pointer.from_json(self.pointer_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self._note(f"pointer.json unreadable ({exc}); falling back to the newest committed slot")
            return None

    def load(self) -> Bundle | None:
        """Resolve the pointer after a (re)start and return the best committed bundle, or None when none is.

        The pointer's active slot when it verifies and is known committed, else the newest known-committed slot
        (see the module docstring); the pointer is rewritten to match. The floor is raised only when it was lost,
        and then only to versions the pointer says were committed.
        """
        pointer = self._read_pointer()
        preferred: Slot | None = None if pointer is None else pointer.active
        excluded: Slot | None = None
        if pointer is not None and pointer.state == "trial":
            self.events.append(f"pointer was on trial of v{pointer.version}: reverting")
            preferred, excluded = pointer.previous, pointer.active
        verified: dict[Slot, Bundle] = {}
        for s in ("a", "b"):
            if s != excluded and (bundle := self._read_slot(s)) is not None:
                verified[s] = bundle
        lost, self._floor_lost = self._floor_lost, False
        found = {s: b for s, b in verified.items() if self._committed(s, b, pointer, floor_lost=lost)}
        if lost:
            self._rebuild_floor(found)
        for s in sorted(set(verified) - set(found)):
            b = verified[s]
            self._note(f"slot {s} holds {b.policy} v{b.version}, above the anti-rollback floor "
                       f"{self.verifier.highest_accepted(b.policy)} and never committed: not activated")
        if not found:
            if pointer is not None or verified:
                self._note("no committed policy on disk: waiting for the fleet's latest bundle")
            self._pointer, self._active = pointer, None
            return None
        if preferred in found:
            slot: Slot = preferred
        else:
            slot = max(found, key=lambda k: found[k].version)
            if pointer is not None:
                self._note(f"active slot {pointer.active} unusable: fell back to slot {slot} "
                           f"({found[slot].policy} v{found[slot].version})")
        bundle = found[slot]
        other: Slot = "b" if slot == "a" else "a"
        keep_previous = other in found and other != excluded
        resolved = Pointer(slot, other if keep_previous else None, "committed", bundle.version,
                           found[other].version if keep_previous else None)
        try:  # a read-only cache still runs its committed bundle; the repair waits for a writable disk
            if resolved != pointer:
                self._write_pointer(resolved)
        except CacheError as exc:
            self._note(str(exc))
        self._pointer, self._active = resolved, bundle
        return bundle

    def _committed(self, slot: Slot, bundle: Bundle, pointer: Pointer | None, *, floor_lost: bool) -> bool:
        """Whether `bundle` in `slot` is known to have been committed (see the module docstring)."""
        if bundle.version <= self.verifier.highest_accepted(bundle.policy):
            return True
        return pointer is not None and floor_lost and (
            (slot == pointer.active and bundle.version == pointer.version)
            or (slot == pointer.previous and bundle.version == pointer.previous_version))

    def _rebuild_floor(self, committed: dict[Slot, Bundle]) -> None:
        """Set a lost floor to the committed versions the pointer named (never higher)."""
        for bundle in sorted(committed.values(), key=lambda b: b.version):
            try:
                self._accept(bundle)
            except (CacheError, RollbackError) as exc:
                self._note(f"cannot record the rebuilt anti-rollback floor: {exc}")
        if not committed:
            self._note("anti-rollback floor lost and no slot is named by a readable pointer: no cached policy is "
                       "known committed, so none is activated")

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
        if self._rejected_cache is None:  # read once; `reject` keeps the copy and the file in step
            path = self.root / "rejected.json"
            found: dict[str, str] = {}
            try:
                obj = json.loads(path.read_bytes())
                if not isinstance(obj, dict):
                    raise ValueError(f"a JSON {type(obj).__name__}, not an object")
                found = {str(k): str(v) for k, v in obj.items()}
            except FileNotFoundError:
                pass
            except (OSError, ValueError, RecursionError) as exc:
                # No slot ever holds a rejected bundle, so forgetting rejections costs a health check, no more.
                self._note(f"rejected.json unreadable ({str(exc)[:200]}); moved to rejected.json.corrupt: a bundle "
                           "that failed its health check will be checked again")
                with contextlib.suppress(OSError):
                    path.replace(path.with_name("rejected.json.corrupt"))
            self._rejected_cache = found
        return dict(self._rejected_cache)

    def stage(self, bundle: Bundle, *, data: bytes | None = None) -> Slot:
        """Write `bundle`, which passed its health check, into the inactive slot (the active one is untouched).

        Never stage a bundle that has not passed its checks: the inactive slot holds the fallback policy.

        Args:
            bundle: The verified bundle that passed its health check.
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
        """The staged bundle passed its health check: raise the floor to its version, then swap the pointer to it."""
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

    def reject(self, bundle: Bundle, reason: str) -> None:
        """`bundle` failed its health check: remember it as rejected; no slot, pointer or floor changes."""
        rejected = self._rejected()
        rejected[f"{bundle.policy}:{bundle.version}:{bundle.manifest.model_sha256}"] = reason[:500]
        kept = dict(list(rejected.items())[-MAX_REJECTED:])
        self._rejected_cache = kept
        try:
            write_atomic(self.root / "rejected.json", json.dumps(kept).encode())
        except OSError as exc:  # remembered in memory; only a restart would check it again
            self._note(f"cannot write rejected.json: {exc}")
        self._phase("discarded", bundle)

    def describe(self) -> dict[str, Any]:
        """Pointer and events, for status output."""
        p = self._pointer
        return {"pointer": None if p is None else json.loads(p.to_json()), "events": self.events[-20:],
                "repairs": list(self.repairs)}
