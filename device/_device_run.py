"""A terminal device: runs its micro policy locally and escalates uncertain observations to its edge node.

Per decision (`TieredController.decide`):

1. the micro policy (`NumpyExecutor`) computes its action and a confidence: for Discrete policies from its
   logits, ``margin`` (top-1 minus top-2 probability) or ``entropy`` (1 minus the normalised entropy); for Box
   policies (no logits) from the observation, `StateRegion.confidence`: how far the observation lies outside the
   states the micro policy was distilled on (recorded by the distillation in the signed manifest); a Box bundle
   without a recorded region has confidence 1;
2. the observation is escalated when the confidence is under the threshold, or when the policy is stale
   (older than ``stale_after_s``, or past its expiry);
3. an escalation is one request to the edge with a correlation id. The latency budget is a hard deadline counted
   from the start of the decision (the micro policy's own time included): the device waits for the reply only
   until it expires, and then (or at once when the link is down or the edge has no answer) uses its own action;
4. every decision records the tier that decided it: ``device``, ``edge`` or ``device-fallback``.

A non-finite observation (NaN or +-inf: a broken sensor) follows the rule of the C export (``strata_policy_act``
returns ``STRATA_POLICY_NONFINITE`` and leaves ``out`` untouched): it is refused before the micro policy runs and
is never escalated (standard JSON cannot carry it); the device decides at once by the fallback, holding the last
action it decided (the neutral action, 0 or the zero vector clipped into the action bounds, before the first),
tier ``device-fallback``, reason `NONFINITE_REASON`, counted in `DeviceReport.nonfinite`.

`DeviceRuntime` is the I/O around it, on paho-mqtt (`device._mqtt`; username/password and TLS for a secure
broker, reconnect by paho): it receives device bundles on its edge's retained device-policy topic, verifies each
(`Verifier`, tier ``device``: signature, digest, expiry, anti-rollback persisted in a state file) and swaps the
executor only for a bundle that passes; a refused bundle leaves the running policy in place and is logged once
(a retained message comes back on every reconnect; the same bytes are not refused, or logged, twice). A message
over ``max_bundle_bytes`` is refused before it is parsed. Topics and payloads are in `device._device_topics`.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from device._bundle import Bundle, Verifier
from device._bundle_errors import BundleError, ModelError
from device._device_topics import DevicePayloadError, DeviceTopics, EscalationReply, EscalationRequest
from device._errors import ConfigError, StrataError
from device._executor import NumpyExecutor
from device._keys import TrustStore
from device._mqtt import DeviceLink, LinkOptions, MqttLinkError, parse_broker
from device._mqtt_access import mqtt_client_id

log = logging.getLogger("strata.device")

Tier = Literal["device", "edge", "device-fallback"]
TIERS: tuple[Tier, ...] = ("device", "edge", "device-fallback")


class DeviceRunError(StrataError):
    """The device cannot run: no policy arrived in time, or the link to the edge cannot be made."""


@dataclass(frozen=True, kw_only=True)
class DeviceConfig:
    """A terminal device: where its edge is, how it decides, and when it escalates."""

    # Link
    broker: str = "mqtt://127.0.0.1:1883"
    """MQTT broker the edge node serves its devices on: ``mqtt://host:1883`` or ``mqtts://host:8883`` (TLS)."""
    username: str | None = None
    """Broker username (on a broker from `strata broker config --devices`: the device id)."""
    password_file: str | None = None
    """File holding the broker password (``credentials/DEVICE.password`` from `strata broker config`)."""
    ca_file: str | None = None
    """CA certificate (PEM) that verifies a TLS broker; default: the system's CAs."""
    cert_file: str | None = None
    """Client certificate (PEM) for brokers that authenticate devices by certificate."""
    key_file: str | None = None
    """Private key (PEM) of `cert_file`."""
    fleet: str = "default"
    """Fleet name (topic segment)."""
    edge_node: str = "edge-0"
    """Id of the edge node this device belongs to."""
    device_id: str = "device-0"
    """This device's id; also its MQTT client id."""
    trust: tuple[str, ...] = ()
    """Trusted public key files (PEM) that may sign device bundles."""
    state_path: str | None = None
    """Anti-rollback state file (JSON); None keeps it in memory only."""
    keepalive_s: int = 30
    """MQTT keepalive."""
    max_bundle_bytes: int = 256 * 1024
    """Largest device bundle accepted; a bigger message on the device-policy topic is refused unread (logged once)."""

    # Decisions
    confidence: Literal["margin", "entropy"] = "margin"
    """Confidence measure of a Discrete micro policy: probability margin or 1 - normalised entropy."""
    threshold: float = 0.5
    """Escalate when the confidence is below this (0 never escalates for confidence)."""
    budget_ms: float = 20.0
    """Latency budget of an escalation; past it the device acts on its own action."""
    stale_after_s: float | None = None
    """A policy older than this (seconds since its bundle was created) is stale: every decision escalates."""
    policy_wait_s: float = 10.0
    """How long `strata device run` waits for the first micro policy."""

    def __post_init__(self) -> None:
        DeviceTopics(self.fleet, self.edge_node).request(self.device_id)  # validates the segments
        if self.confidence not in ("margin", "entropy"):
            raise ConfigError(f"DeviceConfig: confidence must be 'margin' or 'entropy', got {self.confidence!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"DeviceConfig: threshold must be in [0, 1], got {self.threshold}")
        if not self.budget_ms > 0:
            raise ConfigError(f"DeviceConfig: budget_ms must be > 0, got {self.budget_ms}")
        try:
            parse_broker(self.broker)
        except ValueError as exc:
            raise ConfigError(f"DeviceConfig: {exc}") from None
        if self.key_file and not self.cert_file:
            raise ConfigError("DeviceConfig: key_file without cert_file; pass --cert-file too, or drop --key-file")
        if self.max_bundle_bytes < 1024:
            raise ConfigError(f"DeviceConfig: max_bundle_bytes must be >= 1024, got {self.max_bundle_bytes}")


def confidence_of(logits: np.ndarray, measure: str) -> float:
    """Confidence in [0, 1] of one row of logits: probability margin or 1 - normalised entropy."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    if z.size < 2:
        return 1.0
    p = np.exp(z - z.max())
    p /= p.sum()
    if measure == "margin":
        top = np.partition(p, -2)[-2:]
        return float(top[1] - top[0])
    entropy = -float(np.sum(p * np.log(np.clip(p, 1e-12, None))))
    return 1.0 - entropy / math.log(z.size)


REGION_KEY = "state_region"
"""Key of the `StateRegion` in a device bundle manifest's ``preprocessing``."""


@dataclass(frozen=True, eq=False)
class StateRegion:
    """The observations a micro policy was trained on, as an ellipsoid: an out-of-distribution confidence.

    A continuous micro policy has no logits to be unsure with; what makes its action untrustworthy is an
    observation unlike those it imitated its teacher on (supervised imitation is only accurate where it has
    data). The region is the training states' mean and covariance; an observation's distance is its
    Mahalanobis distance ``|W (obs - mean)|`` (``W`` the inverse Cholesky factor of the covariance, so the
    distance is in units of the training spread along every direction, correlations included), and

        confidence = 1                     if distance <= radius
                   = radius / distance     otherwise,

    with ``radius`` the median distance of the training states themselves. So a threshold ``t`` escalates an
    observation ``1/t`` times further out than a typical training state (``t = 0.5``: twice the median).
    It costs one ``d x d`` triangular matrix-vector product per decision, numpy only, and it is fitted on the
    very states the student was fitted on, so it needs no extra data, network output or graph change.
    """

    KEY: ClassVar[str] = REGION_KEY
    """Key of the region in a device bundle manifest's ``preprocessing``."""

    mean: np.ndarray
    """Mean training state, shape ``[d]`` (flattened observation)."""
    whiten: np.ndarray
    """Lower-triangular ``[d, d]`` inverse Cholesky factor of the training states' covariance."""
    radius: float
    """Median Mahalanobis distance of the training states."""
    samples: int = 0
    """Training states the region was fitted on."""

    @classmethod
    def fit(cls, states: np.ndarray) -> StateRegion:
        """The region of `states` (``[n, *obs_shape]``, n >= 2).

        The covariance gets a ridge of 1e-6 of its mean variance (plus 1e-12), so a feature constant in
        training makes any change of it far out rather than a singular matrix.

        Raises:
            ConfigError: Fewer than two states, or non-finite values.
        """
        x = np.asarray(states, dtype=np.float64)
        x = x.reshape(len(x), -1) if x.ndim > 1 else x.reshape(-1, 1)
        if len(x) < 2 or not np.all(np.isfinite(x)):
            raise ConfigError(f"StateRegion.fit: needs at least 2 finite states, got {len(x)} "
                              f"({int(np.sum(~np.isfinite(x)))} non-finite values); collect more states")
        mean = x.mean(axis=0)
        cov = np.atleast_2d(np.cov(x, rowvar=False, bias=True))
        ridge = 1e-6 * float(np.mean(np.diag(cov))) + 1e-12
        chol = np.linalg.cholesky(cov + ridge * np.eye(len(mean)))
        whiten = np.linalg.inv(chol)
        distances = np.linalg.norm((x - mean) @ whiten.T, axis=1)
        return cls(mean=mean, whiten=np.tril(whiten), radius=max(float(np.median(distances)), 1e-12),
                   samples=len(x))

    def distance(self, obs: np.ndarray) -> float:
        """Mahalanobis distance of one observation from the training states."""
        z = self.whiten @ (np.asarray(obs, dtype=np.float64).reshape(-1) - self.mean)
        return float(np.sqrt(z @ z))

    def confidence(self, obs: np.ndarray) -> float:
        """``min(1, radius / distance)``, in (0, 1]; 0 for a non-finite observation."""
        d = self.distance(obs)
        if not math.isfinite(d):
            return 0.0
        return 1.0 if d <= self.radius else self.radius / d

    def to_manifest(self) -> dict[str, Any]:
        """JSON-ready form for a manifest's ``preprocessing[REGION_KEY]``."""
        return {"kind": "mahalanobis", "mean": [float(v) for v in self.mean],
                "whiten": [[float(v) for v in row] for row in self.whiten], "radius": float(self.radius),
                "samples": int(self.samples)}

    @classmethod
    def from_manifest(cls, preprocessing: Mapping[str, Any] | None, *, dim: int) -> StateRegion | None:
        """The region a manifest's ``preprocessing`` records, or None when it records none.

        Raises:
            ModelError: The recorded region is malformed or does not match the observation size `dim`.
        """
        spec = (preprocessing or {}).get(REGION_KEY)
        if spec is None:
            return None
        try:
            if spec["kind"] != "mahalanobis":
                raise ValueError(f"kind {spec['kind']!r} is not 'mahalanobis'")
            mean = np.asarray(spec["mean"], dtype=np.float64)
            whiten = np.asarray(spec["whiten"], dtype=np.float64)
            radius = float(spec["radius"])
            if mean.shape != (dim,) or whiten.shape != (dim, dim):
                raise ValueError(f"mean {mean.shape} / whiten {whiten.shape} do not match {dim} observation values")
            if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(whiten)) and math.isfinite(radius)
                    and radius > 0):
                raise ValueError("non-finite values or a radius <= 0")
            samples = int(spec.get("samples", 0))
        except (TypeError, KeyError, ValueError) as exc:
            raise ModelError(f"StateRegion.from_manifest: preprocessing[{REGION_KEY!r}] is malformed ({exc}); "
                             "re-export the micro policy with `strata export --tier device`") from None
        return cls(mean=mean, whiten=whiten, radius=radius, samples=samples)


