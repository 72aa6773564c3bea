"""The ``edge`` rollout source: the fleet's experience trains the policy, every transition exactly once.

    edge agents ──nodes/{node}/experience (QoS 1, outbox until receipted)──> broker (Mosquitto, AWS IoT Core)
        ──$share/{group}/... ──> ingester processes (``strata edge ingest``, supervised here): validate, store
        once in the spool (``RUN_DIR/edge/spool.sqlite``), acknowledge, receipt to the node
        ──> EdgeSource.collect: records in arrival order -> dedup by (node, record id) -> staleness window ->
        cut into the learner's [num_steps] columns -> log-probs and values of the learner's policy -> one update

and back: every ``edge_publish_every`` versions the learner's policy goes out as a signed bundle (retained, on a
publisher thread, so the learner never waits on the broker) that carries the learner's `ExperienceRequest`
(sampled actions, ``num_steps`` steps per record).

Exactly once. A record can arrive twice (a broker redelivery, an ingester killed between storing and
acknowledging, a node that sends again for want of a receipt, a node restarted after a kill -9 before it
deleted a receipted record); the spool stores a (node, record id) once, and the learner keeps the ids of every
record it learned from (or refused) as intervals per node, `RecordIds`, in its checkpoint (`state_dict`). Each
update marks its records in the spool with its version; a learner that resumes from checkpoint ``v`` clears the
marks past ``v`` (that learning was lost with the process, so those records are learned from again) and deletes
what a checkpoint on disk covers. A record in the spool whose id the learner already holds is a duplicate: it is
dropped and counted. Nothing else can drop a record: nodes keep it until the receipt, the spool is durable.

Staleness. Every transition carries the bundle version that acted; a record whose oldest step is more than
``edge_max_staleness`` versions behind the learner's is refused (counted). The rest is corrected for the
policy that acted (``edge_correction="vtrace"``): the batch carries the behaviour log-probs and the PPO update
uses V-trace advantages with truncated importance weights (`cloud.learners._losses.compute_vtrace`).
``"none"`` learns from it as if the learner's policy had acted. Which, and what each does to learning, is
measured in ``benchmarks/edge_experience.py`` (figures in BENCHMARKS.md).

The transitions' ids are ``(edge:{node}:{record_id}, env column, step)`` (see `edge.Experience`), so the
switcher's accounting counts duplicates and gaps of edge experience as it does for every source.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import math
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cloud._errors import CloudError
from device import ConfigError, RolloutBatch, write_atomic
from device._mqtt_access import SHARE_GROUP

log = logging.getLogger(__name__)

EDGE_DIR = "edge"
"""Sub-folder of the run dir: the spool, the spaces file and the ingesters' logs."""
STALENESS_BINS = 64
"""Staleness (versions) is counted per value up to this; older records are counted in the last bin."""


class EdgeSourceError(CloudError):
    """The edge source cannot go on (its ingesters cannot start, the fleet sent nothing within the wait)."""


