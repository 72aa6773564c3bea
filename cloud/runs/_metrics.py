"""Training metrics: one JSON object per line in ``RUN_DIR/metrics.jsonl``, and TensorBoard when it is installed.

Metric names are namespaced as in CleanRL (``charts/episodic_return``, ``losses/pg_loss``,
``perf/env_steps_per_s``); every line also carries ``global_step`` (env steps so far),
``policy_version`` and ``time`` (unix seconds). The file is appended to, so a resumed run continues
the same log.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path
from types import TracebackType
from typing import Any

METRICS_FILE = "metrics.jsonl"
"""Name of the metrics log inside a run dir."""


class MetricsWriter:
    """Append metric records to the run's JSONL file (and TensorBoard event files when available)."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._tb: Any = None
        # TensorBoard is optional: torch's SummaryWriter needs the `tensorboard` package.
        if tensorboard and importlib.util.find_spec("tensorboard") is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    @property
    def tensorboard_enabled(self) -> bool:
        """True when TensorBoard event files are written too."""
        return self._tb is not None

    def log(self, *, global_step: int, policy_version: int, values: dict[str, float]) -> None:
        """Write one record; NaN and infinite values are written as null."""
        record: dict[str, Any] = {"global_step": global_step, "policy_version": policy_version,
                                  "time": round(time.time(), 3)}
        record.update({k: (v if math.isfinite(v) else None) for k, v in values.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in values.items():
                if math.isfinite(value):
                    self._tb.add_scalar(key, value, global_step)

    def close(self) -> None:
        """Flush and close the files."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Return every record of the run's metrics log, in order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
