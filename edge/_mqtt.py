"""The one module that imports paho-mqtt: a link to an MQTT broker (3.1.1, or 5 for publishers) that survives outages.

`MqttLink` fixes what every strata client needs: callback API version 2; a stable client id with a
persistent session (``clean_session=False``), so QoS 1 messages queued by the broker while the node was away
arrive after it reconnects; subscriptions made again in ``on_connect``; TCP_NODELAY on the client socket the
moment it opens (MEASURED.md: with Nagle on, a QoS 1 round trip takes ~88 ms instead of ~0.2 ms); reconnects
with jittered exponential backoff on its own thread, with an injectable ``sleep`` and ``clock``; bounded paho
queues; MQTT 5 for clients that need to know when the broker refuses a publish (a PUBACK reason code) or that
share a subscription (the learner's experience ingesters: ``$share/{group}/...``, with a persistent session kept
``session_expiry_s``), with a fallback to 3.1.1; manual acknowledgement of received QoS 1 messages (a consumer that
acknowledges only once it has stored a message, so a crash before that brings it again); TLS client certificates
(AWS IoT Core) and username/password (Mosquitto).

Link conditions are states, not exceptions: `publish` returns a `PublishResult` whose state says whether the
message is on its way, held for the reconnect, or refused because the queue is full; `state` says whether the
broker is reachable. Caller mistakes (a bad URL, a wildcard in a publish topic, an oversized payload) raise
`EdgeConfigError` (a ValueError).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import random
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from device import require
from device._mqtt import closed_before_connack, tls_context, tls_failure
from device._names import HOST_FORM, is_host, shown
from edge._errors import EdgeConfigError
from edge._topics import AWS_MAX_PAYLOAD, QOS

log = logging.getLogger("strata.edge.mqtt")

UNSUPPORTED_PROTOCOL_VERSION = 132
"""MQTT 5 CONNACK reason code of a broker that does not speak 5 (amqtt answers it)."""

MessageHandler = Callable[[str, bytes, bool], None]
"""``handler(topic, payload, retained)``; runs on the link's thread, so it must be quick."""
DeliveryHandler = Callable[[str, bytes, int], None]
"""``handler(topic, payload, mid)`` of a link with ``manual_ack``: the message stays unacknowledged (the broker
sends it again after a reconnect) until the owner calls ``MqttLink.ack(mid)``; runs on the link's thread."""


class LinkState(enum.Enum):
    """Where the link stands; read `MqttLink.state`."""

    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    UNREACHABLE = "unreachable"
    """The broker cannot be reached (refused, timed out, DNS); retrying with backoff."""
    REFUSED = "refused"
    """The broker answered CONNACK with an error (bad credentials, not authorised); retrying with backoff until
    `LinkConfig.max_refusals`, then the link gives up (`MqttLink.gave_up`)."""
    DISCONNECTED = "disconnected"
    """An established connection was lost; retrying with backoff."""
    CLOSED = "closed"


class PublishState(enum.Enum):
    """What happened to one `MqttLink.publish` call."""

    SENT = "sent"
    """Handed to the socket; the PUBACK will be reported to ``on_ack``."""
    HELD = "held"
    """Not connected: paho holds it in memory and sends it after the reconnect (then ``on_ack``)."""
    QUEUE_FULL = "queue_full"
    """Refused: paho's bounded queue is full. The caller keeps the message and tries again later."""


@dataclass(frozen=True)
class PublishResult:
    """Outcome of a publish; `mid` identifies the later ``on_ack`` call (0 when nothing was queued)."""

    state: PublishState
    mid: int

    @property
    def accepted(self) -> bool:
        """Whether the message will reach the broker without the caller sending it again."""
        return self.state is not PublishState.QUEUE_FULL


