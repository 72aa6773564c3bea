"""The run machinery every learner shares: run dir, checkpoints, metrics, switch log, control and the stop path.

PPO (`cloud.runs._train`), SAC (`cloud.runs._sac_run`) and rank 0 of a hybrid group (`cloud.hybrid`) drive a
training run through the same two pieces:

    open_run(spec)     fresh: refuse a run dir that already holds a run; resume: its newest checkpoint,
                       checked to be this algorithm's run of this env, the logs trimmed past it
    RunSession(spec)   entered around the training loop
        begin(...)     the run dir exists from here on: metrics.jsonl and switches.jsonl are opened, the first
                       switches line records the initial mode, the control endpoint (if any) is served
        commit(state)  each completed update becomes what any stop keeps (`cloud.runs._stop.Checkpointer`:
                       kept every ``checkpoint_every`` versions, the newest written in the background)
        log(...) / record_switch(...) / status(...)   metrics, switch log and the control snapshot
        on_close(fn)   what to close when the run ends, newest first
      leaving by return:     the closers run; `finish` has written the final checkpoint
      leaving by exception:  Ctrl-C, SIGTERM/SIGHUP (`StopSignal`), a source failure, a learner error: the last
                             commit is written and the one stop line is logged first (before closing anything can
                             hang or fail), then the closers run and the exception goes on; before `begin` (a
                             refusal while the run is built) there is nothing to keep: no stop line
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from cloud.runs._checkpoint import latest_checkpoint
from cloud.runs._metrics import MetricsWriter
from cloud.runs._stop import ROLLING_EVERY_S, Checkpointer, resume_state, stop_signals
from cloud.switching._control import SWITCHES_FILE, RunStatus
from device import ConfigError


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What names a training run and how it keeps its work; the same for every learner."""

    algo: str
    """``"ppo"`` or ``"sac"``: a run dir holds runs of one algorithm."""
    env_id: str
    run_dir: Path
    seed: int = 0
    total_steps: int
    """Env-step budget of the whole lineage; a resumed run stops at the same total."""
    resume: bool = False
    """Continue from the newest checkpoint in `run_dir` (it must exist)."""
    checkpoint_every: int = 100
    """Keep a checkpoint every this many policy versions (the last one always is)."""
    rolling_checkpoint_s: float = ROLLING_EVERY_S
    """Write the newest commit in the background at most this often (0: every commit)."""
    resume_command: str | None = None
    """The command the stop line tells the user to run; None: the basic ``strata train ... --resume``."""
    caller: str = "train"
    """Who is asking, for error messages."""

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ConfigError(f"{self.caller}: total_steps must be >= 1, got {self.total_steps}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"{self.caller}: checkpoint_every must be >= 1, got {self.checkpoint_every}")

    @property
    def command(self) -> str:
        """The command that resumes this run."""
        algo = " --algo sac" if self.algo == "sac" else ""
        return self.resume_command or (f"strata train{algo} --env {self.env_id} --run-dir {self.run_dir} "
                                       f"--total-steps {self.total_steps} --resume")


def resume_command(args: Any) -> str:
    """The command line that continues the run `strata train` was given: the same arguments, with ``--resume``."""
    import shlex

    argv = list(getattr(args, "argv", None) or ["train", "--env", args.env, "--run-dir", str(args.run_dir),
                                                 "--total-steps", str(args.total_steps)])
    if "--resume" not in argv:
        argv.append("--resume")
    return shlex.join(["strata", *argv])


def open_run(spec: RunSpec, *, also_taken: tuple[str, ...] = (), trim: bool = True) -> dict[str, Any] | None:
    """The state a run starts from: None for a fresh run, the newest checkpoint's for ``spec.resume``.

    Args:
        spec: The run.
        also_taken: Files whose presence in the run dir means it holds a run even without checkpoints (SAC's
            ``policy.onnx``: a trained policy is never overwritten).
        trim: On resume, drop the metrics and switch-log lines past the checkpoint (rank 0 of a group does; the
            other units read only).

    Raises:
        ConfigError: A fresh run into a dir that holds a run, a resume without a checkpoint, or one of another
            algorithm or env.
    """
    run_dir = Path(spec.run_dir)
    taken = [name for name in also_taken if (run_dir / name).exists()]
    if spec.resume:
        hint = (f" (it holds {', '.join(taken)} of a run that wrote no checkpoints; it is not overwritten)"
                if taken else "")
        return resume_state(run_dir, env_id=spec.env_id, algo=spec.algo, caller=spec.caller, hint=hint, trim=trim)
    if latest_checkpoint(run_dir) is not None or taken:
        raise ConfigError(f"{spec.caller}: run dir {str(run_dir)!r} already holds a run; pass --resume to continue "
                          "it or choose another --run-dir (a trained policy is never overwritten)")
    return None


class RunSession:
    """One training run's machinery while it goes (see the module docstring for its life).

    Args:
        spec: The run.
        start_version: The policy version the run starts from (a stop before any commit keeps nothing new).
        keep_every: Keep a checkpoint every this many versions (default ``spec.checkpoint_every``).
        log: Where the stop line goes.
        signals: Turn SIGTERM and SIGHUP into `StopSignal` while the session is open (a hybrid unit has its own
            stop flag and passes False).
        tensorboard: Also write TensorBoard event files (when installed).
    """

    def __init__(self, spec: RunSpec, *, start_version: int, keep_every: int | None = None,
                 log: Callable[[str], None] = print, signals: bool = True, tensorboard: bool = True) -> None:
        self.spec = spec
        self.run_dir = Path(spec.run_dir)
        self._log = log
        self._signals = signals
        self._tensorboard = tensorboard
        self._keep_every = keep_every or spec.checkpoint_every
        self._start_version = start_version
        self._stack = contextlib.ExitStack()
        self._metrics: MetricsWriter | None = None
        self._control: RunStatus | None = None
        self._closers: list[Callable[[], None]] = []
        self._begun = False
        self.start_step = 0

    def __enter__(self) -> RunSession:
        if self._signals:
            self._stack.enter_context(stop_signals())
        try:
            self.checkpointer = Checkpointer(self.run_dir, keep_every=self._keep_every,
                                             start_version=self._start_version,
                                             rolling_every_s=self.spec.rolling_checkpoint_s)
        except BaseException:
            self._stack.close()
            raise
        return self

    def begin(self, *, mode: str, step: int, version: int, reason: str = "initial mode",
              control: RunStatus | None = None) -> None:
        """The run starts: create the run dir, open the metrics log, record the initial mode, serve `control`."""
        self.start_step, self._begun = step, True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = MetricsWriter(self.run_dir, tensorboard=self._tensorboard)
        self.record_switch({"from_mode": None, "to_mode": mode, "reason": reason, "trigger": "start",
                            "at_step": step, "at_version": version, "pause_s": 0.0})
        if control is not None:
            self._control = control.start()

    def on_close(self, close: Callable[[], None]) -> None:
        """Run `close` when the session ends, however it ends (newest first)."""
        self._closers.append(close)

    def commit(self, state: dict[str, Any]) -> None:
        """The update is complete: `state` (cloned, with ``version`` and ``global_step``) is what any stop keeps."""
        self.checkpointer.commit(state)

    def log(self, *, global_step: int, policy_version: int, values: dict[str, float]) -> None:
        """Append one metrics record."""
        assert self._metrics is not None, "RunSession.log before begin()"
        self._metrics.log(global_step=global_step, policy_version=policy_version, values=values)

    def record_switch(self, record: dict[str, Any]) -> None:
        """Append one line to the run's switch log (``switches.jsonl``)."""
        with (self.run_dir / SWITCHES_FILE).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def status(self, **values: Any) -> None:
        """Merge figures into the control endpoint's status snapshot (no-op without an endpoint)."""
        if self._control is not None:
            self._control.update(**values)

    def finish(self) -> Path | None:
        """The run is over: write the last commit durably; return the newest checkpoint."""
        return self.checkpointer.final() or latest_checkpoint(self.run_dir)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None and self._begun:  # a refusal while building the run is the error alone
                # The stop path: the last completed update is written first, before closing anything can hang.
                self._log(self.checkpointer.stopped(exc, step=self.start_step, resume_command=self.spec.command))
        finally:
            self.checkpointer.close()
            if self._control is not None:
                self._control.stop()
            for close in reversed(self._closers):
                close()
            if self._metrics is not None:
                self._metrics.close()
            self._stack.close()
