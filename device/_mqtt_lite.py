"""A minimal MQTT 3.1.1 client in pure standard library, for devices that cannot carry paho.

What it speaks: CONNECT (clean or persistent session, keepalive, optional credentials and last will),
CONNACK, SUBSCRIBE/SUBACK (QoS 0 or 1), PUBLISH at QoS 0 and 1 (with the retained flag) and the PUBACK of
each, PINGREQ/PINGRESP and DISCONNECT. QoS 2, MQTT 5 and TLS are out of scope (the edge-device link is
local). One reader thread decodes packets and calls ``on_message(topic, payload, retained)``; writers share
one lock so packets never interleave; Nagle is off (TCP_NODELAY), which request/response latency needs
(MEASURED.md). A malformed packet from the broker closes the connection and is kept as `last_error`
(an `MqttProtocolError` naming what was wrong); blocking calls waiting on it raise `MqttConnectionError`.

Packet layout (spec section 2): a fixed header byte (type << 4 | flags), the remaining length as a
1-4 byte base-128 varint, then the variable header and payload; strings are a 2-byte big-endian length
and UTF-8 bytes.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from device._errors import StrataError

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14
MAX_REMAINING_LENGTH = 268_435_455
"""The largest remaining length four varint bytes encode (spec 2.2.3)."""

_CONNACK_REASONS = {1: "unacceptable protocol version", 2: "client identifier rejected", 3: "server unavailable",
                    4: "bad user name or password", 5: "not authorized"}

MessageCallback = Callable[[str, bytes, bool], None]


class MqttLiteError(StrataError):
    """Base of the MQTT-lite client's errors."""


class MqttProtocolError(MqttLiteError):
    """The broker sent bytes that are not a valid MQTT 3.1.1 packet (or a packet a client must not receive)."""


class MqttConnectionError(MqttLiteError):
    """The connection could not be made, was refused, or was lost while a call waited on it."""


def encode_remaining_length(n: int) -> bytes:
    """The remaining-length varint of `n` bytes (spec 2.2.3)."""
    if not 0 <= n <= MAX_REMAINING_LENGTH:
        raise MqttProtocolError(f"mqtt-lite: remaining length {n} is outside 0..{MAX_REMAINING_LENGTH}")
    out = bytearray()
    while True:
        digit, n = n % 128, n // 128
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def decode_remaining_length(read_byte: Callable[[], int]) -> int:
    """Read a remaining-length varint with `read_byte`; refuse one longer than four bytes."""
    value, multiplier = 0, 1
    for _ in range(4):
        b = read_byte()
        value += (b & 0x7F) * multiplier
        if not b & 0x80:
            return value
        multiplier *= 128
    raise MqttProtocolError("mqtt-lite: malformed remaining length: more than 4 bytes (spec 2.2.3)")


def _string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    if len(raw) > 0xFFFF:
        raise MqttLiteError(f"mqtt-lite: string field of {len(raw)} bytes exceeds 65535")
    return struct.pack("!H", len(raw)) + raw


def _packet(kind: int, flags: int, body: bytes) -> bytes:
    return bytes([kind << 4 | flags]) + encode_remaining_length(len(body)) + body


def check_topic(topic: str, *, publish: bool) -> None:
    """Raise `MqttLiteError` for a topic a client cannot publish to (or subscribe with)."""
    if not topic or len(topic.encode()) > 0xFFFF or "\x00" in topic or (publish and ("+" in topic or "#" in topic)):
        what = "publish to" if publish else "subscribe to"
        raise MqttLiteError(f"mqtt-lite: cannot {what} topic {topic!r}: it must be non-empty UTF-8 without NUL"
                            + (" and without the wildcards '+' and '#'" if publish else ""))


@dataclass(frozen=True)
class Publish:
    """One decoded PUBLISH packet."""

    topic: str
    payload: bytes
    qos: int
    retained: bool
    packet_id: int | None