@dataclass(frozen=True, kw_only=True)
class EdgeSourceConfig:
    """The ``edge`` mode: the fleet's experience as a rollout source (``strata train --modes edge``)."""

    # the broker and the learner's identity on it
    edge_broker: str = ""
    """Broker URL of the fleet (mqtt://host:1883, mqtts://host:8883); required by the edge mode."""
    edge_fleet: str = ""
    """Fleet whose experience trains the policy (topics strata/{fleet}/...); required by the edge mode."""
    edge_policy: str = ""
    """Policy name the learner publishes to the fleet (empty: from the env id, e.g. cartpole)."""
    edge_username: str | None = None
    """Broker username of the learner; its ingesters connect as {username}-ingest-{k} (Mosquitto binds client
    ids to usernames; `strata broker config --learner` makes these users with one password)."""
    edge_password_file: str | None = None
    """File holding the learner's broker password."""
    edge_ca_file: str | None = None
    """CA bundle of the broker's TLS certificate (AWS IoT: AmazonRootCA1.pem)."""
    edge_cert_file: str | None = None
    """The learner's client certificate (AWS IoT)."""
    edge_key_file: str | None = None
    """Private key of the learner's client certificate."""
    # ingestion
    edge_ingesters: int = 1
    """Ingester processes sharing the fleet's experience (MQTT 5 shared subscription); 1 on a 3.1.1-only broker."""
    edge_group: str = SHARE_GROUP
    """Shared-subscription group of this learner's ingesters."""
    edge_protocol: Literal["auto", "5", "3.1.1"] = "auto"
    """MQTT version of the ingesters: auto tries 5 (shared subscriptions) and falls back to 3.1.1 (one ingester)."""
    edge_wait_s: float = 0.0
    """Give up (fail over, or stop with a checkpoint) when the fleet sends no usable record for this long (0: wait
    for ever, saying so every 30 s)."""
    # staleness
    edge_correction: Literal["vtrace", "none"] = "vtrace"
    """How PPO learns from experience acted by older versions: V-trace (truncated importance weights of the
    learner's policy over the one that acted), or none (as if the learner's policy had acted)."""
    edge_max_staleness: int = 8
    """Refuse records whose oldest step was acted more than this many versions before the learner's."""
    # what the fleet is asked to do
    edge_actions: Literal["sample", "greedy"] = "sample"
    """How the fleet acts while collecting: sample from the policy (on-policy data), or its greedy action."""
    edge_noise_std: float = 0.1
    """Box actions with sample: standard deviation of the fleet's Gaussian exploration noise."""
    edge_publish_every: int = 1
    """Publish the learner's policy to the fleet every this many versions."""

    def __post_init__(self) -> None:
        if self.edge_protocol == "3.1.1" and self.edge_ingesters > 1:
            raise ConfigError(f"EdgeSourceConfig: edge_ingesters={self.edge_ingesters} with edge_protocol 3.1.1: "
                              "without MQTT 5 shared subscriptions every ingester would receive every record; run "
                              "one, or use a broker that speaks MQTT 5")
        if self.edge_ingesters < 1 or self.edge_max_staleness < 0 or self.edge_publish_every < 1:
            raise ConfigError(f"EdgeSourceConfig: edge_ingesters={self.edge_ingesters} and edge_publish_every="
                              f"{self.edge_publish_every} must be >= 1, edge_max_staleness="
                              f"{self.edge_max_staleness} >= 0")
        if not 0 <= self.edge_wait_s < math.inf or not (0 < self.edge_noise_std < math.inf):
            raise ConfigError(f"EdgeSourceConfig: edge_wait_s={self.edge_wait_s} must be >= 0 and edge_noise_std="
                              f"{self.edge_noise_std} > 0, both finite")

    def check_ready(self) -> None:
        """Raise `ConfigError` unless the edge mode can run: a broker and a fleet, valid names."""
        from edge import FleetTopics, parse_broker_url

        if not self.edge_broker or not self.edge_fleet:
            raise ConfigError("train: mode edge needs --edge-broker mqtt://HOST:PORT and --edge-fleet NAME (the fleet "
                              "whose experience trains the policy)")
        parse_broker_url(self.edge_broker)
        FleetTopics(self.edge_fleet)
        from edge._topics import check_segment

        check_segment(self.edge_group, "--edge-group")
        if self.edge_policy:
            check_segment(self.edge_policy, "--edge-policy")
        for name in ("edge_password_file", "edge_ca_file", "edge_cert_file", "edge_key_file"):
            value = getattr(self, name)
            if value is not None and not Path(value).is_file():
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"train: {flag} {value[:80]!r} is not a readable file; pass an existing file")


class RecordIds:
    """The (node, record id) pairs the learner consumed: sorted disjoint ``[lo, hi]`` intervals per node.

    Record ids of one node only grow, and a node sends its oldest first, so the intervals stay few (a gap is a
    record dropped by a full outbox, or one still on its way). Plain lists: they go into the checkpoint as is.
    """

    def __init__(self, intervals: dict[str, list[list[int]]] | None = None) -> None:
        self._by_node: dict[str, list[list[int]]] = {n: [list(map(int, iv)) for iv in ivs]
                                                     for n, ivs in (intervals or {}).items()}

    def __contains__(self, key: tuple[str, int]) -> bool:
        node, rid = key
        ivs = self._by_node.get(node)
        if not ivs:
            return False
        i = bisect.bisect_right(ivs, [rid, math.inf]) - 1
        return i >= 0 and ivs[i][0] <= rid <= ivs[i][1]

    def add(self, node: str, rid: int) -> None:
        """Record `rid` of `node` (already there: no change)."""
        ivs = self._by_node.setdefault(node, [])
        i = bisect.bisect_right(ivs, [rid, math.inf])
        if i > 0 and ivs[i - 1][1] >= rid:
            return
        joins_left = i > 0 and ivs[i - 1][1] == rid - 1
        joins_right = i < len(ivs) and ivs[i][0] == rid + 1
        if joins_left and joins_right:
            ivs[i - 1][1] = ivs[i][1]
            del ivs[i]
        elif joins_left:
            ivs[i - 1][1] = rid
        elif joins_right:
            ivs[i][0] = rid
        else:
            ivs.insert(i, [rid, rid])

    def count(self) -> int:
        """How many ids are held."""
        return sum(hi - lo + 1 for ivs in self._by_node.values() for lo, hi in ivs)

    def intervals(self) -> dict[str, list[list[int]]]:
        """Per node, the intervals (a copy, as plain lists)."""
        return {n: [list(iv) for iv in ivs] for n, ivs in self._by_node.items()}


