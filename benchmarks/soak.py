"""Soak: one live PPO run with an edge fleet for a set time while things break on a seeded schedule.

One `strata train` run (PPO on CartPole-v1, ``--modes colocated decoupled functions``, the real CLI in a
subprocess) feeds a small edge fleet: every 2 minutes (30 s in a soak of 10 minutes or less; a thread of its
own) the newest checkpoint is exported (`strata export`) and published (`strata publish`) to a real Mosquitto
broker, and ``--agents`` edge agents (`strata edge run` subprocesses) follow it. A seeded schedule
(``--seed``) meanwhile:

    kill -9   a co-located pool worker, a decoupled env service, a local function worker, an edge agent
              (the soak restarts a killed agent, as its service manager would; the run must heal the rest)
    restart   the broker (SIGTERM, then the same port and persistence file)
    switch    `strata switch` to another mode every ``--switch-every`` seconds
    resume    SIGTERM of the trainer every ``--resume-every`` seconds, then `strata train ... --resume`

Every ``--sample-every`` seconds it samples, per role (trainer, pool worker, env service, functions
runtime, function worker, edge agent, broker): process count, RSS, open fds and threads; and the
/dev/shm segments named after a soak process, the files under the soak's own TMPDIR, the run dir's
size, env steps/s and the policy version.

At the end it checks:

    faults      every fault recovered within ``--recovery-bound-s``: a trainer-side kill once the run
                completed 2 more updates, an edge kill once the restarted agent is online on the latest
                published version, a broker restart once every agent reported again on that version
    modes       a final `strata switch` into every mode succeeds (a killed worker/service was replaced)
    stops       every trainer stopped by SIGTERM exits with 143 within 120 s
    resume      the final checkpoint resumes: `strata train --resume` continues it by 2 updates
    edge        every agent is online on the last published version
    accounting  transitions lost / duplicated, counted two ways and summed:
                - stream level, per trainer segment: the "transitions produced, consumed, duplicates,
                  gaps" line each segment prints when it ends (by SIGTERM or its budget); duplicates are
                  transitions the learner consumed twice (same stream id and sequence number), lost are
                  sequence gaps inside a stream;
                - lineage level, from what the run dir records: the update records of metrics.jsonl
                  must be policy versions 1..N exactly once with global_step == version * batch, and the
                  final checkpoint must hold version N at N * batch steps; a repeated version counts its
                  batch as duplicated, a missing one as lost.
                The rollout a SIGTERM interrupts is produced but never consumed by design (the checkpoint
                is the last completed update); it is reported as ``discarded_at_stops``, not as lost.
    slopes      least-squares slope per hour of each sampled figure after warm-up, pooled within trainer
                segments (each segment's own mean removed, so a resume's restart is not a trend), with
                its standard error.

Plots (matplotlib) of every figure over time go into ``--out``; a table and one JSON line end the output.

    .venv/bin/python benchmarks/soak.py [--quick] [--duration S] [--seed N] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mosquitto import free_port

STRATA = str(Path(sys.executable).with_name("strata"))
ENV_ID = "CartPole-v1"
MODES = ("colocated", "decoupled", "functions")
NUM_ENVS, NUM_STEPS = 4, 32
BATCH = NUM_ENVS * NUM_STEPS
FLEET = "soak"
TRAINER_KINDS = ("pool-worker", "env-service", "function-worker")
MODE_OF = {"pool-worker": "colocated", "env-service": "decoupled", "function-worker": "functions"}
FAULT_KINDS = (*TRAINER_KINDS, "edge-agent", "broker")
SHM_PREFIX = "strata_colo_"
MARKER = ".strata-soak"
"""File that marks a folder as a soak's output (only such a folder is replaced)."""
STOP_BOUND_S = 120.0
"""Seconds a trainer may take to exit after SIGTERM before the soak calls it hung and kills it."""
ACCOUNTING = re.compile(r"transitions produced ([\d,]+), consumed ([\d,]+), duplicates (\d+), gaps (\d+)")


@dataclass(frozen=True, kw_only=True)
class SoakConfig:
    """Settings of one soak."""

    duration_s: float
    seed: int
    out: Path
    agents: int
    sample_every_s: float
    fault_every_s: float
    switch_every_s: float
    resume_every_s: float
    publish_every_s: float
    recovery_bound_s: float
    warmup_s: float


@dataclass
class Fault:
    """One injected fault and when it was seen recovered."""

    kind: str
    at_s: float
    target: str
    version: int
    published: int
    recovered_s: float | None = None


