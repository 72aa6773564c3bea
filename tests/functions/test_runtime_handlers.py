"""Handlers the local-runtime tests deploy (imported by worker processes from the source tree; no tests here)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any


def echo(event: Any, context: Any) -> Any:
    print(f"echo handler saw {event!r}")
    return {"event": event, "request_id": context.aws_request_id, "function": context.function_name,
            "memory": context.memory_limit_in_mb, "remaining_ms": context.get_remaining_time_in_millis(),
            "pid": os.getpid(), "arn": context.invoked_function_arn, "version": context.function_version,
            "client_context": getattr(context.client_context, "custom", None)}


def boom(event: Any, context: Any) -> Any:
    print("about to fail", file=sys.stderr)
    raise ValueError(f"boom: {event.get('why', 'no reason')}")


def sleepy(event: Any, context: Any) -> Any:
    time.sleep(float(event.get("s", 1.0)))
    return {"slept": event.get("s", 1.0), "pid": os.getpid()}


def hold(event: Any, context: Any) -> Any:
    """Touch ``event["started"]``, then wait (at most a minute) until ``event["release"]`` exists."""
    Path(event["started"]).touch()
    deadline = time.monotonic() + 60
    while not Path(event["release"]).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"held": True, "pid": os.getpid()}


def exit_now(event: Any, context: Any) -> Any:
    os._exit(3)


def alloc(event: Any, context: Any) -> Any:
    block = bytearray(int(event["mb"]) * 1024 * 1024)
    return {"allocated": len(block)}


def big_response(event: Any, context: Any) -> Any:
    return "x" * (7 * 1024 * 1024)
