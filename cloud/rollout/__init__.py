"""Rollout: where experience comes from, behind one `RolloutSource` protocol.

Env helpers, the shared-memory env pool, and the co-located, decoupled (gRPC env services) and serverless
(functions) sources; the collector that acts with the learner's policy.
"""

from cloud.rollout._collector import Episode, RolloutCollector
from cloud.rollout._colocated import ColocatedConfig, PoolCounters, SharedMemoryVectorEnv
from cloud.rollout._decoupled import (
    DecoupledError,
    FragmentSource,
    StalenessGate,
    make_decoupled_vector_env,
    start_services,
)
from cloud.rollout._envs import make_vector_env, probe_spaces
from cloud.rollout._serverless import ServerlessConfig, ServerlessError, ServerlessRolloutSource, make_serverless_source
from cloud.rollout._sources import FragmentFeed, RolloutSource, VectorEnvSource

__all__ = [
    "ColocatedConfig",
    "DecoupledError",
    "Episode",
    "FragmentFeed",
    "FragmentSource",
    "PoolCounters",
    "RolloutCollector",
    "RolloutSource",
    "ServerlessConfig",
    "ServerlessError",
    "ServerlessRolloutSource",
    "SharedMemoryVectorEnv",
    "StalenessGate",
    "VectorEnvSource",
    "make_decoupled_vector_env",
    "make_serverless_source",
    "make_vector_env",
    "probe_spaces",
    "start_services",
]
