"""The switcher: which rollout source feeds the learner, and the live swap between sources.

A training job names its modes (``"colocated"``, ``"decoupled"``, ``"functions"``, ...); each is a
`RolloutSource`. The learner asks the switcher for the active source once per update; between
updates it calls `Switcher.at_boundary`, where a switch happens:

    RUNNING(a) ──request(b) or a rule fires──> PENDING(b)
    PENDING(b) ──learner reaches the update boundary──> SWITCHING
        1. drain: the old source has nothing in flight at a boundary (sources issue exactly the work
           one update needs), so no transition is left behind; its open episodes end here, and the
           learner's GAE already bootstraps them from ``V(next_obs)``, exactly as a time limit would
        2. start: the new source (kept warm when ``warm_standby``) is reset on the current policy
           version ``v``: fresh episodes, fresh transition streams ``{mode}:{v}`` (a run switches at
           most once per update, so the name is unique, also across a resumed run)
    SWITCHING ──> RUNNING(b), the pause and the reason recorded in `SwitchEvent`

A source that fails for good while it collects (a dead env service with no spare, a dead function
runtime, crashed pool workers: any `StrataError`) is failed over at once to another configured mode that
has not failed, on the same policy version: the update is collected again there, the failed source is
closed (a later switch to its mode starts it afresh), and the move is logged and recorded as an
automatic switch whose reason starts with ``failover:``. Only when no mode is left does the error
reach the learner, whose stop path checkpoints the last completed update. A warm standby source that
died while idle (its env service or worker killed) is replaced by a fresh one when a switch or a
failover starts it; a switch whose target will not start even then fails the request (`strata switch`
says why) and the run stays in its mode.

Manual requests (`strata switch`) and automatic rules (`SwitchRules`) go through the same path. A
manual switch is an override: the automatic rules stay quiet for the rest of the run (an operator who
moved the run does not want the phase schedule to move it back), which the log says when it happens.
Every transition carries ``(source, worker, seq)``; `Accounting` counts what each source produced
and what the learner consumed, so a loss or a duplicate is visible.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cloud._errors import CloudError
from cloud.rollout._sources import RolloutSource
from cloud.switching._control import SwitchRefused
from device import ConfigError, RolloutBatch, StrataError
from device._options import Integer, Name, Number, check_fields, declared


class SwitchError(CloudError):
    """A switch could not be carried out (the new source failed to start)."""


@dataclass(frozen=True, kw_only=True)
class SwitchRules:
    """When the switcher moves a run by itself. Every rule is off unless configured."""

    # --- phase schedule ---
    phase_steps: int | None = declared(Integer(min=0, max=10**12), None)
    """Start in the initial mode, move to phase_to once this many env steps are done (None: off)."""
    phase_to: str = declared(Name(), "decoupled")
    """Mode of the second phase."""
    plateau_updates: int | None = declared(Integer(min=1, max=10**9), None)
    """Also start the second phase when the 20-episode mean return gained less than plateau_delta
    over this many updates (None: off)."""
    plateau_delta: float = declared(Number(), 1.0)
    """Smallest gain in mean return that is not a plateau."""
    # --- design thresholds ---
    thresholds: bool = False
    """Apply the design's thresholds: a fast env (steps/s above fast_env_steps_per_s) favours
    co-located, a big env (memory above big_env_bytes) favours decoupled."""
    fast_env_steps_per_s: float = declared(Number(min=0.0, max=1e12, min_open=True), 5000.0)
    """Env step rate above which co-located is favoured."""
    big_env_bytes: int = declared(Integer(min=0, max=2**62, unit="bytes"), 4 << 30)
    """Per-env memory above which decoupled is favoured."""
    # --- measured check and hysteresis ---
    probe: bool = False
    """Before an automatic switch, measure the other mode and switch only if it is faster (or if
    capacity is needed: the memory threshold)."""
    probe_margin: float = declared(Number(min=1.0, max=1e6), 1.1)
    """The other mode must be this many times faster to win a probe."""
    min_dwell_updates: int = declared(Integer(min=0, max=10**9), 5)
    """Hysteresis: no automatic switch within this many updates of the previous switch."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class SwitchEvent:
    """One completed switch."""

    from_mode: str
    to_mode: str
    reason: str
    trigger: str
    """``"manual"`` or ``"auto"``."""
    at_step: int
    at_version: int
    pause_s: float
    """Wall-clock seconds between the old source's last batch and the new source being ready."""

    def to_dict(self) -> dict[str, Any]:
        """Return the event as plain JSON values."""
        return dict(self.__dict__)


