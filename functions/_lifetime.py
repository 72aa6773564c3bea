"""Child processes die with the process that started them, also when it is killed with SIGKILL.

The parent starts a child with `child_environment` (``STRATA_PARENT_PID`` = its pid); the child calls
`watch_parent` first thing. A daemon thread then blocks on a pidfd of the parent (Linux 5.3+; else it
polls ``getppid``) and, when the parent exits, signals the child itself: SIGTERM, so the child stops as
it would when asked (an env service closes its envs, the function runtime kills its workers), and
SIGKILL after a grace period if that did not end it.

A watch rather than ``prctl(PR_SET_PDEATHSIG)``: the kernel sends the parent-death signal when the
*thread* that forked the child exits, and the local function runtime starts its workers from
short-lived HTTP request threads, so a worker would be killed as soon as its first request was answered.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping

PARENT_ENV = "STRATA_PARENT_PID"
"""Environment variable naming the pid a child must not outlive."""

GRACE_S = 10.0
"""Seconds between the SIGTERM a child sends itself and the SIGKILL that follows if it is still alive."""


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user's counts; a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) plus ``STRATA_PARENT_PID`` set to this process."""
    env = dict(os.environ if base is None else base)
    env[PARENT_ENV] = str(os.getpid())
    return env


def _signal_self(grace_s: float) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)


def watch_parent(parent: int | None = None, *, on_death: Callable[[], None] | None = None,
                 grace_s: float = GRACE_S) -> threading.Thread | None:
    """Stop this process when `parent` exits (default: the pid in ``STRATA_PARENT_PID``, removed from the env).

    Returns the watching thread, or None when there is no parent to watch (the variable is not set:
    the process was started by a person, not by strata). When the parent is already gone, `on_death`
    runs at once.

    Args:
        parent: The pid to watch.
        on_death: What to do when it exits (default: SIGTERM to this process, SIGKILL `grace_s` later).
        grace_s: See `on_death`.
    """
    direct = parent is None  # started with child_environment: the pid is our parent's
    if parent is None:
        text = os.environ.pop(PARENT_ENV, "")
        if not text.isdigit():
            return None
        parent = int(text)
    action = on_death or (lambda: _signal_self(grace_s))
    fd: int | None = None
    with contextlib.suppress(AttributeError, OSError):  # no pidfd on this kernel or platform: poll instead
        fd = os.pidfd_open(parent)
    if direct and os.getppid() != parent:  # it exited before we could watch it (we were re-parented)
        if fd is not None:
            os.close(fd)
        fd = None
        thread = threading.Thread(target=action, name="strata-parent-gone", daemon=True)
        thread.start()
        return thread

    def alive() -> bool:
        if direct:
            return os.getppid() == parent
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def watch() -> None:
        if fd is not None:
            try:
                select.select([fd], [], [])  # readable once the process has exited
            finally:
                os.close(fd)
        else:
            while alive():
                time.sleep(0.5)
        action()

    thread = threading.Thread(target=watch, name="strata-parent-watch", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def signals_masked() -> Iterator[None]:
    """Block SIGINT, SIGTERM and SIGHUP in the main thread while the block runs (they are delivered when it ends).

    For a gRPC call: an exception raised by a signal handler while a call waits can orphan it, and closing its
    channel then waits for ever. (A training run's stop path has the fuller `cloud.runs._stop.signals_held`.)
    """
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