class Region(Protocol):
    """What the controller asks for a Box policy's confidence: `StateRegion`'s ``confidence``."""

    def confidence(self, obs: np.ndarray) -> float: ...


@dataclass(frozen=True)
class Decision:
    """One decided observation."""

    action: Any
    """The env action: an int for Discrete, a float32 array for Box."""
    tier: Tier
    """Who decided: the device's micro policy, the edge's policy, or the device after an escalation failed."""
    reason: str
    """``confident``, ``low-confidence`` or ``stale`` (why it was or was not escalated), plus the fallback cause."""
    confidence: float
    latency_s: float
    """Wall time of the whole decision, escalation included."""
    edge_version: int | None = None
    """Version of the edge policy that decided, for ``tier == "edge"``."""


Escalate = Callable[[np.ndarray, float], "EscalationReply | None"]
NONFINITE_REASON = "non-finite observation (broken sensor)"
"""`Decision.reason` of an observation holding NaN or +-inf: refused, decided by the fallback at once."""


class MicroPolicy(Protocol):
    """What the controller runs: `NumpyExecutor`'s ``run`` and ``act``."""

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]: ...

    def act(self, obs: Any) -> np.ndarray: ...


class TieredController:
    """The decision rule of the module docstring, independent of any transport.

    Args:
        executor: The micro policy.
        discrete: Whether the action space is Discrete.
        escalate: ``escalate(obs, budget_s)`` returns the edge's reply, or None on timeout / no link.
        confidence: Measure used for Discrete policies.
        threshold: Escalate below this confidence.
        region: Confidence of a Box policy (`StateRegion`); None gives Box policies confidence 1 (they
            escalate only when stale). Not used for Discrete policies.
        budget_ms: Deadline of a decision that escalates, counted from its start; `escalate` gets what is left.
        is_stale: Whether the running policy is stale now.
        clock: Monotonic clock.
        neutral: The action of a non-finite observation before any action was decided (default: 0 for Discrete,
            the zero vector of the action's shape for Box; `DeviceRuntime` clips it into the action bounds).
    """

    def __init__(self, executor: MicroPolicy, *, discrete: bool, escalate: Escalate, confidence: str = "margin",
                 threshold: float = 0.5, budget_ms: float = 20.0, is_stale: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.perf_counter, region: Region | None = None,
                 neutral: Any = None) -> None:
        self.executor, self.discrete, self.escalate, self.region = executor, discrete, escalate, region
        self.measure, self.threshold, self.budget_s = confidence, threshold, budget_ms / 1000.0
        self.is_stale, self.clock = is_stale, clock
        self._last: Any = neutral
        self.nonfinite = 0
        """Non-finite observations refused so far."""

    def decide(self, obs: np.ndarray) -> Decision:
        """Decide one observation (see the module docstring)."""
        start = self.clock()
        x = np.asarray(obs, dtype=np.float32).reshape(1, *np.shape(obs))
        if not np.isfinite(x).all():  # a broken sensor: the C export's rule (refused), the fallback at once
            self.nonfinite += 1
            if self._last is None:  # nothing decided yet: the neutral action (0, or zeros of the action's shape)
                self._last = 0 if self.discrete else np.zeros_like(self.executor.act(np.zeros_like(x))[0])
            return Decision(self._last, "device-fallback", NONFINITE_REASON, 0.0, self.clock() - start)
        decision = self._decide(x, start)
        self._last = decision.action
        return decision

    def _decide(self, x: np.ndarray, start: float) -> Decision:
        if self.discrete:
            out = self.executor.run({"obs": x})
            own: Any = int(out["action"][0])
            conf = confidence_of(out["logits"][0], self.measure)
        else:
            own = self.executor.act(x)[0]
            conf = 1.0 if self.region is None else self.region.confidence(x[0])
        stale = self.is_stale()
        if not stale and conf >= self.threshold:
            return Decision(own, "device", "confident", conf, self.clock() - start)
        reason = "stale" if stale else "low-confidence"
        left = self.budget_s - (self.clock() - start)  # the budget is a deadline for the whole decision
        reply = self.escalate(x[0], left) if left > 0 else None
        if reply is None or reply.action is None:
            cause = "timeout" if reply is None else (reply.error or "no action")
            return Decision(own, "device-fallback", f"{reason}; {cause}", conf, self.clock() - start)
        action: Any = int(reply.action[0]) if self.discrete else np.asarray(reply.action, dtype=np.float32)
        return Decision(action, "edge", reason, conf, self.clock() - start, reply.policy_version)


