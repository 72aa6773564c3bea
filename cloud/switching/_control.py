"""Control endpoint of a running training job: loopback HTTP + JSON, protected by a token in the run dir.

A job started with a run directory writes two files there:

    control.json    {"url": "http://127.0.0.1:PORT", "pid": ..., "started_at": ...}
    control.token   a random secret, mode 0600; every request carries it as a bearer token

Routes (all JSON):

    GET  /v1/status           the job's `status()` dict
    POST /v1/switch {"to": M} blocks until the switch is complete; answers its result dict
                              (409 when a switch is already running or M is already active)

The job supplies the behaviour through `ControlHandlers`; this module only moves requests.
"""

from __future__ import annotations

import hmac
import json
import math
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from cloud._errors import CloudError
from device import write_atomic
from functions._lifetime import pid_alive

CONTROL_FILE = "control.json"
TOKEN_FILE = "control.token"
SWITCHES_FILE = "switches.jsonl"
"""One line per completed switch (`cloud.switching._switcher.SwitchEvent`), appended by the job; the first
line records the initial mode as a switch from nothing."""


class ControlError(CloudError):
    """A control request failed: no job, bad token, refused switch or a lost connection."""


class SwitchRefused(ControlError):
    """The job refused a switch (already in that mode, or another switch is running)."""


class ControlHandlers(Protocol):
    """What a training job exposes to the control endpoint."""

    def status(self) -> dict[str, Any]:
        """Return the job's current status."""
        ...

    def switch(self, to: str, *, reason: str) -> dict[str, Any]:
        """Switch to mode `to`, blocking until done; raise `SwitchRefused` to refuse."""
        ...


REASON_MAX = 200
"""Longest switch reason kept (the rest is cut): it goes into logs and switches.jsonl."""


def sanitise_reason(value: object) -> str:
    """A switch reason fit for a log line: printable characters only (a newline cannot forge a line), capped."""
    text = "".join(c if c.isprintable() else " " for c in str(value)).strip()
    return (text[:REASON_MAX - 1] + "…") if len(text) > REASON_MAX else (text or "requested with strata switch")


def loopback_url(url: object, *, source: Path | str) -> str:
    """`url` if it is ``http://`` to a loopback address; else `ControlError` (the client sends its token there)."""
    import ipaddress
    import urllib.parse

    try:
        parsed = urllib.parse.urlsplit(str(url))
        host, port = parsed.hostname or "", parsed.port
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a bad port or host in a damaged control file
        loopback, port = False, None
    if parsed.scheme != "http" or not loopback or port is None:
        raise ControlError(f"{source} names the endpoint {str(url)[:100]!r}, which is not an http://127.0.0.1:PORT "
                           "loopback URL; the control token is never sent elsewhere. Remove the file if no job runs")
    return str(url)


def _write_private(path: Path, text: str) -> None:
    write_atomic(path, text, mode=0o600, durable=False)


