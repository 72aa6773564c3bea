"""Stop and resume: every way a training run stops leaves a checkpoint at its last completed update.

The learner (PPO in `cloud.runs._train`, SAC in `cloud.learners._sac`) drives one `Checkpointer`; its life:

    RUNNING ──update v complete──> commit(v): the state is cloned in memory (well under a millisecond for
        strata's small nets); every `keep_every` updates it is written durably and kept, otherwise a
        background thread writes it as the rolling checkpoint (not fsynced) and removes the previous one;
        by default every commit (`ROLLING_EVERY_S` 0: a commit waits until the previous one is on disk),
        or the newest at most once per ``--rolling-checkpoint-s`` seconds
    RUNNING ──Ctrl-C (SIGINT) / SIGTERM / SIGHUP / a source failure / a learner error──> STOPPING
    STOPPING: SIGINT and SIGTERM are held; the rolling writer is drained; the last commit is written
        durably as ``checkpoints/{v:09d}.pt``; `stop_line` says in one line where it is and the command
        that resumes; then the sources are closed and the error goes on (exit 130, 143, or 2)
    SIGKILL: nothing runs; the newest rolling checkpoint (one update behind the last commit at most, by
        default; with an interval, about that long of training) is the resume point; child
        processes notice that their parent died
        (`functions._lifetime`) and stop, unlinking their shared memory
    RESUME: the newest checkpoint; `trim_jsonl` drops the lines of ``metrics.jsonl`` and
        ``switches.jsonl`` past its version, so the logs continue without duplicates

A commit is the only point where the learner's state is consistent (between the optimiser steps of an
update the weights are neither version v nor v + 1), which is why the stop path writes the commit
and never the live objects.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cloud.runs._checkpoint import checkpoint_path, latest_checkpoint, load_checkpoint, save_checkpoint
from device import ConfigError, write_atomic

_SIGNALS = ("SIGTERM", "SIGHUP")
"""Signals turned into `StopSignal` (SIGINT already raises KeyboardInterrupt)."""


class StopSignal(BaseException):
    """Raised in the main thread when the process gets SIGTERM or SIGHUP while `stop_signals` is active."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_status(self) -> int:
        """The shell's status for a process ended by this signal (143 for SIGTERM)."""
        return 128 + self.signum


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into `StopSignal` while the block runs (only in the main thread).

    SIGINT stays KeyboardInterrupt. Inside `signals_held` each is put off until the held block ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if _held[0]:  # inside `signals_held`: raised when the block ends
            _held[1] = signum
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise StopSignal(signum)

    previous = {name: signal.signal(getattr(signal, name), handler) for name in (*_SIGNALS, "SIGINT")}
    try:
        yield
    finally:
        for name, old in previous.items():
            signal.signal(getattr(signal, name), old)