@dataclass
class DeviceReport:
    """What a device run did."""

    steps: int = 0
    episodes: list[float] = field(default_factory=list)
    """Returns of the episodes that ended."""
    by_tier: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    latencies: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TIERS})
    policy: str | None = None
    policy_version: int | None = None
    bundles_refused: list[str] = field(default_factory=list)
    nonfinite: int = 0
    """Observations refused as non-finite (a broken sensor), decided by the fallback."""

    def record(self, d: Decision) -> None:
        """Count one decision."""
        self.steps += 1
        self.by_tier[d.tier] += 1
        self.latencies[d.tier].append(d.latency_s)
        if d.reason == NONFINITE_REASON:
            self.nonfinite += 1

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary: returns, tier counts, escalated fraction, latency percentiles (ms) per tier."""
        def pct(xs: list[float], q: float) -> float | None:
            return round(float(np.percentile(xs, q)) * 1000.0, 4) if xs else None

        escalated = self.by_tier["edge"] + self.by_tier["device-fallback"]
        return {"steps": self.steps, "episodes": len(self.episodes),
                "mean_return": float(np.mean(self.episodes)) if self.episodes else None,
                "by_tier": dict(self.by_tier), "escalated_fraction": escalated / self.steps if self.steps else 0.0,
                "latency_ms": {t: {"p50": pct(v, 50), "p99": pct(v, 99)} for t, v in self.latencies.items()},
                "policy": self.policy, "policy_version": self.policy_version,
                "bundles_refused": list(self.bundles_refused), "nonfinite_observations": self.nonfinite}


def read_password_file(path: str) -> str:
    """The broker password stored in `path` (surrounding whitespace removed); `ConfigError` naming the fix."""
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"DeviceConfig: cannot read the broker password file {path!r}: {exc}; pass the file "
                          "`strata broker config --devices` wrote (credentials/DEVICE.password)") from None


class DeviceRuntime:
    """A device's link to its edge: policy updates in, escalations out (see the module docstring)."""

    def __init__(self, config: DeviceConfig, *, trust: TrustStore | None = None, clock: Callable[[], float] = time.time
                 ) -> None:
        self.config = config
        self.topics = DeviceTopics(config.fleet, config.edge_node)
        self._reply_topic = self.topics.reply(config.device_id)
        self._request_topic = self.topics.request(config.device_id)
        if trust is None:
            if not config.trust:
                raise ConfigError("DeviceConfig: trust is empty; pass at least one --trust PUBFILE that signs "
                                  "device bundles")
            trust = TrustStore.from_paths([Path(p) for p in config.trust])
        self.verifier = Verifier(trust=trust, tier="device",
                                 state_path=Path(config.state_path) if config.state_path else None, clock=clock)
        self._clock = clock
        host, port, tls = parse_broker(config.broker)
        cid = mqtt_client_id("device", fleet=config.fleet, node=config.edge_node, device=config.device_id)
        password = read_password_file(config.password_file) if config.password_file else None
        options = LinkOptions(host=host, port=port, client_id=cid, tls=tls, keepalive_s=config.keepalive_s,
                              username=config.username, password=password, ca_file=config.ca_file,
                              cert_file=config.cert_file, key_file=config.key_file)
        self.link = DeviceLink(options, on_message=self._on_message,
                               subscriptions=[(self._reply_topic, 0), (self.topics.device_policy, 1)])
        self._seen_refused: set[bytes] = set()
        self._lock = threading.Lock()
        self._policy_ready = threading.Condition(self._lock)
        self.bundle: Bundle | None = None
        self.executor: NumpyExecutor | None = None
        self.region: StateRegion | None = None
        self.refused: list[str] = []
        self._pending: dict[str, tuple[threading.Event, list[EscalationReply]]] = {}
        self._ids = itertools.count(1)
        self._prefix = f"{config.device_id}-{int(time.time() * 1000) % 1_000_000}"
        self.late_replies = 0
        self.bad_replies = 0

    # -------------------------------------------------------------------------------- link

    @property
    def reconnects(self) -> int:
        """Times the link was made again after it was lost (paho reconnects, 1 s doubling to 10 s)."""
        return max(0, self.link.connects - 1)

    def connect(self) -> DeviceRuntime:
        """Connect to the broker and subscribe to the device-policy and reply topics; paho reconnects from then on.

        While the link is down the device keeps acting on its own policy (escalations fall back at once).

        Raises:
            DeviceRunError: The first connection cannot be made (unreachable, refused credentials, bad TLS files).
        """
        try:
            self.link.connect()
        except MqttLinkError as exc:
            raise DeviceRunError(f"strata device run: cannot reach the edge's broker {self.config.broker}: {exc}"
                                 ) from None
        return self

    def close(self) -> None:
        """Disconnect."""
        self.link.close()

    def __enter__(self) -> DeviceRuntime:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_message(self, topic: str, payload: bytes, retained: bool) -> None:
        if topic == self._reply_topic:
            try:
                reply = EscalationReply.decode(topic, payload)
            except DevicePayloadError:
                self.bad_replies += 1
                return
            with self._lock:
                waiter = self._pending.get(reply.id)
                if waiter is None:
                    self.late_replies += 1
                    return
                waiter[1].append(reply)
            waiter[0].set()
        elif topic == self.topics.device_policy:
            if len(payload) > self.config.max_bundle_bytes:
                self._refuse(payload, f"a {len(payload):,} byte message on {topic} exceeds max_bundle_bytes="
                                      f"{self.config.max_bundle_bytes:,}; not a device bundle, or raise "
                                      "--max-bundle-bytes")
                return
            self.offer(payload)

    def _refuse(self, data: bytes, why: str) -> None:
        """Record and log a refused bundle once: a retained message comes back on every reconnect."""
        digest = hashlib.sha256(data).digest()
        with self._lock:
            if digest in self._seen_refused:
                return
            self._seen_refused.add(digest)
            self.refused.append(why)
        log.warning("strata device %s: refused a device bundle: %s", self.config.device_id, why)

    # -------------------------------------------------------------------------------- policy

    def offer(self, data: bytes) -> bool:
        """Verify a device bundle and install it; a refused one is recorded and the running policy stays.

        The bundle already running is accepted again without a reinstall (a retained message re-delivered on
        reconnect); before any policy is installed, the highest accepted version itself is accepted too, so a
        restarted device reloads its policy while anything older is still refused.
        """
        current = self.bundle
        if current is not None and bytes(data) == current.to_bytes():
            return True
        try:
            bundle = self.verifier.verify(data, allow_current=current is None)
            executor = NumpyExecutor.from_bundle(bundle)
            dim = math.prod(int(d) for d in bundle.manifest.observation_space.get("shape", ()))
            region = StateRegion.from_manifest(bundle.manifest.preprocessing, dim=dim)
        except (BundleError, ModelError) as exc:
            self._refuse(bytes(data), str(exc))
            return False
        self.verifier.accept(bundle)
        with self._lock:
            self.bundle, self.executor, self.region = bundle, executor, region
            self._policy_ready.notify_all()
        return True

    def wait_for_policy(self, timeout: float) -> Bundle:
        """Block until a verified micro policy is installed.

        Raises:
            DeviceRunError: None arrived within `timeout` seconds (the reason of the last refusal is named).
        """
        with self._lock:
            self._policy_ready.wait_for(lambda: self.bundle is not None, timeout)
            if self.bundle is None:
                why = f"; the last bundle was refused: {self.refused[-1]}" if self.refused else ""
                raise DeviceRunError(f"strata device run: no micro policy arrived on {self.topics.device_policy} "
                                     f"within {timeout} s{why}; is the edge gateway relaying a device bundle?")
            return self.bundle

    def is_stale(self) -> bool:
        """Whether the running policy is past `stale_after_s` or its bundle's expiry."""
        bundle = self.bundle
        if bundle is None:
            return True
        now = self._clock()
        m = bundle.manifest
        if m.expires_at is not None and now >= m.expires_at:
            return True
        return self.config.stale_after_s is not None and now - m.created_at > self.config.stale_after_s

    # -------------------------------------------------------------------------------- escalation

    def escalate(self, obs: np.ndarray, budget_s: float) -> EscalationReply | None:
        """Ask the edge to decide `obs`; the reply, or None when none comes within `budget_s` or there is no link."""
        rid = f"{self._prefix}-{next(self._ids)}"
        event = threading.Event()
        slot: list[EscalationReply] = []
        with self._lock:
            self._pending[rid] = (event, slot)
        try:
            request = EscalationRequest(id=rid, obs=tuple(float(v) for v in np.ravel(obs)),
                                        budget_ms=budget_s * 1000.0)
            if not self.link.publish(self._request_topic, request.encode(), qos=0):
                return None  # no link: fall back now, not after the budget
            event.wait(budget_s)
            return slot[0] if slot else None
        finally:
            with self._lock:
                self._pending.pop(rid, None)

    def controller(self) -> TieredController:
        """A `TieredController` over the installed policy that escalates through this runtime."""
        if self.bundle is None or self.executor is None:
            raise DeviceRunError("DeviceRuntime.controller: no micro policy is installed yet; call wait_for_policy")
        c = self.config
        installed = _Installed(self)
        space = self.bundle.manifest.action_space
        discrete = space.get("type") == "Discrete"
        return TieredController(installed, discrete=discrete, escalate=self.escalate, confidence=c.confidence,
                                threshold=c.threshold, budget_ms=c.budget_ms, is_stale=self.is_stale, region=installed,
                                neutral=0 if discrete else neutral_box_action(space))


