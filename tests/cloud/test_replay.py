"""The replay service: the same tests against the shared-memory and the gRPC deployment."""

from __future__ import annotations

import multiprocessing
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from cloud.replay._factory import make_replay
from cloud.replay._grpc import ReplayServer
from cloud.replay._tables import (
    Replay,
    ReplayConfig,
    ReplayError,
    ReplayHandle,
    ReplayTable,
    Signature,
    annealed_beta,
    load_state_file,
)
from device import ConfigError

REPO = Path(__file__).resolve().parents[2]
SIG: Signature = {"obs": ((3,), "float32"), "action": ((1,), "float32"), "reward": ((), "float32"),
                  "done": ((), "bool"), "step": ((), "int64")}

MakeReplay = Callable[..., Replay]


def items(start: int, k: int) -> dict[str, np.ndarray]:
    steps = np.arange(start, start + k)
    return {
        "obs": np.stack([steps, steps + 0.5, -steps], axis=1).astype(np.float32),
        "action": (steps % 7).astype(np.float32)[:, None],
        "reward": steps.astype(np.float32),
        "done": steps % 5 == 0,
        "step": steps,
    }


@pytest.fixture(params=["shared_memory", "grpc"])
def make(request: pytest.FixtureRequest) -> Iterator[MakeReplay]:
    """Build a replay of the parametrized deployment; everything is closed after the test."""
    opened: list[Replay] = []
    servers: list[ReplayServer] = []

    def build(config: ReplayConfig, signature: Signature = SIG, seed: int = 0) -> Replay:
        if request.param == "grpc":
            server = ReplayServer(signature, config, seed=seed).start()
            servers.append(server)
            replay = make_replay("grpc", signature, config, address=server.address)
        else:
            replay = make_replay("shared_memory", signature, config, seed=seed)
        opened.append(replay)
        return replay

    yield build
    for replay in opened:
        replay.close()
    for server in servers:
        server.stop(grace=None)


def test_insert_then_sample_returns_what_was_inserted(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=100, prioritized=False))
    assert replay.insert(items(0, 10))
    batch = replay.sample(32)
    assert batch is not None
    steps = batch.data["step"]
    assert set(steps) <= set(range(10)) and steps.shape == (32,)
    np.testing.assert_array_equal(batch.data["reward"], steps.astype(np.float32))
    np.testing.assert_array_equal(batch.data["obs"][:, 1], steps + 0.5)
    np.testing.assert_array_equal(batch.data["done"], steps % 5 == 0)
    np.testing.assert_array_equal(batch.keys, steps)  # key = global insert sequence number
    np.testing.assert_array_equal(batch.weights, np.ones(32, np.float32))
    stats = replay.stats()
    assert (stats.size, stats.capacity, stats.inserts, stats.samples) == (10, 100, 10, 32)
    assert stats.item_nbytes == 12 + 4 + 4 + 1 + 8


def test_ring_overwrites_the_oldest(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=8, prioritized=False))
    replay.insert(items(0, 6))
    replay.insert(items(6, 6))
    meta, arrays = replay.export_state()
    np.testing.assert_array_equal(arrays["step"], np.arange(4, 12))
    assert replay.stats().size == 8 and meta["inserts"] == 12


def test_prioritized_sampling_follows_priority_to_the_alpha(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=4, alpha=0.5, priority_eps=1e-9), seed=1)
    replay.insert(items(0, 4))
    replay.update_priorities(np.arange(4), np.array([1.0, 4.0, 9.0, 16.0]))  # ** 0.5 -> 1 : 2 : 3 : 4
    counts = np.zeros(4)
    for _ in range(50):
        batch = replay.sample(200)
        assert batch is not None
        counts += np.bincount(batch.keys, minlength=4)
    np.testing.assert_allclose(counts / counts.sum(), [0.1, 0.2, 0.3, 0.4], atol=0.01)
    np.testing.assert_allclose(np.sort(np.unique(batch.probabilities)), [0.1, 0.2, 0.3, 0.4], rtol=1e-5)


