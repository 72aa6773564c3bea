"""A rollout handler that fails the first time it sees each rollout id (run inside a local-runtime worker)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from functions._handlers import rollout_handler


def fail_once(event: Any, context: Any) -> Any:
    """Raise on a rollout id's first delivery (marked in ``$FLAKY_DIR``), run the real handler afterwards."""
    mark = Path(os.environ["FLAKY_DIR"]) / str(event["rollout_id"])
    if not mark.exists():
        mark.touch()
        raise RuntimeError(f"first delivery of {event['rollout_id']} fails on purpose")
    return rollout_handler(event, context)