@dataclass
class Segment:
    """One `strata train` process of the lineage."""

    started_s: float
    proc: subprocess.Popen[bytes]
    log: Path
    ended_s: float | None = None
    returncode: int | None = None
    stop_s: float | None = None
    """Seconds from the SIGTERM to the exit (a trainer still alive after `STOP_BOUND_S` is killed)."""


@dataclass
class State:
    """Everything the soak records while it goes."""

    t0: float = field(default_factory=time.monotonic)
    samples: list[dict[str, Any]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    switches: list[dict[str, Any]] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    publish_failures: list[str] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        """Seconds since the soak started."""
        return time.monotonic() - self.t0

    def say(self, line: str) -> None:
        """Print a progress line."""
        print(f"soak {self.now():7.1f}s: {line}", flush=True)


def _strata(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STRATA, *args], capture_output=True, text=True, timeout=timeout)


class Broker:
    """Mosquitto on a fixed loopback port with a persistence file, restartable on the same port."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text("\n".join([f"listener {self.port} 127.0.0.1", "allow_anonymous true",
                                        f"user {getpass.getuser()}", "persistence true",
                                        f"persistence_location {workdir}/", "autosave_interval 5", ""]))
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        """Start Mosquitto on the port (retrying while a previous one still holds it)."""
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        deadline = time.monotonic() + 30
        while True:
            self.proc = subprocess.Popen([binary, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            if self._listening(self.proc, deadline=time.monotonic() + 5):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto did not start on port {self.port} (config {self.conf})")
            time.sleep(0.5)  # the port may still be in TIME_WAIT after a restart

    def _listening(self, proc: subprocess.Popen[bytes], *, deadline: float) -> bool:
        import socket

        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def restart(self) -> None:
        """Stop and start again on the same port and persistence file."""
        self.stop()
        self.start()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Soak:
    """The run, the fleet, the schedule and the sampler of one soak."""

    def __init__(self, config: SoakConfig) -> None:
        from device import generate_keypair

        self.config = config
        self.out = config.out
        if self.out.exists():
            shutil.rmtree(self.out)  # main() checked that it is a soak's own folder
        self.out.mkdir(parents=True)
        (self.out / MARKER).write_text("written by benchmarks/soak.py; replaced by the next soak into this folder\n")
        self.tmp = self.out / "tmp"
        self.tmp.mkdir()
        self.run_dir = self.out / "run"
        self.env = {**os.environ, "TMPDIR": str(self.tmp)}
        self.key, self.pub = generate_keypair(self.out / "keys")
        self.state = State()
        self.rng = random.Random(config.seed)
        self.broker = Broker(self.out / "broker")
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.monitor: Any = None
        self._stop_sampling = threading.Event()
        self._publishing = threading.Event()  # set while no publish is under way
        self._publishing.set()
        self._watching = threading.Event()  # cleared to stop the watcher
        self._watching.set()
        self._resumed_from = 0  # the policy version a resumed trainer must pass before it counts as started

    # --- the pieces -------------------------------------------------------------------------------------------

    def start_trainer(self, *, resume: bool) -> Segment:
        """`strata train` (fresh or ``--resume``); returns once it completed an update."""
        n = len(self.state.segments)
        log = self.out / f"trainer-{n}.log"
        args = [STRATA, "train", "--env", ENV_ID, "--preset", "none", "--total-steps", str(10**10),
                "--run-dir", str(self.run_dir), "--seed", str(self.config.seed), "--num-envs", str(NUM_ENVS),
                "--num-steps", str(NUM_STEPS), "--update-epochs", "2", "--hidden-sizes", "32", "32",
                "--checkpoint-every", "1000", "--modes", *MODES]
        with log.open("wb") as f:
            proc = subprocess.Popen([*args, "--resume"] if resume else args, stdout=f, stderr=subprocess.STDOUT,
                                    env=self.env)
        segment = Segment(started_s=self.state.now(), proc=proc, log=log)
        self.state.segments.append(segment)
        self._wait(lambda: (self.run_dir / "control.json").exists() and self.version() > self._resumed_from,
                   what="the trainer's first update", proc=proc, timeout=300)
        return segment

    def stop_trainer(self) -> None:
        """SIGTERM the trainer and wait for its exit."""
        segment = self.state.segments[-1]
        started = time.monotonic()
        segment.proc.send_signal(signal.SIGTERM)
        try:
            segment.returncode = segment.proc.wait(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            self.state.say(f"the trainer did not exit within {STOP_BOUND_S:g} s of SIGTERM; killing it")
            segment.proc.kill()
            segment.returncode = segment.proc.wait()
        segment.stop_s = time.monotonic() - started
        segment.ended_s = self.state.now()

    def resume_trainer(self) -> None:
        """SIGTERM, then `strata train --resume`."""
        self.stop_trainer()
        self.state.say(f"trainer stopped by SIGTERM (exit {self.state.segments[-1].returncode}) at policy version "
                       f"{self.version()}; resuming")
        self._resumed_from = self.version()
        self.start_trainer(resume=True)

    def start_agent(self, node: str) -> None:
        """`strata edge run` for `node` (its cache dir survives a restart)."""
        log = self.out / "edge" / f"{node}.log"
        log.parent.mkdir(exist_ok=True)
        with log.open("ab") as f:
            self.agents[node] = subprocess.Popen(
                [STRATA, "edge", "run", "--fleet", FLEET, "--node-id", node, "--cache-dir",
                 str(self.out / "edge" / node), "--trust", str(self.pub), "--broker", self.broker.url,
                 "--control-period-s", "0.02", "--telemetry-interval-s", "2", "--health-deadline-s", "120",
                 "--health-latency-budget-ms", "5000"], stdout=f, stderr=subprocess.STDOUT, env=self.env)

    def publish(self) -> None:
        """Export the newest checkpoint and publish it to the fleet."""
        bundle = self.out / "bundles" / "latest.bundle"
        bundle.parent.mkdir(exist_ok=True)
        exported = _strata("export", "--run", str(self.run_dir), "--out", str(bundle), "--key", str(self.key),
                           "--tier", "edge", "--policy", "cartpole")
        if exported.returncode != 0:
            self.state.publish_failures.append(f"export: {exported.stderr.strip()[-300:]}")
            self.state.say(self.state.publish_failures[-1])
            return
        published = _strata("publish", str(bundle), "--broker", self.broker.url, "--fleet", FLEET,
                            "--timeout", "30")
        match = re.search(r"published \S+ v(\d+)", published.stdout)
        if published.returncode != 0 or match is None:
            self.state.publish_failures.append(f"publish: {published.stderr.strip()[-300:]}")
            self.state.say(self.state.publish_failures[-1])
            return
        self.state.published.append(int(match.group(1)))
        self.state.say(f"published v{match.group(1)}")

    def version(self) -> int:
        """The newest policy version in metrics.jsonl (0 before the first update)."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return 0
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            lines = f.read().decode(errors="replace").splitlines()
        for line in reversed(lines):
            try:
                return int(json.loads(line)["policy_version"])
            except (ValueError, KeyError):
                continue
        return 0

    def _wait(self, condition: Any, *, what: str, proc: subprocess.Popen[bytes] | None = None,
              timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"soak: {what}: the process exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"soak: timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.2)

    # --- processes and samples --------------------------------------------------------------------------------

    def processes(self) -> Iterator[tuple[str, int]]:
        """Every live process of the soak (pid) with its role."""
        roots: list[tuple[str, int]] = []
        if self.state.segments and self.state.segments[-1].proc.poll() is None:
            roots.append(("trainer", self.state.segments[-1].proc.pid))
        if self.broker.proc is not None and self.broker.proc.poll() is None:
            roots.append(("broker", self.broker.proc.pid))
        roots += [("edge-agent", p.pid) for p in self.agents.values() if p.poll() is None]
        table = proc_table()
        for role, pid in roots:
            if pid not in table:
                continue
            yield role, pid
            for child in descendants(pid, table):
                yield role_of(table[child][1], default=role), child

    def sample(self) -> dict[str, Any]:
        """One sample of every figure (see the module docstring)."""
        roles: dict[str, dict[str, float]] = {}
        for role, pid in self.processes():
            figures = proc_figures(pid)
            if figures is None:
                continue
            with self.state.lock:
                self.state.pids.add(pid)
            r = roles.setdefault(role, {"count": 0, "rss_mb": 0.0, "fds": 0, "threads": 0})
            r["count"] += 1
            for k, v in figures.items():
                r[k] += v
        shm = [n for n in _listdir(Path("/dev/shm")) if n.startswith(SHM_PREFIX)
               and _pid_of_segment(n) in self.state.pids]
        return {"t": self.state.now(), "roles": roles, "shm_segments": len(shm),
                "tmp_files": sum(len(files) for _, _, files in os.walk(self.tmp)),
                "run_dir_mb": _tree_bytes(self.run_dir) / 2**20, "version": self.version(),
                "segment": len(self.state.segments) - 1}

    def sampler(self) -> None:
        """Sample every ``sample_every_s`` until stopped (a thread)."""
        while not self._stop_sampling.is_set():
            started = time.monotonic()
            s = self.sample()
            with self.state.lock:
                prev = self.state.samples[-1] if self.state.samples else None
                s["steps_per_s"] = (max(0, s["version"] - prev["version"]) * BATCH / max(s["t"] - prev["t"], 1e-9)
                                    if prev else 0.0)
                self.state.samples.append(s)
            self._stop_sampling.wait(max(0.0, self.config.sample_every_s - (time.monotonic() - started)))

    # --- faults -----------------------------------------------------------------------------------------------

    def watcher(self) -> None:
        """Check the open faults' recovery every half second (a thread, so a blocking switch delays no check)."""
        while self._watching.is_set():
            self.check_recoveries()
            time.sleep(0.5)

    def publisher(self) -> None:
        """Export and publish every ``publish_every_s`` until stopped (a thread: an export takes seconds)."""
        while not self._stop_sampling.wait(self.config.publish_every_s):
            self._publishing.clear()
            try:
                self.publish()
            finally:
                self._publishing.set()

    def inject(self, kind: str) -> None:
        """Inject one fault of `kind` (a trainer-side kill skips when no such process exists)."""
        version, published = self.version(), (self.state.published[-1] if self.state.published else 0)
        if kind == "broker":
            self.broker.restart()
            target = f"mosquitto :{self.broker.port}"
        elif kind == "edge-agent":
            node = self.rng.choice(sorted(self.agents))
            self.agents[node].kill()
            self.agents[node].wait()
            target = node
            self.start_agent(node)
        else:
            # Half the kills hit the mode feeding the learner (mid-rollout), the rest a warm standby when it has
            # processes of that kind (a function worker lives only while its mode is used).
            victims = sorted(pid for role, pid in self.processes() if role == kind)
            if (not victims or self.rng.random() < 0.5) and self.current_mode() != MODE_OF[kind]:
                self.switch(MODE_OF[kind])
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not (
                        victims := sorted(pid for role, pid in self.processes() if role == kind)):
                    time.sleep(0.2)
                version = self.version()
            if not victims:
                self.state.skipped.append(f"{self.state.now():.0f}s {kind}: no such process")
                self.state.say(f"fault {kind} skipped: no such process")
                return
            pid = self.rng.choice(victims)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                self.state.skipped.append(f"{self.state.now():.0f}s {kind}: pid {pid} already gone")
                return
            target = f"pid {pid}"
        self.state.faults.append(Fault(kind=kind, at_s=self.state.now(), target=target, version=version,
                                       published=published))
        self.state.say(f"fault {kind}: {target} (policy version {version}, published v{published})")

    def check_recoveries(self) -> None:
        """Mark the faults whose recovery condition holds now (see the module docstring)."""
        open_faults = [f for f in list(self.state.faults) if f.recovered_s is None]
        if not open_faults:
            return
        version = self.version()
        views = {v.node: v for v in self.monitor.snapshot()}
        now = self.state.now()
        wall = time.time()
        for f in open_faults:
            if f.kind in TRAINER_KINDS:
                ok = version >= f.version + 2
            else:
                nodes = [f.target] if f.kind == "edge-agent" else sorted(self.agents)
                since = wall - (now - f.at_s)
                ok = all(n in views and views[n].online and (views[n].version or 0) >= f.published
                         and views[n].status_age_s is not None and wall - views[n].status_age_s >= since
                         for n in nodes)
            if ok:
                f.recovered_s = now - f.at_s
                self.state.say(f"recovered from {f.kind} ({f.target}) in {f.recovered_s:.1f} s")

    def current_mode(self) -> str | None:
        """The mode feeding the learner now, from the run's control endpoint (None while it is not up)."""
        from cloud.switching._control import ControlClient, ControlError

        try:
            mode = ControlClient.for_run(self.run_dir).status().get("mode")
        except (ControlError, OSError):
            return None
        return str(mode) if mode else None

    def switch(self, to: str) -> dict[str, Any]:
        """`strata switch` to `to`; its exit status, time and answer."""
        started = time.monotonic()
        done = _strata("switch", str(self.run_dir), "--to", to, "--timeout", "120", timeout=180)
        record = {"at_s": round(self.state.now(), 1), "to": to, "rc": done.returncode,
                  "seconds": round(time.monotonic() - started, 2),
                  "said": (done.stdout.strip() or done.stderr.strip())[-200:]}
        self.state.switches.append(record)
        self.state.say(f"switch to {to}: rc {done.returncode}: {record['said']}")
        return record

    # --- the whole soak ---------------------------------------------------------------------------------------

    def schedule(self) -> list[tuple[float, str]]:
        """(seconds into the soak, event) for the whole duration, from the seed."""
        c, events = self.config, []
        kinds: list[str] = []
        t = c.fault_every_s
        while t < c.duration_s:
            if not kinds:
                kinds = list(FAULT_KINDS)
                self.rng.shuffle(kinds)
            events.append((t + self.rng.uniform(-0.2, 0.2) * c.fault_every_s, f"fault:{kinds.pop()}"))
            t += c.fault_every_s
        t = c.switch_every_s
        while t < c.duration_s:
            events.append((t + self.rng.uniform(-0.2, 0.2) * c.switch_every_s, "switch"))
            t += c.switch_every_s
        t = c.resume_every_s
        while t < c.duration_s - c.resume_every_s / 4:
            events.append((t, "resume"))
            t += c.resume_every_s
        return sorted(events)

    def run(self) -> dict[str, Any]:
        """The whole soak; returns the figures."""
        from edge import FleetMonitor

        c = self.config
        events = self.schedule()
        self.start_trainer(resume=False)
        self.publish()
        for i in range(c.agents):
            self.start_agent(f"edge-{i}")
        self.monitor = FleetMonitor(broker=self.broker.url, fleet=FLEET, client_id="soak-monitor").start()
        sampler = threading.Thread(target=self.sampler, daemon=True)
        sampler.start()
        publisher = threading.Thread(target=self.publisher, daemon=True)
        publisher.start()
        watcher = threading.Thread(target=self.watcher, daemon=True)
        watcher.start()
        try:
            for at, event in events:
                while self.state.now() < at:
                    time.sleep(0.2)
                if event.startswith("fault:"):
                    self.inject(event.removeprefix("fault:"))
                elif event == "switch":
                    self.switch(self.rng.choice([m for m in MODES if m != self.current_mode()]))
                elif event == "resume":
                    self.resume_trainer()
            while self.state.now() < c.duration_s:
                time.sleep(0.2)
            return self.finish()
        finally:
            self._stop_sampling.set()
            sampler.join(timeout=60)
            publisher.join(timeout=300)
            self._watching.clear()
            watcher.join(timeout=60)
            self.teardown()

    def finish(self) -> dict[str, Any]:
        """The end checks (see the module docstring)."""
        c = self.config
        self._stop_sampling.set()  # the slopes are over the soak itself, not the checks after it; no more publishing
        self._publishing.wait(timeout=300)
        # Let the last faults heal (up to the bound), then every mode must take the run once more.
        deadline = time.monotonic() + c.recovery_bound_s
        while any(f.recovered_s is None for f in self.state.faults) and time.monotonic() < deadline:
            time.sleep(0.5)
        final_switches = []
        mode = self.current_mode() or MODES[0]
        for to in [m for m in MODES if m != mode] + [mode]:
            final_switches.append(self.switch(to))
        self.publish()
        last = self.state.published[-1] if self.state.published else None
        edge_deadline = time.monotonic() + c.recovery_bound_s
        views: list[Any] = []
        while time.monotonic() < edge_deadline:
            views = [v for v in self.monitor.snapshot() if v.node in self.agents]
            if len(views) == len(self.agents) and all(v.online and v.version == last for v in views):
                break
            time.sleep(0.5)
        final_sample = self.sample()
        self.stop_trainer()
        resume = self.check_resume()
        return self.report(final_switches=final_switches, views=views, last=last, resume=resume,
                           final_sample=final_sample)

    def check_resume(self) -> dict[str, Any]:
        """Resume the stopped run for 2 more updates."""
        from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint

        state = load_checkpoint(latest_checkpoint(self.run_dir))  # type: ignore[arg-type]
        version, step = int(state["version"]), int(state["global_step"])
        self.lineage_before_check = lineage(self.run_dir)
        done = _strata("train", "--env", ENV_ID, "--run-dir", str(self.run_dir), "--resume", "--total-steps",
                       str(step + 2 * BATCH), "--no-control", timeout=600)
        expected = f"policy version {version + 2}, {step + 2 * BATCH:,} env steps"
        return {"version": version, "global_step": step, "rc": done.returncode,
                "ok": done.returncode == 0 and expected in done.stdout and step == version * BATCH,
                "said": (done.stdout.strip().splitlines() or [""])[-1][-200:] if done.returncode == 0
                else done.stderr.strip()[-300:]}

    def teardown(self) -> None:
        """Stop everything the soak started."""
        for segment in self.state.segments:
            if segment.proc.poll() is None:
                segment.proc.kill()
                segment.proc.wait()
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.monitor is not None:
            self.monitor.close()
        self.broker.stop()

    # --- the report -------------------------------------------------------------------------------------------

    def report(self, *, final_switches: list[dict[str, Any]], views: list[Any], last: int | None,
               resume: dict[str, Any], final_sample: dict[str, Any]) -> dict[str, Any]:
        """The figures and checks of the soak."""
        c, st = self.config, self.state
        streams = [stream_accounting(s.log) for s in st.segments]
        counted = [a for a in streams if a is not None]
        lin = self.lineage_before_check
        duplicated = sum(a["duplicates"] for a in counted) + lin["duplicated_versions"] * BATCH
        lost = sum(a["gaps"] for a in counted) + lin["missing_versions"] * BATCH
        discarded = sum(max(0, a["produced"] - a["consumed"]) for a in counted)
        faults = [{"kind": f.kind, "at_s": round(f.at_s, 1), "target": f.target,
                   "recovered_s": None if f.recovered_s is None else round(f.recovered_s, 1)} for f in st.faults]
        recovered = [f for f in st.faults if f.recovered_s is not None and f.recovered_s <= c.recovery_bound_s]
        samples = st.samples
        slopes = {name: pooled_slope(samples, key, warmup_s=c.warmup_s) for name, key in figure_keys(samples)}
        warm = [s for s in samples if s["t"] >= c.warmup_s]
        first, end = (warm[0] if warm else final_sample), final_sample
        start_end = {role: {k: [round(first["roles"].get(role, {}).get(k, 0), 1),
                                round(end["roles"].get(role, {}).get(k, 0), 1)] for k in ("count", "rss_mb", "fds")}
                     for role in sorted(set(first["roles"]) | set(end["roles"]))}
        rates = [s["steps_per_s"] for s in samples[1:]]
        checks = {
            "faults_recovered": len(recovered) == len(st.faults),
            "every_mode_after_faults": all(switched(s) for s in final_switches),
            "checkpoint_resumes": bool(resume["ok"]),
            "edge_on_latest": last is not None and len(views) == len(self.agents)
            and all(v.online and v.version == last for v in views),
            "lineage_exact": lin["exact"],
            "trainer_stops_clean": all(s.returncode == 143 and (s.stop_s or 0) < STOP_BOUND_S
                                       for s in st.segments),
            "no_transition_lost_or_duplicated": lost == 0 and duplicated == 0,
            "no_shm_left": self.sample()["shm_segments"] == 0,
        }
        return {
            "benchmark": "soak", "duration_s": c.duration_s, "seed": c.seed, "out": str(c.out),
            "agents": c.agents, "samples": len(samples), "warmup_s": c.warmup_s,
            "recovery_bound_s": c.recovery_bound_s,
            "faults_injected": len(st.faults), "faults_recovered": len(recovered),
            "faults_skipped": st.skipped,
            "max_recovery_s": max((f.recovered_s for f in st.faults if f.recovered_s is not None), default=None),
            "faults": faults,
            "switches": len(st.switches), "switches_failed": [s for s in st.switches if not switched(s)],
            "final_switches": final_switches, "resumes": len(st.segments) - 1,
            "segments": [{"rc": s.returncode, "stop_s": None if s.stop_s is None else round(s.stop_s, 1),
                          "accounting": a} for s, a in zip(st.segments, streams, strict=True)],
            "published_versions": len(st.published), "last_published": last,
            "publish_failures": st.publish_failures,
            "edge": [{"node": v.node, "online": v.online, "version": v.version} for v in views],
            "resume_check": resume, "lineage": lin,
            "transitions_lost": lost, "transitions_duplicated": duplicated, "discarded_at_stops": discarded,
            "steps_per_s_median": sorted(rates)[len(rates) // 2] if rates else 0.0,
            "start_end": start_end, "slopes_per_h": slopes, "checks": checks, "ok": all(checks.values()),
        }


def switched(record: dict[str, Any]) -> bool:
    """Whether a `strata switch` left the run in its target mode (a refusal because it already was counts)."""
    return bool(record["rc"] == 0 or "the run is already in mode" in record["said"])


def proc_table() -> dict[int, tuple[int, str]]:
    """Map each pid to its parent pid and command line, from /proc."""
    table = {}
    for name in _listdir(Path("/proc")):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmd.strip())
    return table


