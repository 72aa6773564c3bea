"""strata's cloud tier: learners, parameter server, exporter, rollout sources, switcher and the CLI."""

from cloud._colocated import ColocatedConfig, PoolCounters, SharedMemoryVectorEnv
from cloud._decoupled import DecoupledError, FragmentSource, StalenessGate, make_decoupled_vector_env, start_services
from cloud._paramserver import ParameterServer, ParamServerConfig, ParamServerError

__all__ = [
    "ColocatedConfig",
    "DecoupledError",
    "FragmentSource",
    "ParamServerConfig",
    "ParamServerError",
    "ParameterServer",
    "PoolCounters",
    "SharedMemoryVectorEnv",
    "StalenessGate",
    "make_decoupled_vector_env",
    "start_services",
]
