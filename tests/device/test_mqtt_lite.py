"""The stdlib MQTT 3.1.1 client against a real Mosquitto, and against a socket that sends garbage."""

from __future__ import annotations

import re
import socket
import threading
import time
import uuid

import pytest

from device._mqtt_lite import (
    MqttConnectionError,
    MqttLiteClient,
    MqttLiteError,
    MqttProtocolError,
    decode_remaining_length,
    encode_remaining_length,
    parse_publish,
)
from tests._services import Mosquitto


def _client(broker: Mosquitto, **kw: object) -> MqttLiteClient:
    return MqttLiteClient(host=broker.host, port=broker.port, client_id=f"t-{uuid.uuid4().hex[:12]}",
                          **kw)  # type: ignore[arg-type]


class Inbox:
    def __init__(self) -> None:
        self.items: list[tuple[str, bytes, bool]] = []
        self.cond = threading.Condition()

    def __call__(self, topic: str, payload: bytes, retained: bool) -> None:
        with self.cond:
            self.items.append((topic, payload, retained))
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 5.0) -> list[tuple[str, bytes, bool]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.items) >= n, timeout), self.items
            return list(self.items)


@pytest.mark.parametrize("n", [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455])
def test_remaining_length_round_trips(n: int) -> None:
    data = iter(encode_remaining_length(n))
    assert decode_remaining_length(lambda: next(data)) == n


def test_remaining_length_of_five_bytes_is_refused() -> None:
    data = iter(b"\xff\xff\xff\xff\x01")
    with pytest.raises(MqttProtocolError, match=re.escape("more than 4 bytes")):
        decode_remaining_length(lambda: next(data))


def test_parse_publish_refuses_a_topic_past_the_end() -> None:
    with pytest.raises(MqttProtocolError, match=re.escape("topic length 200 runs past the packet (5 bytes)")):
        parse_publish(0, b"\x00\xc8abc")
    with pytest.raises(MqttProtocolError, match=re.escape("QoS 3 is reserved")):
        parse_publish(0b0110, b"\x00\x01a\x00\x01")


def test_qos1_publish_and_subscribe_through_mosquitto(mosquitto: Mosquitto) -> None:
    inbox = Inbox()
    topic = f"t/{uuid.uuid4().hex}/x"
    with _client(mosquitto, on_message=inbox) as sub, _client(mosquitto) as pub:
        assert sub.subscribe(topic, qos=1) == 1
        pub.publish(topic, b"one", qos=1)  # returns only after the broker's PUBACK
        pub.publish(topic, b"two", qos=0)
        got = inbox.wait(2)
    assert [(t, p) for t, p, _ in got] == [(topic, b"one"), (topic, b"two")]
    assert not sub.connected


def test_retained_message_reaches_a_late_subscriber(mosquitto: Mosquitto) -> None:
    topic = f"t/{uuid.uuid4().hex}/retained"
    with _client(mosquitto) as pub:
        pub.publish(topic, b"latest" * 1000, qos=1, retain=True)
    inbox = Inbox()
    with _client(mosquitto, on_message=inbox) as sub:
        sub.subscribe(topic)
        (msg,) = inbox.wait(1)
    assert msg == (topic, b"latest" * 1000, True)


def test_keepalive_pings_keep_the_connection(mosquitto: Mosquitto) -> None:
    with _client(mosquitto, keepalive_s=1) as c:
        time.sleep(2.5)
        assert c.connected
        c.publish("t/ping", b"x", qos=1)


def test_last_will_is_published_when_the_device_vanishes(mosquitto: Mosquitto) -> None:
    topic = f"t/{uuid.uuid4().hex}/will"
    inbox = Inbox()
    with _client(mosquitto, on_message=inbox) as watcher:
        watcher.subscribe(topic)
        dying = _client(mosquitto, will=(topic, b"gone", False)).connect()
        assert dying._sock is not None
        dying._sock.shutdown(socket.SHUT_RDWR)  # no DISCONNECT: the broker must publish the will
        assert inbox.wait(1, timeout=15)[0][:2] == (topic, b"gone")
        dying.close()


def test_unreachable_broker_is_a_clean_error() -> None:
    from tests._services import free_port

    port = free_port()
    with pytest.raises(MqttConnectionError, match=re.escape(f"cannot connect to 127.0.0.1:{port}")):
        MqttLiteClient(host="127.0.0.1", port=port, client_id="x", timeout_s=1.0).connect()


def test_publish_topic_with_wildcard_is_refused(mosquitto: Mosquitto) -> None:
    with _client(mosquitto) as c, pytest.raises(MqttLiteError, match=re.escape("without the wildcards")):
        c.publish("a/+/b", b"")


class FakeBroker:
    """A TCP server that accepts CONNECT, answers CONNACK, then sends the given raw bytes."""

    def __init__(self, after_connack: bytes) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.after = after_connack
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(b"\x20\x02\x00\x00" + self.after)
            time.sleep(1.0)

    def close(self) -> None:
        self.server.close()
        self.thread.join(timeout=3)


@pytest.mark.parametrize(("garbage", "reason"), [
    (b"\x30\xff\xff\xff\xff\x01", "more than 4 bytes"),
    (b"\x30\x05\x00\xc8abc", "topic length 200 runs past the packet"),
    (b"\x10\x00", "unexpected packet type 1"),
    (b"\x40\x03\x00\x01\x00", "malformed packet type 4: 3-byte body"),
    (b"\x30" + encode_remaining_length(2 << 20), "packet type 3 of 2097152 bytes exceeds max_packet_bytes=1048576"),
])
def test_malformed_packet_closes_the_connection_with_a_reason(garbage: bytes, reason: str) -> None:
    fake = FakeBroker(garbage)
    try:
        client = MqttLiteClient(host="127.0.0.1", port=fake.port, client_id="x", keepalive_s=0, timeout_s=2.0)
        client.connect()
        deadline = time.monotonic() + 3
        while client.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not client.connected
        assert client.last_error is not None and reason in client.last_error
        with pytest.raises(MqttConnectionError, match=re.escape("not connected")):
            client.publish("a", b"x")
        client.close()
    finally:
        fake.close()


def test_refused_connack_names_the_reason() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(b"\x20\x02\x00\x05")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(MqttConnectionError, match=re.escape("refused the connection: not authorized")):
            MqttLiteClient(host="127.0.0.1", port=port, client_id="x").connect()
    finally:
        t.join(timeout=3)
        server.close()