def descendants(pid: int, table: dict[int, tuple[int, str]]) -> list[int]:
    """Every process below `pid`."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found


def proc_figures(pid: int) -> dict[str, float] | None:
    """RSS (MB), open fds and threads of `pid` from /proc (None once it is gone)."""
    try:
        rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("Threads:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None
    return {"rss_mb": rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20, "fds": fds, "threads": threads}


def role_of(cmd: str, *, default: str) -> str:
    """A child's role from its command line."""
    if "envs serve" in cmd:
        return "env-service"
    if "functions serve" in cmd:
        return "functions-runtime"
    if "functions._worker" in cmd:
        return "function-worker"
    if "resource_tracker" in cmd:
        return "resource-tracker"
    if default == "trainer" and (" train " in cmd or "multiprocessing" in cmd):
        return "pool-worker"  # the co-located pool's workers are forks of the trainer
    return f"{default}-child"


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _pid_of_segment(name: str) -> int:
    try:
        return int(name.removeprefix(SHM_PREFIX).split("_")[0])
    except ValueError:
        return -1


def _tree_bytes(root: Path) -> int:
    total = 0
    for base, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(base) / name).stat().st_size
    return total


def stream_accounting(log: Path) -> dict[str, int] | None:
    """The last "transitions produced ..., consumed ..., duplicates ..., gaps ..." line a segment printed."""
    matches = ACCOUNTING.findall(log.read_text(errors="replace")) if log.exists() else []
    if not matches:
        return None
    produced, consumed, duplicates, gaps = matches[-1]
    return {"produced": int(produced.replace(",", "")), "consumed": int(consumed.replace(",", "")),
            "duplicates": int(duplicates), "gaps": int(gaps)}