def test_importance_weights_match_hand_computed_values(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=2, alpha=1.0, priority_eps=1e-9))
    replay.insert(items(0, 2))
    replay.update_priorities(np.array([0, 1]), np.array([1.0, 3.0]))
    batch = replay.sample(64, beta=1.0)
    assert batch is not None
    # P = [0.25, 0.75], N = 2: w = (N P) ** -1 = [2, 2/3], divided by the max -> [1, 1/3]
    expected = np.where(batch.keys == 0, 1.0, 1.0 / 3.0)
    np.testing.assert_allclose(batch.weights, expected, rtol=1e-5)
    half = replay.sample(64, beta=0.5)
    assert half is not None
    np.testing.assert_allclose(half.weights, np.where(half.keys == 0, 1.0, (1 / 3) ** 0.5), rtol=1e-5)


def test_new_items_get_the_highest_priority_seen(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=4, alpha=1.0, priority_eps=1e-9))
    replay.insert(items(0, 1))
    replay.update_priorities(np.array([0]), np.array([5.0]))
    replay.insert(items(1, 1))
    batch = replay.sample(100)
    assert batch is not None
    np.testing.assert_allclose(batch.probabilities, 0.5, rtol=1e-5)


def test_priority_updates_for_overwritten_items_are_ignored(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=2, alpha=1.0, priority_eps=1e-9))
    replay.insert(items(0, 2))
    replay.insert(items(2, 2))  # keys 0, 1 are gone; slots now hold keys 2, 3
    replay.update_priorities(np.array([0, 1, 3]), np.array([100.0, 100.0, 3.0]))
    batch = replay.sample(64)
    assert batch is not None
    assert set(batch.keys) == {2, 3}
    np.testing.assert_allclose(np.where(batch.keys == 3, 0.75, 0.25), batch.probabilities, rtol=1e-5)


def test_min_size_holds_samples_without_blocking_when_asked(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=100, min_size_to_sample=5))
    replay.insert(items(0, 4))
    assert replay.sample(2, timeout=0) is None
    started = time.monotonic()
    assert replay.sample(2, timeout=0.2) is None
    assert 0.15 < time.monotonic() - started < 60  # it waited its timeout; the bound fails only a hang
    assert replay.stats().samples == 0
    replay.insert(items(4, 1))
    assert replay.sample(2, timeout=0) is not None


def test_sample_to_insert_ratio_is_held_within_the_error_buffer(make: MakeReplay) -> None:
    # spi = 4: each insert earns 4 sampled items; the window is 4 * min_size +- 8.
    replay = make(ReplayConfig(capacity=100, min_size_to_sample=2, samples_per_insert=4.0, error_buffer=8.0))
    inserted = 0
    while replay.insert(items(inserted, 1), timeout=0):
        inserted += 1
    assert inserted == 4  # diff = 4 * 4 = 16 = 8 + 8 fills the window; a fifth insert would overshoot
    sampled = 0
    while replay.sample(4, timeout=0) is not None:
        sampled += 4
    assert sampled == 16  # diff back to 0 = 8 - 8
    assert replay.insert(items(inserted, 1), timeout=0)
    stats = replay.stats()
    assert (stats.inserts, stats.samples) == (5, 16)


def test_a_blocked_sample_resumes_when_an_insert_arrives(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=100, min_size_to_sample=3))
    replay.insert(items(0, 2))
    result: list[object] = []
    waiter = threading.Thread(target=lambda: result.append(replay.sample(4, timeout=20)))
    waiter.start()
    time.sleep(0.1)
    assert not result
    replay.insert(items(2, 1))
    waiter.join(20)
    assert result and result[0] is not None


def test_window_too_small_for_the_batch_is_a_clear_error(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=100, samples_per_insert=2.0, error_buffer=4.0))
    replay.insert(items(0, 3))
    with pytest.raises(ReplayError, match=re.escape(
        "Replay.sample: batch_size=8 plus samples_per_insert=2.0 exceeds the rate limiter's window "
        "2 * error_buffer = 8.0, so inserts and samples could both wait forever; raise error_buffer"
    )):
        replay.sample(8, timeout=0)


