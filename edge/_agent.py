"""The edge agent: a verified policy cache fed over MQTT, a local simulator acting with it, and reporting.

Threads of one agent:

    link     (edge._mqtt) receives announcements, bundles, chunks and control; keeps reconnecting
    updater  takes the newest bundle per topic from a coalescing inbox: verify -> health check -> act on
             it -> write it into the inactive cache slot -> swap the pointer (a failed check is remembered and
             the running policy stays); a failure never blocks the next update
    sender   publishes the retained status when it changes and pumps the SQLite outbox (records are
             deleted only after their PUBACK)
    caller   `run` steps the gymnasium simulator with the active policy; every decision is tagged with the
             policy version; episodes and inference latency become telemetry records in the outbox; with
             ``experience_steps`` the steps also become experience records for the learner (`edge._experience`:
             actions chosen as the policy's bundle asks, within the node's budget), kept in the outbox until the
             learner's receipt names them

The simulator never waits for the broker: with the broker unreachable, also from a restart, it acts on the
cached policy and telemetry piles up on disk until the link is back.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from device import (
    Bundle,
    BundleError,
    ConfigError,
    ObsPipeline,
    TrustStore,
    is_image,
    load_public_key,
    mqtt_client_id,
    require,
    shown,
)
from device._kinds import (
    CA_FILE,
    CERT_FILE,
    FLEET,
    FRAME_STACK,
    KEY_FILE,
    MAX_PASSWORD_BYTES,
    NODE,
    OBS_CODEC,
    PASSWORD_FILE,
    PUBLIC_KEY,
    SEED,
)
from device._obs_pipeline import make_checked_env, register_envs
from device._options import (
    EnvId,
    Integer,
    Many,
    Name,
    Number,
    OutputFolder,
    Seconds,
    Text,
    Url,
    check_fields,
    declared,
    read_bounded,
)
from edge._cache import Phase, PolicyCache
from edge._errors import CacheError, EdgeConfigError, EdgeError, PayloadError
from edge._experience import (
    MAX_RECORD_STEPS,
    Budget,
    ExperienceRecorder,
    ExperienceRequest,
    act_for_experience,
    fits_payload,
)
from edge._gateway import EdgeGateway, GatewayConfig
from edge._mqtt import LinkConfig, MqttLink, parse_broker_url
from edge._outbox import Outbox, OutboxConfig
from edge._policy import HealthChecker, HealthConfig, HealthReport, OnnxPolicy
from edge._topics import (
    Announcement,
    Chunk,
    ChunkAssembler,
    Control,
    FleetTopics,
    NodeStatus,
    Receipt,
    Telemetry,
    check_segment,
    is_json_payload,
)

log = logging.getLogger("strata.edge.agent")

MAX_EPISODES_PER_RECORD = 200
MAX_LATENCIES = 100_000
MAX_TRACED_UPDATES = 64


MAX_DURATION_S = 10 * 365 * 86400.0
"""Ten years: a longer duration is a typo (and `time.monotonic() + inf` never ends)."""


@dataclass(frozen=True, kw_only=True)
class EdgeAgentConfig:
    """Settings of one edge agent (`strata edge run`)."""

    # where it lives
    fleet: str = declared(FLEET)
    """Fleet name: the topic namespace strata/{fleet}/."""
    node_id: str = declared(NODE)
    """This node's id; its MQTT client id is ``{fleet}.{node_id}`` (stable, so the persistent session is kept)."""
    cache_dir: str = declared(OutputFolder(what="cache folder"))
    """Folder of the A/B policy cache, the anti-rollback state and the telemetry outbox (its parent must exist)."""
    trust: tuple[str, ...] = declared(Many(item=PUBLIC_KEY, min_items=1))
    """Public key files (PEM) whose signatures are trusted."""
    env: str = declared(EnvId(), "CartPole-v1")
    """Gymnasium env id of the local simulator."""
    frame_stack: int = declared(FRAME_STACK, 1)
    """Observations stacked per step, as the policy was trained (its manifest's ``preprocessing.pipeline``)."""
    obs_codec: str = declared(OBS_CODEC, "raw")
    """Observation codec of the run that trained the policy (``webp``, ``webp:90``, ...): a lossy one is applied to
    the simulator's frames as in training, and image experience records travel through it."""
    policy: str | None = declared(Name(), None)
    """Policy to follow; None follows whichever policy the fleet announces last."""
    serve_devices: bool = False
    """Also serve this node's terminal devices (edge._gateway): answer their escalations with the running
    policy and relay device bundles to them."""

    # the broker
    broker: str | None = declared(Url(schemes=("mqtt", "mqtts", "tcp", "ssl"), credentials=True), None)
    """Broker URL (mqtt://host:1883, mqtts://host:8883); None runs on the cached policy only."""
    username: str | None = declared(Text(max_chars=256, what="a broker user name"), None)
    """Broker username (Mosquitto password file)."""
    password_file: str | None = declared(PASSWORD_FILE, None)
    """File holding the broker password."""
    ca_file: str | None = declared(CA_FILE, None)
    """CA bundle of the broker's TLS certificate (AWS IoT: AmazonRootCA1.pem)."""
    cert_file: str | None = declared(CERT_FILE, None)
    """Client certificate for TLS (AWS IoT thing certificate)."""
    key_file: str | None = declared(KEY_FILE, None)
    """Private key of the client certificate."""

    # how long
    steps: int | None = declared(Integer(min=0, max=10**12), None)
    """Stop after this many simulator steps (None: no step limit)."""
    duration: float | None = declared(Seconds(max=MAX_DURATION_S), None)
    """Stop after this many seconds (None: run until interrupted)."""
    control_period_s: float = declared(Seconds(max=3600.0), 0.0)
    """Seconds between decisions, like a real control loop (0: as fast as possible)."""
    seed: int = declared(SEED, 0)
    """Simulator seed."""

    # health check of a new policy
    health_deadline_s: float = declared(Seconds(max=3600.0, positive=True), 10.0)
    """The health check of a new policy must pass within this many seconds."""
    health_latency_budget_ms: float = declared(Number(min=0.0, max=60_000.0, min_open=True, unit="milliseconds"),
                                               20.0)
    """p99 inference latency a new policy may take."""
    health_min_return: float | None = declared(Number(), None)
    """Minimum mean return on the local simulator (None: not checked)."""
    health_episodes: int = declared(Integer(min=1, max=1000), 1)
    """Simulator episodes for the minimum-return check."""

    # reporting
    telemetry_interval_s: float = declared(Seconds(max=1e7, positive=True), 1.0)
    """Seconds between telemetry records."""
    experience_steps: int = declared(Integer(min=0, max=MAX_RECORD_STEPS), 0)
    """Collect experience for the learner in records of this many steps (0: none). A bundle that asks for
    experience (an edge-mode learner's) sets the record length and how actions are chosen instead."""
    experience_max_bytes_per_s: float = declared(Number(min=0.0, max=1e12, unit="bytes per second"), 0.0)
    """Bandwidth budget of experience records, bytes per second (0: unlimited); over it, steps go unrecorded."""
    experience_max_steps_per_s: float = declared(Number(min=0.0, max=1e9, unit="steps per second"), 0.0)
    """CPU budget of experience, recorded steps per second (0: unlimited); over it, steps go unrecorded."""
    experience_receipt_timeout_s: float = declared(Seconds(max=3600.0, positive=True), 10.0)
    """Seconds an experience record waits for the learner's receipt after the broker's PUBACK before it is sent
    again (doubling with every attempt)."""
    outbox_max_records: int = declared(Integer(min=1, max=10**9), 100_000)
    """Outbox capacity in records."""
    outbox_overflow: Literal["drop_oldest", "drop_newest"] = "drop_oldest"
    """What a full outbox drops; drops are counted and reported."""

    def __post_init__(self) -> None:
        check_fields(self, error=EdgeConfigError)
        check_segment(self.fleet, "fleet")
        check_segment(self.node_id, "node id")
        if self.policy is not None:
            check_segment(self.policy, "policy")
        if self.broker is not None:  # validated where the config is built, so a kit or install never carries junk
            parse_broker_url(self.broker)
        if not self.trust:
            raise EdgeConfigError("EdgeAgentConfig: trust is empty; pass the public key that signs the fleet's "
                                  "bundles (--trust strata-signing.pub)")
        if self.key_file and not self.cert_file:
            raise EdgeConfigError("EdgeAgentConfig: key_file without cert_file; pass --cert-file too, or drop "
                                  "--key-file")
        try:
            self.pipeline  # noqa: B018  (checks frame_stack and obs_codec together)
        except ConfigError as exc:
            raise EdgeConfigError(f"EdgeAgentConfig: {exc}") from None

    @property
    def pipeline(self) -> ObsPipeline:
        """The observation pipeline the simulator is made with (`device.make_env`)."""
        return ObsPipeline(frame_stack=self.frame_stack, obs_codec=self.obs_codec)

    def health(self) -> HealthConfig:
        """The health-check settings."""
        return HealthConfig(deadline_s=self.health_deadline_s, latency_budget_ms=self.health_latency_budget_ms,
                            min_return=self.health_min_return, episodes=self.health_episodes,
                            pipeline=self.pipeline.to_json())


