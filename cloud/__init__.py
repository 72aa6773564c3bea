"""strata's cloud tier: learners, parameter server, exporter, rollout sources, switcher and the CLI.

Concerns are subpackages, in a one-way order (a later one may import an earlier one, never the reverse;
`tests/test_layering.py` checks it): `rollout`, `replay`, `params` -> `learners` -> `switching` -> `runs` ->
`hybrid` -> the demo and the CLI. This module is the tier's public surface.
"""

from cloud.learners import DistillConfig, DistillError, DistillResult, ExportError, PPOConfig, SACConfig, SACTrainer
from cloud.params import ParameterServer, ParamServerConfig, ParamServerError
from cloud.replay import Replay, ReplayConfig, ReplayError, ReplayTable, make_replay, start_replay_server
from cloud.rollout import (
    ColocatedConfig,
    DecoupledError,
    FragmentSource,
    PoolCounters,
    RolloutSource,
    ServerlessConfig,
    ServerlessError,
    ServerlessRolloutSource,
    SharedMemoryVectorEnv,
    StalenessGate,
    make_decoupled_vector_env,
    make_serverless_source,
    make_vector_env,
    start_services,
)
from cloud.runs import SACResult, TrainResult, distill, export_run, train, train_sac
from cloud.switching import (
    ControlClient,
    ControlError,
    Switcher,
    SwitchError,
    SwitchEvent,
    SwitchingConfig,
    SwitchRefused,
    SwitchRules,
    list_runs,
)

__all__ = [
    "ColocatedConfig",
    "ControlClient",
    "ControlError",
    "DecoupledError",
    "DistillConfig",
    "DistillError",
    "DistillResult",
    "ExportError",
    "FragmentSource",
    "PPOConfig",
    "ParamServerConfig",
    "ParamServerError",
    "ParameterServer",
    "PoolCounters",
    "Replay",
    "ReplayConfig",
    "ReplayError",
    "ReplayTable",
    "RolloutSource",
    "SACConfig",
    "SACResult",
    "SACTrainer",
    "ServerlessConfig",
    "ServerlessError",
    "ServerlessRolloutSource",
    "SharedMemoryVectorEnv",
    "StalenessGate",
    "SwitchError",
    "SwitchEvent",
    "SwitchRefused",
    "SwitchRules",
    "Switcher",
    "SwitchingConfig",
    "TrainResult",
    "distill",
    "export_run",
    "list_runs",
    "make_decoupled_vector_env",
    "make_replay",
    "make_serverless_source",
    "make_vector_env",
    "start_replay_server",
    "start_services",
    "train",
    "train_sac",
]
