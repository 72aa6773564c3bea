"""Real services for the tests, on free loopback ports: a Mosquitto broker and a moto server."""

from __future__ import annotations

import contextlib
import getpass
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, *, timeout: float = 10.0, host: str = LOOPBACK) -> None:
    """Block until something accepts TCP connections on ``host:port``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.02)


def mosquitto_binary() -> str:
    """Path of the mosquitto binary; fails with the install command when it is missing."""
    path = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    if path is None:
        raise RuntimeError("mosquitto is not installed: run scripts/setup.sh (apt-get install mosquitto)")
    return path


class Mosquitto:
    """One real Mosquitto broker on a free loopback port, with its own config file.

    `extra_config` lines are appended to a base config that listens on 127.0.0.1 only, allows
    anonymous clients unless the extra lines say otherwise, and turns Nagle off (see MEASURED.md).
    `restart()` keeps the port and config, so persistence and reconnects can be tested.
    """

    def __init__(self, workdir: Path, extra_config: Sequence[str] = (), *, anonymous: bool = True) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host = LOOPBACK
        self.config_path = workdir / "mosquitto.conf"
        lines = [
            f"listener {self.port} {LOOPBACK}",
            f"allow_anonymous {'true' if anonymous else 'false'}",
            "set_tcp_nodelay true",
            # Run as the current user: started as root, mosquitto would switch to the user "mosquitto",
            # which cannot read the test's private temp folder.
            f"user {getpass.getuser()}",
            f"persistence_location {workdir}/",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            *extra_config,
        ]
        self.config_path.write_text("\n".join(lines) + "\n")
        self.log_path = workdir / "mosquitto.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:PORT``."""
        return f"mqtt://{self.host}:{self.port}"

    def start(self) -> Mosquitto:
        """Start the broker and wait until it accepts connections."""
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen([mosquitto_binary(), "-c", str(self.config_path)], stdout=log, stderr=log)
        try:
            wait_for_port(self.port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"mosquitto did not start; its log:\n{self.log_path.read_text()}") from None
        return self

    def stop(self) -> None:
        """Stop the broker (SIGTERM, so it saves persistent state) and wait for it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def kill(self) -> None:
        """Kill the broker with SIGKILL, as a crash would."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        """Stop and start again on the same port with the same config."""
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None


class MotoServer:
    """A moto server on a free loopback port, spoken to over HTTP by real boto3 clients."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
        self.url = ""

    def start(self) -> MotoServer:
        """Start serving; `url` is set once the port is known."""
        self._server.start()
        # ThreadedMotoServer exposes the bound port only on its private server object (MEASURED.md).
        _host, port = self._server._server.server_address[:2]
        self.url = f"http://{LOOPBACK}:{port}"
        wait_for_port(int(port))
        return self

    def reset(self) -> None:
        """Forget every resource, so tests do not see each other's state."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=10)

    def stop(self) -> None:
        """Stop the server."""
        self._server.stop()


@contextlib.contextmanager
def running_mosquitto(workdir: Path, extra_config: Sequence[str] = (), *, anonymous: bool = True
                      ) -> Iterator[Mosquitto]:
    """Context manager form of `Mosquitto`."""
    broker = Mosquitto(workdir, extra_config, anonymous=anonymous).start()
    try:
        yield broker
    finally:
        broker.stop()