@dataclass(frozen=True, kw_only=True)
class LinkConfig:
    """How to reach the broker, and the limits of the link."""

    broker: str
    """Broker URL: ``mqtt://host:1883`` (plain TCP) or ``mqtts://host:8883`` (TLS); ``user:pass@`` allowed."""
    client_id: str
    """Stable client id; the broker keeps the persistent session under it."""
    clean_session: bool = False
    """False keeps a persistent session across reconnects (QoS 1 messages wait at the broker)."""
    username: str | None = None
    """Username (Mosquitto password file); overrides one in the URL."""
    password: str | None = None
    """Password for `username`."""
    ca_file: str | None = None
    """CA bundle that signs the broker's certificate (AWS IoT: AmazonRootCA1.pem); implies TLS."""
    cert_file: str | None = None
    """Client certificate (AWS IoT thing certificate), PEM."""
    key_file: str | None = None
    """Private key of `cert_file`, PEM."""
    keepalive_s: int = 30
    """MQTT keepalive; the broker publishes the last will after 1.5x this without traffic."""
    reconnect_min_s: float = 0.25
    """First reconnect delay; doubles up to `reconnect_max_s`. AWS IoT allows 1 CONNECT/s per client id."""
    reconnect_max_s: float = 10.0
    """Longest reconnect delay."""
    reconnect_jitter: float = 0.5
    """Each reconnect sleep is drawn uniformly from ``[delay * (1 - jitter), delay]``, so a fleet that lost its
    broker at the same instant does not come back at the same instant (no thundering herd). 0: exact delays."""
    protocol: Literal["3.1.1", "5", "auto"] = "3.1.1"
    """MQTT version. ``"5"`` gives every PUBACK a reason code (a publish the broker refuses is reported to
    ``on_refused``) and shared subscriptions; ``"auto"`` speaks 5 and falls back to 3.1.1 on a broker that refuses
    it (amqtt). Nodes' persistent sessions stay on 3.1.1, the required path."""
    session_expiry_s: int = 3600
    """MQTT 5 with ``clean_session=False``: seconds the broker keeps the session (and queues QoS 1 messages for it)
    after a disconnect (AWS IoT Core's default maximum is one hour)."""
    manual_ack: bool = False
    """Acknowledge received QoS 1 messages only when the owner calls `MqttLink.ack` (``on_delivery`` handler)."""
    max_inflight: int = 100
    """QoS 1 messages awaiting PUBACK at once."""
    max_queued: int = 1000
    """Messages paho holds in memory in all (in flight + waiting); beyond it publish answers QUEUE_FULL."""
    connect_timeout_s: float = 5.0
    """TCP connect timeout."""
    max_refusals: int | None = 5
    """Consecutive CONNACK refusals (bad credentials, not authorised) after which the link gives up and
    `gave_up` turns true (None: retry forever). An unreachable broker never counts: that is an outage."""


@dataclass(frozen=True)
class BrokerAddress:
    """Parsed broker URL."""

    host: str
    port: int
    tls: bool
    username: str | None
    password: str | None


def parse_broker_url(url: str) -> BrokerAddress:
    """Parse ``mqtt://[user:pass@]host[:port]`` or ``mqtts://...``; raise `EdgeConfigError` naming the fix."""
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:
        parsed = urllib.parse.urlsplit("")
    if parsed.scheme not in ("mqtt", "mqtts", "tcp", "ssl") or not parsed.hostname:
        raise EdgeConfigError(f"broker URL {shown(url)} is not of the form mqtt://host:port or mqtts://host:port")
    if not is_host(parsed.hostname) or parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise EdgeConfigError(f"broker URL {shown(url)}: the host must be {HOST_FORM}, with nothing after the port")
    tls = parsed.scheme in ("mqtts", "ssl")
    try:
        port = parsed.port or (8883 if tls else 1883)
    except ValueError:
        raise EdgeConfigError(f"broker URL {shown(url)} has an invalid port") from None
    user = urllib.parse.unquote(parsed.username) if parsed.username else None
    password = urllib.parse.unquote(parsed.password) if parsed.password else None
    return BrokerAddress(parsed.hostname, port, tls, user, password)


def check_broker_url(url: str, *, what: str, credentials: bool = True) -> str:
    """Return `url` if `parse_broker_url` takes it (and, without `credentials`, it holds no ``user:pass@``).

    Config writers (kits) call this before writing a URL into a file.

    Raises:
        EdgeConfigError: naming `what`, the value and the form.
    """
    try:
        address = parse_broker_url(url)
    except EdgeConfigError as exc:
        raise EdgeConfigError(f"{what}: {exc}") from None
    if not credentials and (address.username or address.password):
        raise EdgeConfigError(f"{what}: {shown(url.split('@')[-1])} must not hold credentials (user:pass@): a "
                              "kit keeps its password in its own 0600 file")
    return url


