"""strata's cloud tier: learners, parameter server, exporter, rollout sources, switcher and the CLI."""

from cloud._colocated import ColocatedConfig, PoolCounters, SharedMemoryVectorEnv
from cloud._control import ControlClient, ControlError, SwitchRefused, list_runs
from cloud._decoupled import DecoupledError, FragmentSource, StalenessGate, make_decoupled_vector_env, start_services
from cloud._distill import DistillConfig, DistillError, DistillResult, distill
from cloud._envs import make_vector_env
from cloud._export import ExportError, export_run
from cloud._paramserver import ParameterServer, ParamServerConfig, ParamServerError
from cloud._ppo import PPOConfig
from cloud._replay import Replay, ReplayConfig, ReplayError, ReplayTable, make_replay, start_replay_server
from cloud._sac import SACConfig, SACResult, SACTrainer, train_sac
from cloud._serverless import ServerlessConfig, ServerlessError, ServerlessRolloutSource, make_serverless_source
from cloud._switcher import RolloutSource, Switcher, SwitchError, SwitchEvent, SwitchRules
from cloud._switching import SwitchingConfig
from cloud._train import TrainResult, train

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
