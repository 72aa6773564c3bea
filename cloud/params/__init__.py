"""Params: the parameter server, versioned policy weights that decoupled workers pull (full or as deltas)."""

from cloud.params._server import ParameterServer, ParamServerConfig, ParamServerError

__all__ = [
    "ParamServerConfig",
    "ParamServerError",
    "ParameterServer",
]
