"""The device's paho link against a real Mosquitto: keepalive under load, TLS, refusals, no blocking callbacks."""

from __future__ import annotations

import re
import threading
import time
import uuid
from pathlib import Path

import pytest

from device import DeviceLink, LinkOptions, MqttLinkError
from device._mqtt import parse_broker
from tests._services import Mosquitto, free_port
from tests.conftest import MosquittoFactory


def _options(broker: Mosquitto, **kw: object) -> LinkOptions:
    return LinkOptions(host=broker.host, port=broker.port, client_id=f"t-{uuid.uuid4().hex[:12]}", **kw)  # type: ignore[arg-type]


def test_a_link_that_publishes_often_stays_up_past_its_keepalive(mosquitto: Mosquitto) -> None:
    """Issue 21: the stdlib client never pinged while it published QoS 0 and declared the link dead at 1.5 x
    keepalive. paho pings on its own schedule: with keepalive 1 s, 3 s of publishing every 50 ms keep one
    connection, and the subscriber receives every message."""
    got: list[bytes] = []
    all_in = threading.Event()
    n = 60
    topic = f"t/{uuid.uuid4().hex[:8]}"

    def on_message(t: str, payload: bytes, retained: bool) -> None:
        got.append(payload)
        if len(got) == n:
            all_in.set()

    with DeviceLink(_options(mosquitto), on_message=on_message, subscriptions=[(topic, 0)]) as sub, \
            DeviceLink(_options(mosquitto, keepalive_s=1), on_message=lambda *a: None, subscriptions=[]) as pub:
        for i in range(n):
            assert pub.publish(topic, str(i).encode())
            time.sleep(0.05)  # the load pattern of the bug, not a synchronisation
        assert all_in.wait(60)
        assert pub.connected and pub.connects == 1 and sub.connects == 1
    assert got == [str(i).encode() for i in range(n)]


def test_publishing_inside_on_message_does_not_block(mosquitto: Mosquitto) -> None:
    """A QoS 1 publish from the message callback is queued; the old client blocked it until its timeout."""
    request, reply = f"rq/{uuid.uuid4().hex[:8]}", f"rp/{uuid.uuid4().hex[:8]}"
    answered = threading.Event()
    replies: list[bytes] = []

    def on_request(t: str, payload: bytes, retained: bool) -> None:
        assert echo.publish(reply, payload.upper(), qos=1)
        answered.set()

    def on_reply(t: str, payload: bytes, retained: bool) -> None:
        replies.append(payload)

    with DeviceLink(_options(mosquitto), on_message=on_request, subscriptions=[(request, 1)]) as echo, \
            DeviceLink(_options(mosquitto), on_message=on_reply, subscriptions=[(reply, 1)]) as asker:
        for i in range(20):
            assert asker.publish(request, f"q{i}".encode(), qos=1)
        assert answered.wait(60)
        deadline = time.monotonic() + 60
        while len(replies) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert replies == [f"Q{i}".encode() for i in range(20)]


def test_unreachable_broker_is_a_link_error() -> None:
    port = free_port()
    with pytest.raises(MqttLinkError, match=re.escape(f"cannot connect to 127.0.0.1:{port}")):
        DeviceLink(LinkOptions(host="127.0.0.1", port=port, client_id="x"), on_message=lambda *a: None,
                   subscriptions=[]).connect()


def test_refused_credentials_name_the_fix(mosquitto_factory: MosquittoFactory) -> None:
    broker = mosquitto_factory(anonymous=False)
    with pytest.raises(MqttLinkError, match=re.escape("refused the connection: Not authorized")) as info:
        DeviceLink(_options(broker, username="d1", password="wrong"), on_message=lambda *a: None,
                   subscriptions=[]).connect()
    assert "--password-file" in str(info.value)


# paho-mqtt 2.2's `Client._ssl_wrap_socket` does not close the socket when `do_handshake()` fails (the refused
# connection below), so its SSLSocket is only closed by the garbage collector, with a ResourceWarning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_tls_with_a_ca_file(tmp_path: Path, mosquitto_factory: MosquittoFactory) -> None:
    from tests.edge.test_tls import _cert, _write

    ca_key, ca_cert = _cert("strata test CA", None, None, ca=True)
    server_key, server_cert = _cert("127.0.0.1", ca_key, ca_cert.subject, ip="127.0.0.1")
    _, ca_file = _write(tmp_path / "ca", ca_key, ca_cert)
    server_key_file, server_cert_file = _write(tmp_path / "server", server_key, server_cert)
    port = free_port()
    mosquitto_factory([f"listener {port} 127.0.0.1", f"cafile {ca_file}", f"certfile {server_cert_file}",
                       f"keyfile {server_key_file}"])
    host, port_, tls = parse_broker(f"mqtts://127.0.0.1:{port}")
    got = threading.Event()
    options = LinkOptions(host=host, port=port_, tls=tls, client_id="d-tls", ca_file=ca_file)
    with DeviceLink(options, on_message=lambda t, p, r: got.set(), subscriptions=[("tls/echo", 0)]) as link:
        assert link.publish("tls/echo", b"over tls")
        assert got.wait(60)
    # Without the CA the broker's certificate does not verify: refused at connect, not a retry loop.
    with pytest.raises(MqttLinkError, match="cannot connect"):
        DeviceLink(LinkOptions(host=host, port=port_, tls=True, client_id="d-x"), on_message=lambda *a: None,
                   subscriptions=[]).connect()


@pytest.mark.parametrize(("url", "message"), [
    ("http://h:1", "must be of the form mqtt://host:port or mqtts://host:port"),
    ("mqtt://u:p@h:1", "holds credentials; pass --username and --password-file"),
    ("mqtt://h:99999", "has an invalid port"),
])
def test_broker_urls_are_checked(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_broker(url)
    assert parse_broker("mqtts://h") == ("h", 8883, True) and parse_broker("mqtt://h") == ("h", 1883, False)
