"""The edge's gateway to its terminal devices: answers escalations with the edge policy and relays micro policies.

Two jobs, on one MQTT link of its own (client id ``{fleet}.{node}.gateway``) beside the edge agent's:

- **Escalations.** Requests from every device of this edge (``edges/{node}/devices/+/request``) go into a
  bounded queue; when it is full the device is told ``busy`` at once, so it falls back without waiting out
  its budget. One worker thread takes requests in order, drops those that waited longer than their budget
  (the device has already acted on its own), runs the edge policy (onnxruntime, `OnnxPolicy`) on the
  observation and replies on that device's reply topic with the request's correlation id.
- **Relay.** A device bundle published to the fleet (``device-policy``, retained), or handed to `relay`, is
  verified as a device-tier bundle (signature, digest, expiry, anti-rollback) and republished retained on
  this edge's ``edges/{node}/device-policy``, where its devices read it. Devices verify it again themselves.
  The gateway reads its own relay back: a relay not seen on that topic within ``relay_confirm_s`` (a broker
  that does not let this user write it drops the message without telling a 3.1.1 client) is logged, counted
  in ``relay_failures`` and kept in ``relay_error``, which the edge agent reports in its status (`strata fleet`).

The edge policy comes from ``policy_source``, called per request, so a gateway hosted by the edge agent
answers with whatever policy the agent's A/B cache runs now. Topic strings are defined by the device tier
(`device._device_topics`), the one place both sides read them from.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device import (
    BundleError,
    DevicePayloadError,
    DeviceTopics,
    EscalationReply,
    EscalationRequest,
    TrustStore,
    Verifier,
    mqtt_client_id,
)
from edge._errors import EdgeConfigError
from edge._mqtt import LinkConfig, MqttLink
from edge._policy import OnnxPolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """Where the gateway listens and how much it queues."""

    broker: str
    """Broker URL the devices of this edge use (``mqtt://host:port``)."""
    fleet: str
    """Fleet name."""
    node: str
    """This edge node's id."""
    queue_size: int = 64
    """Escalations waiting at once; beyond it requests are answered ``busy``."""
    state_path: str | None = None
    """Anti-rollback state of relayed device bundles (JSON); None keeps it in memory."""
    username: str | None = None
    """Broker username."""
    password: str | None = None
    """Broker password."""
    ca_file: str | None = None
    """CA bundle of the broker's TLS certificate."""
    cert_file: str | None = None
    """Client certificate for TLS."""
    key_file: str | None = None
    """Private key of the client certificate."""
    relay_confirm_s: float = 10.0
    """How long a relayed device bundle may take to be read back before the relay counts as failed."""

    def __post_init__(self) -> None:
        DeviceTopics(self.fleet, self.node)
        if self.queue_size < 1:
            raise EdgeConfigError(f"GatewayConfig: queue_size must be >= 1, got {self.queue_size}")


@dataclass
class GatewayCounters:
    """What the gateway did."""

    served: int = 0
    busy: int = 0
    """Requests refused because the queue was full."""
    expired: int = 0
    """Requests dropped because they waited longer than their budget."""
    no_policy: int = 0
    bad_requests: int = 0
    relayed: int = 0
    refused_bundles: int = 0
    relay_failures: int = 0
    """Relays not read back from the broker in time (dropped: not authorized, or the link went down)."""


class EdgeGateway:
    """Serves one edge node's devices (see the module docstring).

    Args:
        config: Broker, fleet, node and queue size.
        policy_source: Returns the edge policy to answer with now, or None when the edge has none.
        trust: Keys that may sign device bundles; None turns the relay off (every bundle is refused).
        clock: Monotonic clock for queue ages.
        link: An existing link to share (the edge agent's); its owner starts and closes it and passes the
            gateway's messages to `handle`. None opens a link of the gateway's own.
    """

    def __init__(self, config: GatewayConfig, *, policy_source: Callable[[], OnnxPolicy | None],
                 trust: TrustStore | None = None, clock: Callable[[], float] = time.monotonic,
                 link: MqttLink | None = None) -> None:
        self.config = config
        self.topics = DeviceTopics(config.fleet, config.node)
        self.policy_source = policy_source
        self.verifier = None if trust is None else Verifier(
            trust=trust, tier="device", state_path=Path(config.state_path) if config.state_path else None)
        self.counters = GatewayCounters()
        self._clock = clock
        self._queue: queue.Queue[tuple[str, bytes, float] | None] = queue.Queue(maxsize=config.queue_size)
        # A shared link is the edge agent's own connection: a broker that binds the client id to the username
        # (`strata broker config`) would let a second connection of the node's user take the first one over.
        self._owns_link = link is None
        if link is None:
            link_config = LinkConfig(broker=config.broker, clean_session=True,
                                     client_id=mqtt_client_id("gateway", fleet=config.fleet, node=config.node),
                                     username=config.username, password=config.password, ca_file=config.ca_file,
                                     cert_file=config.cert_file, key_file=config.key_file)
            link = MqttLink(link_config, on_message=self._on_message)
        self._link = link
        self._worker: threading.Thread | None = None
        self.last_refusal: str | None = None
        self.relay_error: str | None = None
        """Why the latest relay failed; None once a relay is read back."""
        self._relay_pending: dict[bytes, threading.Timer] = {}
        self._relay_lock = threading.Lock()

    def start(self, *, connect_timeout: float = 10.0) -> EdgeGateway:
        """Connect, subscribe to the devices' requests and the fleet's device bundle, start the worker.

        Waits up to `connect_timeout` seconds for the first connection (0: not at all; the link keeps
        reconnecting in the background either way).
        """
        self._link.subscribe(self.topics.all_requests)
        if self.verifier is not None:
            self._link.subscribe(self.topics.fleet_device_policy)
            self._link.subscribe(self.topics.device_policy)  # to read each relay back
        if self._owns_link:  # a shared link is started and closed by its owner
            self._link.start()
            self._link.wait_connected(connect_timeout)
        self._worker = threading.Thread(target=self._serve, name=f"gateway-{self.config.node}", daemon=True)
        self._worker.start()
        return self

    @property
    def connected(self) -> bool:
        """Whether the gateway's link is up."""
        return self._link.connected

    def close(self) -> None:
        """Stop the worker, the relay read-back timers and (unless shared) the link."""
        with self._relay_lock:
            for timer in self._relay_pending.values():
                timer.cancel()
            self._relay_pending.clear()
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=5)
            self._worker = None
        if self._owns_link:
            self._link.close()

    def __enter__(self) -> EdgeGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ relay

    def relay(self, data: bytes) -> bool:
        """Verify a device bundle and publish it retained to this edge's devices; False (and why) if refused."""
        if self.verifier is None:
            self.counters.refused_bundles += 1
            self.last_refusal = "the gateway has no trusted keys to verify device bundles with"
            return False
        try:
            # The current version passes too: after a restart the edge relays it again (devices skip a repeat).
            bundle = self.verifier.verify(data, allow_current=True)
        except BundleError as exc:
            self.counters.refused_bundles += 1
            self.last_refusal = str(exc)
            log.warning("gateway %s: refused device bundle: %s", self.config.node, exc)
            return False
        digest = hashlib.sha256(bytes(data)).digest()
        what = f"{bundle.manifest.policy} v{bundle.manifest.version}"
        timer = threading.Timer(self.config.relay_confirm_s, self._relay_failed, (digest, what))
        timer.daemon = True
        with self._relay_lock:
            old = self._relay_pending.pop(digest, None)
            if old is not None:
                old.cancel()
            self._relay_pending[digest] = timer
        timer.start()
        self._link.publish(self.topics.device_policy, bytes(data), retain=True)
        self.verifier.accept(bundle)
        self.counters.relayed += 1
        return True

    def _relay_failed(self, digest: bytes, what: str) -> None:
        with self._relay_lock:
            if self._relay_pending.pop(digest, None) is None:
                return  # read back meanwhile
        self.counters.relay_failures += 1
        user = self.config.username or "this client"
        self.relay_error = (f"relay of device bundle {what} to {self.topics.device_policy} was not read back within "
                            f"{self.config.relay_confirm_s:g} s: the broker dropped it or the link is down (may "
                            f"{user!r} write and read that topic? `strata broker config --devices` grants it to "
                            f"node {self.config.node})")
        log.warning("gateway %s: %s", self.config.node, self.relay_error)

    def _relay_read_back(self, payload: bytes) -> None:
        with self._relay_lock:
            timer = self._relay_pending.pop(hashlib.sha256(payload).digest(), None)
        if timer is not None:
            timer.cancel()
            self.relay_error = None

    # ------------------------------------------------------------------------------------ escalations

    def handle(self, topic: str, payload: bytes, retained: bool) -> bool:
        """Take a message from a shared link; return whether it was one of the gateway's topics."""
        if topic not in (self.topics.fleet_device_policy, self.topics.device_policy) and \
                self.topics.device_of_request(topic) is None:
            return False
        self._on_message(topic, payload, retained)
        return True

    def _on_message(self, topic: str, payload: bytes, retained: bool) -> None:
        if topic == self.topics.fleet_device_policy:
            self.relay(payload)
            return
        if topic == self.topics.device_policy:
            self._relay_read_back(payload)
            return
        device = self.topics.device_of_request(topic)
        if device is None:
            return
        try:
            self._queue.put_nowait((device, payload, self._clock()))
        except queue.Full:
            try:
                rid = EscalationRequest.decode(topic, payload).id
            except DevicePayloadError:
                self.counters.bad_requests += 1
                return
            self.counters.busy += 1
            self._link.publish(self.topics.reply(device), EscalationReply(id=rid, action=None, error="busy").encode())

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            device, payload, received = item
            try:
                self._answer(device, payload, received)
            except Exception:  # one bad request must not stop the gateway
                log.exception("gateway %s: failed to answer %s", self.config.node, device)

    def _answer(self, device: str, payload: bytes, received: float) -> None:
        topic = self.topics.request(device)
        try:
            request = EscalationRequest.decode(topic, payload)
        except DevicePayloadError as exc:
            self.counters.bad_requests += 1
            log.warning("gateway %s: %s", self.config.node, exc)
            return
        if (self._clock() - received) * 1000.0 > request.budget_ms:
            self.counters.expired += 1
            return
        policy = self.policy_source()
        if policy is None:
            self.counters.no_policy += 1
            reply = EscalationReply(id=request.id, action=None, error="no policy")
        else:
            obs = np.asarray(request.obs, dtype=np.float32)
            shape = tuple(int(d) for d in policy.bundle.manifest.observation_space.get("shape", [obs.size]))
            if int(np.prod(shape)) != obs.size:
                self.counters.bad_requests += 1
                reply = EscalationReply(id=request.id, action=None,
                                        error=f"bad request: observation of {obs.size} values, the edge policy "
                                        f"takes {list(shape)}")
            else:
                action = np.asarray(policy.run(obs.reshape(1, *shape))[0], dtype=np.float64).reshape(-1)
                if np.all(np.isfinite(action)):
                    reply = EscalationReply(id=request.id, action=tuple(float(a) for a in action),
                                            policy_version=policy.version)
                    self.counters.served += 1
                else:  # nothing non-standard on the wire; the device falls back at once instead of timing out
                    reply = EscalationReply(id=request.id, action=None, error="the edge policy's action is not finite")
        self._link.publish(self.topics.reply(device), reply.encode())
