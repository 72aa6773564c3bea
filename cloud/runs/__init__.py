"""Runs: a training run end to end, on the run machinery PPO and SAC share.

The PPO and SAC loops, stop and resume, checkpoints, metrics, control, tuned presets, and export of a run as a
signed bundle.
"""

from cloud.runs._export import ExportResult, distill, export_run
from cloud.runs._run import RunSession, RunSpec, open_run
from cloud.runs._sac_run import SACResult, train_sac
from cloud.runs._train import TrainResult, train

__all__ = [
    "ExportResult",
    "RunSession",
    "RunSpec",
    "SACResult",
    "TrainResult",
    "distill",
    "export_run",
    "open_run",
    "train",
    "train_sac",
]
