"""The device's MQTT link: paho-mqtt (pure Python, no dependencies) with the settings a device needs fixed here.

The device tier's only paho import (the edge tier has its own, `edge._mqtt`, which the device cannot import).
paho brings what a home-made client lacked: keepalive that pings on its own schedule whatever else is sent, TLS,
reconnect, and a ``publish`` that queues and never blocks its caller (so publishing inside ``on_message`` is
safe). Fixed here: callback API version 2; MQTT 3.1.1 (any broker); TCP_NODELAY on the socket (request/response
latency, MEASURED.md); reconnect backoff 1 s doubling to 10 s, done by paho's network thread; subscriptions
made in ``on_connect`` so they survive reconnects; a broker that refuses the first CONNECT (bad credentials, not
authorized) is an error naming the fix, not a retry loop.

Connection states: ``connect()`` starts paho's thread and waits for the first CONNACK (accepted: connected;
refused: `MqttLinkError`, thread stopped). After that a lost link is reconnected by paho in the background;
``connected`` tells the caller, and ``publish`` returns False while the link is down instead of raising.
"""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from device._deps import require
from device._errors import StrataError
from device._names import HOST_FORM, is_host, shown

MessageCallback = Callable[[str, bytes, bool], None]


class MqttLinkError(StrataError):
    """The device's broker link cannot be made: unreachable, refused (credentials, ACL) or bad TLS files."""


@dataclass(frozen=True, kw_only=True)
class LinkOptions:
    """Where and how the device connects."""

    host: str
    port: int
    client_id: str
    tls: bool = False
    """TLS (``mqtts://``); with no `ca_file` the system's CAs verify the broker."""
    keepalive_s: int = 30
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def parse_broker(url: str) -> tuple[str, int, bool]:
    """``mqtt://host[:1883]`` or ``mqtts://host[:8883]`` as ``(host, port, tls)``; `ValueError` names the form."""
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:
        parsed = urllib.parse.urlsplit("")
    if parsed.scheme not in ("mqtt", "mqtts", "tcp", "ssl") or not parsed.hostname:
        raise ValueError(f"broker {shown(url)} must be of the form mqtt://host:port or mqtts://host:port")
    if not is_host(parsed.hostname) or parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise ValueError(f"broker {shown(url)}: the host must be {HOST_FORM}, with nothing after the port")
    tls = parsed.scheme in ("mqtts", "ssl")
    try:
        port = parsed.port or (8883 if tls else 1883)
    except ValueError:
        raise ValueError(f"broker {shown(url)} has an invalid port") from None
    if parsed.username or parsed.password:
        raise ValueError(f"broker {shown(url.split('@')[-1])} holds credentials; pass --username and --password-file "
                         "instead (a URL ends up in logs and process lists)")
    return parsed.hostname, port, tls


class DeviceLink:
    """One paho client with the device's settings (see the module docstring).

    Args:
        options: Where and how to connect.
        on_message: ``on_message(topic, payload, retained)``, called on paho's network thread.
        subscriptions: ``(topic, qos)`` pairs, subscribed on every (re)connect.
    """

    def __init__(self, options: LinkOptions, *, on_message: MessageCallback,
                 subscriptions: Sequence[tuple[str, int]]) -> None:
        mqtt: Any = require("paho.mqtt.client", extra="device", purpose="the device's link to its edge")
        self.options = options
        self._on_message = on_message
        self._subscriptions = list(subscriptions)
        self._first = threading.Event()
        self._refused: str | None = None
        self._connected = threading.Event()
        self.connects = 0
        """CONNACKs accepted so far (the first connection and every reconnection)."""
        self.last_error: str | None = None
        """Why the link was last lost or refused, for status lines."""
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=options.client_id, clean_session=True,
                             protocol=mqtt.MQTTv311)
        if options.username:
            client.username_pw_set(options.username, options.password)
        if options.tls or options.ca_file or options.cert_file:
            try:
                context = ssl.create_default_context(cafile=options.ca_file)
                if options.cert_file:
                    context.load_cert_chain(options.cert_file, options.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise MqttLinkError(f"cannot load the TLS files (ca {options.ca_file!r}, cert {options.cert_file!r}, "
                                    f"key {options.key_file!r}): {exc}; pass readable PEM files") from None
            client.tls_set_context(context)
        client.reconnect_delay_set(min_delay=1, max_delay=10)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_message = self._handle_message
        client.on_socket_open = _nodelay
        self._client = client

    @property
    def connected(self) -> bool:
        """Whether the link holds an accepted connection now."""
        return self._connected.is_set()

    def connect(self, timeout_s: float = 10.0) -> DeviceLink:
        """Connect, subscribe and start paho's network thread (which reconnects from then on).

        Raises:
            MqttLinkError: The broker cannot be reached, refused the connection, or did not answer in `timeout_s`.
        """
        o = self.options
        try:
            self._client.connect(o.host, o.port, keepalive=o.keepalive_s)
        except (OSError, ssl.SSLError) as exc:
            raise MqttLinkError(f"cannot connect to {o.host}:{o.port}: {exc}") from None
        self._client.loop_start()
        if not self._first.wait(timeout_s):
            self.close()
            raise MqttLinkError(f"{o.host}:{o.port} did not answer the MQTT CONNECT within {timeout_s} s")
        if self._refused is not None:
            self.close()
            refused_credentials = "authori" in self._refused or "password" in self._refused
            hint = (" (check --username and --password-file, and that `strata broker config --devices` lists "
                    f"{o.username or o.client_id!r})") if refused_credentials else ""
            raise MqttLinkError(f"{o.host}:{o.port} refused the connection: {self._refused}{hint}")
        return self

    def publish(self, topic: str, payload: bytes, *, qos: int = 0, retain: bool = False,
                wait_s: float = 0.0) -> bool:
        """Queue one message; False (nothing sent) while the link is down.

        With the default ``wait_s=0`` it never blocks on the network (safe inside ``on_message``); with
        ``wait_s > 0`` it waits up to that long for the message to be handed over (the PUBACK at QoS 1) and
        returns whether it was.
        """
        if not self._connected.is_set():
            return False
        info = self._client.publish(topic, payload, qos=qos, retain=retain)
        if info.rc != 0:
            return False
        if wait_s > 0:
            info.wait_for_publish(wait_s)
            return bool(info.is_published())
        return True

    def close(self) -> None:
        """Disconnect and stop paho's thread."""
        self._connected.clear()
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()

    def __enter__(self) -> DeviceLink:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ paho callbacks

    def _handle_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self.last_error = str(reason)
            if not self._first.is_set():
                self._refused = str(reason)
                self._first.set()
            return
        for topic, qos in self._subscriptions:
            client.subscribe(topic, qos=qos)
        self.connects += 1
        self._connected.set()
        self._first.set()

    def _handle_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self._connected.clear()
        if reason.is_failure:
            self.last_error = str(reason)

    def _handle_message(self, client: Any, userdata: Any, message: Any) -> None:
        self._on_message(message.topic, bytes(message.payload), bool(message.retain))


def _nodelay(client: Any, userdata: Any, sock: Any) -> None:
    # Nagle plus delayed ACK adds ~40-90 ms to a request/response on loopback (MEASURED.md).
    if isinstance(sock, (socket.socket, ssl.SSLSocket)):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