_held: list[Any] = [0, None]
"""Depth of `signals_held` blocks, and the signal `stop_signals`' handler put off meanwhile."""


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP while the block runs (they are delivered when it ends).

    Two layers: the main thread's signal mask, and `stop_signals`' handler, which puts off a signal that the
    kernel delivered to another thread (a signal to the process goes to any thread that does not block it, and
    Python then runs the handler in the main thread all the same).
    """
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    _held[0] += 1
    try:
        yield
    finally:
        _held[0] -= 1
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if not _held[0] and _held[1] is not None:
            signum, _held[1] = _held[1], None
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise StopSignal(signum)


def describe_stop(exc: BaseException) -> str:
    """What stopped the run, for the stop line."""
    if isinstance(exc, StopSignal):
        return exc.name
    if isinstance(exc, KeyboardInterrupt):
        return "Ctrl-C (SIGINT)"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


ROLLING_EVERY_S = 0.0
"""Default seconds between two rolling checkpoints (`Checkpointer`; ``--rolling-checkpoint-s``): 0, every update
(``benchmarks/rolling_checkpoint.py`` measures its cost against once a second and never)."""


class Checkpointer:
    """Commits of the learner's state, the periodic and rolling checkpoints, and the final one on a stop.

    Args:
        run_dir: The run dir (checkpoints go to ``checkpoints/``).
        keep_every: Every this many updates a commit is written durably and kept.
        start_version: The version the run starts from (a stop before any commit writes nothing new).
        rolling: Write other commits in the background as the rolling checkpoint (what a SIGKILL resumes from).
        rolling_every_s: Start a rolling write at most this often (seconds). 0: every commit, and a commit
            waits until the previous one is on disk, so a SIGKILL loses at most one commit. Otherwise the newest
            commit is the one written and a SIGKILL loses about this long of training.
        save: ``save(run_dir, state, durable) -> path``; `cloud.runs._checkpoint.save_checkpoint` by default.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(self, run_dir: Path, *, keep_every: int, start_version: int, rolling: bool = True,
                 rolling_every_s: float = ROLLING_EVERY_S,
                 save: Callable[[Path, dict[str, Any], bool], Path] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 <= rolling_every_s < float("inf"):  # also refuses NaN; rolling=False is "never"
            raise ConfigError(f"Checkpointer: rolling_every_s must be a finite number of seconds >= 0, got "
                              f"{rolling_every_s}")
        self.run_dir = Path(run_dir)
        self.keep_every = keep_every
        self.start_version = start_version
        self._save = save or (lambda run_dir, state, durable: save_checkpoint(run_dir, state, durable=durable))
        self._committed: dict[str, Any] | None = None
        self._on_disk: set[int] = set()
        self.last_path: Path | None = None
        self._rolling = rolling
        self._cond = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._writing = False
        self._closed = False
        self._rolled: int | None = None  # version of the rolling checkpoint on disk
        self._rolling_every_s = float(rolling_every_s)
        self._clock = clock
        self._last_roll: float | None = None  # clock() when the last rolling write started
        self._hurry = False  # drain(): write what is pending now, whatever the interval
        self._thread: threading.Thread | None = None
        if rolling:
            self._thread = threading.Thread(target=self._writer, name="strata-checkpoint", daemon=True)
            self._thread.start()

    @property
    def committed(self) -> dict[str, Any] | None:
        """The state of the last completed update, or None before the first."""
        return self._committed

    @property
    def version(self) -> int:
        """Version of the last commit (the start version before any)."""
        return int(self._committed["version"]) if self._committed is not None else self.start_version

    def commit(self, state: dict[str, Any]) -> None:
        """Record `state` (already cloned, holding ``"version"``) as the last completed update."""
        self._committed = state
        version = int(state["version"])
        if version % self.keep_every == 0:
            self._write(state, durable=True)
            with self._cond:
                self._drop_rolled(below=version)
        elif self._rolling:
            with self._cond:
                if self._rolling_every_s == 0:
                    # Every commit: the previous one is on disk before this one is handed over, so a SIGKILL
                    # loses at most the update committed last, however loaded the machine (the writer overlaps
                    # the next update and waits here only when it is slower than an update).
                    while (self._pending is not None or self._writing) and not self._closed:
                        self._cond.wait()
                self._pending = state
                self._cond.notify_all()

    def _write(self, state: dict[str, Any], *, durable: bool) -> Path:
        path = self._save(self.run_dir, state, durable)
        with self._cond:
            self._on_disk.add(int(state["version"]))
        self.last_path = path
        return path

    def _drop_rolled(self, *, below: int) -> None:
        """Delete the rolling checkpoint once a durable one of a later version exists (caller holds the lock)."""
        if self._rolled is not None and self._rolled < below and self._rolled % self.keep_every:
            checkpoint_path(self.run_dir, self._rolled).unlink(missing_ok=True)
            self._rolled = None

    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._pending is None or self._wait_s() > 0):
                    # A commit, drain() or close() notifies; the interval's end is a timeout.
                    self._cond.wait(timeout=None if self._pending is None else self._wait_s())
                if self._pending is None or self._closed:
                    return
                state, self._pending = self._pending, None
                self._writing = True
                self._last_roll = self._clock()
            try:
                version = int(state["version"])
                self._save(self.run_dir, state, False)
                with self._cond:
                    previous, self._rolled = self._rolled, version
                    if previous is not None and previous != version and previous % self.keep_every:
                        checkpoint_path(self.run_dir, previous).unlink(missing_ok=True)
                    # a durable checkpoint of a later version, written meanwhile, supersedes this one
                    self._drop_rolled(below=max(self._on_disk, default=-1))
            except Exception:
                pass
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()

    def _wait_s(self) -> float:
        """Seconds until the next rolling write may start (caller holds the lock)."""
        if self._hurry or self._last_roll is None:
            return 0.0
        return self._last_roll + self._rolling_every_s - self._clock()

    def drain(self) -> None:
        """Write the pending rolling checkpoint now, whatever the interval, and wait until the writer is idle."""
        with self._cond:
            self._hurry = True
            self._cond.notify_all()
            while (self._pending is not None and not self._closed) or self._writing:
                self._cond.wait()
            self._hurry = False

    def final(self) -> Path | None:
        """Write the last commit durably (unless it already is) and return it; None if nothing was committed."""
        self.drain()
        state = self._committed
        if state is None:
            return None
        version = int(state["version"])
        if not (version in self._on_disk and self.last_path is not None and int(self.last_path.stem) == version):
            with signals_held():
                self._write(state, durable=True)
        with self._cond:
            self._drop_rolled(below=version)
        return self.last_path

    def stopped(self, exc: BaseException, *, step: int, resume_command: str, what: str = "strata train") -> str:
        """The stop path of a learner: write the last commit (`final`) and return the one line to print.

        `step` is the learner's own step count, used only when nothing was committed yet.
        """
        path = self.final()
        committed = int(self._committed["global_step"]) if self._committed else step
        return stop_line(what=what, exc=exc, path=path, step=committed, version=self.version,
                         resume_command=resume_command)

    def close(self) -> None:
        """Stop the rolling writer (after its current write)."""
        with self._cond:
            self._closed = True
            self._pending = None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()


