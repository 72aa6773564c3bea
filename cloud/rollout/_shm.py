"""One shared-memory segment holding named, 64-byte-aligned numpy arrays, with leak-proof cleanup.

The parent process creates the segment (`ShmArena.create`) and owns it: it is unlinked exactly once,
by `close()`, by the garbage collector, or at interpreter exit (including after a KeyboardInterrupt),
and only in the process that created it, so a forked worker exiting never removes it. Workers started
with ``fork`` use the inherited mapping; workers started with ``spawn``/``forkserver`` map the segment by
name without registering it with multiprocessing's resource tracker (which would otherwise unlink it,
or warn about a "leak", when the worker exits).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

ALIGN = 64
SHM_PREFIX = "strata_colo_"


@dataclass(frozen=True, kw_only=True)
class ArraySpec:
    """Where one array lives inside the segment."""

    offset: int
    """Byte offset from the start of the segment (a multiple of 64)."""
    shape: tuple[int, ...]
    """Array shape."""
    dtype: str
    """numpy dtype string."""


@dataclass(frozen=True, kw_only=True)
class ShmLayout:
    """The picklable description of a segment: its name, size and arrays; enough for a worker to map it."""

    name: str
    """Name of the POSIX shared-memory object (without the leading slash)."""
    size: int
    """Total size in bytes."""
    arrays: Mapping[str, ArraySpec]
    """Array name to placement."""

    @staticmethod
    def plan(name: str, arrays: Mapping[str, tuple[tuple[int, ...], Any]]) -> ShmLayout:
        """Place `arrays` one after another, each starting on a 64-byte boundary."""
        placed: dict[str, ArraySpec] = {}
        offset = 0
        for key, (shape, dtype) in arrays.items():
            dt = np.dtype(dtype)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            placed[key] = ArraySpec(offset=offset, shape=tuple(int(s) for s in shape), dtype=dt.str)
            offset += -(-max(nbytes, 1) // ALIGN) * ALIGN
        return ShmLayout(name=name, size=max(offset, ALIGN), arrays=placed)

    def views(self, buf: memoryview | mmap.mmap) -> dict[str, np.ndarray]:
        """Numpy views of every array over `buf` (the mapped segment)."""
        return {
            key: np.ndarray(spec.shape, dtype=np.dtype(spec.dtype), buffer=buf, offset=spec.offset)
            for key, spec in self.arrays.items()
        }


def _unlink_once(shm: shared_memory.SharedMemory, owner_pid: int) -> None:
    """Finalizer: remove the segment's name, in the owning process only; mapped views stay valid until freed."""
    if os.getpid() != owner_pid:
        return
    with contextlib.suppress(FileNotFoundError):
        shm.unlink()  # also unregisters it from the resource tracker
    with contextlib.suppress(BufferError):  # numpy views still alive: the mapping goes when they do
        shm.close()


class ShmArena:
    """The parent's handle on one segment: its layout, its numpy views and its cleanup."""

    def __init__(self, layout: ShmLayout, shm: shared_memory.SharedMemory) -> None:
        self.layout = layout
        self._shm = shm
        assert shm.buf is not None
        self.arrays = layout.views(shm.buf)
        self._finalizer = weakref.finalize(self, _unlink_once, shm, os.getpid())

    @classmethod
    def create(cls, arrays: Mapping[str, tuple[tuple[int, ...], Any]]) -> ShmArena:
        """Create a zero-filled segment with a unique ``strata_colo_`` name holding `arrays`."""
        name = f"{SHM_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
        layout = ShmLayout.plan(name, arrays)
        shm = shared_memory.SharedMemory(name=name, create=True, size=layout.size)
        arena = cls(layout, shm)
        for view in arena.arrays.values():
            view.fill(0)
        return arena

    @property
    def name(self) -> str:
        """The segment's name (an entry under /dev/shm while it exists)."""
        return self.layout.name

    def close(self) -> None:
        """Unlink the segment now (idempotent)."""
        self._finalizer()


def attach(layout: ShmLayout, inherited: ShmArena | None) -> dict[str, np.ndarray]:
    """Numpy views of the segment inside a worker: the forked mapping if there is one, else a fresh mmap."""
    if inherited is not None:
        return inherited.arrays
    fd = os.open(f"/dev/shm/{layout.name}", os.O_RDWR)
    try:
        mapping = mmap.mmap(fd, layout.size)
    finally:
        os.close(fd)
    return layout.views(mapping)
