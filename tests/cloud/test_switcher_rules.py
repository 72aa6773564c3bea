"""The switcher's state machine and rules, over a minimal in-memory source (the protocol under test)."""

from __future__ import annotations

import re
import threading
from typing import Any

import numpy as np
import pytest

from cloud.switching._control import SwitchRefused
from cloud.switching._switcher import Switcher, SwitchRules
from device import RolloutBatch


class CountingSource:
    """Produces [T=2, N=2] batches of numbered transitions; what the switcher sees of a real source."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.incarnation = -1
        self.seq = np.zeros(2, np.int64)
        self.count = 0
        self.closed = False

    def prepare(self) -> None:
        pass

    def restart(self, *, incarnation: int) -> None:
        self.incarnation = incarnation
        self.seq[:] = 0

    def collect(self, *, policy_version: int, global_step: int) -> tuple[list[RolloutBatch], list[Any]]:
        t, n = 2, 2
        seq = self.seq + np.arange(t)[:, None]
        self.seq += t
        self.count += t * n
        z = np.zeros((t, n), np.float32)
        batch = RolloutBatch(source=f"{self.mode}:{self.incarnation}", obs=np.zeros((t, n, 1), np.float32),
                             actions=np.zeros((t, n), np.int64), rewards=z, terminations=z.astype(bool),
                             truncations=z.astype(bool), final_obs=np.zeros((t, n, 1), np.float32),
                             next_obs=np.zeros((n, 1), np.float32), policy_version=np.zeros((t, n), np.int64),
                             worker=np.arange(n, dtype=np.int64), seq=seq)
        return [batch], []

    def produced(self) -> int:
        return self.count

    def workers(self) -> int:
        return 1

    def probe(self) -> float:
        return 1.0

    def close(self) -> None:
        self.closed = True


def make(rules: SwitchRules | None = None, **kw: Any) -> Switcher:
    return Switcher(builders={"colocated": lambda: CountingSource("colocated"),
                              "decoupled": lambda: CountingSource("decoupled")},
                    initial="colocated", rules=rules, log=lambda _: None, **kw)


def run(sw: Switcher, updates: int, start: int = 0) -> list[Any]:
    events = []
    for u in range(start, start + updates):
        sw.collect(policy_version=u, global_step=4 * u)
        event = sw.at_boundary(step=4 * (u + 1), version=u + 1, update=u + 1)
        if event:
            events.append(event)
    return events


def test_phase_schedule_fires_once_with_its_reason() -> None:
    sw = make(SwitchRules(phase_steps=20))
    events = run(sw, 20)
    assert [(e.from_mode, e.to_mode, e.trigger) for e in events] == [("colocated", "decoupled", "auto")]
    assert events[0].reason == "phase schedule: 20 env steps >= phase_steps=20"
    assert sw.mode == "decoupled"


def test_manual_requests_switch_both_ways_and_account_every_transition() -> None:
    sw = make()
    for k, to in enumerate(["decoupled", "colocated", "decoupled", "colocated"]):
        future = sw.request(to, reason="test")
        run(sw, 1, start=k)
        assert future.result(timeout=1).to_mode == to
    run(sw, 2, start=4)
    check = sw.accounting.check()
    assert check == {"consumed": sw.produced(), "duplicates": 0, "gaps": 0}
    assert len(sw.history) == 4


def test_refusals_are_clear() -> None:
    sw = make()
    with pytest.raises(SwitchRefused, match=re.escape("the run is already in mode 'colocated'; nothing to do")):
        sw.request("colocated")
    with pytest.raises(SwitchRefused, match=re.escape("mode 'gpu' is not configured for this run")):
        sw.request("gpu")
    sw.request("decoupled")
    with pytest.raises(SwitchRefused, match=re.escape("a switch to 'decoupled' is already in progress")):
        sw.request("decoupled")


def test_thresholds_with_hysteresis_never_flap() -> None:
    rates = iter([100.0] * 100)
    sw = make(SwitchRules(thresholds=True, min_dwell_updates=3), env_profile={"steps_per_s": next(rates)})
    events = run(sw, 30)
    # A slow env favours decoupled once; the rule then agrees with the active mode and stays quiet.
    assert [e.to_mode for e in events] == ["decoupled"]


def test_probe_refuses_a_slower_mode() -> None:
    speeds = {"colocated": 1000.0, "decoupled": 900.0}
    sw = make(SwitchRules(phase_steps=4, probe=True, min_dwell_updates=2), probe=speeds.__getitem__)
    assert run(sw, 10) == []
    assert sw.mode == "colocated"


def test_a_request_from_another_thread_completes_at_the_boundary() -> None:
    sw = make()
    results: list[Any] = []
    t = threading.Thread(target=lambda: results.append(sw.request("decoupled").result(timeout=5)))
    t.start()
    while sw._pending is None:
        pass
    run(sw, 1)
    t.join()
    assert results[0].to_mode == "decoupled" and results[0].pause_s >= 0


def test_a_manual_switch_overrides_the_automatic_rules() -> None:
    sw = make(SwitchRules(phase_steps=40, min_dwell_updates=0))
    sw.request("decoupled", reason="operator")
    run(sw, 1)
    sw.request("colocated", reason="operator")
    events = run(sw, 30, start=1)  # the phase schedule would fire at step 40, but the operator is in charge
    assert [e.trigger for e in sw.history] == ["manual", "manual"] and sw.mode == "colocated"
    assert events[-1].to_mode == "colocated"


def test_transition_accounting_memory_does_not_grow_with_the_transitions() -> None:
    # Found by benchmarks/soak.py: the accounting kept every consumed id, ~57 MB per hour of a CartPole run.
    import tracemalloc
    from types import SimpleNamespace

    from cloud.switching._switcher import Accounting

    accounting = Accounting()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for u in range(20_000):  # half an hour of 4 envs x 32 steps per update at 11 updates/s
            seq = np.arange(u * 32, (u + 1) * 32)[:, None].repeat(4, axis=1)
            accounting.consume(SimpleNamespace(source="colocated:0", size=128, worker=np.arange(4), seq=seq))
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert accounting.check() == {"consumed": 20_000 * 128, "duplicates": 0, "gaps": 0}
    assert grown < 1 << 20, f"{grown:,} bytes for 2.56 M transitions"


def test_transition_accounting_counts_duplicates_and_gaps_as_every_id_would() -> None:
    from cloud.switching._switcher import SeqIntervals

    rng = np.random.default_rng(0)
    for _ in range(300):
        parts = [rng.integers(0, 60, size=int(rng.integers(1, 12))) for _ in range(int(rng.integers(1, 8)))]
        seen = SeqIntervals()
        for part in parts:
            seen.add(part)
        ids = np.sort(np.concatenate(parts))
        unique = np.unique(ids)
        assert seen.duplicates == int(np.sum(ids[1:] == ids[:-1]))
        assert seen.gaps == int(unique[-1] - unique[0] + 1 - unique.size)
