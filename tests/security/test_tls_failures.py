"""Case 5 of issue 34: every TLS failure ends `edge run` / `device run` with one line naming the cause.

Before: with the wrong CA file, an expired server certificate, or ``mqtts://`` to a plain listener, ``strata edge
run`` retried forever and reported ``last_error: null``; only a refused client certificate ended it. Now an unknown
CA, an expired or wrong-host server certificate, TLS to a plain port and plain MQTT to a TLS port are refusals:
bounded by the link's retry budget (`LinkConfig.max_refusals`), each named with its fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge import LinkConfig, LinkState, MqttLink
from tests._cli import run_strata
from tests._services import Mosquitto, free_port
from tests.edge._agents import wait_until
from tests.edge._policies import make_keys
from tests.security._helpers import certificate, one_line_error, write_pem


@dataclass(frozen=True)
class TlsBroker:
    """One Mosquitto: a plain listener and three TLS listeners (a good, an expired, a wrong-host certificate)."""

    plain: int
    good: int
    expired: int
    wrong_host: int
    ca_file: str
    other_ca_file: str


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    d = tmp_path_factory.mktemp("tls")
    ca_key, ca = certificate("strata test CA", ca=True)
    _, ca_file = write_pem(d / "ca", ca_key, ca)
    other_key, other = certificate("another CA", ca=True)
    _, other_ca_file = write_pem(d / "other-ca", other_key, other)
    listeners = []
    ports = []
    for name, kwargs in (("good", {"ip": "127.0.0.1"}), ("expired", {"ip": "127.0.0.1", "expired": True}),
                         ("wrong", {"dns": "broker.example"})):
        key, cert = certificate(name, ca_key, ca.subject, **kwargs)  # type: ignore[arg-type]
        key_file, cert_file = write_pem(d / name, key, cert)
        port = free_port()
        ports.append(port)
        listeners += [f"listener {port} 127.0.0.1", f"certfile {cert_file}", f"keyfile {key_file}"]
    broker = Mosquitto(d / "broker", listeners).start()
    try:
        yield TlsBroker(plain=broker.port, good=ports[0], expired=ports[1], wrong_host=ports[2], ca_file=ca_file,
                        other_ca_file=other_ca_file)
    finally:
        broker.stop()


CAUSES = {
    "unknown CA": ("not signed by a CA in --ca-file", "--ca-file with the CA that signed"),
    "expired certificate": ("has expired", "renew the broker's certificate"),
    "wrong host": ("is not valid for '127.0.0.1'", "reissue it for this host"),
    "TLS to a plain port": ("is it a plain MQTT port?", "use mqtt://"),
    "plain to a TLS port": ("is it a TLS port?", "use mqtts://"),
}


def _target(b: TlsBroker, cause: str) -> tuple[str, str | None]:
    """``(broker URL, CA file)`` that meets `cause`."""
    return {"unknown CA": (f"mqtts://127.0.0.1:{b.good}", b.other_ca_file),
            "expired certificate": (f"mqtts://127.0.0.1:{b.expired}", b.ca_file),
            "wrong host": (f"mqtts://127.0.0.1:{b.wrong_host}", b.ca_file),
            "TLS to a plain port": (f"mqtts://127.0.0.1:{b.plain}", b.ca_file),
            "plain to a TLS port": (f"mqtt://127.0.0.1:{b.good}", None)}[cause]


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_the_link_gives_up_on_a_tls_failure_and_names_it(tls_broker: TlsBroker, cause: str) -> None:
    url, ca_file = _target(tls_broker, cause)
    config = LinkConfig(broker=url, client_id=f"tls-{cause.split()[0]}", ca_file=ca_file, reconnect_min_s=0.01,
                        reconnect_max_s=0.05)
    with MqttLink(config) as link:
        wait_until(lambda: link.gave_up, what=f"the link to give up on {cause}", timeout=30)
        assert link.state is LinkState.REFUSED and link.refusals == config.max_refusals
        for text in CAUSES[cause]:
            assert link.last_error is not None and text in link.last_error, link.last_error
    # and the right settings connect
    with MqttLink(LinkConfig(broker=f"mqtts://127.0.0.1:{tls_broker.good}", client_id="tls-ok",
                             ca_file=tls_broker.ca_file)) as ok:
        assert ok.wait_connected(60), ok.last_error


def _edge_run(tmp_path: Path, url: str, ca_file: str | None) -> object:
    _, pub = make_keys(tmp_path / "keys")
    argv = ["edge", "run", "--fleet", "f", "--node-id", "n1", "--trust", str(pub), "--cache-dir",
            str(tmp_path / "cache"), "--broker", url, "--log-level", "CRITICAL", "--json"]
    return run_strata(*argv, *(["--ca-file", ca_file] if ca_file else []), timeout=120)


def test_edge_run_ends_on_an_unknown_ca_with_one_line(tls_broker: TlsBroker, tmp_path: Path) -> None:
    url, ca_file = _target(tls_broker, "unknown CA")
    line = one_line_error(_edge_run(tmp_path, url, ca_file), "refused the connection 5 times",  # type: ignore[arg-type]
                          *CAUSES["unknown CA"], progress=1)
    assert "--password-file" not in line


@pytest.mark.slow
@pytest.mark.parametrize("cause", sorted(set(CAUSES) - {"unknown CA"}))
def test_edge_run_ends_on_every_tls_failure_with_one_line(tls_broker: TlsBroker, tmp_path: Path, cause: str) -> None:
    url, ca_file = _target(tls_broker, cause)
    one_line_error(_edge_run(tmp_path, url, ca_file), "refused the connection 5 times",  # type: ignore[arg-type]
                   *CAUSES[cause], progress=1)


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_device_run_ends_on_every_tls_failure_with_one_line(tls_broker: TlsBroker, tmp_path: Path,
                                                            cause: str) -> None:
    _, pub = make_keys(tmp_path / "keys")
    url, ca_file = _target(tls_broker, cause)
    result = run_strata("device", "run", "--env", "CartPole-v1", "--steps", "1", "--broker", url, "--trust", str(pub),
                        *(["--ca-file", ca_file] if ca_file else []), timeout=120)
    one_line_error(result, *CAUSES[cause])  # type: ignore[arg-type]