@dataclass
class SeqIntervals:
    """The sequence numbers seen of one transition stream, kept as disjoint sorted runs (not one id each).

    A stream's ids arrive in order, so it stays one run however long the run goes; memory grows only with the
    holes and the out-of-order arrivals, never with the transitions.
    """

    lows: list[int] = field(default_factory=list)
    highs: list[int] = field(default_factory=list)
    size: int = 0
    """Ids added, duplicates included."""

    def add(self, seq: np.ndarray) -> None:
        """Record the ids of `seq` (any order; repeats are counted by `duplicates`)."""
        unique = np.unique(seq)
        self.size += int(seq.size)
        for run in np.split(unique, np.flatnonzero(np.diff(unique) != 1) + 1):
            if run.size:
                self._merge(int(run[0]), int(run[-1]))

    def _merge(self, lo: int, hi: int) -> None:
        first = bisect.bisect_left(self.highs, lo - 1)  # the first run that ends at or after lo - 1
        last = bisect.bisect_right(self.lows, hi + 1)  # past the last run that starts at or before hi + 1
        if first < last:
            lo, hi = min(lo, self.lows[first]), max(hi, self.highs[last - 1])
        self.lows[first:last] = [lo]
        self.highs[first:last] = [hi]

    @property
    def unique(self) -> int:
        """Distinct ids seen."""
        return sum(h - lo + 1 for lo, h in zip(self.lows, self.highs, strict=True))

    @property
    def duplicates(self) -> int:
        """Ids seen more than once (each repeat counts)."""
        return self.size - self.unique

    @property
    def gaps(self) -> int:
        """Ids missing between the smallest and the largest seen."""
        return self.highs[-1] - self.lows[0] + 1 - self.unique if self.lows else 0


@dataclass
class Accounting:
    """Transitions produced per source vs consumed by the learner, with duplicate and gap checks."""

    consumed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _seen: dict[tuple[str, int], SeqIntervals] = field(default_factory=lambda: defaultdict(SeqIntervals))

    def consume(self, batch: RolloutBatch) -> None:
        """Record that the learner used every transition of `batch` (one source's part of an update)."""
        self.consumed[batch.source] += batch.size
        for j, w in enumerate(batch.worker.tolist()):
            self._seen[(batch.source, int(w))].add(batch.seq[:, j])

    def check(self) -> dict[str, int]:
        """Return ``{"consumed", "duplicates", "gaps"}`` over every stream seen."""
        return {"consumed": sum(self.consumed.values()), "duplicates": sum(s.duplicates for s in self._seen.values()),
                "gaps": sum(s.gaps for s in self._seen.values())}


@dataclass
class _Request:
    to: str
    reason: str
    future: Future[SwitchEvent]


