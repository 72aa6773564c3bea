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


class _ClosingSSLSocket(ssl.SSLSocket):
    """An `ssl.SSLSocket` that closes itself when its handshake fails.

    paho (2.2, ``Client._ssl_wrap_socket``) leaves the socket of a failed handshake open for the garbage collector
    (a ResourceWarning per attempt); a refused certificate is retried up to the refusal budget, so it is closed here.
    """

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except BaseException:
            self.close()
            raise


def tls_context(*, ca_file: str | None, cert_file: str | None, key_file: str | None) -> ssl.SSLContext:
    """The client TLS context of both MQTT links; a failed handshake closes its socket.

    It verifies the broker against `ca_file` (or the system's CAs), host name included, and presents `cert_file`
    when given.

    Raises:
        OSError, ssl.SSLError: a file cannot be read or is not PEM.
    """
    context = ssl.create_default_context(cafile=ca_file)
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    context.sslsocket_class = _ClosingSSLSocket
    return context


# OpenSSL verify codes (x509_vfy.h) of the certificate failures a client meets, each with its own fix.
_EXPIRED, _NOT_YET_VALID = 10, 9
_UNKNOWN_ISSUER = (2, 18, 19, 20, 21)
_WRONG_HOST = (62, 64)


def tls_failure(exc: BaseException, *, host: str, port: int, tls: bool, ca_file: str | None) -> str | None:
    """One line naming why connecting failed in TLS terms and the fix, or None when `exc` is no TLS failure.

    A TLS failure is a configuration error that retrying cannot fix (unlike a refused TCP connection, which is
    an outage): an unknown CA, an expired or not yet valid certificate, a certificate for another host, or a
    handshake the server breaks off (TLS to a plain MQTT port). Both MQTT links (`device._mqtt`,
    `edge._mqtt`) use it, so `strata edge run` and `strata device run` name the same causes.
    """
    where = f"{host}:{port}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        code, detail = getattr(exc, "verify_code", None), str(getattr(exc, "verify_message", "") or exc)
        if code == _EXPIRED:
            return (f"TLS: the server certificate of {where} has expired; renew the broker's certificate (or fix "
                    "this machine's clock)")
        if code == _NOT_YET_VALID:
            return f"TLS: the server certificate of {where} is not valid yet; check this machine's clock"
        if code in _WRONG_HOST or "mismatch" in detail:
            return (f"TLS: the server certificate of {where} is not valid for {host!r} ({detail}); connect by the "
                    "name the certificate holds, or reissue it for this host")
        if code in _UNKNOWN_ISSUER:
            trusted = f"--ca-file {ca_file}" if ca_file else "the system's CA store (no --ca-file)"
            return (f"TLS: the server certificate of {where} is not signed by a CA in {trusted} ({detail}); pass "
                    "--ca-file with the CA that signed the broker's certificate")
        return f"TLS: the server certificate of {where} does not verify ({detail}); check --ca-file"
    if tls and isinstance(exc, ssl.SSLError | ConnectionResetError | BrokenPipeError):
        return (f"TLS: the handshake with {where} failed ({type(exc).__name__}: {exc}); is it a plain MQTT port? "
                "use mqtt:// for it, or the broker's TLS port with mqtts://")
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {where}: {exc}; check --ca-file, --cert-file and --key-file"
    return None


def closed_before_connack(*, host: str, port: int, tls: bool, cert_file: str | None) -> str:
    """Why a broker that accepted the connection closed it before answering CONNECT, with the fix."""
    where = f"{host}:{port}"
    if not tls:
        return (f"{where} closed the connection before answering CONNECT: is it a TLS port? use mqtts:// (with "
                "--ca-file) for it")
    if cert_file:
        return (f"the broker {where} closed the TLS connection before answering CONNECT: it refused the client "
                f"certificate --cert-file {cert_file} (wrong CA, expired or revoked), or the client id is not allowed")
    return (f"the broker {where} closed the TLS connection before answering CONNECT: it may require a client "
            "certificate (--cert-file, --key-file)")


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
        self._closed_early: str | None = None
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
                context = tls_context(ca_file=options.ca_file, cert_file=options.cert_file, key_file=options.key_file)
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
            tls = tls_failure(exc, host=o.host, port=o.port, tls=bool(o.tls or o.ca_file or o.cert_file),
                              ca_file=o.ca_file)
            raise MqttLinkError(f"cannot connect: {tls}" if tls else f"cannot connect to {o.host}:{o.port}: {exc}"
                                ) from None
        self._client.loop_start()
        if not self._first.wait(timeout_s):
            self.close()
            raise MqttLinkError(f"{o.host}:{o.port} did not answer the MQTT CONNECT within {timeout_s} s")
        if self._closed_early is not None:
            self.close()
            raise MqttLinkError(self._closed_early)
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
        if not self._first.is_set():  # the broker accepted the socket but closed it before any CONNACK
            o = self.options
            self._closed_early = closed_before_connack(host=o.host, port=o.port, tls=bool(o.tls or o.ca_file or
                                                                                           o.cert_file),
                                                       cert_file=o.cert_file)
            self.last_error = self._closed_early
            self._first.set()

    def _handle_message(self, client: Any, userdata: Any, message: Any) -> None:
        self._on_message(message.topic, bytes(message.payload), bool(message.retain))


def _nodelay(client: Any, userdata: Any, sock: Any) -> None:
    # Nagle plus delayed ACK adds ~40-90 ms to a request/response on loopback (MEASURED.md).
    if isinstance(sock, (socket.socket, ssl.SSLSocket)):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
