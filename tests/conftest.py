"""Fixtures shared by every tier's tests: real services on loopback and a clean environment."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests._services import Mosquitto, MotoServer

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Take SIGINT back when the caller handed it over ignored.

    A shell without job control starts background commands (``(make test &)``, ``nohup``) with SIGINT ignored, and
    every child inherits that through exec: the Ctrl-C tests would then interrupt nothing and fail on the runner,
    not on strata. Python's own handler here means children start with SIGINT at its default again.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop AWS_* and MQTT_* variables inherited from the caller, so no test reaches a real account."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "MQTT_", "STRATA_")) and name != "STRATA_AWS_SMOKE":
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """One anonymous Mosquitto broker for the whole test session."""
    broker = Mosquitto(tmp_path_factory.mktemp("mosquitto")).start()
    yield broker
    broker.stop()


MosquittoFactory = Callable[..., Mosquitto]


@pytest.fixture
def mosquitto_factory(tmp_path: Path) -> Iterator[MosquittoFactory]:
    """Start brokers of a test's own (passwords, ACLs, persistence); all are stopped afterwards."""
    started: list[Mosquitto] = []

    def start(extra_config: Sequence[str] = (), *, anonymous: bool = True) -> Mosquitto:
        broker = Mosquitto(tmp_path / f"broker{len(started)}", extra_config, anonymous=anonymous).start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """One moto server over HTTP on loopback for the whole session."""
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def aws_env(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """Point boto3 at the moto server with dummy credentials; the server is reset first."""
    moto_server.reset()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return moto_server


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that collected nothing is a failure, never pytest's quiet exit code 5."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print("\nstrata: no tests were collected; check the paths and -m/-k filters", flush=True)