class Switcher:
    """Owns the rollout sources of one training job and swaps the active one at update boundaries.

    Args:
        builders: Mode name -> zero-argument function building that mode's `RolloutSource`.
        initial: The mode to start in.
        rules: Automatic switching rules.
        warm_standby: Build every mode at start and keep the inactive ones warm, so a switch is a
            reset rather than a start-up (the pause the design asks to keep under 500 ms).
        probe: ``probe(mode) -> env steps/s`` of a short measured run in that mode (for
            ``rules.probe``); None uses the sources' own `RolloutSource.probe`.
        env_profile: ``{"steps_per_s": ..., "bytes": ...}`` of one env, for the design thresholds.
        log: Where the reason of every switch is logged.
        first_version: The learner's policy version at start (names the first source's streams).
    """

    def __init__(self, *, builders: Mapping[str, Callable[[], RolloutSource]], initial: str,
                 rules: SwitchRules | None = None, warm_standby: bool = True,
                 probe: Callable[[str], float] | None = None, env_profile: Mapping[str, float] | None = None,
                 log: Callable[[str], None] = print, first_version: int = 0) -> None:
        if initial not in builders:
            raise ConfigError(f"Switcher: initial mode {initial!r} is not one of {sorted(builders)}")
        self.rules = rules or SwitchRules()
        for name in (self.rules.phase_to,) if self.rules.phase_steps or self.rules.plateau_updates else ():
            if name not in builders:
                raise ConfigError(f"SwitchRules: phase_to={name!r} is not a configured mode {sorted(builders)}; "
                                  "add it or change --phase-to")
        self._builders = dict(builders)
        self._sources: dict[str, RolloutSource] = {}
        self._probe = probe or (lambda mode: self._source(mode).probe())
        self._profile = dict(env_profile or {})
        self._log = log
        self._lock = threading.Lock()
        self._pending: _Request | None = None
        self._switching = False
        self._phase_done = False
        self._manual_override = False
        self._returns: list[float] = []
        self.mode = initial
        self.history: list[SwitchEvent] = []
        self._produced_before = 0  # by sources closed after a failure
        self.failovers = 0
        """Automatic moves away from a failed source (each is also in `history`)."""
        self.accounting = Accounting()
        self._last_switch_update: int | None = None
        self._source(initial).restart(incarnation=first_version)
        if warm_standby:
            for name in self._builders:
                self._source(name).prepare()

    # -- sources -----------------------------------------------------------------------------------

    def _source(self, mode: str) -> RolloutSource:
        if mode not in self._sources:
            self._sources[mode] = self._builders[mode]()
        return self._sources[mode]

    @property
    def active(self) -> RolloutSource:
        """The source feeding the learner now."""
        return self._sources[self.mode]

    @property
    def modes(self) -> list[str]:
        """Every configured mode."""
        return sorted(self._builders)

    def collect(self, *, policy_version: int, global_step: int) -> tuple[RolloutBatch, list[Any]]:
        """One update's batch from the active source, counted as consumed; a failed source is failed over."""
        failed: list[str] = []
        while True:
            try:
                parts, episodes = self.active.collect(policy_version=policy_version, global_step=global_step)
                break
            except StrataError as exc:
                failed.append(self.mode)
                self._fail_over(exc, failed, step=global_step, version=policy_version)
        for part in parts:
            self.accounting.consume(part)
        batch = parts[0] if len(parts) == 1 else RolloutBatch.concat_envs(parts, source=self.mode)
        return batch, episodes

    def _start(self, mode: str, *, incarnation: int) -> None:
        """Start `mode`'s source on fresh streams; a warm one that died while idle is replaced by a new one, once."""
        if mode in self._sources:
            try:
                self._source(mode).restart(incarnation=incarnation)
                return
            except Exception as exc:
                first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self._log(f"switcher: the warm {mode} source failed to start ({first_line[:300]}); starting it anew")
                self._drop(mode)
        try:
            self._source(mode).restart(incarnation=incarnation)
        except Exception:
            self._drop(mode)
            raise

    def _drop(self, mode: str) -> None:
        """Close `mode`'s source and forget it (a later use builds it afresh); what it produced stays counted."""
        source = self._sources.pop(mode, None)
        if source is None:
            return
        self._produced_before += source.produced()
        with contextlib.suppress(Exception):  # its processes may be dead already; closing must not mask the cause
            source.close()

    def _fail_over(self, exc: StrataError, failed: list[str], *, step: int, version: int) -> None:
        """Move from the failed active source to the first configured mode that has not failed; else re-raise."""
        broken = self.mode
        self._drop(broken)
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        for to in [m for m in self._builders if m not in failed]:
            started = time.perf_counter()
            try:
                self._start(to, incarnation=version)
            except Exception as start_exc:  # the next mode may still work
                self._log(f"switcher: failover to {to} failed while starting it: {start_exc}")
                failed.append(to)
                continue
            self.mode = to
            event = SwitchEvent(from_mode=broken, to_mode=to, reason=f"failover: {broken} failed: {first_line[:300]}",
                                trigger="auto", at_step=step, at_version=version,
                                pause_s=time.perf_counter() - started)
            self.history.append(event)
            self.failovers += 1
            self._log(f"switcher: {broken} -> {to} at step {step:,} (v{version}, auto): {event.reason}; "
                      f"pause {event.pause_s * 1000:.0f} ms")
            return
        raise exc

    def produced(self) -> int:
        """Transitions every source has produced."""
        return self._produced_before + sum(s.produced() for s in self._sources.values())

    # -- requests ----------------------------------------------------------------------------------

    def request(self, to: str, *, reason: str = "manual") -> Future[SwitchEvent]:
        """Ask for a switch to `to` at the next boundary; the future completes when it is done.

        Raises:
            SwitchRefused: `to` is unknown, already active, or another switch is pending.
        """
        with self._lock:
            if to not in self._builders:
                raise SwitchRefused(f"mode {to!r} is not configured for this run; choose one of {self.modes}")
            if self._pending is not None or self._switching:
                busy = self._pending.to if self._pending else "another mode"
                raise SwitchRefused(f"a switch to {busy!r} is already in progress; wait for it to finish")
            if to == self.mode:
                raise SwitchRefused(f"the run is already in mode {to!r}; nothing to do")
            self._pending = _Request(to, reason, Future())
            return self._pending.future

    # -- rules -------------------------------------------------------------------------------------

    def _auto_target(self, *, step: int, update: int, mean_return: float) -> tuple[str, str] | None:
        r = self.rules
        if self._manual_override:
            return None
        if self._last_switch_update is not None and update - self._last_switch_update < r.min_dwell_updates:
            return None
        if not self._phase_done and (r.phase_steps is not None or r.plateau_updates is not None):
            if r.phase_steps is not None and step >= r.phase_steps:
                return r.phase_to, f"phase schedule: {step:,} env steps >= phase_steps={r.phase_steps:,}"
            if r.plateau_updates is not None and not np.isnan(mean_return):
                self._returns.append(mean_return)
                window = self._returns[-(r.plateau_updates + 1):]
                if len(window) > r.plateau_updates and max(window) - window[0] < r.plateau_delta:
                    return r.phase_to, (f"phase schedule: return plateau (gain {max(window) - window[0]:.2f} < "
                                        f"{r.plateau_delta} over {r.plateau_updates} updates)")
            return None
        if r.thresholds and self._profile:
            if self._profile.get("bytes", 0.0) > r.big_env_bytes and "decoupled" in self._builders:
                return "decoupled", (f"threshold: env memory {self._profile['bytes'] / 2**30:.1f} GiB > "
                                     f"{r.big_env_bytes / 2**30:.1f} GiB favours decoupled")
            rate = self._profile.get("steps_per_s", 0.0)
            if rate > r.fast_env_steps_per_s and "colocated" in self._builders:
                return "colocated", (f"threshold: env steps {rate:,.0f}/s > {r.fast_env_steps_per_s:,.0f}/s "
                                     "favours co-located")
            if 0 < rate <= r.fast_env_steps_per_s and "decoupled" in self._builders:
                return "decoupled", (f"threshold: env steps {rate:,.0f}/s <= {r.fast_env_steps_per_s:,.0f}/s "
                                     "favours decoupled")
        return None

    def _probe_allows(self, to: str, reason: str) -> tuple[bool, str]:
        if not self.rules.probe or reason.startswith("threshold: env memory"):
            return True, reason
        here, there = self._probe(self.mode), self._probe(to)
        verdict = there >= self.rules.probe_margin * here
        note = f"{reason}; probe {to} {there:,.0f} vs {self.mode} {here:,.0f} steps/s"
        return verdict, note

    # -- the boundary ------------------------------------------------------------------------------

    def at_boundary(self, *, step: int, version: int, update: int, mean_return: float = float("nan"),
                    ) -> SwitchEvent | None:
        """Called by the learner between updates; performs a pending or rule-triggered switch."""
        with self._lock:
            request, self._pending = self._pending, None
            if request is not None:
                self._switching = True
        trigger = "manual"
        if request is None:
            target = self._auto_target(step=step, update=update, mean_return=mean_return)
            if target is None or target[0] == self.mode:
                return None
            allowed, reason = self._probe_allows(*target)
            self._phase_done = self._phase_done or reason.startswith("phase schedule")
            if not allowed:
                self._log(f"switcher: stays in {self.mode}: {reason}")
                self._last_switch_update = update
                return None
            with self._lock:
                if self._pending is not None:  # a manual request arrived meanwhile: it wins next time
                    return None
                self._switching = True
            request = _Request(target[0], reason, Future())
            trigger = "auto"
        try:
            event = self._switch(request.to, request.reason, trigger, step=step, version=version)
        except SwitchError as exc:  # the target would not start: the requester hears why, the run goes on
            request.future.set_exception(exc)
            self._log(f"switcher: {exc}")
            self._last_switch_update = update
            return None
        except BaseException as exc:
            request.future.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._switching = False
        self._last_switch_update = update
        if trigger == "manual" and not self._manual_override:
            self._manual_override = True
            self._log("switcher: manual switch: automatic rules are off for the rest of this run")
        request.future.set_result(event)
        return event

    def _switch(self, to: str, reason: str, trigger: str, *, step: int, version: int) -> SwitchEvent:
        started = time.perf_counter()
        previous = self.mode
        try:
            self._start(to, incarnation=version)
        except Exception as exc:
            raise SwitchError(f"switch {previous} -> {to} failed while starting {to}: {exc}; "
                              f"the run stays in {previous}") from exc
        self.mode = to
        event = SwitchEvent(from_mode=previous, to_mode=to, reason=reason, trigger=trigger, at_step=step,
                            at_version=version, pause_s=time.perf_counter() - started)
        self.history.append(event)
        self._log(f"switcher: {previous} -> {to} at step {step:,} (v{version}, {trigger}): {reason}; "
                  f"pause {event.pause_s * 1000:.0f} ms")
        return event

    def close(self) -> None:
        """Close every source; a pending request fails."""
        with self._lock:
            if self._pending is not None:
                self._pending.future.set_exception(SwitchRefused("the run ended before the switch"))
                self._pending = None
        for source in self._sources.values():
            source.close()
        self._sources.clear()
