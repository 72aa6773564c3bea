"""Learners: PPO and SAC, the export of a policy to verified ONNX, and distillation into micro policies.

Configs, networks, pure losses and updates; torch is imported inside the code that needs it.
"""

from cloud.learners._distill import DistillConfig, DistillError, DistillResult
from cloud.learners._onnx import ExportError, export_onnx, verify_onnx
from cloud.learners._ppo import PPOLearner
from cloud.learners._ppo_config import PPOConfig
from cloud.learners._sac import SACConfig, SACTrainer

__all__ = [
    "DistillConfig",
    "DistillError",
    "DistillResult",
    "ExportError",
    "PPOConfig",
    "PPOLearner",
    "SACConfig",
    "SACTrainer",
    "export_onnx",
    "verify_onnx",
]