class ControlServer:
    """Serve `handlers` on 127.0.0.1 (an ephemeral port by default) for the job in `run_dir`."""

    def __init__(self, run_dir: Path, handlers: ControlHandlers, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._token = secrets.token_hex(16)
        _write_private(self.run_dir / TOKEN_FILE, self._token)
        token = self._token

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet: the job logs what matters
                return

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                given = self.headers.get("Authorization", "").removeprefix("Bearer ")
                if hmac.compare_digest(given.encode(), token.encode()):
                    return True
                self._reply(401, {"error": "bad or missing token; read it from the run dir's control.token"})
                return False

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path == "/v1/status":
                    self._reply(200, handlers.status())
                else:
                    self._reply(404, {"error": f"no route {self.path!r}; try /v1/status"})

            def do_POST(self) -> None:
                if not self._authorised():
                    return
                if self.path != "/v1/switch":
                    self._reply(404, {"error": f"no route {self.path!r}; try /v1/switch"})
                    return
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                    body = json.loads(self.rfile.read(min(length, 1 << 16)) or b"{}")
                    to = body["to"]
                    if not isinstance(to, str):
                        raise TypeError
                except (ValueError, KeyError, TypeError):
                    self._reply(400, {"error": 'body must be JSON like {"to": "decoupled"}'})
                    return
                try:
                    reason = sanitise_reason(body.get("reason", "requested with strata switch"))
                    self._reply(200, handlers.switch(to, reason=reason))
                except SwitchRefused as exc:
                    self._reply(409, {"error": str(exc)})
                except CloudError as exc:
                    self._reply(400, {"error": str(exc)})

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://{host}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="strata-control", daemon=True)

    def start(self) -> ControlServer:
        """Start serving in a background thread and advertise the endpoint in the run dir."""
        self._thread.start()
        _write_private(self.run_dir / CONTROL_FILE,
                       json.dumps({"url": self.url, "pid": os.getpid(), "started_at": time.time()}))
        return self

    def stop(self) -> None:
        """Stop serving and withdraw the advertisement and the token (a stopped job answers no one)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        (self.run_dir / CONTROL_FILE).unlink(missing_ok=True)
        (self.run_dir / TOKEN_FILE).unlink(missing_ok=True)


class RunStatus:
    """A run's side of the control endpoint: a status snapshot the learner updates, served while the run goes.

    The base for every learner (PPO's `cloud.switching.JobControl` adds live switching); a run without modes to
    switch between answers `strata switch` with `refusal`.
    """

    def __init__(self, run_dir: Path, *, refusal: str = "this run has one mode", **initial: Any) -> None:
        self._run_dir = Path(run_dir)
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {"run_dir": str(run_dir), "state": "starting", **initial}
        self._refusal = refusal
        self._server: ControlServer | None = None

    def start(self) -> RunStatus:
        """Serve the endpoint in the background (advertised in the run dir)."""
        self._server = ControlServer(self._run_dir, self).start()
        return self

    def stop(self) -> None:
        """Stop serving (withdraws the advertisement); a second call does nothing."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def update(self, **values: Any) -> None:
        """Merge fresh figures into the status snapshot (called by the learner after every update)."""
        with self._lock:
            self._status.update(values)

    def status(self) -> dict[str, Any]:
        """The status snapshot."""
        with self._lock:
            return dict(self._status)

    def switch(self, to: str, *, reason: str) -> dict[str, Any]:
        """Refuse: a run of one mode has nothing to switch to."""
        raise SwitchRefused(self._refusal)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect: urllib would send the bearer token on to wherever it points."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclass(frozen=True, kw_only=True)
class ControlClient:
    """Talks to the control endpoint of the job in a run directory."""

    url: str
    token: str

    @classmethod
    def for_run(cls, run_dir: Path) -> ControlClient:
        """Find the endpoint of the job running in `run_dir`."""
        run_dir = Path(run_dir)
        path = run_dir / CONTROL_FILE
        try:
            info = json.loads(_read_small(path))
            path = run_dir / TOKEN_FILE
            token = _read_small(path).decode().strip()
            url = info["url"]
        except FileNotFoundError:
            raise ControlError(f"no running job in {str(run_dir)!r}: {path.name} is missing "
                               "(is `strata train --run-dir` running there?)") from None
        except PermissionError:
            raise ControlError(f"cannot read {path}: permission denied; run this as the user who started the job "
                               "(the token is readable by that user only)") from None
        except OSError as exc:
            raise ControlError(f"cannot read {path}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise ControlError(f"{path} is not a control file of a strata job (bad JSON or no url); remove it "
                               "if no job runs there") from None
        return cls(url=loopback_url(url, source=run_dir / CONTROL_FILE), token=token)

    def __post_init__(self) -> None:
        loopback_url(self.url, source="ControlClient.url")

    def _call(self, method: str, path: str, body: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                result: dict[str, Any] = json.loads(response.read())
                return result
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read() or b"{}").get("error", exc.reason)
            except (ValueError, AttributeError):
                message = exc.reason
            if exc.code == 409:
                raise SwitchRefused(message) from None
            raise ControlError(f"{method} {path} answered {exc.code}: {message}") from None
        except OSError as exc:
            raise ControlError(f"cannot reach the job at {self.url}: {exc} (has it stopped?)") from None

    def status(self, *, timeout: float = 10.0) -> dict[str, Any]:
        """Return the job's status dict."""
        return self._call("GET", "/v1/status", None, timeout)

    def switch(self, to: str, *, timeout: float = 300.0, reason: str | None = None) -> dict[str, Any]:
        """Ask the job to switch to mode `to` (for `reason`, logged sanitised); return once the switch is complete."""
        body = {"to": to} if reason is None else {"to": to, "reason": reason}
        return self._call("POST", "/v1/switch", body, timeout)


def _read_small(path: Path) -> bytes:
    """A control or token file: a regular file of at most 64 KB (OSError otherwise, as for a missing one)."""
    if path.exists() and not path.is_file():
        raise OSError(21, "not a regular file", str(path))
    with path.open("rb") as f:
        data = f.read(65537)
    if len(data) > 65536:
        raise ValueError(f"{path} is over 64 KB")
    return data


def last_record(path: Path, *, having: str | None = None) -> dict[str, Any]:
    """The last complete JSON line of a JSONL file (holding the key `having`, if given); empty when none."""
    if not path.exists():
        return {}
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 65536))
        lines = f.read().splitlines()
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # a line cut by a crash or by the tail window
            continue
        if isinstance(record, dict) and (having is None or having in record):
            return record
    return {}


def _of(value: Any, kind: type) -> Any:
    """`value` when it is of `kind` (an int counts as a float, a bool as neither), else None.

    A damaged log line shows as "-" in `strata runs`, never as a crash.
    """
    if isinstance(value, bool):
        return None
    if kind is float and isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    return value if isinstance(value, kind) else None


def list_runs(root: Path) -> list[dict[str, Any]]:
    """Describe every run directory under `root`: running or stopped, last step, return and version."""
    root = Path(root)
    if not root.is_dir():
        return []
    runs = []
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists():
            continue
        info: dict[str, Any] = {"run": str(run_dir), "state": "stopped"}
        control = run_dir / CONTROL_FILE
        if control.exists():
            try:
                pid = int(json.loads(_read_small(control))["pid"])
                info["state"] = "running" if pid_alive(pid) else "crashed"
            except (ValueError, KeyError, TypeError, OSError):  # unreadable (another user's run) or torn
                info["state"] = "unknown"
        last = last_record(run_dir / "metrics.jsonl", having="charts/mean_return_20")
        switch = last_record(run_dir / SWITCHES_FILE)
        info.update(step=_of(last.get("global_step"), int), version=_of(last.get("policy_version"), int),
                    mean_return=_of(last.get("charts/mean_return_20"), float), mode=_of(switch.get("to_mode"), str))
        runs.append(info)
    return runs
