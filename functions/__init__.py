"""strata's functions tier: env simulators as services (serverless handlers, env service, local runtime).

Importing this package loads nothing but this file: a Lambda cold start that imports
`functions._handlers` pays neither for gRPC and protobuf (the env service) nor for the local runtime.
Public names resolve on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from functions._envservice import (
        EnvService,
        EnvServiceClient,
        EnvServiceConfig,
        EnvServiceError,
        ServiceUnavailableError,
    )
    from functions._envstate import (
        EnvState,
        EnvStateCodec,
        Field,
        FieldCodec,
        capture_env_state,
        decode_env_state,
        encode_env_state,
        register_env_codec,
        restore_env_state,
    )
    from functions._errors import EventError, FunctionsError, NoEnvCodecError, RuntimeConfigError, SimulationError
    from functions._events import ErrorResult, RolloutRequest, RolloutResult, parse_result, parse_rollout_event
    from functions._handlers import ping_handler, rollout_handler
    from functions._lambda_api import FunctionSpec
    from functions._paramclient import ParamClientError, ParameterClient, WeightsHashError
    from functions._runtime import (
        FaultConfig,
        FunctionSource,
        LocalRuntime,
        RuntimeConfig,
        SourceTreeFunctions,
    )

_LAZY = {
    "EnvService": "functions._envservice",
    "EnvServiceClient": "functions._envservice",
    "EnvServiceConfig": "functions._envservice",
    "EnvServiceError": "functions._envservice",
    "EnvState": "functions._envstate",
    "EnvStateCodec": "functions._envstate",
    "ErrorResult": "functions._events",
    "EventError": "functions._errors",
    "FaultConfig": "functions._runtime",
    "Field": "functions._envstate",
    "FieldCodec": "functions._envstate",
    "FunctionSource": "functions._runtime",
    "FunctionSpec": "functions._lambda_api",
    "FunctionsError": "functions._errors",
    "LocalRuntime": "functions._runtime",
    "NoEnvCodecError": "functions._errors",
    "ParamClientError": "functions._paramclient",
    "ParameterClient": "functions._paramclient",
    "RolloutRequest": "functions._events",
    "RolloutResult": "functions._events",
    "RuntimeConfig": "functions._runtime",
    "RuntimeConfigError": "functions._errors",
    "ServiceUnavailableError": "functions._envservice",
    "SimulationError": "functions._errors",
    "SourceTreeFunctions": "functions._runtime",
    "WeightsHashError": "functions._paramclient",
    "capture_env_state": "functions._envstate",
    "decode_env_state": "functions._envstate",
    "encode_env_state": "functions._envstate",
    "parse_result": "functions._events",
    "parse_rollout_event": "functions._events",
    "ping_handler": "functions._handlers",
    "register_env_codec": "functions._envstate",
    "restore_env_state": "functions._envstate",
    "rollout_handler": "functions._handlers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'functions' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "EnvService",
    "EnvServiceClient",
    "EnvServiceConfig",
    "EnvServiceError",
    "EnvState",
    "EnvStateCodec",
    "ErrorResult",
    "EventError",
    "FaultConfig",
    "Field",
    "FieldCodec",
    "FunctionSource",
    "FunctionSpec",
    "FunctionsError",
    "LocalRuntime",
    "NoEnvCodecError",
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
    "capture_env_state",
    "decode_env_state",
    "encode_env_state",
    "parse_result",
    "parse_rollout_event",
    "ping_handler",
    "register_env_codec",
    "restore_env_state",
    "rollout_handler",
]
