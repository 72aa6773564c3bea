"""An embedded MQTT 3.1.1 broker (amqtt) on a free loopback port, for `strata demo` when no broker is given.

It runs in a background thread with its own asyncio loop, allows anonymous clients on 127.0.0.1 only, and
stops cleanly. It is a convenience for one machine; fleets run on Mosquitto or AWS IoT Core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

from device import require
from edge._errors import EdgeError


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _SnapshotSubscriptions(dict):  # type: ignore[type-arg]
    """amqtt's topic-filter map, iterated over a copy.

    amqtt 0.12 walks `Broker._subscriptions` with awaits inside the loop (retained messages on connect, the
    broadcast fan-out); a client subscribing to a new filter meanwhile raises "dictionary changed size during
    iteration", which kills the connecting client's session after its CONNACK (it then hangs until keepalive)
    or drops a broadcast. Iterating a snapshot makes both loops safe; lookups and writes are a dict's.
    """

    def __iter__(self) -> Iterator[Any]:
        return iter(list(super().keys()))

    def items(self) -> Any:
        return [(key, list(value)) for key, value in super().items()]


class EmbeddedBroker:
    """amqtt on ``mqtt://127.0.0.1:PORT``; `start` blocks until it listens, `stop` until it is gone."""

    def __init__(self, *, port: int | None = None) -> None:
        self.port = port or _free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._broker: Any = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:PORT``."""
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> EmbeddedBroker:
        """Start the broker thread and wait until it accepts connections."""
        require("amqtt.broker", extra="cloud", purpose="the embedded MQTT broker")
        # amqtt logs every connection at INFO; keep a demo's output readable.
        logging.getLogger("amqtt").setLevel(logging.WARNING)
        logging.getLogger("transitions").setLevel(logging.WARNING)
        for name, quiet in (("amqtt.broker", _QuietProtocolFallback), ("amqtt.broker", _QuietLatePuback),
                            ("amqtt.mqtt.protocol.handler", _QuietLatePuback)):
            logger = logging.getLogger(name)
            if not any(isinstance(f, quiet) for f in logger.filters):
                logger.addFilter(quiet())
        self._thread = threading.Thread(target=self._main, name="embedded-broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise EdgeError(f"EmbeddedBroker: amqtt did not start on 127.0.0.1:{self.port}: {self._error}")
        return self

    def _main(self) -> None:
        from amqtt.broker import Broker

        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        try:
            async def boot() -> None:
                self._broker = Broker(config)
                if isinstance(getattr(self._broker, "_subscriptions", None), dict):  # a private map: see above
                    self._broker._subscriptions = _SnapshotSubscriptions(self._broker._subscriptions)
                await self._broker.start()

            loop.run_until_complete(boot())
        except BaseException as exc:  # report any start failure to the caller of start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        loop.run_forever()
        self._drain(loop)
        loop.close()

    @staticmethod
    def _drain(loop: asyncio.AbstractEventLoop) -> None:
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        # amqtt's shutdown leaves the server side of client connections open, which surfaces later as
        # "unclosed transport" ResourceWarnings; close what the loop still tracks (a private map of asyncio's
        # selector loop, read defensively).
        for transport in list(getattr(loop, "_transports", {}).values()):
            with contextlib.suppress(Exception):
                transport.close()
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(loop.shutdown_asyncgens())

    def stop(self) -> None:
        """Shut the broker down and join its thread."""
        loop, broker = self._loop, self._broker
        if loop is None or broker is None or self._thread is None:
            return
        future = asyncio.run_coroutine_threadsafe(broker.shutdown(), loop)
        with contextlib.suppress(Exception):
            future.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def embedded_broker() -> Iterator[EmbeddedBroker]:
    """Context manager: a running `EmbeddedBroker`."""
    broker = EmbeddedBroker().start()
    try:
        yield broker
    finally:
        broker.stop()


class _QuietProtocolFallback(logging.Filter):
    """Drops amqtt's warnings about an MQTT 5 CONNECT, which amqtt (3.1.1 only) refuses.

    strata's publisher speaks protocol "auto": it tries 5 and falls back to 3.1.1, which amqtt serves, so those two
    lines ("Invalid connection from ...", "... Invalid protocol from ...: 5") told a demo's user of a failure that
    had already been handled. amqtt writes "Invalid connection" before the reason of any refused CONNECT; the
    reason line stays for every other refusal, so a real one is still reported.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Invalid connection from"):
            return False
        return not ("Invalid protocol from" in message and message.rstrip().endswith(": 5"))


class _QuietLatePuback(logging.Filter):
    """Drops amqtt's lines about a QoS 1 delivery whose PUBACK came after its fixed 5 s wait.

    amqtt (0.12) waits 5 s for a subscriber's PUBACK (hard-coded in ``ProtocolHandler._handle_qos1_message_flow``),
    then gives the delivery up and logs a warning, a traceback ("Task failed and will be skipped") and, when the
    PUBACK does come, "Received PUBACK for unknown pending message". The learner's ingesters acknowledge a record
    only once it is in the spool, which on a loaded machine can take longer; the record is not lost: the node keeps
    it until the learner's receipt and sends it again. So the lines told a demo's user of a failure strata handles.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("Timeout waiting for PUBACK" in message or "PUBACK for unknown pending message" in message)
