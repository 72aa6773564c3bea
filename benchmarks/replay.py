"""Prioritized replay at capacity 1M: strata's sum-tree table vs a straightforward numpy implementation.

Both store the same transitions in preallocated numpy arrays. The baseline keeps a float64 priority
array and, per sampled batch, recomputes the probabilities from the whole array
(``p ** alpha / sum``) and draws with ``rng.choice(p=...)``; strata's table keeps float16 leaves
(``priority ** alpha``) under a float64 sum tree over blocks of 32 leaves, and draws a stratified batch
with one vectorised descent to the blocks and a vectorised search inside them. Measured in the same run:

- insert throughput: one transition per call (an actor's pattern) and 1000 per call;
- sample throughput: a batch of 256 plus its priority update (the learner's pattern), at a full table;
- memory: the table's preallocated bytes (and the process RSS growth while filling it) vs the raw
  bytes of the transitions, for a Pendulum-sized and a MuJoCo-sized transition;
- fidelity of the float16 leaves: at the full table, the largest relative error of the probability
  each item is sampled with vs the exact float64 ``p ** alpha / sum``; and a chi-square of 1M draws
  from a 1000-item table against the exact probabilities (stratified draws: expect <= df).

Usage: ``python benchmarks/replay.py [--quick] [--capacity N]``; the last output line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

from cloud.replay._tables import ReplayConfig, ReplayTable, Signature, item_nbytes

ALPHA, BETA, BATCH = 0.6, 0.4, 256
SIGNATURES: dict[str, Signature] = {
    # Pendulum-v1: obs 3, action 1
    "pendulum": {"obs": ((3,), "float32"), "action": ((1,), "float32"), "reward": ((), "float32"),
                 "next_obs": ((3,), "float32"), "done": ((), "bool")},
    # HalfCheetah-sized: obs 17, action 6
    "mujoco": {"obs": ((17,), "float32"), "action": ((6,), "float32"), "reward": ((), "float32"),
               "next_obs": ((17,), "float32"), "done": ((), "bool")},
}


class NaiveReplay:
    """The straightforward version: ring arrays plus a priority array scanned on every sample."""

    def __init__(self, signature: Signature, capacity: int, seed: int = 0) -> None:
        self.capacity = capacity
        self.arrays = {n: np.zeros((capacity, *s), d) for n, (s, d) in signature.items()}
        self.priorities = np.zeros(capacity, np.float64)
        self.max_priority = 1.0
        self.inserts = 0
        self.rng = np.random.default_rng(seed)

    def insert(self, items: dict[str, np.ndarray]) -> None:
        """Write `items` at the ring cursor with the highest priority seen."""
        k = next(iter(items.values())).shape[0]
        slots = (self.inserts + np.arange(k)) % self.capacity
        for name, arr in items.items():
            self.arrays[name][slots] = arr
        self.priorities[slots] = self.max_priority
        self.inserts += k

    def sample(self, n: int, beta: float) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Recompute the probabilities from the whole priority array and draw `n` items."""
        size = min(self.inserts, self.capacity)
        scaled = self.priorities[:size] ** ALPHA
        probs = scaled / scaled.sum()
        idx = self.rng.choice(size, n, p=probs)
        weights = (size * probs[idx]) ** -beta
        return {name: arr[idx] for name, arr in self.arrays.items()}, idx, weights / weights.max()

    def update_priorities(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        """Store new priorities."""
        self.priorities[idx] = priorities + 1e-6
        self.max_priority = max(self.max_priority, float(priorities.max()))

    def nbytes(self) -> int:
        """Bytes of the preallocated arrays."""
        return sum(a.nbytes for a in self.arrays.values()) + self.priorities.nbytes


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def batch_of(signature: Signature, k: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {n: rng.normal(size=(k, *s)).astype(d) if d != "bool" else rng.random(k) < 0.01
            for n, (s, d) in signature.items()}


def rate(fn: Callable[[], None], calls: int, repeats: int) -> float:
    """Median calls per second over `repeats` timings of `calls` calls."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rates.append(calls / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller capacity and fewer repeats (< 1 minute)")
    parser.add_argument("--capacity", type=int, default=None, help="table capacity (default: 1M, quick: 200k)")
    args = parser.parse_args()
    capacity = args.capacity or (200_000 if args.quick else 1_000_000)
    repeats = 3 if args.quick else 5
    rng = np.random.default_rng(0)
    sig = SIGNATURES["mujoco"]
    one = batch_of(sig, 1, rng)
    thousand = batch_of(sig, 1000, rng)

    rss0 = rss_bytes()
    ours = ReplayTable.create(sig, ReplayConfig(capacity=capacity, alpha=ALPHA), seed=0)
    naive = NaiveReplay(sig, capacity)

    # -- insert ---------------------------------------------------------------------------------------------
    results: dict[str, float] = {}
    results["insert1_ours_per_s"] = rate(lambda: ours.insert(one), 5000, repeats)
    results["insert1_naive_per_s"] = rate(lambda: naive.insert(one), 5000, repeats)
    results["insert1000_ours_items_per_s"] = 1000 * rate(lambda: ours.insert(thousand), 50, repeats)
    results["insert1000_naive_items_per_s"] = 1000 * rate(lambda: naive.insert(thousand), 50, repeats)
    while ours.stats().inserts < capacity:  # fill both tables completely
        ours.insert(thousand)
    while naive.inserts < capacity:
        naive.insert(thousand)
    rss_full = rss_bytes()
    spread = rng.random(capacity) * 10
    ours.update_priorities(np.arange(ours.stats().inserts - capacity, ours.stats().inserts), spread)
    naive.update_priorities(np.arange(capacity), spread)

    # -- fidelity of the float16 leaves ---------------------------------------------------------------------
    exact = (spread + 1e-6) ** ALPHA
    exact /= exact.sum()
    slots = (ours.stats().inserts - capacity + np.arange(capacity)) % capacity  # spread[j]'s item's slot
    stored = ours._prio[slots].astype(np.float64) / float(ours._tree[1])
    fidelity_max_rel = float(np.max(np.abs(stored - exact) / exact))
    chi_n, chi_draws = 1000, 200_000 if args.quick else 1_000_000
    chi_pri = 10.0 ** rng.uniform(-3, 3, chi_n)
    chi_exact = (chi_pri + 1e-6) ** ALPHA
    chi_exact /= chi_exact.sum()
    with ReplayTable.create({"x": ((), "int32")}, ReplayConfig(capacity=chi_n, alpha=ALPHA), seed=1) as small:
        small.insert({"x": np.zeros(chi_n, np.int32)})
        small.update_priorities(np.arange(chi_n), chi_pri)
        counts = np.zeros(chi_n)
        for _ in range(chi_draws // 1000):
            drawn = small.sample(1000, timeout=0)
            assert drawn is not None
            counts += np.bincount(drawn.keys, minlength=chi_n)
    chi2 = float(((counts - counts.sum() * chi_exact) ** 2 / (counts.sum() * chi_exact)).sum())

    # -- sample + priority update -----------------------------------------------------------------------------
    def ours_step() -> None:
        batch = ours.sample(BATCH, beta=BETA, timeout=0)
        assert batch is not None
        ours.update_priorities(batch.keys, rng.random(BATCH))

    def naive_step() -> None:
        _, idx, _ = naive.sample(BATCH, BETA)
        naive.update_priorities(idx, rng.random(BATCH))

    results["sample_ours_batches_per_s"] = rate(ours_step, 200, repeats)
    results["sample_naive_batches_per_s"] = rate(naive_step, 3 if args.quick else 5, repeats)

    # -- memory -----------------------------------------------------------------------------------------------
    memory = {}
    for name, signature in SIGNATURES.items():
        with ReplayTable.create(signature, ReplayConfig(capacity=capacity, alpha=ALPHA)) as t:
            raw = capacity * item_nbytes(signature)
            memory[name] = {"item_bytes": item_nbytes(signature), "raw_bytes": raw, "table_bytes": t.stats().nbytes,
                            "ratio": t.stats().nbytes / raw,
                            "naive_ratio": NaiveReplay(signature, 1).nbytes() / item_nbytes(signature)}
    ours_nbytes = ours.stats().nbytes
    ours.close()

    speedup = results["sample_ours_batches_per_s"] / results["sample_naive_batches_per_s"]
    print(f"capacity {capacity:,}, MuJoCo-sized transitions ({item_nbytes(sig)} B), batch {BATCH}, alpha {ALPHA}; "
          f"medians of {repeats} repeats (machine shared and loaded)")
    print(f"{'':38}{'strata':>14}{'naive numpy':>14}{'ratio':>9}")
    rows = [("insert, 1 per call (items/s)", "insert1_ours_per_s", "insert1_naive_per_s"),
            ("insert, 1000 per call (items/s)", "insert1000_ours_items_per_s", "insert1000_naive_items_per_s"),
            ("sample 256 + update (batches/s)", "sample_ours_batches_per_s", "sample_naive_batches_per_s")]
    for label, a, b in rows:
        print(f"{label:38}{results[a]:>14,.0f}{results[b]:>14,.1f}{results[a] / results[b]:>8.1f}x")
    for name, m in memory.items():
        print(f"memory {name:9} ({m['item_bytes']:3} B/item): table {m['table_bytes'] / 2**20:8.1f} MiB for "
              f"{m['raw_bytes'] / 2**20:8.1f} MiB raw = {m['ratio']:.3f}x (naive with float64 priorities "
              f"{m['naive_ratio']:.3f}x)")
    print(f"fidelity: max relative error of an item's sampling probability vs exact ({capacity:,} items, "
          f"priorities in [0, 10)): {fidelity_max_rel:.2e}; chi-square of {chi_draws:,} draws over {chi_n} items with "
          f"priorities over six decades: {chi2:.0f} (df {chi_n - 1})")
    print(f"process RSS growth while creating and filling both MuJoCo tables: {(rss_full - rss0) / 2**20:.1f} MiB "
          f"(strata {ours_nbytes / 2**20:.1f} MiB + naive {naive.nbytes() / 2**20:.1f} MiB preallocated)")
    print(json.dumps({"benchmark": "replay", "capacity": capacity, "quick": args.quick,
                      **{k: round(v, 1) for k, v in results.items()},
                      "sample_speedup": round(speedup, 1),
                      "insert1_ratio": round(results["insert1_ours_per_s"] / results["insert1_naive_per_s"], 2),
                      "memory_ratio_mujoco": round(memory["mujoco"]["ratio"], 4),
                      "memory_ratio_pendulum": round(memory["pendulum"]["ratio"], 4),
                      "fidelity_max_rel_error": float(f"{fidelity_max_rel:.3g}"),
                      "chi2": round(chi2, 1), "chi2_df": chi_n - 1,
                      "rss_growth_mib": round((rss_full - rss0) / 2**20, 1)}))


if __name__ == "__main__":
    main()
