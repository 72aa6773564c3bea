"""`Progress`: a rich progress bar on a terminal, a plain progress line every few seconds elsewhere."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


class Progress:
    """A rich progress bar on a terminal; otherwise a plain progress line every few seconds."""

    def __init__(self, total: int, done: int, *, enabled: bool, log: Callable[[str], None], env_id: str,
                 every_s: float = 5.0) -> None:
        self.total, self.enabled, self.log, self.env_id, self.every_s = total, enabled, log, env_id, every_s
        self._last_print = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None
        self._done = done

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), TextColumn("[cyan]{task.fields[mode]}"),
                                 BarColumn(), MofNCompleteColumn(), TextColumn("return {task.fields[ret]:>7}"),
                                 TextColumn("{task.fields[sps]:>8} steps/s"), TimeElapsedColumn())
            self._bar.start()
            self._task = self._bar.add_task(f"PPO {self.env_id}", total=self.total, completed=self._done,
                                            ret="-", sps="-", mode="")
        return self

    def update(self, global_step: int, mean_return: float, steps_per_s: float, mode: str = "") -> None:
        """Show the env-step count, the 20-episode mean return, the throughput and the active mode."""
        ret = "-" if np.isnan(mean_return) else f"{mean_return:.1f}"
        if self._bar is not None:
            self._bar.update(self._task, completed=min(global_step, self.total), ret=ret, sps=f"{steps_per_s:,.0f}",
                             mode=mode)
        elif time.perf_counter() - self._last_print >= self.every_s:
            self._last_print = time.perf_counter()
            where = f" [{mode}]" if mode else ""
            self.log(f"train {self.env_id}{where}: step {global_step:,}/{self.total:,}  return(20) {ret}  "
                     f"{steps_per_s:,.0f} steps/s")

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

