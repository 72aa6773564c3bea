"""Separate "hosts" for tests and benchmarks: Linux network namespaces joined by veth pairs on one bridge.

`Hosts(["learner", "env1", ...])` makes one namespace per host and one for the switch (a bridge), a veth pair
from each host to the switch, and one address per host on `SUBNET`. Those addresses exist only inside the
namespaces made here: nothing outside (the test process included) can reach them, and they are gone when
`close()` deletes the namespaces. Programs run on a host with ``ip netns exec`` (`popen`, `run`); `close()` kills
what it started first, so no namespace is kept alive by a leftover process.

Needs root, iproute2 and a kernel with network namespaces, veth and bridge; `unavailable()` says which is missing
(tests skip with that reason). Namespaces of a process that died without closing (kill -9 of the test run) are
removed by the next `Hosts` (their names carry the creating pid), and the processes left running in them killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PREFIX = "strata-t"
SUBNET = "10.238.0"  # lives only inside the namespaces a Hosts makes (its switch's bridge), removed by close()
_NAME = re.compile(rf"{PREFIX}-(\d+)-[0-9a-f]+-")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be used here (a skip reason), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:6]}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"the kernel refuses network namespaces: {made.stderr.strip()}"
    try:
        for kind, args in (("veth", ["type", "veth", "peer", "name", "p1"]), ("bridge", ["type", "bridge"])):
            made = _ip("-n", probe, "link", "add", "p0" if kind == "veth" else "b0", *args, check=False)
            if made.returncode != 0:
                return f"the kernel has no {kind} links: {made.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _close_pipes(proc: subprocess.Popen[Any]) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def remove_stale() -> list[str]:
    """Delete namespaces left by dead processes (names carry the creating pid), killing what still runs in them
    first; return their names."""
    listing = _ip("netns", "list", check=False).stdout.split("\n")
    removed = []
    for line in listing:
        name = line.split(" ")[0]
        match = _NAME.match(name)
        if match is None:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(match.group(1)), 0)
            continue  # its owner is alive
        for pid in _ip("netns", "pids", name, check=False).stdout.split():  # what the dead owner left running
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", name, check=False)
        shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        removed.append(name)
    return removed


class Hosts:
    """Namespaces as hosts on one bridge (see the module docstring); a context manager."""

    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names) or not names or len(names) > 200:
            raise ValueError(f"Hosts: need 1-200 distinct host names, got {list(names)}")
        self.names = list(names)
        self._tag = f"{PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._made: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._etc: list[Path] = []

    def ns(self, host: str) -> str:
        """The namespace of `host`."""
        return f"{self._tag}-{self.names.index(host)}"

    def address(self, host: str) -> str:
        """`host`'s address: only inside the namespaces of this `Hosts` (SUBNET.N on the switch's bridge)."""
        return f"{SUBNET}.{self.names.index(host) + 1}"

    def start(self) -> Hosts:
        """Make the switch, the hosts and their links; on any failure remove what was made and raise."""
        remove_stale()
        switch = f"{self._tag}-sw"
        try:
            self._add(switch)
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
            for i, host in enumerate(self.names):
                ns = self.ns(host)
                self._add(ns)
                _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", switch)
                _ip("-n", switch, "link", "set", f"p{i}", "master", "br0")
                _ip("-n", switch, "link", "set", f"p{i}", "up")
                _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run on `host` (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def kill(self, proc: subprocess.Popen[Any]) -> None:
        """SIGKILL a process started by `popen` and everything in its session; reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        _close_pipes(proc)

    def popen(self, host: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` on `host` in a session of its own; `close()` kills that session if it still runs."""
        full_env = {**os.environ, **(env or {})}
        proc: subprocess.Popen[Any] = subprocess.Popen(self.command(host, argv), env=full_env,
                                                       start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], *, timeout: float = 120.0, env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on `host` to its end; its output as text."""
        return subprocess.run(self.command(host, argv), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})

    def hosts_file(self, host: str, names: Mapping[str, Sequence[str]]) -> None:
        """Give `host` this machine's /etc/hosts plus each DNS name resolving to the listed hosts' addresses (all of
        them, as a headless Service's name does). ``ip netns exec`` mounts ``/etc/netns/NS/hosts`` over /etc/hosts
        for the programs it starts; `close()` removes that folder."""
        folder = Path("/etc/netns") / self.ns(host)
        folder.mkdir(parents=True, exist_ok=True)
        self._etc.append(folder)
        ours = [f"{self.address(h)} {name}" for name, hs in names.items() for h in hs]
        (folder / "hosts").write_text(Path("/etc/hosts").read_text().rstrip("\n") + "\n" + "\n".join(ours) + "\n")

    def cut(self, host: str) -> None:
        """Take `host`'s link down: its services stay up but nothing reaches them (a partitioned host)."""
        _ip("-n", self.ns(host), "link", "set", "eth0", "down")

    def close(self) -> None:
        """Kill the processes started here, then delete every namespace made (idempotent)."""
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the process and whatever it started (torchrun's workers)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            _close_pipes(proc)
        self._procs.clear()
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        for folder in self._etc:
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                folder.parent.rmdir()  # /etc/netns, once no namespace has files there
        self._etc.clear()

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
