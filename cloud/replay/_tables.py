"""Prioritized experience replay: a preallocated ring buffer, a two-level sum tree and a Reverb-style rate limiter.

One `ReplayTable` holds every array in a single buffer allocated at construction, so its memory is
bounded by construction and `ReplayStats.nbytes` is exact:

    fields     [capacity, *shape] per signature field   the transitions, in ring order
    _prio      float16 [nblocks * B]                    priority ** alpha per slot, in ring order (prioritized only)
    _tree      float64 [2 * P]                          sum tree over the sums of blocks of B leaves (prioritized only)
    _counters  int64 [2] + float64 [1]                  inserts, samples, max priority seen

with B = 32, nblocks = ceil(capacity / B) and P the next power of 2 >= nblocks.

About 2.5 bytes per slot at capacity 1M (2 for the leaf, 0.5 for the block tree). A prioritized batch
is one vectorised descent of the block tree for the whole batch, then a vectorised cumulative search
inside each drawn block of B leaves; an update rewrites leaves, recomputes each touched block's sum
from its leaves (exact, no drift from deltas) and the block's path to the root.

Precision: leaves hold ``(priority + priority_eps) ** alpha`` rounded to float16, clipped to
[2**-24, 65504] (so no stored item has probability zero; values above 65504, e.g. priority > 1e8 at
alpha 0.6, saturate). Between 2**-14 and 65504 the rounding error is at most 2**-11 relative (0.05 %),
below 2**-14 at most 2**-25 absolute. Sampling is exact with respect to the stored leaves (block and
tree sums are float64), and `SampleBatch.probabilities` are the probabilities actually sampled from.

The buffer is a private bytearray (`kind="local"`) or a `multiprocessing.shared_memory` segment
(`kind="shared_memory"`), which co-located actor processes attach to by name through `ReplayHandle`
and insert into under one process-shared lock. `cloud.replay._grpc` serves the same table over gRPC
for the decoupled mode; `make_replay` picks the deployment, and every deployment satisfies `Replay`.

Every transition's key is its global insert sequence number. It is not stored: slot ``i`` holds the
item of the largest ``s < inserts`` with ``s % capacity == i``, so a key ``k`` is live exactly while
``inserts - capacity <= k < inserts``, and the learner's priority updates for a slot the ring has
since overwritten are recognised and dropped.

Rate limiter (as Reverb's ``SampleToInsertRatio``): with ``spi = samples_per_insert``,
``diff = inserts * spi - samples`` must stay within ``spi * min_size_to_sample +- error_buffer``:
an insert waits while it would push ``diff`` above the window, a sample of ``n`` waits while the table
holds fewer than `min_size_to_sample` items or while it would push ``diff`` below it. ``timeout=None``
waits forever, ``timeout=0`` never waits; a call the limiter holds past its timeout returns
``False`` (insert) or ``None`` (sample) and changes nothing: "would block" is a state, not an error.

Checkpoints are ``np.savez`` files (no pickle; loaded with ``allow_pickle=False``) written to a temp
file and renamed into place; `ReplayTable.export_state` / `load_state` move the same contents in memory
(the gRPC deployment streams them), so a run can hand its replay from one deployment to another.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from cloud._errors import CloudError
from device import ConfigError, atomic_file

FieldSpec = tuple[tuple[int, ...], str]
"""Shape of one item (without the leading batch axis) and its numpy dtype string."""
Signature = Mapping[str, FieldSpec]
"""The fields of a transition, e.g. ``{"obs": ((3,), "float32"), "reward": ((), "float32")}``."""
ReplayKind = Literal["local", "shared_memory", "grpc"]

_ALIGN = 64
_SCALAR_UPDATE_MAX = 16
_STATE_FORMAT = 1  # unchanged by the float16 leaves: "_priority" still travels as float32 (exact widening)
_BLOCK = 32
_LEAF_MIN = float(np.finfo(np.float16).smallest_subnormal)
_LEAF_MAX = float(np.finfo(np.float16).max)


class ReplayError(CloudError):
    """A replay call was given data that does not fit the table, or a checkpoint cannot be used."""


@dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    """Size, sampling and rate limiting of one replay table."""

    # storage
    capacity: int = 100_000
    """Maximum number of transitions held; the oldest are overwritten first."""
    # sampling
    prioritized: bool = True
    """Sample proportionally to priority ** alpha (sum tree) instead of uniformly."""
    alpha: float = 0.6
    """Priority exponent: 0 is uniform sampling, 1 fully proportional."""
    priority_eps: float = 1e-6
    """Added to every priority so that no transition's sampling probability is zero."""
    # rate limiter
    min_size_to_sample: int = 1
    """Samples wait until the table has received at least this many inserts."""
    samples_per_insert: float = 0.0
    """Target ratio of sampled items to inserted items; 0 turns the ratio limit off."""
    error_buffer: float = 0.0
    """How far (in sampled items) the ratio may drift either way before inserts or samples wait."""

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ConfigError(f"ReplayConfig: capacity={self.capacity} must be at least 1")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"ReplayConfig: alpha={self.alpha} must lie in [0, 1]")
        if self.priority_eps <= 0.0:
            raise ConfigError(f"ReplayConfig: priority_eps={self.priority_eps} must be positive")
        if self.min_size_to_sample < 1:
            raise ConfigError(f"ReplayConfig: min_size_to_sample={self.min_size_to_sample} must be at least 1")
        if self.samples_per_insert < 0.0:
            raise ConfigError(f"ReplayConfig: samples_per_insert={self.samples_per_insert} must be >= 0")
        if self.samples_per_insert > 0.0 and self.error_buffer < self.samples_per_insert:
            raise ConfigError(
                f"ReplayConfig: error_buffer={self.error_buffer} is smaller than samples_per_insert="
                f"{self.samples_per_insert}, so no insert could ever fit the window; set error_buffer >= "
                "samples_per_insert (a few sample batches is typical)"
            )


