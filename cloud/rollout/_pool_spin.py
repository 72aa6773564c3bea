"""Spin-then-block waiting on a semaphore whose poster first bumps a shared counter (the pool's signalling)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from multiprocessing.synchronize import Semaphore

import numpy as np


class Spinner:
    """Spin-then-block waits on a semaphore whose poster first bumps a shared counter, with adaptive spinning.

    `wait` polls `ready` (the counter; ~0.1 us a poll, against several times that for a try-acquire) for up to
    `spin_s`, yielding the CPU between polls, then blocks on the semaphore. The poster always writes its
    counter and then posts, so once `ready` is seen the post is a few instructions away and taking it does
    not sleep. Measured on the 2-core host: spinning without yielding lets three processes steal each other's
    time slices (1 ms of it drops 2x1 CartPole from ~40k to ~1k steps/s); yielding keeps ~46k on a quiet
    machine, but on a loaded one a yield hands the core to another process for a whole time slice, and a
    plain futex block (woken with the scheduler's wake-up preference) is faster. So the spinner stops
    spinning after `misses` waits in a row that outlast the spin, for the next `pause` waits, then tries again.
    """

    def __init__(self, spin_s: float, *, misses: int = 4, pause: int = 256) -> None:
        self.spin_s = spin_s
        self._limit, self._pause = misses, pause
        self._misses = 0
        self._skip = 0

    def wait(self, sem: Semaphore, ready: Callable[[], bool], block_s: float) -> bool:
        """Take one post of `sem`; False if nothing was posted within `block_s` after the spin."""
        if ready() or self.spin_s <= 0:
            return sem.acquire(True, block_s)
        if self._skip:
            self._skip -= 1
            return sem.acquire(True, block_s)
        deadline = time.perf_counter() + self.spin_s
        while True:
            os.sched_yield()
            seen = ready()
            if time.perf_counter() > deadline:
                break  # seen or not, this wait outlasted the spin (a yield can cost a whole time slice)
            if seen:
                self._misses = 0
                return sem.acquire(True, block_s)
        self._misses += 1
        if self._misses >= self._limit:
            self._misses, self._skip = 0, self._pause
        return sem.acquire(True, block_s)


def reached(row: np.ndarray, slot: int, target: int) -> Callable[[], bool]:
    """A `ready` test for `Spinner.wait`: has the worker's done counter for `slot` reached `target`?"""
    return lambda: bool(row[slot] >= target)