@dataclass
class AgentCounters:
    """What an agent did, for its summary and the tests."""

    steps: int = 0
    episodes: int = 0
    updates: int = 0
    refused: list[str] = field(default_factory=list)
    health_failures: list[str] = field(default_factory=list)
    install_failures: list[str] = field(default_factory=list)
    """Verified, healthy bundles that could not be written into the cache (the previous policy kept running)."""
    malformed: int = 0
    telemetry_records: int = 0
    experience_records: int = 0
    experience_skipped_steps: int = 0
    """Steps not recorded because the experience budget was spent (or a record would not fit one message)."""
    receipts: int = 0
    """Experience records the learner receipted (stored)."""
    refused_records: int = 0
    """Experience records the learner receipted as refused (the reason is in ``last_error``)."""
    first_act_at: dict[int, float] = field(default_factory=dict)
    """Unix time of the first decision made with each policy version."""
    update_stages: dict[int, dict[str, float]] = field(default_factory=dict)
    """Milliseconds each stage of an update took, per installed version: ``queued`` (received until the
    updater took it), ``verify``, the health check's own stages (``health_*``), ``install``, ``first_act``
    (installed until the first decision with it), ``persist`` (the A/B cache writes after acting), and the
    updater thread's CPU time: ``critical_cpu`` (taking the bundle until installing it) and ``persist_cpu``
    (the cache writes). The newest 64 versions are kept."""


