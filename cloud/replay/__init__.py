"""Replay: prioritized experience replay tables, in process, in shared memory or behind a gRPC service."""

from cloud.replay._factory import make_replay, start_replay_server
from cloud.replay._tables import Replay, ReplayConfig, ReplayError, ReplayTable

__all__ = [
    "Replay",
    "ReplayConfig",
    "ReplayError",
    "ReplayTable",
    "make_replay",
    "start_replay_server",
]