def test_bad_inserts_and_updates_name_the_problem(make: MakeReplay) -> None:
    replay = make(ReplayConfig(capacity=10))
    bad = items(0, 2)
    del bad["step"]
    with pytest.raises(ReplayError, match=re.escape(
        "Replay.insert: got fields ['action', 'done', 'obs', 'reward'], the table's signature has "
        "['action', 'done', 'obs', 'reward', 'step']"
    )):
        replay.insert(bad)
    wrong = {**items(0, 2), "obs": np.zeros((2, 4), np.float32)}
    with pytest.raises(ReplayError, match=re.escape("Replay.insert: field 'obs' has shape (2, 4); expected [k, 3]")):
        replay.insert(wrong)
    with pytest.raises(ReplayError, match=re.escape("Replay.update_priorities: 2 keys but 1 priorities")):
        replay.update_priorities(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ReplayError, match=re.escape("priorities must be finite and >= 0")):
        replay.update_priorities(np.array([0]), np.array([np.nan]))


@pytest.mark.parametrize("to_kind", ["shared_memory", "grpc"])
def test_checkpoint_restore_round_trips_between_deployments(make: MakeReplay, to_kind: str, tmp_path: Path) -> None:
    config = ReplayConfig(capacity=16, alpha=1.0)
    source = make(config)
    source.insert(items(0, 12))
    source.insert(items(12, 8))
    source.update_priorities(np.arange(4, 20), np.linspace(0.1, 2.0, 16))
    source.sample(8)
    path = source.checkpoint(tmp_path / "replay.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["replay.npz"]  # the temp file was renamed into place
    meta, arrays = load_state_file(path)
    assert meta["inserts"] == 20 and "_meta" not in arrays

    if to_kind == "grpc":
        server = ReplayServer(SIG, config).start()
        target: Replay = make_replay("grpc", SIG, config, address=server.address)
    else:
        server = None
        target = make_replay("shared_memory", SIG, config)
    try:
        target.restore(path)
        assert target.stats() == source.stats()
        m1, a1 = source.export_state()
        m2, a2 = target.export_state()
        assert m1 == m2 and a1.keys() == a2.keys()
        for name in a1:
            np.testing.assert_array_equal(a1[name], a2[name])
        with pytest.raises(ReplayError, match=re.escape(
            "Replay.load_state: the table already holds 20 inserts; load state only into a new, empty table"
        )):
            target.restore(path)
    finally:
        target.close()
        if server is not None:
            server.stop(grace=None)


def test_restore_refuses_another_signature(make: MakeReplay, tmp_path: Path) -> None:
    source = make(ReplayConfig(capacity=4))
    source.insert(items(0, 2))
    path = source.checkpoint(tmp_path / "r.npz")
    other = make(ReplayConfig(capacity=4), signature={"obs": ((2,), "float32")})
    with pytest.raises(ReplayError, match=re.escape("Replay.load_state: the state's signature")):
        other.restore(path)


def test_a_smaller_table_keeps_the_newest_items_under_their_keys(tmp_path: Path) -> None:
    big = ReplayTable.create(SIG, ReplayConfig(capacity=10))
    small = ReplayTable.create(SIG, ReplayConfig(capacity=4))
    with big, small:
        big.insert(items(0, 7))
        small.load_state(*big.export_state())
        _, arrays = small.export_state()
        np.testing.assert_array_equal(arrays["step"], [3, 4, 5, 6])
        batch = small.sample(16)
        assert batch is not None
        np.testing.assert_array_equal(batch.keys, batch.data["step"])


def test_checkpoint_files_are_never_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "evil.npz"
    np.savez(path, _meta=np.frombuffer(b'{"format": 1}', np.uint8), obs=np.array([object()], dtype=object))
    with pytest.raises(ReplayError, match=re.escape("Replay.restore: cannot read checkpoint")):
        load_state_file(path)


def test_two_level_descent_matches_a_cumulative_sum_search_over_the_stored_leaves() -> None:
    rng = np.random.default_rng(3)
    # 1000 slots: 31 full blocks of 32 and one partial block, under a block tree padded to 32 leaves
    with ReplayTable.create({"x": ((), "float32")}, ReplayConfig(capacity=1000, alpha=1.0, priority_eps=1e-9)) as t:
        t.insert({"x": np.zeros(1000, np.float32)})
        t.update_priorities(np.arange(1000), rng.random(1000) ** 4)
        leaves = t._prio[:1000].astype(np.float64)
        targets = np.concatenate([rng.random(5000) * leaves.sum(), [0.0, leaves.sum(), leaves.sum() * 2]])
        expected = np.minimum(np.searchsorted(np.cumsum(leaves), targets, side="right"), 999)
        got = t._descend(targets)
        assert np.mean(got == expected) > 0.9995  # float64 sums in another order may move a boundary target
        assert np.all(got < 1000)  # targets at or past the total stay on filled slots


def test_block_sums_and_tree_stay_exact_under_updates() -> None:
    rng = np.random.default_rng(4)
    with ReplayTable.create({"x": ((), "float32")}, ReplayConfig(capacity=300, alpha=0.7)) as t:
        for k in (1, 5, 17, 40, 100, 300, 3):  # single-slot, scalar-path and vectorised-path updates
            t.insert({"x": np.zeros(k, np.float32)})
            inserts = t.stats().inserts
            keys = rng.integers(max(inserts - 300, 0), inserts, size=k)
            t.update_priorities(keys, rng.random(k) * 10)
            sums = t._prio_blocks.astype(np.float64).sum(axis=1)
            np.testing.assert_array_equal(t._tree[t._leaves : t._leaves + sums.shape[0]], sums)
            for node in range(1, t._leaves):
                assert t._tree[node] == t._tree[2 * node] + t._tree[2 * node + 1]


def test_sampling_distribution_matches_the_exact_probabilities() -> None:
    """Fidelity of the float16 leaves: per-item probabilities and a chi-square over 250k draws."""
    rng = np.random.default_rng(5)
    n, alpha, eps = 500, 0.6, 1e-6
    priorities = 10.0 ** rng.uniform(-3, 3, n)  # six decades of |TD error|
    exact = (priorities + eps) ** alpha
    exact /= exact.sum()
    with ReplayTable.create({"x": ((), "int64")}, ReplayConfig(capacity=n, alpha=alpha, priority_eps=eps), seed=5) as t:
        t.insert({"x": np.arange(n)})
        t.update_priorities(np.arange(n), priorities)
        counts = np.zeros(n)
        for _ in range(500):
            batch = t.sample(500)
            assert batch is not None
            counts += np.bincount(batch.keys, minlength=n)
            # the reported probabilities are within float16 rounding (2 ** -11 per leaf, and in the total)
            np.testing.assert_allclose(batch.probabilities, exact[batch.keys], rtol=2.0**-10)
        expected = counts.sum() * exact
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        df = n - 1
        assert chi2 < df + 5 * np.sqrt(2 * df), chi2  # stratified draws are, if anything, below df


def test_extreme_priorities_saturate_but_never_reach_zero_or_infinity() -> None:
    with ReplayTable.create(SIG, ReplayConfig(capacity=3, alpha=1.0, priority_eps=1e-12)) as t:
        t.insert(items(0, 3))
        t.update_priorities(np.arange(3), np.array([0.0, 1.0, 1e9]))
        assert float(t._prio[0]) > 0.0 and np.isfinite(float(t._prio[2]))
        assert float(t._prio[2]) == float(np.finfo(np.float16).max)
        batch = t.sample(64)
        assert batch is not None and np.all(np.isfinite(batch.weights)) and np.all(batch.probabilities > 0)


def test_keys_are_derived_correctly_over_many_wraps_and_stale_keys_are_ignored() -> None:
    rng = np.random.default_rng(6)
    cap = 37  # not a multiple of the block size
    with ReplayTable.create(SIG, ReplayConfig(capacity=cap, alpha=1.0, priority_eps=1e-9), seed=6) as t:
        inserts = 0
        old_keys = np.zeros(0, np.int64)
        for _ in range(40):
            k = int(rng.integers(1, 30))
            t.insert(items(inserts, k))
            inserts += k
            batch = t.sample(64)
            assert batch is not None
            np.testing.assert_array_equal(batch.keys, batch.data["step"])  # key = the item's insert number
            assert batch.keys.min() >= max(inserts - cap, 0) and batch.keys.max() < inserts
            old_keys = np.concatenate([old_keys, batch.keys])
        before = t._prio.copy()
        stale = np.unique(old_keys[old_keys < inserts - cap])
        assert stale.size > 0
        t.update_priorities(stale, np.full(stale.size, 1e3))  # every one of them was overwritten since
        np.testing.assert_array_equal(t._prio, before)
        live = inserts - 1
        t.update_priorities(np.array([live - cap, live]), np.array([1e3, 7.0]))  # live - cap is one lap too old
        assert float(t._prio[live % cap]) == 7.0
        np.testing.assert_array_equal(np.delete(t._prio, live % cap), np.delete(before, live % cap))


def test_checkpoint_round_trip_keeps_leaves_tree_and_keys(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    config = ReplayConfig(capacity=100, alpha=0.6)
    with ReplayTable.create(SIG, config, seed=1) as source, ReplayTable.create(SIG, config, seed=1) as target:
        source.insert(items(0, 90))
        source.insert(items(90, 73))  # wraps: slots 90..99 then 0..62
        source.update_priorities(np.arange(63, 163), rng.random(100) * 5)
        path = source.checkpoint(tmp_path / "replay.npz")
        meta, arrays = load_state_file(path)
        assert meta["format"] == 1 and arrays["_priority"].dtype == np.float32
        target.restore(path)
        np.testing.assert_array_equal(target._prio, source._prio)
        np.testing.assert_array_equal(target._tree, source._tree)
        a, b = source.sample(256), target.sample(256)
        assert a is not None and b is not None
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(b.keys, b.data["step"])
        np.testing.assert_array_equal(a.probabilities, b.probabilities)


def test_format_1_checkpoints_with_float32_leaves_still_load(tmp_path: Path) -> None:
    # What the earlier float32-tree table wrote: the same format, leaves as float32 priority ** alpha.
    with ReplayTable.create(SIG, ReplayConfig(capacity=4, alpha=1.0, priority_eps=1e-9)) as t:
        meta, arrays = t.export_state()
        meta.update(inserts=6, samples=0, max_priority=3.0)
        arrays = {name: items(2, 4)[name] for name in SIG}
        arrays["_priority"] = np.array([1.0001, 2.0, 3.0, 1e6], np.float32)
        t.load_state(meta, arrays)
        np.testing.assert_array_equal(t._prio[[2, 3, 0, 1]], np.array([1.0001, 2.0, 3.0, 65504.0], np.float16))
        batch = t.sample(32)
        assert batch is not None
        np.testing.assert_array_equal(batch.keys, batch.data["step"])


def test_memory_is_bounded_by_construction() -> None:
    sig: Signature = {"obs": ((17,), "float32"), "action": ((6,), "float32"), "reward": ((), "float32"),
                      "next_obs": ((17,), "float32"), "done": ((), "bool")}
    with ReplayTable.create(sig, ReplayConfig(capacity=100_000)) as table:
        stats = table.stats()
        assert stats.item_nbytes == 165
        assert stats.nbytes <= 1.1 * 100_000 * 165
        table.insert({n: np.zeros((1000, *s), d) for n, (s, d) in sig.items()})
        assert table.stats().nbytes == stats.nbytes


def test_small_transitions_stay_within_1_1x_at_capacity_1m() -> None:
    pendulum: Signature = {"obs": ((3,), "float32"), "action": ((1,), "float32"), "reward": ((), "float32"),
                           "next_obs": ((3,), "float32"), "done": ((), "bool")}
    with ReplayTable.create(pendulum, ReplayConfig(capacity=1_000_000)) as table:
        stats = table.stats()
        assert stats.item_nbytes == 33
        overhead = (stats.nbytes - 1_000_000 * 33) / 1_000_000
        assert overhead <= 2.6  # float16 leaf + the block tree's share; uniform tables need none
        assert stats.nbytes <= 1.1 * 1_000_000 * 33


def test_config_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match=re.escape(
        "ReplayConfig: error_buffer=1.0 is smaller than samples_per_insert=4.0"
    )):
        ReplayConfig(samples_per_insert=4.0, error_buffer=1.0)
    with pytest.raises(ConfigError, match=re.escape("make_replay: kind='grpc' needs address='host:port'")):
        make_replay("grpc", SIG, ReplayConfig())
    with pytest.raises(ReplayError, match=re.escape("ReplayTable.handle: this table is local")):
        ReplayTable.create(SIG, ReplayConfig(capacity=2)).handle()


def test_annealed_beta() -> None:
    assert annealed_beta(0, 100, beta_start=0.4) == 0.4
    assert annealed_beta(50, 100, beta_start=0.4) == pytest.approx(0.7)
    assert annealed_beta(500, 100, beta_start=0.4) == 1.0


def _actor(handle: ReplayHandle, start: int, count: int) -> None:
    table = ReplayTable.attach(handle)
    try:
        for i in range(start, start + count, 10):
            assert table.insert(items(i, 10), timeout=30)
    finally:
        table.close()


def test_actor_processes_insert_through_shared_memory() -> None:
    ctx = multiprocessing.get_context("spawn")
    config = ReplayConfig(capacity=1000, min_size_to_sample=50, samples_per_insert=1.0, error_buffer=100.0)
    with ReplayTable.create(SIG, config, shared=True, seed=0) as table:
        actors = [ctx.Process(target=_actor, args=(table.handle(), 1000 * i, 300)) for i in range(2)]
        for p in actors:
            p.start()
        sampled = 0
        while sampled < 500:  # the limiter keeps the actors at most ~100 items ahead of the learner
            batch = table.sample(25, timeout=30)
            assert batch is not None
            sampled += 25
            stats = table.stats()
            assert stats.inserts * 1.0 - stats.samples <= 50 + 100 + 10
        for p in actors:
            p.join(30)
            assert p.exitcode == 0
        _, arrays = table.export_state()
        assert sorted(arrays["step"]) == [*range(300), *range(1000, 1300)]


def test_attach_to_a_closed_table_is_a_clear_error() -> None:
    table = ReplayTable.create(SIG, ReplayConfig(capacity=2), shared=True)
    handle = table.handle()
    table.close()
    with pytest.raises(ReplayError, match=re.escape(f"ReplayTable.attach: no shared-memory segment {handle.name!r}")):
        ReplayTable.attach(handle)


def test_generated_proto_code_is_up_to_date(tmp_path: Path) -> None:
    subprocess.run([str(REPO / "scripts" / "gen_replay_proto.sh"), str(tmp_path)], check=True, capture_output=True)
    for path in sorted((REPO / "cloud" / "replay" / "_proto").glob("*.py*")):
        assert (tmp_path / path.name).read_text() == path.read_text(), path.name


def test_large_inserts_that_wrap_keep_the_tree_and_keys_consistent() -> None:
    with ReplayTable.create(SIG, ReplayConfig(capacity=64, alpha=1.0, priority_eps=1e-9), seed=0) as table:
        table.insert(items(0, 50))
        table.update_priorities(np.arange(50), np.linspace(1.0, 2.0, 50))
        table.insert(items(50, 50))  # slots 50..63 then 0..35: two runs, the blocks and tree updated per run
        _, arrays = table.export_state()
        np.testing.assert_array_equal(arrays["step"], np.arange(36, 100))
        sums = table._prio_blocks.astype(np.float64).sum(axis=1)
        np.testing.assert_array_equal(table._tree[table._leaves : table._leaves + 2], sums)
        assert table._tree[1] == pytest.approx(table._prio[:64].astype(np.float64).sum(), rel=1e-12)
        batch = table.sample(500)
        assert batch is not None
        np.testing.assert_array_equal(batch.keys, batch.data["step"])
        assert batch.keys.min() >= 36


def _grpc_actor(address: str, start: int, count: int) -> None:
    from cloud.replay._grpc import GrpcReplayClient

    client = GrpcReplayClient(address, signature=SIG)
    try:
        for i in range(start, start + count, 10):
            assert client.insert(items(i, 10), timeout=30)
    finally:
        client.close()


def test_decoupled_actor_processes_insert_over_grpc() -> None:
    ctx = multiprocessing.get_context("spawn")
    config = ReplayConfig(capacity=1000, min_size_to_sample=50, samples_per_insert=1.0, error_buffer=100.0)
    with ReplayServer(SIG, config, seed=0) as server:
        learner = make_replay("grpc", SIG, config, address=server.address)
        actors = [ctx.Process(target=_grpc_actor, args=(server.address, 1000 * i, 200)) for i in range(2)]
        for p in actors:
            p.start()
        sampled = 0
        while sampled < 300:
            batch = learner.sample(25, timeout=30)
            assert batch is not None
            sampled += 25
        for p in actors:
            p.join(30)
            assert p.exitcode == 0
        _, arrays = learner.export_state()
        assert sorted(arrays["step"]) == [*range(200), *range(1000, 1200)]
        learner.close()
