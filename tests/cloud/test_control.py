"""The control endpoint: loopback only, token-protected, switch refusals answered clearly."""

from __future__ import annotations

import json
import re
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from cloud.switching._control import ControlClient, ControlError, ControlServer, SwitchRefused
from tests._cli import run_strata


class FakeJob:
    """A stand-in for the training job's side of the protocol (the protocol is what is under test)."""

    def __init__(self) -> None:
        self.mode = "colocated"
        self.busy = threading.Lock()

    def status(self) -> dict[str, Any]:
        return {"mode": self.mode}

    def switch(self, to: str, *, reason: str) -> dict[str, Any]:
        if to == self.mode:
            raise SwitchRefused(f"already in mode {to!r}")
        if not self.busy.acquire(blocking=False):
            raise SwitchRefused("a switch is already in progress")
        try:
            previous, self.mode = self.mode, to
            return {"from": previous, "to": to, "reason": reason, "pause_s": 0.0}
        finally:
            self.busy.release()


@pytest.fixture
def served(tmp_path: Path) -> Any:
    job = FakeJob()
    server = ControlServer(tmp_path, job).start()
    yield job, server
    server.stop()


def test_status_and_switch_round_trip(served: Any, tmp_path: Path) -> None:
    job, server = served
    assert server.url.startswith("http://127.0.0.1:")
    client = ControlClient.for_run(tmp_path)
    assert client.status() == {"mode": "colocated"}
    result = client.switch("decoupled")
    assert result["from"] == "colocated" and result["to"] == "decoupled"
    assert job.mode == "decoupled"


def test_token_file_is_private_and_required(served: Any, tmp_path: Path) -> None:
    assert stat.S_IMODE((tmp_path / "control.token").stat().st_mode) == 0o600
    client = ControlClient.for_run(tmp_path)
    with pytest.raises(ControlError, match=re.escape("answered 401: bad or missing token")):
        ControlClient(url=client.url, token="wrong").status()


def test_switch_to_the_active_mode_is_refused(served: Any, tmp_path: Path) -> None:
    with pytest.raises(SwitchRefused, match=re.escape("already in mode 'colocated'")):
        ControlClient.for_run(tmp_path).switch("colocated")


def test_no_job_gives_an_actionable_error(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match=re.escape("control.json is missing")):
        ControlClient.for_run(tmp_path / "nowhere")


class RecordingJob(FakeJob):
    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def switch(self, to: str, *, reason: str) -> dict[str, Any]:
        self.reasons.append(reason)
        return super().switch(to, reason=reason)


def test_the_reason_cannot_forge_log_lines_and_is_capped(tmp_path: Path) -> None:
    job = RecordingJob()
    server = ControlServer(tmp_path, job).start()
    try:
        client = ControlClient.for_run(tmp_path)
        client.switch("decoupled", reason="maintenance\nswitcher: colocated -> evil at step 0\r\x1b[2J")
        client.switch("colocated", reason="x" * 5000)
    finally:
        server.stop()
    assert job.reasons[0] == "maintenance switcher: colocated -> evil at step 0  [2J"
    assert len(job.reasons[1]) == 200 and job.reasons[1].endswith("…")


def test_the_token_is_removed_when_the_job_stops(tmp_path: Path) -> None:
    server = ControlServer(tmp_path, FakeJob()).start()
    assert (tmp_path / "control.token").exists()
    server.stop()
    assert not (tmp_path / "control.token").exists() and not (tmp_path / "control.json").exists()


@pytest.mark.parametrize("url", ["http://192.0.2.7:8080", "https://127.0.0.1:443", "http://example.com:80",
                                 "http://127.0.0.1", "file:///etc/passwd"])
def test_the_client_sends_its_token_to_loopback_only(url: str, tmp_path: Path) -> None:
    (tmp_path / "control.json").write_text(json.dumps({"url": url, "pid": 1}))
    (tmp_path / "control.token").write_text("secret")
    with pytest.raises(ControlError, match=re.escape("which is not an http://127.0.0.1:PORT loopback URL")):
        ControlClient.for_run(tmp_path)
    with pytest.raises(ControlError, match="loopback URL"):
        ControlClient(url=url, token="secret")


@pytest.mark.parametrize(("write", "message"), [
    (lambda d: (d / "control.json").mkdir(), "cannot read"),
    (lambda d: (d / "control.json").write_text("{not json"), "is not a control file of a strata job"),
    (lambda d: (d / "control.json").write_text('{"pid": 3}'), "is not a control file of a strata job"),
])
def test_an_unreadable_control_file_is_a_one_line_error(write: Any, message: str, tmp_path: Path) -> None:
    write(tmp_path)
    (tmp_path / "control.token").write_text("secret")
    with pytest.raises(ControlError, match=re.escape(message)):
        ControlClient.for_run(tmp_path)
    result = run_strata("switch", str(tmp_path), "--to", "decoupled")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
