"""A child started with `child_environment` that calls `watch_parent` exits when its parent is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from functions._lifetime import PARENT_ENV, child_environment, watch_parent

REPO = str(Path(__file__).resolve().parents[2])
CHILD = "from functions._lifetime import watch_parent; import time; watch_parent(); time.sleep(600)"
# The middle process starts the child (which watches it), prints the child's pid, then waits to be killed.
MIDDLE = (f"import subprocess, sys, time; from functions._lifetime import child_environment; "
          f"p = subprocess.Popen([sys.executable, '-c', {CHILD!r}], env=child_environment()); "
          f"print(p.pid, flush=True); time.sleep(600)")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_the_child_exits_when_its_parent_is_killed(signum: int) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE], stdout=subprocess.PIPE, text=True, env=env)
    child = 0
    try:
        assert middle.stdout is not None
        child = int(middle.stdout.readline())
        assert not _gone(child)
        middle.send_signal(signum)
        middle.wait(timeout=60)
        deadline = time.monotonic() + 60  # generous: only a child that ignores its parent's death reaches it
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child), "the child outlived its parent"
    finally:
        if middle.poll() is None:
            middle.kill()
            middle.wait()
        if child and not _gone(child):
            os.kill(child, signal.SIGKILL)
        if middle.stdout is not None:
            middle.stdout.close()


def test_without_the_variable_nothing_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARENT_ENV, raising=False)
    assert watch_parent() is None
    assert child_environment({})[PARENT_ENV] == str(os.getpid())


def test_a_parent_already_gone_triggers_at_once() -> None:
    fired: list[bool] = []
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    thread = watch_parent(dead.pid, on_death=lambda: fired.append(True))
    assert thread is not None
    thread.join(timeout=60)
    assert fired == [True]