class EdgeAgent:
    """One edge node (see the module docstring). Call `start`, then `run` (blocking), then `close`."""

    def __init__(self, config: EdgeAgentConfig, *, make_env: Callable[[], Any] | None = None,
                 clock: Callable[[], float] = time.time,
                 on_phase: Callable[[Phase, Bundle], None] | None = None) -> None:
        self.config = config
        self.topics = FleetTopics(config.fleet)
        self._clock = clock
        self._make_env = make_env or self._default_env
        self._checker = HealthChecker(self._make_env, config.health())
        trust = TrustStore([load_public_key(p) for p in config.trust])
        _check_cache_dir(Path(config.cache_dir))
        self.cache = PolicyCache(Path(config.cache_dir), trust=trust, tier="edge", clock=clock, on_phase=on_phase)
        self.last_error: str | None = None
        self.outbox = self._open_outbox()
        self.counters = AgentCounters()
        self._policy: OnnxPolicy | None = None
        self._policy_sha: str | None = None
        self._follow: str | None = config.policy
        self._inbox: dict[str, tuple[bytes, float]] = {}
        self._inbox_cond = threading.Condition()
        self._assembler = ChunkAssembler()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._status_dirty = threading.Event()
        self._sender_wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self.link: MqttLink | None = None
        self.gateway: EdgeGateway | None = None
        """The device gateway, when `serve_devices` is set."""
        self._lock = threading.Lock()
        self._last_report: tuple[float | None, float | None, int | None] = (None, None, None)
        self._installed_at = time.perf_counter()

    def _open_outbox(self) -> Outbox:
        path = Path(self.config.cache_dir) / "outbox.sqlite"
        config = OutboxConfig(max_records=self.config.outbox_max_records, overflow=self.config.outbox_overflow,
                              receipt_timeout_s=self.config.experience_receipt_timeout_s,
                              receipt_max_s=max(300.0, self.config.experience_receipt_timeout_s))
        try:
            try:
                return Outbox(path, config)
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError as exc:
                # A corrupt outbox must not keep the node from acting: keep it for inspection, start a new one
                # whose record ids (from the clock, in ms) stay above the old ones, so receivers that drop
                # repeated (node, record_id) pairs do not drop the new records.
                aside = path.with_name(f"outbox.sqlite.corrupt-{int(time.time())}")
                for suffix in ("", "-wal", "-shm"):
                    src = path.with_name(path.name + suffix)
                    if src.exists():
                        src.replace(aside.with_name(aside.name + suffix))
                self.last_error = (f"telemetry outbox {path} was unreadable ({exc}): moved to {aside}; the records "
                                   "it held are not sent")
                log.warning("%s: %s", self.config.node_id, self.last_error)
                return Outbox(path, config, first_id=int(time.time() * 1000))
        except (OSError, sqlite3.Error) as exc:
            raise EdgeConfigError(f"EdgeAgent: cannot open the telemetry outbox in --cache-dir "
                                  f"{self.config.cache_dir!r}: {exc}; pass a writable folder") from None

    def _default_env(self) -> Any:
        return make_checked_env(self.config.env, self.config.pipeline, command="strata edge run", extra="edge")

    def _check_env(self) -> None:
        gym = require("gymnasium", extra="edge", purpose="the edge simulators")
        register_envs()
        try:
            gym.spec(self.config.env)
        except gym.error.Error as exc:
            raise EdgeConfigError(f"--env {self.config.env!r} is not a gymnasium env: {exc}; pass a registered "
                                  "env id such as CartPole-v1") from None

    # ------------------------------------------------------------------------------------------ state

    @property
    def version(self) -> int | None:
        """Version of the policy the simulator acts with (None before the first one)."""
        p = self._policy
        return None if p is None else p.version

    @property
    def active_policy(self) -> OnnxPolicy | None:
        """The policy the simulator acts with now (a gateway can use ``lambda: agent.active_policy``)."""
        return self._policy

    @property
    def policy_name(self) -> str | None:
        """Name of the active policy."""
        p = self._policy
        return None if p is None else p.policy

    def status(self, *, online: bool = True) -> NodeStatus:
        """The status message this node publishes."""
        stats = self.outbox.stats()
        mean_return, p99, record_id = self._last_report
        return NodeStatus(node=self.config.node_id, online=online, policy=self.policy_name, version=self.version,
                          updated_at=self._clock(), outbox_pending=stats.pending,
                          last_error=self.last_error or (self.gateway.relay_error if self.gateway else None),
                          outbox_dropped=stats.dropped, steps=self.counters.steps, episodes=self.counters.episodes,
                          mean_return=mean_return, latency_p99_us=p99, last_record_id=record_id,
                          cache_repairs=self.cache_repairs)

    @property
    def cache_repairs(self) -> str | None:
        """The policy cache's repairs and fallbacks since start (`PolicyCache.repairs`), or None."""
        repairs = self.cache.repairs
        return "; ".join(repairs)[-2000:] if repairs else None

    def _will_payload(self) -> bytes:
        # The will cannot change while connected (MQTT 3.1.1); it names the policy running at connect time.
        return NodeStatus(node=self.config.node_id, online=False, policy=self.policy_name, version=self.version,
                          updated_at=0.0, last_error="connection lost (last will)").encode()

    def wait_for_version(self, version: int, timeout: float) -> bool:
        """Block until the active policy has `version` (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.version == version:
                return True
            time.sleep(0.005)
        return self.version == version

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> EdgeAgent:
        """Load the cached policy (verified), start the link, the updater and the sender."""
        if self._make_env == self._default_env:
            self._check_env()
        bundle = self.cache.load()
        if self.cache_repairs:  # damage found on disk is a status, not only a log line
            self.last_error = f"policy cache: {self.cache_repairs}"
        if bundle is not None:
            try:
                self._install(OnnxPolicy(bundle), bundle)
                log.info("%s: running cached %s v%d", self.config.node_id, bundle.policy, bundle.version)
            except Exception as exc:  # a cached model onnxruntime cannot load: wait for the next bundle
                self._note_error(f"cached policy does not load: {exc}")
        if self._follow is None and bundle is not None:
            self._follow = bundle.policy
        if self.config.broker is not None:
            password = read_password_file(self.config.password_file) if self.config.password_file else None
            cid = mqtt_client_id("agent", fleet=self.config.fleet, node=self.config.node_id)
            link_config = LinkConfig(broker=self.config.broker, client_id=cid,
                                     username=self.config.username, password=password, ca_file=self.config.ca_file,
                                     cert_file=self.config.cert_file, key_file=self.config.key_file)
            will = (self.topics.node(self.config.node_id, "status"), self._will_payload())
            self.link = MqttLink(link_config, on_message=self._on_message, on_ack=self.outbox.ack,
                                 on_connect=self._on_connect, will=will)
            self.link.subscribe(self.topics.announce)
            self.link.subscribe(self.topics.control)
            self.link.subscribe(self.topics.node(self.config.node_id, "control"))
            if self.config.experience_steps:
                self.link.subscribe(self.topics.node(self.config.node_id, "receipt"))
            if self._follow is not None:
                self.link.subscribe(self.topics.policy_latest(self._follow))
            if self.config.serve_devices:
                # One connection per node: the gateway shares the agent's link (a broker that binds the client id
                # to the username would otherwise let the two connections of one user take each other over).
                self.gateway = EdgeGateway(
                    GatewayConfig(broker=self.config.broker, fleet=self.config.fleet, node=self.config.node_id,
                                  state_path=str(Path(self.config.cache_dir) / "device-relay.json"),
                                  username=self.config.username, password=password, ca_file=self.config.ca_file,
                                  cert_file=self.config.cert_file, key_file=self.config.key_file),
                    policy_source=lambda: self.active_policy,
                    trust=TrustStore([load_public_key(p) for p in self.config.trust]), link=self.link).start()
            self.link.start()

        for target, name in ((self._updater, "updater"), (self._sender, "sender")):
            t = threading.Thread(target=target, name=f"{self.config.node_id}-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        """Ask `run` to return at the next step."""
        self._stop.set()
        self._wake.set()
        with self._inbox_cond:
            self._inbox_cond.notify_all()
        self._sender_wake.set()

    def close(self, *, drain_s: float = 2.0) -> None:
        """Stop, send what the outbox holds for up to `drain_s`, publish ``online: false`` and disconnect."""
        self.stop()
        for t in self._threads:
            t.join(timeout=max(5.0, self.config.health_deadline_s + 1))
        if self.gateway is not None:
            self.gateway.close()
        link = self.link
        if link is not None:
            deadline = time.monotonic() + drain_s
            while link.connected and time.monotonic() < deadline:
                self.outbox.pump(link)
                stats = self.outbox.stats()
                if stats.pending == 0:
                    break
                time.sleep(0.02)
            if link.connected:
                # Sent before the DISCONNECT on the same connection, so the broker stores it first.
                link.publish(self.topics.node(self.config.node_id, "status"), self.status(online=False).encode(),
                             retain=True)
            link.close()
        self.outbox.close()

    # ------------------------------------------------------------------------------------------ link thread

    def _on_connect(self) -> None:
        self._status_dirty.set()
        self._sender_wake.set()

    def _on_message(self, topic: str, payload: bytes, retained: bool) -> None:
        gateway = self.gateway
        if gateway is not None and gateway.handle(topic, payload, retained):
            return
        try:
            if topic == self.topics.announce:
                if not payload:
                    return
                ann = Announcement.decode(topic, payload)
                if self.config.policy is None and ann.policy != self._follow:
                    self._follow_policy(ann.policy)
                return
            if topic == self.topics.node(self.config.node_id, "receipt"):
                self._on_receipt(Receipt.decode(topic, payload))
                return
            if topic in (self.topics.control, self.topics.node(self.config.node_id, "control")):
                control = Control.decode(topic, payload)
                if control.command == "status":
                    self._status_dirty.set()
                    self._sender_wake.set()
                elif control.command == "resync" and self._follow is not None and self.link is not None:
                    self.link.resubscribe(self.topics.policy_latest(self._follow))
                return
        except PayloadError as exc:
            self.counters.malformed += 1
            log.warning("%s: dropped: %s", self.config.node_id, exc)
            return
        if not payload:  # a cleared retained message
            return
        with self._inbox_cond:
            self._inbox[topic] = (payload, time.perf_counter())
            self._inbox_cond.notify()

    def _on_receipt(self, receipt: Receipt) -> None:
        """The learner stored (or refused) these experience records: the outbox may delete them."""
        self.outbox.confirm([*receipt.record_ids, *(int(k) for k in receipt.refused)])
        self.counters.receipts += len(receipt.record_ids)
        if receipt.refused:
            self.counters.refused_records += len(receipt.refused)
            rid, reason = next(iter(receipt.refused.items()))
            self._note_error(f"the learner refused {len(receipt.refused)} experience record(s), e.g. {rid}: "
                             f"{reason[:200]}")
        self._sender_wake.set()

    def _follow_policy(self, policy: str) -> None:
        old, self._follow = self._follow, policy
        if self.link is not None:
            if old is not None:
                self.link.unsubscribe(self.topics.policy_latest(old))
            self.link.subscribe(self.topics.policy_latest(policy))

    # ------------------------------------------------------------------------------------------ updater thread

    def _updater(self) -> None:
        try:  # read the simulator's spaces for the health check now, not on the first update's path
            self._checker.prepare()
        except Exception as exc:  # the first check tries again and reports it
            log.warning("%s: cannot make the simulator for health checks yet: %s", self.config.node_id, exc)
        while not self._stop.is_set():
            with self._inbox_cond:
                while not self._inbox and not self._stop.is_set():
                    self._inbox_cond.wait(timeout=1.0)
                    for ann in self._assembler.expire():
                        self._note_error(f"chunked bundle {ann.policy} v{ann.version} timed out incomplete")
                items = sorted(self._inbox.items(), key=lambda kv: "/chunks/" in kv[0])  # latest before chunks
                self._inbox.clear()
            for topic, (payload, received) in items:
                if self._stop.is_set():
                    return
                try:
                    self._handle(topic, payload, received)
                except PayloadError as exc:
                    self.counters.malformed += 1
                    self._note_error(str(exc))
                except CacheError as exc:
                    self._note_error(str(exc))
                except Exception as exc:  # one bad update must never stop the next one
                    log.exception("%s: update from %s failed", self.config.node_id, topic)
                    self._note_error(f"update from {topic} failed: {type(exc).__name__}: {exc}")

    def _note_error(self, message: str) -> None:
        log.warning("%s: %s", self.config.node_id, message)
        self.last_error = message
        self._status_dirty.set()
        self._sender_wake.set()

    def _handle(self, topic: str, payload: bytes, received: float) -> None:
        follow = self._follow
        if follow is not None and topic == self.topics.policy_latest(follow):
            if is_json_payload(payload):
                ann = Announcement.decode(topic, payload)
                if ann.chunks == 0:
                    raise PayloadError(topic, "a JSON payload on a latest topic must announce chunks > 0")
                if ann.sha256 == self._policy_sha or (self.version or 0) >= ann.version:
                    return
                try:
                    self._assembler.expect(ann)
                except EdgeConfigError as exc:
                    raise PayloadError(topic, str(exc)) from None
                if self.link is not None:
                    for index in self._assembler.missing(ann.policy):
                        self.link.resubscribe(self.topics.policy_chunk(ann.policy, index))
                return
            self._consider(payload, received)
            return
        if follow is not None and topic.startswith(f"{self.topics.root}/policies/{follow}/chunks/"):
            data = self._assembler.add(topic, Chunk.decode(topic, payload))
            if data is not None:
                if self.link is not None:
                    total = Chunk.decode(topic, payload).total
                    for index in range(total):
                        self.link.unsubscribe(self.topics.policy_chunk(follow, index))
                self._consider(data, received)

    def _consider(self, data: bytes, received: float) -> None:
        picked, cpu_picked = time.perf_counter(), time.thread_time()
        sha = hashlib.sha256(data).hexdigest()
        if sha == self._policy_sha:
            return
        try:
            bundle = self.cache.verify(data)
        except BundleError as exc:
            self.counters.refused.append(f"{type(exc).__name__}: {exc}")
            self._note_error(f"bundle refused: {exc}")
            return
        if self._follow is not None and bundle.policy != self._follow:
            self._note_error(f"bundle of policy {bundle.policy!r} arrived on the topic of {self._follow!r}; ignored")
            return
        if self.cache.is_rejected(bundle):
            return
        verified = time.perf_counter()
        policy, report = self._checker.check(bundle)
        if policy is None:
            # Remembered as rejected; no slot is written, so the fallback policy on disk stays the last good one.
            self.cache.reject(bundle, report.reason)
            self.counters.health_failures.append(report.reason)
            self._note_error(f"health check of {bundle.policy} v{bundle.version} failed: {report.reason}; "
                             f"still running v{self.version}")
            return
        checked = time.perf_counter()
        # Act on the new policy at once, then make it durable: write the inactive slot, fsync, swap the pointer.
        # A crash in between restarts on the previous committed policy, and the retained latest brings this
        # one again; the fsyncs (~10-30 ms on a VM disk) stay off the propagation path.
        previous = self._policy, self._policy_sha
        stages = {"queued": picked - received, "verify": verified - picked,
                  **{f"health_{k}": v for k, v in report.stages.items()}}
        self._installed_at = time.perf_counter()
        self._install(policy, bundle, report, sha=sha)
        installed = time.perf_counter()
        cpu_installed = time.thread_time()
        stages["critical_cpu"] = cpu_installed - cpu_picked
        try:
            self.cache.stage(bundle, data=data)
            self.cache.commit()
        except CacheError as exc:
            # Not durable, so not installed: go back to the policy the cache holds, and say so in the status.
            kept = previous[0]
            if kept is not None:
                with self._lock:
                    self._policy, self._policy_sha = previous
                self._wake.set()
                if self.link is not None:
                    self.link.set_will(self.topics.node(self.config.node_id, "status"), self._will_payload())
                running = f"still running {kept.policy} v{kept.version}"
            else:  # nothing to go back to: acting on it from memory beats acting on nothing
                running = f"running {bundle.policy} v{bundle.version} from memory only (lost on restart)"
            reason = f"install of {bundle.policy} v{bundle.version} failed: {exc}; {running}"
            self.counters.install_failures.append(reason)
            self._note_error(reason)
            return
        log.info("%s: now running %s v%d (health check %.1f ms)", self.config.node_id, bundle.policy,
                 bundle.version, report.seconds * 1000)
        stages.update(install=installed - checked, persist=time.perf_counter() - installed,
                      persist_cpu=time.thread_time() - cpu_installed)
        with self._lock:
            traced = self.counters.update_stages
            traced.setdefault(bundle.version, {}).update({k: v * 1000 for k, v in stages.items()})
            while len(traced) > MAX_TRACED_UPDATES:
                del traced[min(traced)]

    def _install(self, policy: OnnxPolicy, bundle: Bundle, report: HealthReport | None = None, *,
                 sha: str | None = None) -> None:
        with self._lock:
            self._policy = policy
            self._policy_sha = sha or hashlib.sha256(bundle.to_bytes()).hexdigest()
            self.counters.updates += 1
        self._wake.set()  # the simulator acts on it now; the rest is bookkeeping
        if self.link is not None:
            self.link.set_will(self.topics.node(self.config.node_id, "status"), self._will_payload())
        if report is not None:
            self.last_error = None
        self._status_dirty.set()
        self._sender_wake.set()

    # ------------------------------------------------------------------------------------------ sender thread

    def _sender(self) -> None:
        while not self._stop.is_set():
            self._sender_wake.wait(timeout=0.05)
            self._sender_wake.clear()
            link = self.link
            if link is None or not link.connected:
                continue
            if self._status_dirty.is_set():
                self._status_dirty.clear()
                result = link.publish(self.topics.node(self.config.node_id, "status"), self.status().encode(),
                                      retain=True)
                if not result.accepted:
                    self._status_dirty.set()
            self.outbox.pump(link)

    # ------------------------------------------------------------------------------------------ simulator

    def run(self) -> AgentCounters:
        """Step the simulator with the active policy until `steps`, `duration` or `stop`; return the counters."""
        cfg = self.config
        env = self._make_env()
        started = time.monotonic()
        next_report = started + cfg.telemetry_interval_s
        obs, _ = env.reset(seed=cfg.seed)
        obs = _observation(obs)
        episode_return, episode_length = 0.0, 0
        returns: list[float] = []
        lengths: list[int] = []
        latencies: list[float] = []
        by_version: dict[int, int] = {}
        interval_steps = 0
        experience = _ExperienceTaker(self) if cfg.experience_steps else None
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                link = self.link
                if link is not None and link.gave_up:
                    # The link's last error names the cause (credentials, a certificate, TLS vs plain port) and fix.
                    cause = link.last_error or "no reason given"
                    hint = ("; check --username and --password-file" if cause.startswith("broker refused")
                            else "")
                    raise EdgeError(f"{cfg.node_id}: the broker {cfg.broker} refused the connection {link.refusals} "
                                    f"times ({cause}){hint}")
                if cfg.duration is not None and now - started >= cfg.duration:
                    break
                if cfg.steps is not None and self.counters.steps >= cfg.steps:
                    break
                if now >= next_report:
                    self._report(returns, lengths, latencies, by_version, interval_steps)
                    returns, lengths, latencies, by_version, interval_steps = [], [], [], {}, 0
                    next_report = now + cfg.telemetry_interval_s
                policy = self._policy
                if policy is None:
                    self._wake.wait(timeout=0.05)
                    self._wake.clear()
                    continue
                recording = experience is not None and experience.recording(policy)
                t0 = time.perf_counter()
                act_obs = np.asarray(obs, dtype=np.float32)  # image frames stay uint8 in the records
                if recording:
                    assert experience is not None
                    action, logp = experience.act(policy, act_obs)
                else:
                    action, logp = policy.act(act_obs), None
                latency = time.perf_counter() - t0
                version = policy.version
                if version not in self.counters.first_act_at:
                    self.counters.first_act_at[version] = self._clock()
                    with self._lock:
                        self.counters.update_stages.setdefault(version, {})["first_act"] = (
                            time.perf_counter() - self._installed_at) * 1000
                if len(latencies) < MAX_LATENCIES:
                    latencies.append(latency)
                by_version[version] = by_version.get(version, 0) + 1
                next_obs, reward, terminated, truncated, _ = env.step(action)
                next_obs = _observation(next_obs)
                self.counters.steps += 1
                interval_steps += 1
                episode_return += float(reward)
                episode_length += 1
                done = bool(terminated or truncated)
                if recording:
                    assert experience is not None
                    experience.add(obs=obs, action=action, reward=float(reward), terminated=bool(terminated),
                                   truncated=bool(truncated), final_obs=next_obs if done else None, version=version,
                                   logp=logp, episode=(episode_return, episode_length) if done else None)
                if done:
                    self.counters.episodes += 1
                    returns.append(episode_return)
                    lengths.append(episode_length)
                    episode_return, episode_length = 0.0, 0
                    next_obs, _ = env.reset()
                    next_obs = _observation(next_obs)
                obs = next_obs
                if recording:
                    assert experience is not None
                    experience.finish_if_full(obs)
                if cfg.control_period_s:
                    remaining = cfg.control_period_s - (time.perf_counter() - t0)
                    if remaining > 0 and self._wake.wait(timeout=remaining):
                        self._wake.clear()
            if interval_steps:
                self._report(returns, lengths, latencies, by_version, interval_steps)
        finally:
            env.close()
        return self.counters

    def _report(self, returns: list[float], lengths: list[int], latencies: list[float], by_version: dict[int, int],
                steps: int) -> None:
        if not steps and not returns:
            return
        policy = self._policy
        stats = self.outbox.stats()
        lat = np.asarray(latencies) * 1e6 if latencies else None
        node = self.config.node_id
        p99 = None if lat is None else _finite(float(np.percentile(lat, 99)))

        def build(record_id: int) -> bytes:
            return Telemetry(
                record_id=record_id, node=node, sent_at=self._clock(),
                policy=None if policy is None else policy.policy, version=None if policy is None else policy.version,
                policy_age_s=None if policy is None else max(0.0, self._clock() - policy.created_at), steps=steps,
                episodes=len(returns), episode_returns=tuple(returns[-MAX_EPISODES_PER_RECORD:]),
                episode_lengths=tuple(lengths[-MAX_EPISODES_PER_RECORD:]),
                latency_p50_us=None if lat is None else _finite(float(np.percentile(lat, 50))),
                latency_p99_us=p99,
                decisions_by_version={str(k): v for k, v in sorted(by_version.items())},
                outbox_pending=stats.pending, outbox_dropped=stats.dropped,
            ).encode()

        record_id = self.outbox.put(self.topics.node(node, "telemetry"), build)
        if record_id is not None:
            self.counters.telemetry_records += 1
        mean = float(np.mean(returns)) if returns else self._last_report[0]
        self._last_report = (mean, p99, record_id)
        self._status_dirty.set()  # the retained status carries the latest summary for late viewers
        self._sender_wake.set()


class _ExperienceTaker:
    """The caller thread's experience bookkeeping: the request of the acting policy, the record, the budget."""

    def __init__(self, agent: EdgeAgent) -> None:
        import zlib

        cfg = agent.config
        self.agent = agent
        self.budget = Budget(bytes_per_s=cfg.experience_max_bytes_per_s, steps_per_s=cfg.experience_max_steps_per_s)
        self.rng = np.random.default_rng([cfg.seed, zlib.crc32(cfg.node_id.encode())])
        self.recorder: ExperienceRecorder | None = None
        self._policy_version: int | None = None
        self.request = ExperienceRequest(actions="sample", steps=cfg.experience_steps)
        self.fits = True

    def _follow(self, policy: OnnxPolicy) -> None:
        """Read the experience request of a newly acting policy (once per version)."""
        self._policy_version = policy.version
        cfg = self.agent.config
        try:
            asked = ExperienceRequest.from_bundle(policy.bundle)
        except EdgeConfigError as exc:
            self.agent._note_error(str(exc))
            asked = None
        self.request = asked or ExperienceRequest(actions="sample", steps=cfg.experience_steps)
        space = policy.bundle.manifest.observation_space
        obs_shape = tuple(space.get("shape", ()))
        act_shape = tuple(policy.bundle.manifest.action_space.get("shape", ()))
        # Compressed image records are measured when encoded (a record over the limit is reported, not sent).
        compressed = not cfg.pipeline.codec.is_raw and is_image(obs_shape, space.get("dtype", "float32"))
        self.fits = compressed or fits_payload(obs_shape, 4, act_shape, self.request.steps)
        if not self.fits:
            self.agent._note_error(f"experience records of {self.request.steps} steps of observations "
                                   f"{list(obs_shape)} would exceed the 128 KB MQTT payload limit; nothing is "
                                   "recorded (the learner should ask for fewer steps per record: smaller --num-steps)")

    def recording(self, policy: OnnxPolicy) -> bool:
        """Whether this step is recorded (a record is open, or one may start within the budget)."""
        if policy.version != self._policy_version:
            self._follow(policy)
        if self.recorder is not None:
            return True
        steps = self.request.steps
        if self.fits and self.budget.allow(record_bytes=1024 + steps * 64, steps=steps):
            self.recorder = ExperienceRecorder(self.agent.config.node_id, steps, self.agent.config.pipeline.codec)
            return True
        self.agent.counters.experience_skipped_steps += 1
        return False

    def act(self, policy: OnnxPolicy, obs: np.ndarray) -> tuple[Any, float | None]:
        """The action for the record, and its behaviour log-prob."""
        return act_for_experience(policy, obs, self.request, self.rng)

    def add(self, **step: Any) -> None:
        """One recorded step."""
        assert self.recorder is not None
        self.recorder.add(**step)

    def finish_if_full(self, next_obs: np.ndarray) -> None:
        """Put a full record into the outbox (it stays there until the learner's receipt names it)."""
        recorder = self.recorder
        if recorder is None or not recorder.full:
            return
        self.recorder = None
        agent = self.agent
        build = recorder.record(next_obs)
        sizes: list[int] = []

        def built(record_id: int) -> bytes:
            payload = build(record_id)
            sizes.append(len(payload))
            return payload

        try:
            record_id = agent.outbox.put(agent.topics.node(agent.config.node_id, "experience"), built, receipt=True)
        except EdgeConfigError as exc:  # larger than one message after all (many episode ends)
            agent._note_error(f"an experience record was not sent: {exc}")
            return
        self.budget.spend(record_bytes=sizes[0] if sizes else 0, steps=recorder.steps)
        if record_id is not None:
            agent.counters.experience_records += 1
        agent._sender_wake.set()


def _observation(obs: Any) -> np.ndarray:
    """An env observation as the node keeps it: image frames (uint8) as they are, anything else as float32."""
    a = np.asarray(obs)
    return a if is_image(a.shape, a.dtype) else a.astype(np.float32)


def read_password_file(path: str | Path) -> str:
    """The broker password stored in `path` (surrounding whitespace removed); `EdgeConfigError` if unreadable."""
    try:
        return read_bounded(Path(path), max_bytes=MAX_PASSWORD_BYTES, what="the broker password file").decode().strip()
    except (ConfigError, UnicodeDecodeError) as exc:
        raise EdgeConfigError(f"{exc}; pass a file written by `strata broker config` (credentials/USER.password)"
                              if isinstance(exc, ConfigError) else
                              f"the broker password file {shown(str(path))} is not UTF-8 text; pass a file written "
                              "by `strata broker config` (credentials/USER.password)") from None


def _check_cache_dir(path: Path) -> None:
    """Raise `EdgeConfigError` unless `path` is (or can be made) a folder this process can write."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise EdgeConfigError(f"--cache-dir {str(path)!r} cannot be used: {exc.strerror or exc}; pass a writable "
                              "folder (it holds the policy cache and the telemetry outbox)") from None


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
