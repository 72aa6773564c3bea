"""A fleet of real `strata edge run` processes feeding an edge-mode learner, and the checks of exactly-once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from functions._lifetime import child_environment


class AgentProcess:
    """One `strata edge run` process of `node`, acting with what the learner publishes and sending experience."""

    def __init__(self, root: Path, node: str, *, broker: str, fleet: str, trust: Path, seed: int = 0,
                 env: str = "CartPole-v1", steps_per_s: int = 0) -> None:
        self.node = node
        self.cache = root / node
        self.command = [sys.executable, "-m", "cloud.cli", "edge", "run", "--fleet", fleet, "--node-id", node,
                        "--cache-dir", str(self.cache), "--trust", str(trust), "--broker", broker, "--env", env,
                        "--experience-steps", "16", "--experience-receipt-timeout-s", "2", "--control-period-s", "0",
                        # no telemetry record before a clean stop: every id of the outbox is an experience record's
                        "--telemetry-interval-s", "1000000", "--health-latency-budget-ms", "5000", "--seed", str(seed),
                        "--experience-max-steps-per-s", str(steps_per_s)]
        self.log = root / f"{node}.log"
        self.kills = 0
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            return subprocess.Popen(self.command, stdout=log, stderr=log, env=child_environment())

    def kill9(self) -> None:
        """SIGKILL it and start it again on the same cache dir (its outbox and policy cache)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.kills += 1
        self.proc = self._start()

    def stop(self) -> None:
        """SIGKILL (what is in its outbox stays there, for the checks)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def outbox_ids(self) -> tuple[set[int], int]:
        """Record ids still in its outbox, and the highest record id it ever gave (all of them experience)."""
        db = sqlite3.connect(self.cache / "outbox.sqlite")
        try:
            ids = {int(r) for (r,) in db.execute("SELECT id FROM records")}
            row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'records'").fetchone()
            return ids, int(row[0]) if row else 0
        finally:
            db.close()


@contextmanager
def fleet(root: Path, count: int, *, broker: str, fleet_name: str, trust: Path, env: str = "CartPole-v1",
          steps_per_s: int = 0) -> Iterator[list[AgentProcess]]:
    """`count` agent processes, each recording at most `steps_per_s` steps/s of experience (0: no limit); all
    killed afterwards."""
    agents = [AgentProcess(root, f"n{i}", broker=broker, fleet=fleet_name, trust=trust, seed=i, env=env,
                           steps_per_s=steps_per_s) for i in range(count)]
    try:
        yield agents
    finally:
        for agent in agents:
            agent.stop()


def ingester_pids(spool: Path) -> list[int]:
    """Pids of the `strata edge ingest` processes writing `spool` (from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ingest" in cmdline and str(spool).encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def kill9_ingesters(spool: Path) -> int:
    """SIGKILL every ingester of `spool`; return how many."""
    pids = ingester_pids(spool)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return len(pids)


def check_exactly_once(state: dict[str, Any], *, spool: Path, agents: list[AgentProcess], steps: int) -> dict[str, int]:
    """The checks of exactly-once on a run's final checkpoint `state`; return the figures.

    * every record the learner learned from is counted once: transitions == records * steps == the lineage's env
      steps, and the learner's ids (intervals per node) hold exactly as many records as it learned from or refused;
    * nothing is lost: every record id a node gave to experience is in the learner's ids, or still in the spool,
      or still in the node's outbox.
    """
    from cloud.rollout._edge import RecordIds

    edge = state["edge"]
    counters = edge["counters"]
    ids = RecordIds(edge["record_ids"])
    refused = sum(int(counters.get(k, 0)) for k in ("refused_stale", "refused_shape", "malformed"))
    assert int(counters["transitions"]) == int(counters["records"]) * steps == int(state["global_step"])
    assert ids.count() == int(counters["records"]) + refused
    db = sqlite3.connect(spool)
    try:
        rows = db.execute("SELECT node, record_id FROM records WHERE consumed IS NULL")
        pending = {(str(n), int(r)) for n, r in rows}
    finally:
        db.close()
    # A record the learner holds may be in the spool again (a node sent it again after its receipt was lost, once
    # the spool had let go of it): a duplicate waiting to be dropped at the next update, never learned from twice.
    waiting_duplicates = sum(key in ids for key in pending)
    lost = []
    for agent in agents:
        in_outbox, highest = agent.outbox_ids()
        lost += [(agent.node, rid) for rid in range(1, highest + 1)
                 if (agent.node, rid) not in ids and (agent.node, rid) not in pending and rid not in in_outbox]
    assert lost == []
    return {"records": int(counters["records"]), "transitions": int(counters["transitions"]),
            "pending": len(pending), "waiting_duplicates": waiting_duplicates,
            "duplicates_learner": int(counters.get("duplicates_learner", 0))}