def check_publish_topic(topic: str) -> None:
    """Raise `EdgeConfigError` for a topic that cannot be published to."""
    if not topic or "+" in topic or "#" in topic or len(topic.encode()) > 256:
        raise EdgeConfigError(f"cannot publish to topic {topic!r}: it must be non-empty, at most 256 bytes "
                              "(AWS IoT) and contain no wildcard '+' or '#'")


def _no_op_socket_hook(client: Any, userdata: Any, sock: Any) -> None:
    return None


class MqttLink:
    """One MQTT client on its own network thread; see the module docstring.

    Args:
        config: Broker address and link limits.
        on_message: Called as ``on_message(topic, payload, retained)`` on the link thread.
        on_ack: Called with the mid of each PUBACKed publish, on the link thread.
        on_refused: Called as ``on_refused(mid, reason)`` for a publish the broker refused (MQTT 5 PUBACK with a
            failure reason code), on the link thread.
        on_connect: Called after each successful CONNACK, on the link thread (after subscriptions are renewed).
        will: ``(topic, payload)`` published retained by the broker if this client vanishes.
        sleep: Waits between reconnect attempts (default: an interruptible wait that `close` cuts short).
        clock: Monotonic clock for the backoff bookkeeping.
    """

    def __init__(self, config: LinkConfig, *, on_message: MessageHandler | None = None,
                 on_ack: Callable[[int], None] | None = None, on_connect: Callable[[], None] | None = None,
                 will: tuple[str, bytes] | None = None, sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_refused: Callable[[int, str], None] | None = None,
                 on_delivery: DeliveryHandler | None = None) -> None:
        mqtt = require("paho.mqtt.client", extra="edge", purpose="the MQTT link")
        self.config = config
        self.address = parse_broker_url(config.broker)
        if config.protocol not in ("3.1.1", "5", "auto"):
            raise EdgeConfigError(f"LinkConfig.protocol {config.protocol!r} is not one of '3.1.1', '5', 'auto'")
        if config.session_expiry_s < 0:
            raise EdgeConfigError(f"LinkConfig.session_expiry_s {config.session_expiry_s} must be >= 0")
        if not 0.0 <= config.reconnect_jitter <= 1.0:
            raise EdgeConfigError(f"LinkConfig.reconnect_jitter {config.reconnect_jitter} must be within 0..1")
        if config.manual_ack and on_delivery is None:
            raise EdgeConfigError("LinkConfig.manual_ack needs an on_delivery handler that acknowledges messages")
        self._on_message = on_message
        self._on_delivery = on_delivery
        self._on_ack = on_ack
        self._on_refused = on_refused
        self._rng = random.Random()
        self.protocol = "3.1.1" if config.protocol == "3.1.1" else "5"
        """The MQTT version this link speaks now (``"auto"`` falls back from 5 to 3.1.1)."""
        self._on_connect_hook = on_connect
        self._stop = threading.Event()
        self._closing = False
        self._sleep = sleep or self._stop.wait
        self._clock = clock
        self._subscriptions: set[str] = set()
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._state = LinkState.NEW
        self.last_error: str | None = None
        self.connects = 0
        self.refusals = 0
        """Consecutive CONNACK refusals since the last successful connect."""
        self._answered = False  # whether the broker answered CONNECT on the current socket
        self._gave_up = threading.Event()
        self.connected_at: float | None = None
        """Clock reading of the latest CONNACK."""
        self.backoffs: list[float] = []
        """The last reconnect delays slept (at most 32), for status and tests."""
        self._thread: threading.Thread | None = None
        self._mqtt = mqtt
        if will is not None:
            check_publish_topic(will[0])
        self._will = will
        self._fall_back = False
        self._connect_sent = 0.0  # clock() of the latest CONNECT
        self._tls = self.address.tls or bool(config.ca_file or config.cert_file)
        self._client = self._build_client()

    def _build_client(self) -> Any:
        mqtt, config = self._mqtt, self.config
        if self.protocol == "5":
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=config.client_id,
                                 protocol=mqtt.MQTTv5)
        else:
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=config.client_id,
                                 clean_session=config.clean_session, protocol=mqtt.MQTTv311)
        if config.manual_ack:
            client.manual_ack_set(True)
        client.max_inflight_messages_set(config.max_inflight)
        client.max_queued_messages_set(config.max_queued)
        username = config.username or self.address.username
        password = config.password if config.password is not None else self.address.password
        if username:
            client.username_pw_set(username, password)
        if self._tls:
            try:
                context = tls_context(ca_file=config.ca_file, cert_file=config.cert_file, key_file=config.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise EdgeConfigError(f"cannot load the TLS files (ca {config.ca_file!r}, cert {config.cert_file!r}, "
                                      f"key {config.key_file!r}): {exc}; pass readable PEM files") from None
            client.tls_set_context(context)
        if self._will is not None:
            client.will_set(self._will[0], self._will[1], qos=QOS, retain=True)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_message = self._handle_message
        client.on_publish = self._handle_publish
        client.on_socket_open = self._handle_socket_open
        # With a write hook registered, paho never writes to the socket from the publishing thread: it queues
        # the packet and wakes this link's thread, the only writer (two writers could interleave packets).
        client.on_socket_register_write = _no_op_socket_hook
        client.connect_timeout = config.connect_timeout_s
        return client

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def state(self) -> LinkState:
        """The link's current state."""
        return self._state

    @property
    def gave_up(self) -> bool:
        """Whether the broker refused the connection `LinkConfig.max_refusals` times in a row and the link stopped."""
        return self._gave_up.is_set()

    @property
    def connected(self) -> bool:
        """Whether a CONNACK was received and the connection has not been lost since."""
        return self._connected.is_set()

    def start(self) -> MqttLink:
        """Start the network thread; it connects, and keeps reconnecting, in the background."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"mqtt-{self.config.client_id}", daemon=True)
            self._thread.start()
        return self

    def wait_connected(self, timeout: float) -> bool:
        """Block up to `timeout` seconds for a connection; return whether there is one."""
        return self._connected.wait(timeout)

    def close(self, *, disconnect: bool = True) -> None:
        """Stop the network thread. With `disconnect`, say goodbye first, so the broker skips the last will."""
        if self._state is LinkState.CLOSED:
            return
        self._closing = True
        if disconnect and self.connected:
            self._client.disconnect()
            # Let the link thread write the DISCONNECT (paho then closes the socket); stopping first would drop
            # the connection without it, and the broker would publish the last will.
            deadline = time.monotonic() + 2.0
            while self._client.socket() is not None and time.monotonic() < deadline and self._thread is not None \
                    and self._thread.is_alive():
                time.sleep(0.005)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._client.socket() is not None:
            # The thread is gone; close the socket ourselves. Without a DISCONNECT the broker sends the will.
            self._client._sock_close()
        self._connected.clear()
        self._state = LinkState.CLOSED

    def __enter__(self) -> MqttLink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        delay = self.config.reconnect_min_s
        first = True
        while not self._stop.is_set():
            budget = self.config.max_refusals
            if budget is not None and self.refusals >= budget:
                # Retrying wrong credentials cannot succeed; the owner reads `gave_up` and stops with an error.
                log.error("%s: giving up after %d refusals: %s", self.config.client_id, self.refusals,
                          self.last_error)
                self._gave_up.set()
                return
            if self._client.socket() is None:
                if self._closing:
                    return
                if self._state is LinkState.NEW:  # later attempts keep reporting why the last one failed
                    self._state = LinkState.CONNECTING
                self._connect_sent = self._clock()
                try:
                    if first and self.protocol == "5":
                        self._client.connect(self.address.host, self.address.port, self.config.keepalive_s,
                                             clean_start=self.config.clean_session,
                                             properties=self._connect_properties())
                    elif first:
                        self._client.connect(self.address.host, self.address.port, self.config.keepalive_s)
                    else:
                        self._client.reconnect()
                    first = False
                except (OSError, ssl.SSLError) as exc:
                    tls = tls_failure(exc, host=self.address.host, port=self.address.port, tls=self._tls,
                                      ca_file=self.config.ca_file)
                    if tls is not None:
                        # A certificate that does not verify, or a handshake the server breaks off, is a
                        # configuration error: retrying cannot fix it, so it counts against `max_refusals`.
                        self.refusals += 1
                        self._state = LinkState.REFUSED
                        self.last_error = tls
                        log.warning("%s: %s", self.config.client_id, tls)
                    else:
                        # Retryable: the broker is down, restarting, or the network is out. The node keeps
                        # working offline and tries again after the backoff.
                        self._state = LinkState.UNREACHABLE
                        self.last_error = f"{type(exc).__name__}: {exc}"
                    self._backoff(delay)
                    delay = min(delay * 2, self.config.reconnect_max_s)
                    continue
            rc = self._client.loop(timeout=0.05)
            if self._fall_back:
                # The broker does not speak MQTT 5 (amqtt): the same link goes on in 3.1.1 at once.
                log.info("%s: %s refuses MQTT 5; speaking 3.1.1", self.config.client_id, self.config.broker)
                if self._client.socket() is not None:
                    self._client._sock_close()
                self._fall_back, self.protocol, first = False, "3.1.1", True
                self._client = self._build_client()
                continue
            unanswered_s = self._clock() - self._connect_sent
            if (not self._answered and self.protocol == "5" and self.config.protocol == "auto" and self.connects == 0
                    and not self.config.cert_file and unanswered_s > self.config.connect_timeout_s):
                # A 3.1.1-only broker that cannot parse an MQTT 5 CONNECT with properties (amqtt, given a persistent
                # session's expiry) never answers it: speak 3.1.1 to it, as to one that answers reason 132.
                self._fall_back = True
                continue
            if rc != self._mqtt.MQTT_ERR_SUCCESS and not self._stop.is_set():
                if not self._answered:
                    # The broker took the connection and closed it before any CONNACK: under TLS 1.3 a broker that
                    # rejects the client certificate does so after the handshake, and a TLS listener does so to a
                    # plain CONNECT. That is a refusal, not an outage.
                    self.refusals += 1
                    self._state = LinkState.REFUSED
                    self.last_error = closed_before_connack(host=self.address.host, port=self.address.port,
                                                            tls=self._tls, cert_file=self.config.cert_file)
                    log.warning("%s: %s", self.config.client_id, self.last_error)
                if self._client.socket() is not None:
                    self._client._sock_close()
                if self._state is not LinkState.REFUSED:
                    self._state = LinkState.DISCONNECTED
                self._connected.clear()
                self._backoff(delay)
                delay = min(delay * 2, self.config.reconnect_max_s)
            elif self._connected.is_set():
                delay = self.config.reconnect_min_s

    def _connect_properties(self) -> Any:
        """MQTT 5 CONNECT properties: the session expiry of a persistent session (None for a clean one)."""
        if self.config.clean_session:
            return None
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = self.config.session_expiry_s
        return properties

    def _backoff(self, delay: float) -> None:
        delay *= 1.0 - self.config.reconnect_jitter * self._rng.random()
        self.backoffs = [*self.backoffs[-31:], delay]
        self._sleep(delay)

    # ------------------------------------------------------------------------------------------ paho callbacks

    def _handle_socket_open(self, client: Any, userdata: Any, sock: Any) -> None:
        self._answered = False
        # A non-TCP socket (unix, websocket proxy) has no Nagle to turn off.
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _handle_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        self._answered = True
        if reason_code.is_failure and self.protocol == "5" and self.config.protocol == "auto" and (
                reason_code.value == UNSUPPORTED_PROTOCOL_VERSION):
            self._fall_back = True
            return
        if reason_code.is_failure:
            self.refusals += 1
            self._state = LinkState.REFUSED
            self.last_error = f"broker refused the connection: {reason_code}"
            log.warning("%s: %s", self.config.client_id, self.last_error)
            return
        with self._lock:
            topics = sorted(self._subscriptions)
        if topics:
            client.subscribe([(t, QOS) for t in topics])
        self.connects += 1
        self.refusals = 0
        self.connected_at = self._clock()
        self.last_error = None
        self._state = LinkState.CONNECTED
        self._connected.set()
        if self._on_connect_hook is not None:
            self._on_connect_hook()

    def _handle_disconnect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        self._connected.clear()
        if self._state is LinkState.CONNECTED:
            self._state = LinkState.DISCONNECTED

    def _handle_message(self, client: Any, userdata: Any, message: Any) -> None:
        if self._on_delivery is not None:
            try:
                self._on_delivery(message.topic, bytes(message.payload), int(message.mid))
            except Exception:  # a handler bug must not kill the network thread; the message stays unacknowledged
                log.exception("%s: delivery handler failed on %s", self.config.client_id, message.topic)
            return
        if self._on_message is not None:
            try:
                self._on_message(message.topic, bytes(message.payload), bool(message.retain))
            except Exception:  # a handler bug must not kill the network thread
                log.exception("%s: message handler failed on %s", self.config.client_id, message.topic)

    def _handle_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        # MQTT 5 only: a PUBACK with a failure reason code (135 Not authorized: the ACL denied it). MQTT 3.1.1
        # has no such code; there the broker drops a refused publish and acknowledges it all the same.
        if reason_code.is_failure:
            if self._on_refused is not None:
                self._on_refused(mid, f"{reason_code} (reason code {reason_code.value})")
            return
        if self._on_ack is not None:
            self._on_ack(mid)

    # ------------------------------------------------------------------------------------------ operations

    def ack(self, mid: int) -> None:
        """Acknowledge the received QoS 1 message `mid` (links with ``manual_ack``).

        While disconnected nothing is sent; the broker then delivers the message again after the reconnect, under
        the same packet id (MQTT keeps an unacknowledged packet id in use), and the owner acknowledges it again.
        A message delivered at QoS 0 (mid 0: a broker that downgraded the subscription) has nothing to acknowledge.
        """
        if mid:
            self._client.ack(mid, QOS)

    def set_will(self, topic: str, payload: bytes) -> None:
        """Replace the last will (retained, QoS 1); it takes effect from the next connect."""
        check_publish_topic(topic)
        self._will = (topic, payload)
        self._client.will_set(topic, payload, qos=QOS, retain=True)

    def subscribe(self, topic: str) -> None:
        """Subscribe at QoS 1 now if connected, and again after every reconnect."""
        if not topic:
            raise EdgeConfigError("subscribe: the topic is empty")
        with self._lock:
            if topic in self._subscriptions:
                return
            self._subscriptions.add(topic)
        if self.connected:
            self._client.subscribe(topic, QOS)

    def resubscribe(self, topic: str) -> None:
        """Subscribe again (the broker re-sends the retained message of an exact topic)."""
        with self._lock:
            self._subscriptions.add(topic)
        if self.connected:
            self._client.subscribe(topic, QOS)

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving `topic`."""
        with self._lock:
            self._subscriptions.discard(topic)
        if self.connected:
            self._client.unsubscribe(topic)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> PublishResult:
        """Publish at QoS 1; the result's state says whether it is on its way (see `PublishState`)."""
        check_publish_topic(topic)
        if len(payload) > AWS_MAX_PAYLOAD:
            raise EdgeConfigError(f"publish to {topic!r}: {len(payload)} bytes exceeds the {AWS_MAX_PAYLOAD}-byte "
                                  "limit of AWS IoT Core; chunk it (edge._topics.split_bundle)")
        info = self._client.publish(topic, payload, qos=QOS, retain=retain)
        if info.rc == self._mqtt.MQTT_ERR_QUEUE_SIZE:
            return PublishResult(PublishState.QUEUE_FULL, 0)
        if info.rc == self._mqtt.MQTT_ERR_NO_CONN:
            return PublishResult(PublishState.HELD, int(info.mid))
        return PublishResult(PublishState.SENT, int(info.mid))

    def clear_retained(self, topic: str) -> PublishResult:
        """Delete the retained message of `topic` (an empty retained publish)."""
        check_publish_topic(topic)
        info = self._client.publish(topic, b"", qos=QOS, retain=True)
        state = PublishState.SENT if info.rc == self._mqtt.MQTT_ERR_SUCCESS else PublishState.HELD
        return PublishResult(state, int(info.mid))
