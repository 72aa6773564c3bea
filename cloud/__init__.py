"""strata's cloud tier: learners, parameter server, exporter, rollout sources, switcher and the CLI."""

from cloud._colocated import ColocatedConfig, PoolCounters, SharedMemoryVectorEnv
from cloud._decoupled import DecoupledError, FragmentSource, StalenessGate, make_decoupled_vector_env, start_services
from cloud._distill import DistillConfig, DistillError, DistillResult, distill
from cloud._envs import make_vector_env
from cloud._export import ExportError, export_run
from cloud._paramserver import ParameterServer, ParamServerConfig, ParamServerError
from cloud._ppo import PPOConfig
from cloud._replay import Replay, ReplayConfig, ReplayError, ReplayTable, make_replay, start_replay_server
from cloud._sac import SACConfig, SACResult, SACTrainer, train_sac
from cloud._serverless import ServerlessConfig, ServerlessError, ServerlessRolloutSource, make_serverless_source
from cloud._train import TrainResult, train

__all__ = [
    "ColocatedConfig",
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
    "SACConfig",
    "SACResult",
    "SACTrainer",
    "ServerlessConfig",
    "ServerlessError",
    "ServerlessRolloutSource",
    "SharedMemoryVectorEnv",
    "StalenessGate",
    "TrainResult",
    "distill",
    "export_run",
    "make_decoupled_vector_env",
    "make_replay",
    "make_serverless_source",
    "make_vector_env",
    "start_replay_server",
    "start_services",
    "train",
    "train_sac",
]
