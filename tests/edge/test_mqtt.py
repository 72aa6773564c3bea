"""The paho adapter: URL parsing, caller mistakes raise, link conditions are states, backoff doubles."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest

from edge import EdgeConfigError, LinkConfig, LinkState, MqttLink, PublishState, parse_broker_url
from tests._services import Mosquitto, free_port
from tests.edge._agents import wait_until


def test_parse_broker_url() -> None:
    a = parse_broker_url("mqtts://user:p%40ss@broker.example:8884")
    assert (a.host, a.port, a.tls, a.username, a.password) == ("broker.example", 8884, True, "user", "p@ss")
    assert parse_broker_url("mqtt://127.0.0.1").port == 1883
    with pytest.raises(EdgeConfigError, match=re.escape("broker URL 'http://x' is not of the form mqtt://host:port")):
        parse_broker_url("http://x")


def test_caller_mistakes_raise(mosquitto: Mosquitto) -> None:
    link = MqttLink(LinkConfig(broker=mosquitto.url, client_id="mistakes"))
    with pytest.raises(EdgeConfigError, match=re.escape("cannot publish to topic 'a/+'")):
        link.publish("a/+", b"x")
    with pytest.raises(EdgeConfigError, match=re.escape("131073 bytes exceeds the 131072-byte limit of AWS IoT")):
        link.publish("a/b", bytes(128 * 1024 + 1))


def test_unreachable_broker_is_a_state_and_backoff_doubles_to_the_cap() -> None:
    slept: list[float] = []
    enough = threading.Event()

    def sleep(delay: float) -> None:
        slept.append(delay)
        if len(slept) >= 8:
            enough.set()

    link = MqttLink(LinkConfig(broker=f"mqtt://127.0.0.1:{free_port()}", client_id="lonely", reconnect_min_s=0.25,
                               reconnect_max_s=4.0, reconnect_jitter=0.0), sleep=sleep).start()
    try:
        assert enough.wait(60)
        assert link.state is LinkState.UNREACHABLE and "Connection refused" in (link.last_error or "")
        assert slept[:8] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
        # publishing while unreachable is not an error: paho holds the message for the reconnect
        assert link.publish("a/b", b"later").state is PublishState.HELD
    finally:
        link.close()


def test_reconnect_delays_are_jittered_so_a_fleet_does_not_return_in_step() -> None:
    slept: list[list[float]] = [[], []]
    done = [threading.Event(), threading.Event()]
    release = threading.Event()

    def sleeper(i: int) -> Callable[[float], None]:
        def sleep(delay: float) -> None:
            slept[i].append(delay)
            if len(slept[i]) >= 8:
                done[i].set()
                release.wait(60)  # hold the link here until the test closes it
        return sleep

    links = [MqttLink(LinkConfig(broker=f"mqtt://127.0.0.1:{free_port()}", client_id=f"j{i}", reconnect_min_s=0.25,
                                 reconnect_max_s=4.0), sleep=sleeper(i)) for i in range(2)]
    for link in links:
        link.start()
    try:
        assert done[0].wait(60) and done[1].wait(60)
    finally:
        release.set()
        for link in links:
            link.close()
    ceilings = [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    for delays in slept:
        assert all(c / 2 <= d <= c for d, c in zip(delays[:8], ceilings, strict=True)), delays
    assert slept[0][:8] != slept[1][:8]


def test_reconnects_after_a_broker_restart_and_resubscribes(mosquitto: Mosquitto) -> None:
    got: list[bytes] = []
    link = MqttLink(LinkConfig(broker=mosquitto.url, client_id="sticky", reconnect_min_s=0.05),
                    on_message=lambda t, p, r: got.append(p))
    link.subscribe("sticky/t")
    with link.start(), MqttLink(LinkConfig(broker=mosquitto.url, client_id="sender", reconnect_min_s=0.05)) as sender:
        assert link.wait_connected(60) and sender.wait_connected(60)
        mosquitto.restart()
        wait_until(lambda: link.connects >= 2 and sender.connects >= 2, timeout=30, what="both reconnected")
        # sent until the renewed SUBSCRIBE has reached the broker: the resubscription is what is tested
        def delivered() -> bool:
            if not got:
                sender.publish("sticky/t", b"after restart")
            return bool(got)

        wait_until(delivered, what="message after the restart")
        assert set(got) == {b"after restart"}