class IngesterProcess:
    """One ``strata edge ingest`` child process (it stops when this process is gone, also after a SIGKILL)."""

    def __init__(self, command: list[str], log_path: Path) -> None:
        from functions._lifetime import child_environment

        self.command = command
        self.log_path = log_path
        self.restarts = 0
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=self._log, env=child_environment())

    @property
    def alive(self) -> bool:
        """Whether the process runs."""
        return self.proc.poll() is None

    def restart(self) -> None:
        """Start it again (after it died)."""
        from functions._lifetime import child_environment

        self.restarts += 1
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=self._log, env=child_environment())

    def stop(self) -> None:
        """SIGTERM (it finishes its batch), SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class _BundlePublisher:
    """Publishes the newest offered bundle to the fleet on its own thread, retrying, so the learner never waits."""

    def __init__(self, config: EdgeSourceConfig, password: str | None, log: Callable[[str], None]) -> None:
        from device import mqtt_client_id
        from edge import Publisher

        self._log = log
        self._publisher = Publisher(broker=config.edge_broker, fleet=config.edge_fleet,
                                    client_id=mqtt_client_id("learner", fleet=config.edge_fleet, node="publisher"),
                                    username=config.edge_username, password=password, ca_file=config.edge_ca_file,
                                    cert_file=config.edge_cert_file, key_file=config.edge_key_file)
        self._cond = threading.Condition()
        self._pending: tuple[int, bytes] | None = None
        self._closed = False
        self.published = 0
        """Newest version published (0: none yet)."""
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="strata-edge-publisher", daemon=True)
        self._thread.start()

    def offer(self, version: int, bundle: bytes) -> None:
        """Publish `bundle` (of bundle version `version`) as soon as possible; a newer offer replaces it."""
        with self._cond:
            self._pending = (version, bundle)
            self._cond.notify_all()

    def _run(self) -> None:
        from edge import PublishError

        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                version, data = self._pending  # type: ignore[misc]
                self._pending = None
            try:
                self._publisher.publish(data)
                self.published = version
            except PublishError as exc:
                self.failures += 1
                self._log(f"edge: publishing policy v{version} to the fleet failed ({exc}); retrying")
                with self._cond:
                    if self._pending is None:
                        self._pending = (version, data)
                    self._cond.wait(timeout=1.0)

    def close(self) -> None:
        """Stop the thread and disconnect."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=15)
        self._publisher.close()


@dataclass
class _NodeStats:
    records: int = 0
    transitions: int = 0
    last_version: int = 0
    last_received: float = 0.0


