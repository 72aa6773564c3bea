"""A throwaway Mosquitto broker on a free loopback port, shared by the benchmarks that need one."""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_mosquitto(workdir: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start Mosquitto (loopback only, anonymous, Nagle off, plus `extra` config lines); return it and its URL."""
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text("\n".join([f"listener {port} 127.0.0.1", "allow_anonymous true", "set_tcp_nodelay true",
                               f"user {getpass.getuser()}", *extra, ""]))
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"mqtt://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"mosquitto did not start (config {conf})")
