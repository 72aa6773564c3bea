"""strata's device tier: the policy-bundle contract and a numpy-only policy runtime.

The lowest tier: it needs only the standard library, numpy and cryptography, so it runs where
torch and onnxruntime do not, and every other tier can build on it.
"""

from device._config import add_config_arguments, config_from_args, field_docs
from device._deps import require
from device._errors import ConfigError, MissingDependencyError, StrataError
from device._rollout import RolloutBatch
from device._wire import WireError, pack_arrays, unpack_arrays

__all__ = [
    "ConfigError",
    "MissingDependencyError",
    "RolloutBatch",
    "StrataError",
    "WireError",
    "add_config_arguments",
    "config_from_args",
    "field_docs",
    "pack_arrays",
    "require",
    "unpack_arrays",
]
