"""The control endpoint: loopback only, token-protected, switch refusals answered clearly."""

from __future__ import annotations

import re
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from cloud._control import ControlClient, ControlError, ControlServer, SwitchRefused


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
