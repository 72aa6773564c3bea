"""The one factory for replay deployments: a table in this process, in shared memory, or behind gRPC."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloud.replay._tables import Replay, ReplayConfig, ReplayKind, ReplayTable, Signature
from device import ConfigError

if TYPE_CHECKING:
    from cloud.replay._grpc import ReplayServer
    from functions._secure import ServiceTLS


def make_replay(
    kind: ReplayKind,
    signature: Signature,
    config: ReplayConfig,
    *,
    seed: int | None = None,
    address: str | None = None,
    tls: ServiceTLS | None = None,
) -> Replay:
    """The one factory for replay deployments.

    Args:
        kind: ``"local"`` (private memory), ``"shared_memory"`` (co-located actors attach by handle) or
            ``"grpc"`` (a client of the `cloud.replay._grpc.ReplayServer` at `address`, decoupled mode).
        signature: Fields of one transition.
        config: Table configuration; for ``"grpc"`` the server's table must have been made with it.
        seed: Seed of the sampling generator (local and shared memory; the gRPC server owns its own).
        address: ``host:port`` of the replay server, for ``"grpc"`` only.
        tls: Mutual TLS and the per-run token of the replay server (``"grpc"`` only; default: plaintext, loopback).
    """
    if kind in ("local", "shared_memory"):
        return ReplayTable.create(signature, config, shared=kind == "shared_memory", seed=seed)
    if kind == "grpc":
        if address is None:
            raise ConfigError("make_replay: kind='grpc' needs address='host:port' of a running replay server")
        from cloud.replay._grpc import GrpcReplayClient
        from functions._secure import PLAINTEXT

        return GrpcReplayClient(address, signature=signature, config=config, tls=tls or PLAINTEXT)
    raise ConfigError(f"make_replay: kind={kind!r} is unknown; use 'local', 'shared_memory' or 'grpc'")


def start_replay_server(
    signature: Signature, config: ReplayConfig, *, address: str = "127.0.0.1:0", seed: int | None = None,
    tls: ServiceTLS | None = None,
) -> ReplayServer:
    """Start a gRPC replay server (decoupled mode) hosting a new table; connect with ``make_replay("grpc", ...)``.

    grpc is imported here, not at module import, so importing the cloud tier stays light.
    """
    from cloud.replay._grpc import ReplayServer
    from functions._secure import PLAINTEXT

    return ReplayServer(signature, config, address=address, seed=seed, tls=tls or PLAINTEXT).start()