@dataclass(frozen=True)
class SampleBatch:
    """One sampled batch: field arrays, the keys to update priorities with, and importance weights."""

    data: dict[str, np.ndarray]
    """``[batch, *shape]`` per signature field (copies, safe to keep)."""
    keys: np.ndarray
    """int64 ``[batch]`` global insert sequence numbers; pass them to `Replay.update_priorities`."""
    weights: np.ndarray
    """float32 ``[batch]`` importance-sampling weights ``(N * P(i)) ** -beta``, divided by the batch max."""
    probabilities: np.ndarray
    """float64 ``[batch]`` the probability each item had of being drawn."""


@dataclass(frozen=True)
class ReplayStats:
    """What a table holds and has done."""

    size: int
    capacity: int
    inserts: int
    samples: int
    nbytes: int
    """Bytes of the preallocated buffer: everything the table will ever use for data."""
    item_nbytes: int
    """Raw bytes of one transition (sum over the signature's fields)."""


@dataclass(frozen=True)
class ReplayHandle:
    """What an actor process needs to attach to a shared-memory table (pass it as a `Process` argument)."""

    name: str
    signature: dict[str, FieldSpec]
    config: ReplayConfig
    lock: Any
    """The table's `multiprocessing.Lock`; it travels to child processes only as a `Process` argument."""