class EdgeLedger:
    """What the edge mode has learned from, owned by the run (it outlives a source closed by a failover).

    Args:
        state: A checkpoint's edge state (`state_dict`), or None for a fresh run.
        resumed_version: The policy version of that checkpoint (0 for a fresh run).
    """

    def __init__(self, state: dict[str, Any] | None = None, *, resumed_version: int = 0) -> None:
        state = state or {}
        self.record_ids = RecordIds(state.get("record_ids"))
        self.counters: Counter[str] = Counter({k: int(v) for k, v in state.get("counters", {}).items()})
        self.staleness: Counter[int] = Counter({int(k): int(v) for k, v in state.get("staleness", {}).items()})
        self.nodes: dict[str, _NodeStats] = defaultdict(_NodeStats)
        self.resumed_version = resumed_version
        self.spool_reset = False
        """Whether the spool's marks past `resumed_version` were cleared (once per run)."""
        self.spool_counters: dict[str, int] = {}
        """The spool's counters when the source last looked."""
        self.ingesters_alive = 0

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the consumed record ids, the counters, the staleness histogram (plain values)."""
        return {"record_ids": self.record_ids.intervals(), "counters": dict(self.counters),
                "staleness": {str(k): v for k, v in sorted(self.staleness.items())}}

    def status(self, *, policy_version: int) -> dict[str, Any]:
        """The figures of ``strata status``: records and transitions, duplicates, staleness, per-node lag."""
        spool = self.spool_counters
        now = time.time()
        current = policy_version + 1
        stale = summarise_staleness(self.staleness.items())
        return {
            "records_received": spool.get("received", 0), "records_stored": spool.get("stored", 0),
            "duplicates_wire": spool.get("duplicates_wire", 0), "refused_ingest": spool.get("refused", 0),
            "pending": spool.get("pending", 0), "records": self.counters["records"],
            "transitions": self.counters["transitions"], "duplicates_learner": self.counters["duplicates_learner"],
            "refused_stale": self.counters["refused_stale"],
            "refused": self.counters["malformed"] + self.counters["refused_shape"],
            "staleness_mean": None if math.isnan(stale["mean"]) else round(stale["mean"], 3),
            "staleness_max": None if math.isnan(stale["max"]) else int(stale["max"]),
            "ingesters": self.ingesters_alive, "ingester_restarts": self.counters["ingester_restarts"],
            "nodes": {node: {"records": s.records, "transitions": s.transitions, "version": s.last_version,
                             "lag_versions": current - s.last_version,
                             "lag_s": round(now - s.last_received, 3) if s.last_received else None}
                      for node, s in sorted(self.nodes.items())}}


@dataclass(frozen=True)
class TakenRecord:
    """A record an intake handed out: its key, when it arrived, and its contents."""

    key: tuple[str, int]
    received: float
    record: Any
    """The `edge.Experience`."""


class EdgeIntake:
    """The learner's end of the fleet: spool, ingester processes, policy publisher, and records taken exactly once.

    `EdgeSource` (PPO) and SAC's edge feed take records through `take`; see the module docstring.

    Args:
        config: The edge mode's settings.
        run_dir: The run dir (the spool and the ingesters' files go into ``edge/``).
        observation_space: The learner's observation space (manifest JSON form).
        action_space: Its action space.
        max_steps: Steps of the longest record accepted.
        ledger: What the run has learned from (record ids, counters); shared by every intake the run builds.
        checkpointed: ``checkpointed() -> version`` of the newest checkpoint on disk (-1: none); the spool keeps
            every record a checkpoint on disk has not learned from.
        log: Where notices go.
    """

    def __init__(self, config: EdgeSourceConfig, *, run_dir: Path, observation_space: dict[str, Any],
                 action_space: dict[str, Any], max_steps: int, ledger: EdgeLedger | None = None,
                 checkpointed: Callable[[], int] = lambda: -1, log: Callable[[str], None] = print) -> None:
        config.check_ready()
        self.config = config
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / EDGE_DIR
        self._spaces = {"observation_space": observation_space, "action_space": action_space,
                        "max_steps": max_steps}
        self._log = log
        self.ledger = ledger or EdgeLedger()
        self.counters = self.ledger.counters
        self._spool: Any = None
        self._ingesters: list[IngesterProcess] = []
        self._publisher: _BundlePublisher | None = None
        self._checkpointed = checkpointed
        self._last_gc_version = -1

    @property
    def ready(self) -> bool:
        """Whether `prepare` ran (and `close` did not since)."""
        return self._spool is not None

    def prepare(self) -> None:
        """Open the spool (clearing the marks of updates a crash lost), start the ingesters and the publisher."""
        if self._spool is not None:
            return
        from edge._agent import read_password_file
        from edge._spool import ExperienceSpool

        self.folder.mkdir(parents=True, exist_ok=True)
        spool = ExperienceSpool(self.folder / "spool.sqlite")
        ledger = self.ledger
        if not ledger.spool_reset:
            ledger.spool_reset = True
            relearn = spool.reset_after(ledger.resumed_version)
            if relearn:
                self._log(f"edge: {relearn} spooled records were learned from after checkpoint "
                          f"v{ledger.resumed_version}; that learning was lost, so they are learned from again")
            spool.collect_garbage(ledger.resumed_version)
        self._spool = spool
        spaces = self.folder / "spaces.json"
        write_atomic(spaces, json.dumps(self._spaces, allow_nan=False))
        cfg = self.config
        password = read_password_file(cfg.edge_password_file) if cfg.edge_password_file else None
        try:
            for k in range(cfg.edge_ingesters):
                self._ingesters.append(IngesterProcess(self._ingest_command(k, spaces),
                                                       self.folder / f"ingest-{k}.log"))
            self._publisher = _BundlePublisher(cfg, password, self._log)
        except BaseException:
            self.close()
            raise

    def _ingest_command(self, k: int, spaces: Path) -> list[str]:
        cfg = self.config
        cmd = [sys.executable, "-m", "cloud.cli", "edge", "ingest", "--broker", cfg.edge_broker, "--fleet",
               cfg.edge_fleet, "--spool", str(self.folder / "spool.sqlite"), "--spaces", str(spaces), "--name",
               f"ingest-{k}", "--group", cfg.edge_group, "--protocol", cfg.edge_protocol]
        if cfg.edge_username:
            cmd += ["--username", f"{cfg.edge_username}-ingest-{k}"]
        for flag, value in (("--password-file", cfg.edge_password_file), ("--ca-file", cfg.edge_ca_file),
                            ("--cert-file", cfg.edge_cert_file), ("--key-file", cfg.edge_key_file)):
            if value:
                cmd += [flag, value]
        return cmd

    def close(self) -> None:
        """Stop the ingesters (what they hold unacknowledged waits at the broker) and the publisher."""
        for ingester in self._ingesters:
            with contextlib.suppress(Exception):
                ingester.stop()
        self._ingesters.clear()
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    def offer(self, version: int, bundle: bytes) -> None:
        """Publish the learner's policy (bundle version `version`) to the fleet, on the publisher thread."""
        if self._publisher is not None:
            self._publisher.offer(version, bundle)

    def take(self, *, current: int, budget: int, cost: Callable[[Any], int | str], at_least: int | None = None,
             mark: Callable[[int], int] | None = None) -> list[TakenRecord]:
        """Take records worth up to `budget` (freshest policy first), waiting until they are worth `at_least`.

        Each record is taken whole or not at all, exactly once over the run: repeats of what the run learned from
        are dropped (and counted), records more than ``edge_max_staleness`` versions behind `current` (the
        learner's bundle version now) are refused, and ``cost(record)`` says what a record is worth (or, as a
        text, why it is refused). The taken records are marked in the spool with ``mark(worth)`` (default:
        `current`): the version of the first checkpoint that will hold what was learned from them.

        Raises:
            EdgeSourceError: Nothing usable came within ``edge_wait_s``.
        """
        from edge import Experience, PayloadError

        if self._spool is None:
            raise EdgeSourceError("edge: records taken before the intake started; the switcher starts sources")
        self.supervise()
        self._collect_garbage()
        cfg = self.config
        want = budget if at_least is None else at_least
        got: list[TakenRecord] = []
        worth = 0
        used: list[tuple[str, int]] = []
        duplicates: list[tuple[str, int]] = []
        seen: set[tuple[str, int]] = set()
        for key in self._spool.stale(below_version=current - cfg.edge_max_staleness):
            self._drop_or_refuse(key, used, duplicates, seen, "refused_stale", None)
        skip, started, said = 0, time.monotonic(), time.monotonic()
        while worth < want:
            rows = self._spool.pending(skip=skip, limit=256)
            if not rows:
                skip = 0
                self.supervise()
                now = time.monotonic()
                if cfg.edge_wait_s and now - started > cfg.edge_wait_s:
                    raise EdgeSourceError(f"edge: the fleet {cfg.edge_fleet} sent {worth} of the {want} "
                                          f"(columns or steps) the learner needs within --edge-wait-s "
                                          f"{cfg.edge_wait_s:g}")
                if now - said > 30:
                    said = now
                    self._log(f"edge: waiting for the fleet {cfg.edge_fleet}: {worth} of {want} for v{current}; "
                              f"spool {self._spool.counters()}")
                time.sleep(0.01)
                continue
            for row in rows:
                skip += 1
                key = (row.node, row.record_id)
                if key in seen:
                    continue
                if key in self.ledger.record_ids:
                    self._drop_or_refuse(key, used, duplicates, seen, "", None)
                    continue
                try:
                    record = Experience.decode(f"spool:{row.node}", row.payload, node=row.node)
                except PayloadError as exc:  # the ingester checked it: a spool written by something else
                    self._drop_or_refuse(key, used, duplicates, seen, "malformed", str(exc))
                    continue
                if current - int(record.batch.policy_version.min()) > cfg.edge_max_staleness:
                    self._drop_or_refuse(key, used, duplicates, seen, "refused_stale", None)
                    continue
                value = cost(record)
                if isinstance(value, str):
                    self._drop_or_refuse(key, used, duplicates, seen, "refused_shape", value)
                    continue
                if worth + value > budget:
                    continue  # it fits a later take whole: a record is never split
                seen.add(key)
                used.append(key)
                got.append(TakenRecord(key, row.received, record))
                self._account(row.node, row.received, record, current)
                worth += value
                if worth >= budget:
                    break
        for key in used:
            self.ledger.record_ids.add(*key)
        self._spool.mark_consumed(used, current if mark is None else mark(worth))
        if duplicates:
            self._spool.delete(duplicates)
        self.ledger.spool_counters = self._spool.counters()
        self.ledger.ingesters_alive = sum(i.alive for i in self._ingesters)
        return got

    def _drop_or_refuse(self, key: tuple[str, int], used: list[tuple[str, int]],
                        duplicates: list[tuple[str, int]], seen: set[tuple[str, int]], counter: str,
                        reason: str | None) -> None:
        seen.add(key)
        if key in self.ledger.record_ids:  # learned from already: a repeat, dropped
            duplicates.append(key)
            self.counters["duplicates_learner"] += 1
            return
        self.counters[counter] += 1
        used.append(key)  # marked and remembered like a consumed record: it never comes back
        if reason:
            self._log(f"edge: refused record {key[1]} of node {key[0]}: {reason[:200]}")

    def _account(self, node: str, received: float, record: Any, current: int) -> None:
        batch = record.batch
        lags = current - batch.policy_version.reshape(-1)
        for lag, n in zip(*np.unique(np.clip(lags, 0, STALENESS_BINS), return_counts=True), strict=True):
            self.ledger.staleness[int(lag)] += int(n)
        self.counters["records"] += 1
        self.counters["transitions"] += batch.size
        stats = self.ledger.nodes[node]
        stats.records += 1
        stats.transitions += batch.size
        stats.last_version = max(stats.last_version, int(batch.policy_version.max()))
        stats.last_received = max(stats.last_received, received)

    def supervise(self) -> None:
        """Restart ingesters that died (a kill -9: what they held unacknowledged comes again from the broker)."""
        for k, ingester in enumerate(self._ingesters):
            if not ingester.alive:
                self.counters["ingester_restarts"] += 1
                self._log(f"edge: ingester {k} exited with {ingester.proc.returncode}; restarting it (log "
                          f"{ingester.log_path})")
                ingester.restart()

    def _collect_garbage(self) -> None:
        """Delete spooled records that a checkpoint on disk has learned from."""
        version = self._checkpointed()
        if version > self._last_gc_version:
            self._spool.collect_garbage(version)
            self._last_gc_version = version


class EdgeSource:
    """The fleet's experience as a `cloud.rollout.RolloutSource` for PPO (see the module docstring).

    Args:
        config: The edge mode's settings.
        run_dir: The run dir (the spool and the ingesters' files go into ``edge/``).
        observation_space: The learner's observation space (manifest JSON form).
        action_space: Its action space.
        bundle_for: ``bundle_for(policy_version) -> signed bundle bytes`` of the learner's policy at that version,
            carrying the experience request (bundle version ``policy_version + 1``).
        agent: The learner's agent, for the log-probs and values of the learner's policy.
        normalizer: The learner's observation normaliser.
        num_envs: Columns per update.
        num_steps: Steps per column; a record of ``m * num_steps`` steps gives ``m`` columns.
        ledger: What the run has learned from (record ids, counters); shared by every source the run builds.
        checkpointed: ``checkpointed() -> version`` of the newest checkpoint on disk (-1: none).
        log: Where notices go.
    """

    mode = "edge"

    def __init__(self, config: EdgeSourceConfig, *, run_dir: Path, observation_space: dict[str, Any],
                 action_space: dict[str, Any], bundle_for: Callable[[int], bytes], agent: Any, normalizer: Any,
                 num_envs: int, num_steps: int, ledger: EdgeLedger | None = None,
                 checkpointed: Callable[[], int] = lambda: -1, log: Callable[[str], None] = print) -> None:
        self.intake = EdgeIntake(config, run_dir=run_dir, observation_space=observation_space,
                                 action_space=action_space, max_steps=max(num_steps * 64, 4096), ledger=ledger,
                                 checkpointed=checkpointed, log=log)
        self.config = config
        self.ledger = self.intake.ledger
        self._bundle_for = bundle_for
        self._agent, self._normalizer = agent, normalizer
        self._num_envs, self._num_steps = num_envs, num_steps
        self._published_for: int | None = None
        self._produced = 0
        self._started_at = time.monotonic()

    def prepare(self) -> None:
        """Start the intake: the spool, the ingesters, the publisher."""
        self.intake.prepare()

    def restart(self, *, incarnation: int) -> None:
        """Start what the source runs on; the fleet's streams are its own (records carry their ids)."""
        self.prepare()

    def close(self) -> None:
        """Stop the intake."""
        self.intake.close()

    def collect(self, *, policy_version: int, global_step: int) -> tuple[list[RolloutBatch], list[Any]]:
        """One update's columns from the spool (waiting for the fleet if needed); see the module docstring."""
        from cloud.rollout._collector import Episode

        if not self.intake.ready:
            raise EdgeSourceError("edge: collect() before restart(); the switcher starts sources")
        self._publish(policy_version)
        num_steps, num_envs = self._num_steps, self._num_envs

        def columns(record: Any) -> int | str:
            batch = record.batch
            if batch.num_steps % num_steps:
                return f"a record of {batch.num_steps} steps does not cut into num_steps={num_steps}"
            count = int(batch.num_envs * (batch.num_steps // num_steps))
            if count > num_envs:
                return f"a record of {count} columns of num_steps={num_steps} exceeds an update of num_envs={num_envs}"
            return count

        parts: list[RolloutBatch] = []
        episodes: list[Any] = []
        step = global_step
        for taken in self.intake.take(current=policy_version + 1, budget=num_envs, cost=columns):
            record = taken.record
            parts += [self._evaluated(piece) for piece in _cut(record.batch, num_steps)]
            episodes += _episodes(record, step, Episode)
            step += record.batch.size
        self._produced += sum(p.size for p in parts)
        return parts, episodes

    def _evaluated(self, piece: RolloutBatch) -> RolloutBatch:
        """`piece` with the learner's log-probs and values (and, for V-trace, the behaviour log-probs)."""
        import torch

        obs, actions = np.array(piece.obs), np.array(piece.actions)
        t, n = piece.num_steps, piece.num_envs
        with torch.inference_mode():
            b_obs = torch.from_numpy(self._normalizer(obs.reshape(t * n, *obs.shape[2:])))
            b_act = torch.from_numpy(actions.reshape(t * n, *actions.shape[2:]))
            logprobs, _ = self._agent.evaluate_actions(b_obs, b_act)
            values = self._agent.get_value(b_obs)
        behaviour = None
        if self.config.edge_correction == "vtrace" and piece.behaviour_logprobs is not None:
            behaviour = np.array(piece.behaviour_logprobs, dtype=np.float32)
        return RolloutBatch(
            source=piece.source, obs=obs, actions=actions, rewards=np.array(piece.rewards),
            terminations=np.array(piece.terminations), truncations=np.array(piece.truncations),
            final_obs=np.array(piece.final_obs), next_obs=np.array(piece.next_obs),
            policy_version=np.array(piece.policy_version), worker=np.array(piece.worker), seq=np.array(piece.seq),
            logprobs=logprobs.numpy().reshape(t, n), values=values.numpy().reshape(t, n), behaviour_logprobs=behaviour)

    def _publish(self, policy_version: int) -> None:
        """Hand the learner's policy to the publisher thread when it is due (the export happens here)."""
        due = self._published_for is None or policy_version - self._published_for >= self.config.edge_publish_every
        if due:
            self.intake.offer(policy_version + 1, self._bundle_for(policy_version))
            self._published_for = policy_version

    def produced(self) -> int:
        """Transitions handed to the learner."""
        return self._produced

    def workers(self) -> int:
        """Nodes whose records the learner used."""
        return len(self.ledger.nodes)

    def probe(self) -> float:
        """Transitions per second the fleet has been delivering (nothing is collected: the fleet runs anyway)."""
        return float(self._produced) / max(time.monotonic() - self._started_at, 1e-9)


class EdgeFeed:
    """The fleet's experience for an off-policy learner (SAC): whole records into its replay, each exactly once.

    SAC asks the fleet for records of `steps` steps, a divisor of its commit interval, and takes whole records up
    to its next commit: every checkpoint holds whole records, so a resumed run learns from a record again exactly
    when the checkpoint lost it.

    Args:
        config: The edge mode's settings.
        run_dir: The run dir.
        observation_space: The learner's observation space (manifest JSON form).
        action_space: Its action space.
        steps: Steps of one record.
        ledger: What the run has learned from.
        checkpointed: ``checkpointed() -> version`` of the newest checkpoint on disk (-1: none).
        log: Where notices go.
    """

    def __init__(self, config: EdgeSourceConfig, *, run_dir: Path, observation_space: dict[str, Any],
                 action_space: dict[str, Any], steps: int, ledger: EdgeLedger,
                 checkpointed: Callable[[], int] = lambda: -1, log: Callable[[str], None] = print) -> None:
        self.steps = steps
        self.ledger = ledger
        self.intake = EdgeIntake(config, run_dir=run_dir, observation_space=observation_space,
                                 action_space=action_space, max_steps=steps, ledger=ledger, checkpointed=checkpointed,
                                 log=log)

    def start(self) -> EdgeFeed:
        """Start the spool, the ingesters and the publisher."""
        self.intake.prepare()
        return self

    def publish(self, version: int, bundle: bytes) -> None:
        """Send the learner's policy (bundle version `version`) to the fleet."""
        self.intake.offer(version, bundle)

    def take(self, *, current: int, global_step: int, budget: int) -> list[Any]:
        """Whole records worth at most `budget` steps (at least one record), taken once; `edge.Experience` each."""
        steps = self.steps

        def worth(record: Any) -> int | str:
            if record.batch.num_steps != steps:
                return f"a record of {record.batch.num_steps} steps, not the {steps} this learner asks for"
            return int(record.batch.size)

        taken = self.intake.take(current=current, budget=budget, cost=worth, at_least=min(steps, budget),
                                 mark=lambda total: global_step + total)
        return [t.record for t in taken]

    def close(self) -> None:
        """Stop."""
        self.intake.close()


def _cut(batch: RolloutBatch, steps: int) -> list[RolloutBatch]:
    """Split a record into ``[steps, 1]`` columns; each bootstraps from the next one's first observation."""
    pieces = []
    for n in range(batch.num_envs):
        for start in range(0, batch.num_steps, steps):
            end = start + steps
            column = slice(n, n + 1)
            next_obs = batch.obs[end, column] if end < batch.num_steps else batch.next_obs[column]
            logp = batch.behaviour_logprobs
            pieces.append(RolloutBatch(
                source=batch.source, obs=batch.obs[start:end, column], actions=batch.actions[start:end, column],
                rewards=batch.rewards[start:end, column], terminations=batch.terminations[start:end, column],
                truncations=batch.truncations[start:end, column], final_obs=batch.final_obs[start:end, column],
                next_obs=next_obs, policy_version=batch.policy_version[start:end, column],
                worker=batch.worker[column], seq=batch.seq[start:end, column],
                behaviour_logprobs=None if logp is None else logp[start:end, column]))
    return pieces


def _episodes(record: Any, step: int, episode: Any) -> list[Any]:
    """The episodes that ended in `record` (the node sent their return and length where they ended)."""
    if record.episode_return is None or record.episode_length is None:
        return []
    done = np.logical_or(record.batch.terminations, record.batch.truncations)
    ended = []
    n = record.batch.num_envs
    for t, j in zip(*np.nonzero(done), strict=True):
        if record.episode_length[t, j] > 0:
            ended.append(episode(step + (int(t) + 1) * n, float(record.episode_return[t, j]),
                                 int(record.episode_length[t, j])))
    return ended


def summarise_staleness(histogram: Iterable[tuple[int, int]]) -> dict[str, float]:
    """Mean, median, p90 and max of a staleness histogram ``(versions, transitions)``."""
    pairs = sorted((int(k), int(v)) for k, v in histogram if v)
    total = sum(v for _, v in pairs)
    if not total:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "max": math.nan}
    out = {"mean": sum(k * v for k, v in pairs) / total, "max": float(pairs[-1][0])}
    for name, q in (("p50", 0.5), ("p90", 0.9)):
        seen = 0
        for k, v in pairs:
            seen += v
            if seen >= q * total:
                out[name] = float(k)
                break
    return out