def lineage(run_dir: Path) -> dict[str, Any]:
    """What the run dir records: update records of metrics.jsonl vs the final checkpoint."""
    from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint
    from cloud.runs._metrics import read_metrics

    updates = [r for r in read_metrics(run_dir) if "perf/env_steps_per_s" in r]
    versions = [int(r["policy_version"]) for r in updates]
    state = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    n = int(state["version"])
    unique = set(versions)
    wrong_steps = sum(1 for r in updates if int(r["global_step"]) != int(r["policy_version"]) * BATCH)
    missing = len(set(range(1, n + 1)) - unique)
    return {"checkpoint_version": n, "checkpoint_step": int(state["global_step"]), "update_records": len(updates),
            "duplicated_versions": len(versions) - len(unique), "missing_versions": missing,
            "records_past_checkpoint": sum(1 for v in unique if v > n), "wrong_steps": wrong_steps,
            "exact": missing == 0 and len(versions) == len(unique) and wrong_steps == 0
            and int(state["global_step"]) == n * BATCH and versions == sorted(versions)}


def figure_keys(samples: list[dict[str, Any]]) -> list[tuple[str, tuple[str, ...]]]:
    roles = sorted({r for s in samples for r in s["roles"]})
    keys: list[tuple[str, tuple[str, ...]]] = []
    for role in roles:
        keys += [(f"{role}.{k}", ("roles", role, k)) for k in ("rss_mb", "fds", "threads")]
    keys += [(k, (k,)) for k in ("shm_segments", "tmp_files", "run_dir_mb", "steps_per_s")]
    return keys