class Replay(Protocol):
    """The replay API every deployment (local, shared memory, gRPC) offers."""

    def insert(self, items: Mapping[str, np.ndarray], *, timeout: float | None = None) -> bool:
        """Append ``[k, *shape]`` arrays per field; False if the rate limiter held the call past `timeout`."""

    def sample(self, batch_size: int, *, beta: float = 1.0, timeout: float | None = None) -> SampleBatch | None:
        """Draw `batch_size` items; None if the rate limiter held the call past `timeout`."""

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of sampled items (keys of overwritten items are ignored)."""

    def stats(self) -> ReplayStats:
        """Return the table's counters and memory."""

    def export_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Return the table's contents as ``(meta, arrays)``, oldest item first."""

    def load_state(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Fill an empty table from `export_state` output."""

    def checkpoint(self, path: Path) -> Path:
        """Write the contents to an ``.npz`` file on this machine (temp file, then rename)."""

    def restore(self, path: Path) -> None:
        """Fill an empty table from a `checkpoint` file."""

    def close(self) -> None:
        """Release the table (or the connection to it)."""


def annealed_beta(step: int, total_steps: int, *, beta_start: float, beta_end: float = 1.0) -> float:
    """Importance-sampling exponent annealed linearly from `beta_start` to `beta_end` over `total_steps`."""
    frac = min(max(step / max(total_steps, 1), 0.0), 1.0)
    return beta_start + frac * (beta_end - beta_start)


def item_nbytes(signature: Signature) -> int:
    """Raw bytes of one transition with this signature."""
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in signature.values())


def normalise_signature(signature: Signature) -> dict[str, FieldSpec]:
    """Check a signature and return it with tuple shapes and canonical dtype strings."""
    out: dict[str, FieldSpec] = {}
    for name, (shape, dtype) in signature.items():
        if name.startswith("_"):
            raise ConfigError(f"replay signature: field {name!r} may not start with '_' (reserved for the table)")
        dt = np.dtype(dtype)
        if dt.kind not in "biuf":
            raise ConfigError(f"replay signature: field {name!r} has dtype {dt}; use a bool, int, uint or float dtype")
        out[name] = (tuple(int(d) for d in shape), dt.str)
    if not out:
        raise ConfigError("replay signature: it is empty; give at least one field, e.g. {'obs': ((3,), 'float32')}")
    return out


_Layout = dict[str, tuple[int, tuple[int, ...], str]]


def _layout(signature: dict[str, FieldSpec], config: ReplayConfig) -> tuple[_Layout, int]:
    """Byte offset, full shape and dtype of every array in the buffer, and the buffer's total size."""
    cap = config.capacity
    nblocks = -(-cap // _BLOCK)
    tree_leaves = 1 << max(0, math.ceil(math.log2(nblocks))) if nblocks > 1 else 1
    arrays: dict[str, tuple[tuple[int, ...], str]] = {
        "_counters": ((2,), "<i8"),
        "_max_priority": ((1,), "<f8"),
        "_prio": ((nblocks * _BLOCK if config.prioritized else 0,), "<f2"),
        "_tree": ((2 * tree_leaves if config.prioritized else 0,), "<f8"),
    }
    arrays.update({name: ((cap, *shape), dtype) for name, (shape, dtype) in signature.items()})
    layout = {}
    offset = 0
    for name, (shape, dtype) in arrays.items():
        layout[name] = (offset, shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return layout, max(offset, _ALIGN)


class ReplayTable:
    """A replay table over a private buffer or a shared-memory segment (see the module docstring).

    Create with `ReplayTable.create` (or `make_replay`); actor processes use `ReplayTable.attach`.
    """

    def __init__(
        self,
        signature: Signature,
        config: ReplayConfig,
        *,
        buffer: Any,
        lock: Any,
        shm: shared_memory.SharedMemory | None,
        owner: bool,
        seed: int | None,
    ) -> None:
        self.signature = normalise_signature(signature)
        self.config = config
        self._shm = shm
        self._owner = owner
        self._lock = lock
        self._rng = np.random.default_rng(seed)
        layout, self._nbytes = _layout(self.signature, config)
        self._arrays: dict[str, np.ndarray] = {
            name: np.ndarray(shape, dtype=np.dtype(dtype), buffer=buffer, offset=offset)
            for name, (offset, shape, dtype) in layout.items()
        }
        self._counters = self._arrays.pop("_counters")
        self._max_priority = self._arrays.pop("_max_priority")
        self._prio = self._arrays.pop("_prio")
        self._prio_blocks = self._prio.reshape(-1, _BLOCK)
        self._tree = self._arrays.pop("_tree")
        self._prioritized = config.prioritized
        self._leaves = self._tree.shape[0] // 2  # leaves of the block tree: one per block, padded to P
        # float64 items; typeshed types memoryview items as int
        self._tree_mv: Any = memoryview(self._tree)  # type: ignore[arg-type]
        self._depth = int(math.log2(self._leaves)) if self._leaves else 0
        self._item_nbytes = item_nbytes(self.signature)
        self._closed = False

    # -- construction ----------------------------------------------------------------------------------

    @classmethod
    def create(
        cls, signature: Signature, config: ReplayConfig, *, shared: bool = False, seed: int | None = None
    ) -> ReplayTable:
        """Allocate a zeroed table: in a private buffer, or in a new shared-memory segment if `shared`."""
        sig = normalise_signature(signature)
        _, nbytes = _layout(sig, config)
        if shared:
            import multiprocessing

            shm = shared_memory.SharedMemory(create=True, size=nbytes)
            buf = shm.buf
            assert buf is not None
            buf[:nbytes] = bytes(nbytes)  # fresh segments are zeroed on Linux; make it true everywhere
            # A spawn-context lock can travel to spawned and to forked actor processes alike.
            lock = multiprocessing.get_context("spawn").Lock()
            table = cls(sig, config, buffer=buf, lock=lock, shm=shm, owner=True, seed=seed)
        else:
            table = cls(sig, config, buffer=bytearray(nbytes), lock=threading.Lock(), shm=None, owner=True, seed=seed)
        table._max_priority[0] = 1.0
        return table

    @classmethod
    def attach(cls, handle: ReplayHandle, *, seed: int | None = None) -> ReplayTable:
        """Open the shared-memory table that `handle` names (in an actor process)."""
        try:
            shm = shared_memory.SharedMemory(name=handle.name)
        except FileNotFoundError as exc:
            raise ReplayError(
                f"ReplayTable.attach: no shared-memory segment {handle.name!r}; the owning table was closed "
                "or never created -- attach while the learner's table is open"
            ) from exc
        return cls(handle.signature, handle.config, buffer=shm.buf, lock=handle.lock, shm=shm, owner=False, seed=seed)

    def handle(self) -> ReplayHandle:
        """Return what an actor process needs to `attach` (shared-memory tables only)."""
        if self._shm is None:
            raise ReplayError("ReplayTable.handle: this table is local; create it with shared=True to share it")
        return ReplayHandle(name=self._shm.name, signature=dict(self.signature), config=self.config, lock=self._lock)

    def close(self) -> None:
        """Drop the arrays and release the buffer; the owner of a shared segment also unlinks it."""
        if self._closed:
            return
        self._closed = True
        self._arrays.clear()
        self._tree_mv.release()
        del self._counters, self._max_priority, self._prio, self._prio_blocks, self._tree
        if self._shm is not None:
            self._shm.close()
            if self._owner:
                self._shm.unlink()

    def __enter__(self) -> ReplayTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the Replay API --------------------------------------------------------------------------------

    def insert(self, items: Mapping[str, np.ndarray], *, timeout: float | None = None) -> bool:
        """Append one ``[k, *shape]`` array per field; new items get the highest priority seen so far.

        Returns False, inserting nothing, if the rate limiter held the call longer than `timeout`.
        """
        batch = self._check_items(items)
        k = next(iter(batch.values())).shape[0]
        if k == 0:
            return True
        if not self._acquire_when(lambda: self._can_insert(k), timeout):
            return False
        try:
            inserts = int(self._counters[0])
            cap = self.config.capacity
            first = inserts % cap
            # At most two contiguous runs of slots (the second after the ring wraps): plain slices, no fancy indexing.
            runs = [(first, min(first + k, cap), 0)]
            if first + k > cap:
                runs.append((0, first + k - cap, cap - first))
            top = (float(self._max_priority[0]) + self.config.priority_eps) ** self.config.alpha
            leaf = np.float16(min(max(top, _LEAF_MIN), _LEAF_MAX))  # as `_quantise`, without its numpy calls
            for lo, hi, offset in runs:
                for name, arr in batch.items():
                    self._arrays[name][lo:hi] = arr[offset : offset + hi - lo]
                if self._prioritized:
                    self._set_leaf_run(lo, hi, leaf)
            self._counters[0] = inserts + k
        finally:
            self._lock.release()
        return True

    def sample(self, batch_size: int, *, beta: float = 1.0, timeout: float | None = None) -> SampleBatch | None:
        """Draw `batch_size` items (with replacement), by priority or uniformly.

        Prioritized draws are stratified: the total priority mass is cut into `batch_size` equal
        segments and one item drawn from each by a single vectorised descent of the block tree,
        then a vectorised cumulative search inside the drawn blocks.
        Returns None if the rate limiter held the call longer than `timeout`.
        """
        if batch_size < 1:
            raise ReplayError(f"Replay.sample: batch_size={batch_size} must be at least 1")
        spi = self.config.samples_per_insert
        if spi > 0 and batch_size + spi > 2 * self.config.error_buffer:
            raise ReplayError(
                f"Replay.sample: batch_size={batch_size} plus samples_per_insert={spi} exceeds the rate limiter's "
                f"window 2 * error_buffer = {2 * self.config.error_buffer}, so inserts and samples could both wait "
                "forever; raise error_buffer"
            )
        if not self._acquire_when(lambda: self._can_sample(batch_size), timeout):
            return None
        try:
            size = self._size()
            if self._prioritized:
                total = float(self._tree[1])
                targets = (np.arange(batch_size) + self._rng.random(batch_size)) * (total / batch_size)
                slots = self._descend(targets)
                probabilities = self._prio[slots].astype(np.float64) / total
                weights = (size * probabilities) ** -beta
                weights = (weights / weights.max()).astype(np.float32)
            else:
                slots = self._rng.integers(0, size, batch_size)
                probabilities = np.full(batch_size, 1.0 / size)
                weights = np.ones(batch_size, dtype=np.float32)
            data = {name: arr[slots] for name, arr in self._arrays.items()}
            keys = self._keys(slots)
            self._counters[1] += batch_size
        finally:
            self._lock.release()
        return SampleBatch(data=data, keys=keys, weights=weights, probabilities=probabilities)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Set ``priority ** alpha`` for the items `keys` names; keys of overwritten slots are ignored."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        priorities = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if keys.shape != priorities.shape:
            raise ReplayError(
                f"Replay.update_priorities: {keys.shape[0]} keys but {priorities.shape[0]} priorities; "
                "pass one priority per key"
            )
        if not np.all(np.isfinite(priorities)) or np.any(priorities < 0):
            raise ReplayError(
                "Replay.update_priorities: priorities must be finite and >= 0 (pass |TD error|), "
                f"got min={priorities.min(initial=0.0)} max={priorities.max(initial=0.0)}"
            )
        if not self._prioritized or keys.size == 0:
            return
        cap = self.config.capacity
        with self._lock:
            inserts = int(self._counters[0])
            live = (keys < inserts) & (keys >= max(inserts - cap, 0))
            if not live.any():
                return
            p = priorities[live]
            self._max_priority[0] = max(float(self._max_priority[0]), float(p.max()))
            self._set_leaves(keys[live] % cap, self._quantise(p))

    def stats(self) -> ReplayStats:
        """Return size, counters and the exact bytes of the preallocated buffer."""
        with self._lock:
            inserts, samples = (int(v) for v in self._counters)
        return ReplayStats(
            size=min(inserts, self.config.capacity),
            capacity=self.config.capacity,
            inserts=inserts,
            samples=samples,
            nbytes=self._nbytes,
            item_nbytes=self._item_nbytes,
        )

    # -- state: checkpoint, restore, handover ----------------------------------------------------------

    def export_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Copy out the contents, oldest item first, with the counters and priorities."""
        with self._lock:
            inserts, samples = (int(v) for v in self._counters)
            size = min(inserts, self.config.capacity)
            seq = np.arange(inserts - size, inserts, dtype=np.int64)
            slots = seq % self.config.capacity
            arrays = {name: arr[slots] for name, arr in self._arrays.items()}
            if self._prioritized:
                arrays["_priority"] = self._prio[slots].astype(np.float32)
            max_priority = float(self._max_priority[0])
        meta = {
            "format": _STATE_FORMAT,
            "signature": {name: [list(shape), dtype] for name, (shape, dtype) in self.signature.items()},
            "config": asdict(self.config),
            "inserts": inserts,
            "samples": samples,
            "max_priority": max_priority,
        }
        return meta, arrays

    def load_state(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Fill this empty table from `export_state` output (of any deployment, any capacity).

        The newest ``min(size, capacity)`` items are kept, each under its original key, and the
        rate limiter's counters continue where they were.
        """
        if meta.get("format") != _STATE_FORMAT:
            raise ReplayError(f"Replay.load_state: state format {meta.get('format')!r} is not {_STATE_FORMAT}")
        theirs = {name: (tuple(shape), dtype) for name, (shape, dtype) in meta["signature"].items()}
        if theirs != self.signature:
            raise ReplayError(
                f"Replay.load_state: the state's signature {theirs} differs from this table's {self.signature}; "
                "restore into a table made with the same signature"
            )
        if self._prioritized and meta["config"].get("alpha") != self.config.alpha:
            raise ReplayError(
                f"Replay.load_state: the state was stored with alpha={meta['config'].get('alpha')}, this table "
                f"uses alpha={self.config.alpha}; priorities are kept as priority ** alpha, so use the same alpha"
            )
        inserts, samples = int(meta["inserts"]), int(meta["samples"])
        n = next(iter(arrays[name] for name in self.signature)).shape[0]
        keep = min(n, self.config.capacity)
        seq = np.arange(inserts - keep, inserts, dtype=np.int64)
        slots = seq % self.config.capacity
        with self._lock:
            if self._counters[0] != 0:
                raise ReplayError(
                    f"Replay.load_state: the table already holds {int(self._counters[0])} inserts; "
                    "load state only into a new, empty table"
                )
            for name in self.signature:
                self._arrays[name][slots] = arrays[name][n - keep :]
            if self._prioritized:
                if "_priority" in arrays:  # stored as priority ** alpha (float32; older tables kept float32 leaves)
                    stored = np.asarray(arrays["_priority"][n - keep :], dtype=np.float64)
                    leaves = np.clip(stored, _LEAF_MIN, _LEAF_MAX).astype(np.float16)
                else:  # from a uniform table: every item at the highest priority
                    leaves = np.full(keep, self._quantise(np.asarray(float(meta["max_priority"]))), dtype=np.float16)
                self._set_leaves(slots, leaves)
            self._max_priority[0] = float(meta["max_priority"])
            self._counters[:] = (inserts, samples)

    def checkpoint(self, path: Path) -> Path:
        """Write the contents to `path` (an ``.npz``, no pickle) via a temp file renamed into place."""
        meta, arrays = self.export_state()
        return save_state(path, meta, arrays)

    def restore(self, path: Path) -> None:
        """Fill this empty table from a `checkpoint` file."""
        meta, arrays = load_state_file(path)
        self.load_state(meta, arrays)

    # -- internals -------------------------------------------------------------------------------------

    def _size(self) -> int:
        return min(int(self._counters[0]), self.config.capacity)

    def _diff(self) -> float:
        return float(self._counters[0]) * self.config.samples_per_insert - float(self._counters[1])

    def _can_insert(self, k: int) -> bool:
        spi = self.config.samples_per_insert
        if spi == 0:
            return True
        # Checked for the batch's first item, as Reverb does per item: a batch may overshoot by k - 1 items.
        max_diff = spi * self.config.min_size_to_sample + self.config.error_buffer
        return self._diff() + spi <= max_diff

    def _can_sample(self, n: int) -> bool:
        if self._counters[0] < self.config.min_size_to_sample:
            return False
        spi = self.config.samples_per_insert
        if spi == 0:
            return True
        min_diff = spi * self.config.min_size_to_sample - self.config.error_buffer
        return self._diff() - n >= min_diff

    def _acquire_when(self, ready: Any, timeout: float | None) -> bool:
        """Take the lock once `ready()` holds under it; give up after `timeout` seconds (None: never)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 1e-5
        while True:
            self._lock.acquire()
            if ready():
                return True
            self._lock.release()
            if deadline is not None and time.monotonic() >= deadline:
                return False
            # Polling, not a condition variable: the other side may be another process that holds only
            # the shared lock. Back off to 1 ms so a waiting learner costs little CPU.
            time.sleep(pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, 1e-3)

    def _keys(self, slots: np.ndarray) -> np.ndarray:
        """Insert number of each slot's item: the largest ``s < inserts`` with ``s % capacity == slot``."""
        last = int(self._counters[0]) - 1
        keys: np.ndarray = last - (last - slots.astype(np.int64)) % self.config.capacity
        return keys

    def _quantise(self, priorities: np.ndarray) -> np.ndarray:
        """Leaf values ``(priority + eps) ** alpha`` as float16, clipped so none is zero or infinite."""
        scaled = (priorities + self.config.priority_eps) ** self.config.alpha
        leaves: np.ndarray = np.clip(scaled, _LEAF_MIN, _LEAF_MAX).astype(np.float16)
        return leaves

    def _set_leaves(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Write leaves, recompute each touched block's sum from its leaves and the block's path to the root."""
        slots = slots.astype(np.int64)
        self._prio[slots] = values
        blocks = slots // _BLOCK
        if blocks.shape[0] <= _SCALAR_UPDATE_MAX:
            self._refresh_blocks(set(blocks.tolist()))
            return
        tree = self._tree
        pos = blocks + self._leaves  # repeated blocks are written twice with the same value: harmless
        tree[pos] = self._prio_blocks[blocks].sum(axis=1, dtype=np.float64)
        for _ in range(self._depth):
            pos >>= 1
            tree[pos] = tree[2 * pos] + tree[2 * pos + 1]

    def _refresh_blocks(self, blocks: Iterable[int]) -> None:
        """Recompute a few blocks' sums and their paths to the root.

        For an actor's single insert, plain Python over a memoryview beats ~4 numpy calls per tree level
        by an order of magnitude.
        """
        mv, rows = self._tree_mv, self._prio_blocks
        for block in blocks:
            i = block + self._leaves
            mv[i] = float(rows[block].sum(dtype=np.float64))
            for _ in range(self._depth):
                i >>= 1
                mv[i] = mv[2 * i] + mv[2 * i + 1]

    def _set_leaf_run(self, lo: int, hi: int, value: np.float16) -> None:
        """Set leaves ``lo..hi-1`` to `value`; their blocks and ancestors form one contiguous run per level."""
        self._prio[lo:hi] = value
        if hi - lo <= _SCALAR_UPDATE_MAX:
            self._refresh_blocks(range(lo // _BLOCK, (hi - 1) // _BLOCK + 1))
            return
        tree = self._tree
        lo, hi = lo // _BLOCK, (hi - 1) // _BLOCK
        tree[lo + self._leaves : hi + self._leaves + 1] = self._prio_blocks[lo : hi + 1].sum(axis=1, dtype=np.float64)
        lo, hi = lo + self._leaves, hi + self._leaves
        for _ in range(self._depth):
            lo, hi = lo >> 1, hi >> 1
            tree[lo : hi + 1] = tree[2 * lo : 2 * hi + 2 : 2] + tree[2 * lo + 1 : 2 * hi + 2 : 2]

    def _descend(self, targets: np.ndarray) -> np.ndarray:
        """Slot holding each target's prefix-sum mass: one vectorised walk to a block, then a search inside it."""
        tree = self._tree
        idx = np.ones(targets.shape[0], dtype=np.int64)
        u = targets.astype(np.float64)
        for _ in range(self._depth):
            left = 2 * idx
            left_sum = tree[left]
            # The second test keeps rounding (u at or past the total) from walking into empty blocks.
            go_right = (u >= left_sum) & (tree[left + 1] > 0)
            u -= np.where(go_right, left_sum, 0.0)
            idx = left + go_right
        blocks = idx - self._leaves
        rows = self._prio_blocks[blocks]
        within = np.minimum(np.count_nonzero(np.cumsum(rows, axis=1, dtype=np.float64) <= u[:, None], axis=1),
                            _BLOCK - 1)
        empty = rows[np.arange(rows.shape[0]), within] == 0
        if empty.any():  # u at or past its block's sum (rounding) landed on an empty slot: take the last filled one
            within[empty] = _BLOCK - 1 - np.argmax(rows[empty, ::-1] > 0, axis=1)
        slots: np.ndarray = blocks * _BLOCK + within
        return slots

    def _check_items(self, items: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if set(items) != set(self.signature):
            raise ReplayError(
                f"Replay.insert: got fields {sorted(items)}, the table's signature has {sorted(self.signature)}"
            )
        out = {}
        k = None
        for name, (shape, dtype) in self.signature.items():
            arr = np.asarray(items[name])
            if arr.shape[1:] != shape:
                raise ReplayError(
                    f"Replay.insert: field {name!r} has shape {arr.shape}; expected [k, {', '.join(map(str, shape))}]"
                    " with one row per transition"
                )
            if k is None:
                k = arr.shape[0]
            elif arr.shape[0] != k:
                raise ReplayError(f"Replay.insert: field {name!r} has {arr.shape[0]} rows, other fields have {k}")
            out[name] = arr.astype(dtype, copy=False)
        if k is not None and k > self.config.capacity:
            raise ReplayError(f"Replay.insert: {k} rows exceed capacity={self.config.capacity}; insert fewer at once")
        return out


def save_state(path: Path, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Path:
    """Write replay state to an ``.npz`` (meta as a JSON byte array) through a temp file and a rename."""
    path = Path(path)
    payload = {"_meta": np.frombuffer(json.dumps(dict(meta)).encode(), dtype=np.uint8), **arrays}
    with atomic_file(path) as f:
        np.savez(f, **payload)  # type: ignore[arg-type]
    return path


def load_state_file(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a file written by `save_state` (never unpickles)."""
    try:
        with np.load(Path(path), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError) as exc:
        raise ReplayError(f"Replay.restore: cannot read checkpoint {str(path)!r}: {exc}") from exc
    if "_meta" not in arrays:
        raise ReplayError(f"Replay.restore: {str(path)!r} is not a replay checkpoint (no _meta entry)")
    meta = json.loads(arrays.pop("_meta").tobytes())
    return meta, arrays
