"""strata's functions tier: env simulators as services (serverless handlers, env service, local runtime)."""

from functions._envservice import (
    EnvService,
    EnvServiceClient,
    EnvServiceConfig,
    EnvServiceError,
    ServiceUnavailableError,
)
from functions._paramclient import ParamClientError, ParameterClient, WeightsHashError

__all__ = [
    "EnvService",
    "EnvServiceClient",
    "EnvServiceConfig",
    "EnvServiceError",
    "ParamClientError",
    "ParameterClient",
    "ServiceUnavailableError",
    "WeightsHashError",
]