def _value(sample: dict[str, Any], key: tuple[str, ...]) -> float:
    value: Any = sample
    for k in key:
        value = value.get(k, {}) if isinstance(value, dict) else {}
    return float(value) if isinstance(value, int | float) else 0.0


def pooled_slope(samples: list[dict[str, Any]], key: tuple[str, ...], *, warmup_s: float) -> dict[str, float]:
    """Least-squares slope per hour after warm-up, pooled within trainer segments, with its standard error."""
    by_segment: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        by_segment.setdefault(s["segment"], []).append((s["t"], _value(s, key)))
    sxx = sxy = 0.0
    residuals: list[tuple[float, float]] = []
    for points in by_segment.values():
        start = points[0][0] + warmup_s
        kept = [p for p in points if p[0] >= start]
        if len(kept) < 3:
            continue
        mt = sum(p[0] for p in kept) / len(kept)
        my = sum(p[1] for p in kept) / len(kept)
        centred = [(t - mt, y - my) for t, y in kept]
        sxx += sum(dt * dt for dt, _ in centred)
        sxy += sum(dt * dy for dt, dy in centred)
        residuals += centred
    if sxx == 0:
        return {"slope": float("nan"), "se": float("nan"), "n": 0}
    slope = sxy / sxx
    dof = max(len(residuals) - 2, 1)
    sigma2 = sum((dy - slope * dt) ** 2 for dt, dy in residuals) / dof
    return {"slope": round(slope * 3600, 3), "se": round(math.sqrt(sigma2 / sxx) * 3600, 3), "n": len(residuals)}


