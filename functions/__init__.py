"""strata's functions tier: env simulators as services (serverless handlers, env service, local runtime)."""

from functions._envservice import (
    EnvService,
    EnvServiceClient,
    EnvServiceConfig,
    EnvServiceError,
    ServiceUnavailableError,
)
from functions._errors import EventError, FunctionsError, RuntimeConfigError, SimulationError
from functions._events import ErrorResult, RolloutRequest, RolloutResult, parse_result, parse_rollout_event
from functions._handlers import ping_handler, rollout_handler
from functions._paramclient import ParamClientError, ParameterClient, WeightsHashError
from functions._runtime import (
    FaultConfig,
    FunctionSource,
    FunctionSpec,
    LocalRuntime,
    RuntimeConfig,
    SourceTreeFunctions,
)

__all__ = [
    "EnvService",
    "EnvServiceClient",
    "EnvServiceConfig",
    "EnvServiceError",
    "ErrorResult",
    "EventError",
    "FaultConfig",
    "FunctionSource",
    "FunctionSpec",
    "FunctionsError",
    "LocalRuntime",
    "ParamClientError",
    "ParameterClient",
    "RolloutRequest",
    "RolloutResult",
    "RuntimeConfig",
    "RuntimeConfigError",
    "ServiceUnavailableError",
    "SimulationError",
    "SourceTreeFunctions",
    "WeightsHashError",
    "parse_result",
    "parse_rollout_event",
    "ping_handler",
    "rollout_handler",
]