def neutral_box_action(space: Mapping[str, Any]) -> np.ndarray:
    """The zero action clipped into a Box action space's bounds (the fallback of a broken sensor, before any action)."""
    from device._bundle import space_bounds

    low, high = space_bounds(space)
    shape = tuple(int(d) for d in space.get("shape", ()))
    return np.clip(np.zeros(shape, np.float32), low, high).astype(np.float32)


class _Installed:
    """The runtime's installed executor and region at call time, so a policy update applies from the next decision."""

    def __init__(self, runtime: DeviceRuntime) -> None:
        self._runtime = runtime

    def _executor(self) -> NumpyExecutor:
        executor = self._runtime.executor
        if executor is None:
            raise DeviceRunError("DeviceRuntime: the micro policy was removed while running")
        return executor

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self._executor().run(feeds)

    def act(self, obs: Any) -> np.ndarray:
        return self._executor().act(obs)

    def confidence(self, obs: np.ndarray) -> float:
        region = self._runtime.region
        return 1.0 if region is None else region.confidence(obs)


def run_device(runtime: DeviceRuntime, env: Any, *, steps: int, seed: int = 0,
               on_decision: Callable[[Decision], None] | None = None) -> DeviceReport:
    """Act on `env` (a gymnasium-style env standing in for sensors) for `steps` decisions; return the report."""
    controller = runtime.controller()
    report = DeviceReport()
    obs, _ = env.reset(seed=seed)
    total, episode = 0.0, 0
    for _ in range(steps):
        decision = controller.decide(np.asarray(obs, dtype=np.float32))
        report.record(decision)
        if on_decision is not None:
            on_decision(decision)
        obs, reward, terminated, truncated, _ = env.step(decision.action)
        total += float(reward)
        if terminated or truncated:
            report.episodes.append(total)
            total, episode = 0.0, episode + 1
            obs, _ = env.reset(seed=seed + episode)
    if runtime.bundle is not None:
        report.policy, report.policy_version = runtime.bundle.manifest.policy, runtime.bundle.manifest.version
    report.bundles_refused = list(runtime.refused)
    return report