def plot(samples: list[dict[str, Any]], faults: list[dict[str, Any]], out: Path) -> list[str]:
    """One PNG per figure group; returns the files written (none without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        print("soak: matplotlib is not installed; no plots")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    roles = sorted({r for s in samples for r in s["roles"]})
    t = [s["t"] / 60 for s in samples]
    groups: list[tuple[str, list[tuple[str, tuple[str, ...]]]]] = [
        (f"{k}.png", [(role, ("roles", role, k)) for role in roles]) for k in ("rss_mb", "fds", "threads")]
    groups += [(f"{k}.png", [(k, (k,))]) for k in ("shm_segments", "tmp_files", "run_dir_mb", "steps_per_s")]
    for name, series in groups:
        fig, ax = plt.subplots(figsize=(9, 4))
        for label, key in series:
            ax.plot(t, [_value(s, key) for s in samples], label=label, linewidth=1)
        for f in faults:
            ax.axvline(f["at_s"] / 60, color="grey", alpha=0.25, linewidth=0.8)
        ax.set_xlabel("minutes (grey lines: faults)")
        ax.set_title(name.removesuffix(".png"))
        if len(series) > 1:
            ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        written.append(name)
    return written


def print_table(fig: dict[str, Any]) -> None:
    print(f"{'role':<20} {'count':>11} {'RSS MB start/end':>18} {'fds start/end':>14}")
    for role, v in fig["start_end"].items():
        print(f"{role:<20} {v['count'][0]:>5.0f}/{v['count'][1]:<5.0f} {v['rss_mb'][0]:>8.1f}/{v['rss_mb'][1]:<9.1f} "
              f"{v['fds'][0]:>6.0f}/{v['fds'][1]:<7.0f}")
    print(f"\n{'figure':<32} {'slope/h':>10} {'+-se':>9}")
    for name, s in fig["slopes_per_h"].items():
        print(f"{name:<32} {s['slope']:>10.2f} {s['se']:>9.2f}")
    by_kind: dict[str, list[Any]] = {}
    for f in fig["faults"]:
        by_kind.setdefault(f["kind"], []).append(f["recovered_s"])
    print(f"\n{'fault':<18} {'injected':>8} {'recovered':>9} {'max s':>7}")
    for kind, rec in sorted(by_kind.items()):
        done = [r for r in rec if r is not None]
        print(f"{kind:<18} {len(rec):>8} {len(done):>9} {max(done, default=float('nan')):>7.1f}")
    print(f"\nswitches {fig['switches']} (failed {len(fig['switches_failed'])}), resumes {fig['resumes']}, "
          f"published {fig['published_versions']} versions (last v{fig['last_published']}), "
          f"median {fig['steps_per_s_median']:,.0f} env steps/s")
    print(f"transitions lost {fig['transitions_lost']}, duplicated {fig['transitions_duplicated']}, "
          f"discarded at stops {fig['discarded_at_stops']}")
    for name, ok in fig["checks"].items():
        print(f"check {name:<34} {'ok' if ok else 'FAILED'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 minutes, faults every 15 s (default: 2 hours)")
    parser.add_argument("--duration", type=float, default=None, help="seconds to soak (default: 7200; 180 quick)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule and of the run")
    parser.add_argument("--out", type=Path, default=Path("soak-out"), help="folder for the run, logs and plots "
                        "(a previous soak's folder is replaced; any other existing folder is refused)")
    parser.add_argument("--agents", type=int, default=2, help="edge agents (default: 2)")
    parser.add_argument("--fault-every", type=float, default=None,
                        help="seconds between faults (default: 60; 15 quick)")
    parser.add_argument("--switch-every", type=float, default=None,
                        help="seconds between live switches (default: 180; 30 quick)")
    parser.add_argument("--resume-every", type=float, default=None,
                        help="seconds between SIGTERM + --resume of the trainer (default: 3600, or half the "
                        "duration when shorter)")
    args = parser.parse_args(argv)
    duration = args.duration if args.duration is not None else (180.0 if args.quick else 7200.0)
    if duration < 60 or args.agents < 1:
        print(f"soak: --duration {duration:g} / --agents {args.agents}: need at least 60 s and 1 agent",
              file=sys.stderr)
        return 2
    out: Path = args.out
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        print(f"soak: --out {str(out)[:80]!r} exists and is not a soak's folder; choose a new or empty one",
              file=sys.stderr)
        return 2
    short = duration <= 600
    config = SoakConfig(
        duration_s=duration, seed=args.seed, out=args.out, agents=args.agents, sample_every_s=5.0 if short else 10.0,
        fault_every_s=args.fault_every or (15.0 if short else 60.0),
        switch_every_s=args.switch_every or (30.0 if short else 180.0),
        resume_every_s=args.resume_every or min(3600.0, duration / 2), publish_every_s=30.0 if short else 120.0,
        recovery_bound_s=120.0, warmup_s=30.0 if short else 120.0)
    soak = Soak(config)
    figures = soak.run()
    figures["plots"] = plot(soak.state.samples, figures["faults"], config.out)
    (config.out / "samples.json").write_text(json.dumps(soak.state.samples))
    print_table(figures)
    print(json.dumps(figures, sort_keys=True, default=str))
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