def stop_line(*, what: str, exc: BaseException, path: Path | None, step: int, version: int,
              resume_command: str) -> str:
    """The one line a stopped run prints: why, where the checkpoint is and how to resume."""
    why = describe_stop(exc)
    if path is None:
        return (f"{what}: stopped by {why} before completing an update; nothing new to checkpoint "
                f"(resume point unchanged)")
    return (f"{what}: stopped by {why} at step {step:,} (policy version {version}); checkpoint {path}; "
            f"resume with: {resume_command}")


def trim_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrite the JSONL file `path` without the records `keep` rejects and without torn lines; return drops."""
    path = Path(path)
    if not path.exists():
        return 0
    kept: list[str] = []
    dropped = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            dropped += 1  # a line torn by a kill
            continue
        if isinstance(record, dict) and keep(record):
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        write_atomic(path, "".join(f"{line}\n" for line in kept))
    return dropped


def resume_state(run_dir: Path, *, env_id: str, algo: str, caller: str, hint: str = "",
                 trim: bool = True) -> dict[str, Any]:
    """The newest checkpoint of the run `run_dir` holds, checked to be a `algo` run of `env_id`.

    With `trim`, the run's ``metrics.jsonl`` and ``switches.jsonl`` lose their lines past the checkpoint's version
    (the run may have gone on past it before a kill; a resumed run would log them twice). One reading for every
    learner that resumes (`cloud.runs._train`, `cloud.learners._sac`, `cloud.hybrid`), so each refuses the same way.

    Raises:
        ConfigError: No checkpoint (`hint` is appended to the message), a run of another algorithm or env.
    """
    from cloud.runs._metrics import METRICS_FILE
    from cloud.switching._control import SWITCHES_FILE

    path = latest_checkpoint(run_dir)
    if path is None:
        raise ConfigError(f"{caller}: --resume given but run dir {str(run_dir)!r} has no checkpoint{hint}; "
                          "drop --resume to start a new run")
    state = load_checkpoint(path)
    found = state.get("algo", "ppo")
    if found != algo:
        raise ConfigError(f"{caller}: run dir {str(run_dir)!r} holds a {found!r} run; resume it with --algo {found}")
    if state["env_id"] != env_id:
        raise ConfigError(f"{caller}: run dir {str(run_dir)!r} trains {state['env_id']!r}, not {env_id!r}; "
                          f"resume with --env {state['env_id']}")
    if trim:
        stop_at = int(state["version"])
        trim_jsonl(Path(run_dir) / METRICS_FILE, lambda r: int(r.get("policy_version", 0)) <= stop_at)
        trim_jsonl(Path(run_dir) / SWITCHES_FILE, lambda r: int(r.get("at_version", 0)) <= stop_at)
    return state