def parse_publish(flags: int, body: bytes) -> Publish:
    """Decode the variable header and payload of a PUBLISH (spec 3.3); raise `MqttProtocolError`."""
    qos = (flags >> 1) & 3
    if qos == 3:
        raise MqttProtocolError("mqtt-lite: malformed PUBLISH: QoS 3 is reserved (spec 3.3.1.2)")
    if len(body) < 2:
        raise MqttProtocolError("mqtt-lite: malformed PUBLISH: no room for the topic length")
    (n,) = struct.unpack_from("!H", body)
    if 2 + n + (2 if qos else 0) > len(body):
        raise MqttProtocolError(f"mqtt-lite: malformed PUBLISH: topic length {n} runs past the packet "
                                f"({len(body)} bytes)")
    try:
        topic = body[2:2 + n].decode("utf-8")
    except UnicodeDecodeError:
        raise MqttProtocolError("mqtt-lite: malformed PUBLISH: topic is not UTF-8") from None
    pos = 2 + n
    packet_id = None
    if qos:
        (packet_id,) = struct.unpack_from("!H", body, pos)
        pos += 2
    return Publish(topic=topic, payload=bytes(body[pos:]), qos=qos, retained=bool(flags & 1), packet_id=packet_id)


class MqttLiteClient:
    """One MQTT 3.1.1 connection: `connect`, `subscribe`, `publish`, `close` (see the module docstring).

    Args:
        host: Broker host (loopback or the edge node's address).
        port: Broker port.
        client_id: Client identifier (1-23 characters is what every broker must accept).
        keepalive_s: Keepalive in seconds; a PINGREQ goes out when nothing was sent for half of it, and the
            connection is declared lost when nothing arrives for 1.5 times it.
        clean_session: False asks the broker for a persistent session.
        on_message: Called as ``on_message(topic, payload, retained)`` on the reader thread.
        username: Optional user name; `password` only with it.
        password: Optional password.
        will: Optional ``(topic, payload, retain)`` the broker publishes at QoS 1 if this client vanishes.
        timeout_s: Connect and acknowledgement timeout.
        max_packet_bytes: Largest packet accepted from the broker; a larger one is a protocol error (a device
            has little memory, and a micro policy's bundle is a few KB).
    """

    def __init__(self, *, host: str, port: int, client_id: str, keepalive_s: int = 30, clean_session: bool = True,
                 on_message: MessageCallback | None = None, username: str | None = None, password: str | None = None,
                 will: tuple[str, bytes, bool] | None = None, timeout_s: float = 5.0,
                 max_packet_bytes: int = 1 << 20) -> None:
        if not 0 <= keepalive_s <= 0xFFFF:
            raise MqttLiteError(f"MqttLiteClient: keepalive_s must be in 0..65535, got {keepalive_s}")
        self.host, self.port, self.client_id = host, port, client_id
        self.max_packet_bytes = max_packet_bytes
        self.keepalive_s, self.clean_session, self.timeout_s = keepalive_s, clean_session, timeout_s
        self.on_message = on_message
        self._username, self._password, self._will = username, password, will
        self._sock: socket.socket | None = None
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._waiters: dict[tuple[int, int], threading.Event] = {}
        self._results: dict[tuple[int, int], bytes] = {}
        self._next_id = 0
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._last_sent = self._last_received = time.monotonic()
        self._threads: list[threading.Thread] = []
        self.last_error: str | None = None
        """Why the connection ended (None while connected or after a clean `close`)."""
        self.received = 0
        """PUBLISH packets received."""
        self.callback_errors = 0
        """Exceptions raised by `on_message` (each is caught; the newest is `last_callback_error`)."""
        self.last_callback_error: str | None = None

    @property
    def connected(self) -> bool:
        """Whether CONNACK accepted the connection and it has not been lost or closed since."""
        return self._connected.is_set()

    # ------------------------------------------------------------------------------------ lifecycle

    def connect(self) -> MqttLiteClient:
        """Open the TCP connection, send CONNECT, wait for CONNACK and start the reader and keepalive threads.

        Raises:
            MqttConnectionError: The broker cannot be reached, does not answer in time, or refuses.
        """
        if self.connected:
            return self
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as exc:
            raise MqttConnectionError(f"mqtt-lite: cannot connect to {self.host}:{self.port}: "
                                      f"{exc.strerror or exc}; is the broker running?") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        flags = 0x02 if self.clean_session else 0
        payload = _string(self.client_id)
        if self._will is not None:
            will_topic, will_payload, will_retain = self._will
            check_topic(will_topic, publish=True)
            flags |= 0x04 | (1 << 3) | (0x20 if will_retain else 0)  # will flag, will QoS 1, will retain
            payload += _string(will_topic) + _string(will_payload)
        if self._username is not None:
            flags |= 0x80
            payload += _string(self._username)
            if self._password is not None:
                flags |= 0x40
                payload += _string(self._password)
        body = _string("MQTT") + bytes([4, flags]) + struct.pack("!H", self.keepalive_s) + payload
        try:
            sock.sendall(_packet(CONNECT, 0, body))
            header = self._recv_exact(sock, 2)
            if header[0] != CONNACK << 4 or header[1] != 2:
                raise MqttProtocolError(f"mqtt-lite: expected CONNACK (0x20 0x02), got {header.hex()}")
            ack = self._recv_exact(sock, 2)
        except (OSError, MqttLiteError) as exc:
            sock.close()
            raise MqttConnectionError(f"mqtt-lite: CONNECT to {self.host}:{self.port} failed: {exc}") from None
        if ack[1] != 0:
            sock.close()
            reason = _CONNACK_REASONS.get(ack[1], f"return code {ack[1]}")
            raise MqttConnectionError(f"mqtt-lite: broker {self.host}:{self.port} refused the connection: {reason}")
        sock.settimeout(None)
        self._sock = sock
        # A fresh stop event per connection: threads of an earlier, lost connection keep theirs (set), so they
        # end even while this one runs.
        self._stop = threading.Event()
        self.last_error = None
        self._last_sent = self._last_received = time.monotonic()
        self._connected.set()
        self._threads = [threading.Thread(target=self._reader, args=(sock, self._stop),
                                          name=f"mqtt-lite-{self.client_id}", daemon=True)]
        if self.keepalive_s:
            self._threads.append(threading.Thread(target=self._pinger, args=(self._stop,),
                                                  name=f"mqtt-lite-ping-{self.client_id}", daemon=True))
        for t in self._threads:
            t.start()
        return self

    def close(self) -> None:
        """Send DISCONNECT (the broker then skips the last will), close the socket and join the threads."""
        sock = self._sock
        if sock is not None and self.connected:
            # A connection that broke meanwhile is fine here: closing is what the caller wants anyway.
            with contextlib.suppress(OSError, MqttConnectionError):
                self._send(_packet(DISCONNECT, 0, b""))
        self._lost(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)
        self._threads = []

    def __enter__(self) -> MqttLiteClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ operations

    def subscribe(self, topic: str, *, qos: int = 1) -> int:
        """Subscribe to `topic` (wildcards allowed) and wait for SUBACK; return the granted QoS.

        Raises:
            MqttConnectionError: Not connected, no SUBACK in time, or the broker refused the subscription.
        """
        check_topic(topic, publish=False)
        if qos not in (0, 1):
            raise MqttLiteError(f"MqttLiteClient.subscribe: qos must be 0 or 1, got {qos}")
        pid = self._packet_id()
        body = struct.pack("!H", pid) + _string(topic) + bytes([qos])
        result = self._request(SUBACK, pid, _packet(SUBSCRIBE, 0x02, body), f"SUBSCRIBE {topic!r}")
        granted = result[0] if result else 0x80
        if granted == 0x80:
            raise MqttConnectionError(f"mqtt-lite: broker refused the subscription to {topic!r}")
        return granted

    def publish(self, topic: str, payload: bytes, *, qos: int = 0, retain: bool = False) -> None:
        """Publish `payload`; at QoS 1 wait for the broker's PUBACK.

        Raises:
            MqttConnectionError: Not connected, or (QoS 1) no PUBACK within the timeout.
        """
        check_topic(topic, publish=True)
        if qos not in (0, 1):
            raise MqttLiteError(f"MqttLiteClient.publish: qos must be 0 or 1, got {qos}")
        flags = (qos << 1) | (1 if retain else 0)
        if qos == 0:
            self._send(_packet(PUBLISH, flags, _string(topic) + bytes(payload)))
            return
        pid = self._packet_id()
        packet = _packet(PUBLISH, flags, _string(topic) + struct.pack("!H", pid) + bytes(payload))
        self._request(PUBACK, pid, packet, f"PUBLISH {topic!r}")

    def ping(self) -> None:
        """Send one PINGREQ now (the keepalive thread does this on its own)."""
        self._send(_packet(PINGREQ, 0, b""))

    # ------------------------------------------------------------------------------------ internals

    def _packet_id(self) -> int:
        with self._state_lock:
            self._next_id = self._next_id % 0xFFFF + 1
            return self._next_id

    def _send(self, data: bytes) -> None:
        sock = self._sock
        if sock is None or not self.connected:
            raise MqttConnectionError(f"mqtt-lite: not connected to {self.host}:{self.port}"
                                      + (f" ({self.last_error})" if self.last_error else ""))
        try:
            with self._write_lock:
                sock.sendall(data)
        except OSError as exc:
            self._lost(f"send failed: {exc.strerror or exc}")
            raise MqttConnectionError(f"mqtt-lite: connection to {self.host}:{self.port} lost: {exc}") from None
        self._last_sent = time.monotonic()

    def _request(self, ack_kind: int, pid: int, packet: bytes, what: str) -> bytes:
        key = (ack_kind, pid)
        event = threading.Event()
        with self._state_lock:
            self._waiters[key] = event
        try:
            self._send(packet)
            if not event.wait(self.timeout_s):
                raise MqttConnectionError(f"mqtt-lite: no acknowledgement of {what} within {self.timeout_s} s")
            with self._state_lock:
                if key not in self._results:
                    raise MqttConnectionError(f"mqtt-lite: connection lost before {what} was acknowledged"
                                              + (f" ({self.last_error})" if self.last_error else ""))
                return self._results.pop(key)
        finally:
            with self._state_lock:
                self._waiters.pop(key, None)
                self._results.pop(key, None)

    def _resolve(self, key: tuple[int, int], body: bytes) -> None:
        with self._state_lock:
            event = self._waiters.get(key)
            if event is not None:
                self._results[key] = body
                event.set()

    def _lost(self, reason: str | None) -> None:
        """Mark the connection gone (once), close the socket and wake every waiter."""
        with self._state_lock:
            was = self._connected.is_set()
            self._connected.clear()
            self._stop.set()
            if was and reason is not None:
                self.last_error = reason
            waiters = list(self._waiters.values())
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for event in waiters:
            event.set()

    @staticmethod
    def _recv_exact(sock: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise MqttConnectionError("mqtt-lite: the broker closed the connection")
            buf += chunk
        return bytes(buf)

    def _reader(self, sock: socket.socket, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                first = self._recv_exact(sock, 1)[0]
                length = decode_remaining_length(lambda: self._recv_exact(sock, 1)[0])
                if length > self.max_packet_bytes:
                    raise MqttProtocolError(f"mqtt-lite: packet type {first >> 4} of {length} bytes exceeds "
                                            f"max_packet_bytes={self.max_packet_bytes}")
                body = self._recv_exact(sock, length) if length else b""
                self._last_received = time.monotonic()
                self._dispatch(first >> 4, first & 0x0F, body)
        except MqttProtocolError as exc:
            self._lost(str(exc))
        except (MqttLiteError, OSError) as exc:
            if not stop.is_set():
                self._lost(f"connection lost: {exc}")

    def _dispatch(self, kind: int, flags: int, body: bytes) -> None:
        if kind == PUBLISH:
            msg = parse_publish(flags, body)
            if msg.qos == 2:
                raise MqttProtocolError("mqtt-lite: received a QoS 2 PUBLISH, but subscriptions ask for QoS <= 1")
            self.received += 1
            if self.on_message is not None:
                try:
                    self.on_message(msg.topic, msg.payload, msg.retained)
                except Exception as exc:  # a handler's bug must not kill the connection; it is kept for the caller
                    self.callback_errors += 1
                    self.last_callback_error = f"{type(exc).__name__}: {exc}"
            if msg.qos == 1 and msg.packet_id is not None:
                # PUBACK after the callback: the message is handled before the broker forgets it (at least once).
                self._send(_packet(PUBACK, 0, struct.pack("!H", msg.packet_id)))
        elif kind in (PUBACK, SUBACK, UNSUBACK):
            if len(body) < 2 or (kind == PUBACK and len(body) != 2):
                raise MqttProtocolError(f"mqtt-lite: malformed packet type {kind}: {len(body)}-byte body")
            (pid,) = struct.unpack_from("!H", body)
            self._resolve((kind, pid), body[2:])
        elif kind == PINGRESP:
            if body:
                raise MqttProtocolError(f"mqtt-lite: malformed PINGRESP with a {len(body)}-byte body")
        else:
            raise MqttProtocolError(f"mqtt-lite: unexpected packet type {kind} (flags {flags:#x}) from the broker")

    def _pinger(self, stop: threading.Event) -> None:
        half = self.keepalive_s / 2.0
        while not stop.wait(min(half, 1.0)):
            now = time.monotonic()
            if now - self._last_received > 1.5 * self.keepalive_s:
                self._lost(f"nothing received for {1.5 * self.keepalive_s:.0f} s (keepalive)")
                return
            if now - self._last_sent >= half:
                with contextlib.suppress(MqttLiteError):
                    self.ping()
