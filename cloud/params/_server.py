"""The parameter server: versioned weights per named policy over gRPC, answered as full snapshot or delta.

Per policy it keeps the last `keep_versions` versions (``name -> numpy array``) and, for clients that
took lossy (int8) deltas, the exact weights each such client was left holding, keyed by their sha256
(bounded LRU). A pull names the client's version and sha256; the server finds those weights, encodes
the latest version against them (`functions._codec.encode_delta`) and sends the delta or the full
snapshot, whichever is smaller on the wire. Because a lossy delta is always taken against what the
client really holds, quantisation error does not accumulate over syncs: each client is off the
latest weights by one quantisation step of one delta at most.

The client lives in `functions._paramclient` so env hosts need neither torch nor this module.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from cloud._errors import CloudError
from device import StrataError, require
from functions._codec import (
    CodecError,
    Weights,
    apply_delta,
    decode_bytes,
    decode_weights,
    encode_delta,
    encode_weights,
    weights_sha256,
)
from functions._secure import PLAINTEXT, ServiceTLS


class ParamServerError(CloudError, ValueError):
    """A push or pull the parameter server refuses (bad version, unknown policy, malformed weights)."""


@dataclass(frozen=True, kw_only=True)
class ParamServerConfig:
    """How the parameter server listens and what it keeps."""

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 0
    """TCP port; 0 picks a free one."""
    keep_versions: int = 8
    """Versions kept per policy to answer deltas against; older clients get a full snapshot."""
    lossy_states: int = 64
    """Client states left by lossy deltas remembered per policy (LRU), so the next delta can build on them."""
    compress: bool = True
    """zlib the payload when that makes it smaller."""
    max_workers: int = 4
    """gRPC handler threads."""
    health_port: int | None = None
    """Also answer grpc.health.v1 in plaintext on this port (nothing else), for probes that speak no TLS; 0 picks
    a free one. None: no such port."""
    tls: ServiceTLS = PLAINTEXT
    """Mutual TLS and the per-run token (`functions._secure`)."""


@dataclass(frozen=True)
class PullAnswer:
    """What `ParameterServer.pull` answers (the gRPC reply carries the same fields)."""

    version: int
    kind: str
    base_version: int
    payload: bytes
    codec: str
    raw_size: int
    sha256: str
    full_size: int


class _Policy:
    def __init__(self) -> None:
        self.versions: OrderedDict[int, tuple[Weights, str]] = OrderedDict()
        self.lossy: OrderedDict[str, tuple[int, Weights]] = OrderedDict()


class ParameterServer:
    """In-process store plus gRPC front (`start()` / `stop()`); `push` and `pull` work without gRPC too."""

    def __init__(self, config: ParamServerConfig | None = None) -> None:
        self.config = config or ParamServerConfig()
        if self.config.keep_versions < 1:
            raise ParamServerError(f"ParameterServer: keep_versions={self.config.keep_versions} must be >= 1")
        from functions._secure import check_listen

        self._tls = self.config.tls.load("parameter server")
        check_listen(self.config.host, self._tls, call="parameter server")
        self._policies: dict[str, _Policy] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        self._health_server: Any = None
        self.port = 0
        self.health_port = 0

    # -- store -------------------------------------------------------------------------------------

    def push(self, policy: str, weights: dict[str, np.ndarray], *, version: int = 0) -> tuple[int, str]:
        """Store `weights` as `version` (0: the next one); return ``(version, sha256)``."""
        if not policy:
            raise ParamServerError("push: policy name is empty; name the policy the weights belong to")
        frozen = {name: np.array(a, copy=True) for name, a in weights.items()}
        for a in frozen.values():
            a.setflags(write=False)
        sha = weights_sha256(frozen)
        with self._lock:
            store = self._policies.setdefault(policy, _Policy())
            latest = next(reversed(store.versions)) if store.versions else 0
            if version == 0:
                version = latest + 1
            if version <= latest:
                raise ParamServerError(f"push: version {version} of policy {policy!r} is not newer than the "
                                       f"latest {latest}; push version 0 to take the next one")
            store.versions[version] = (frozen, sha)
            while len(store.versions) > self.config.keep_versions:
                store.versions.popitem(last=False)
        return version, sha

    def latest(self, policy: str) -> tuple[int, str]:
        """``(version, sha256)`` of the newest weights of `policy`; ``(0, "")`` when unknown."""
        with self._lock:
            store = self._policies.get(policy)
            if store is None or not store.versions:
                return 0, ""
            version = next(reversed(store.versions))
            return version, store.versions[version][1]

    def _pack(self, raw: bytes) -> tuple[bytes, str]:
        if self.config.compress:
            from functions._codec import compress

            packed = compress(raw, "zlib")
            if len(packed) < len(raw):
                return packed, "zlib"
        return raw, ""

    def pull(self, policy: str, *, since_version: int = 0, since_sha256: str = "", lossy: bool = False
             ) -> PullAnswer:
        """Answer a client holding `since_version` (hash `since_sha256`): none, full or a (lossy) delta."""
        with self._lock:
            store = self._policies.get(policy)
            if store is None or not store.versions:
                return PullAnswer(0, "none", 0, b"", "", 0, "", 0)
            version = next(reversed(store.versions))
            target, sha = store.versions[version]
            if since_version >= version:
                return PullAnswer(version, "none", since_version, b"", "", 0, sha, 0)
            base: Weights | None = None
            if since_version in store.versions and store.versions[since_version][1] == since_sha256:
                base = store.versions[since_version][0]
            elif since_sha256 in store.lossy and store.lossy[since_sha256][0] == since_version:
                store.lossy.move_to_end(since_sha256)
                base = store.lossy[since_sha256][1]
        full_raw = encode_weights(target)
        full, full_codec = self._pack(full_raw)
        answer = PullAnswer(version, "full", 0, full, full_codec, len(full_raw), sha, len(full))
        if base is None:
            return answer
        try:
            delta_raw = encode_delta(target, base, lossy=lossy)
        except CodecError:
            return answer  # the tensor layout changed: only a full snapshot can say that
        delta, codec = self._pack(delta_raw)
        if len(delta) >= len(full):
            return answer
        delta_sha = sha
        if lossy:
            rebuilt = apply_delta(base, delta_raw)
            delta_sha = weights_sha256(rebuilt)
            if delta_sha != sha:
                with self._lock:
                    store.lossy[delta_sha] = (version, rebuilt)
                    while len(store.lossy) > self.config.lossy_states:
                        store.lossy.popitem(last=False)
        return PullAnswer(version, "lossy" if lossy else "delta", since_version, delta, codec, len(delta_raw),
                          delta_sha, len(full))

    # -- gRPC --------------------------------------------------------------------------------------

    def start(self) -> ParameterServer:
        """Serve over gRPC; `port` holds the bound port afterwards."""
        require("grpc", extra="cloud", purpose="the parameter server")
        from functions._proto import strata_params_pb2_grpc
        from functions._secure import add_health, bind, new_server, serve_health

        server = new_server(self._tls, name="parameter server", max_workers=self.config.max_workers,
                            options=[("grpc.max_receive_message_length", 256 << 20),
                                     ("grpc.max_send_message_length", 256 << 20)])
        strata_params_pb2_grpc.add_ParameterServerServicer_to_server(  # type: ignore[no-untyped-call]
            _Servicer(self), server)
        health = add_health(server, ["strata.params.v1.ParameterServer"])
        self.port = bind(server, self.config.host, self.config.port, self._tls, call="parameter server")
        if self.port == 0:
            raise ParamServerError(f"ParameterServer.start: cannot bind {self.config.host}:{self.config.port}")
        server.start()
        self._server = server
        if self.config.health_port is not None and health is not None:
            self._health_server = serve_health(health, self.config.host, self.config.health_port,
                                               call="parameter server")
            self.health_port = self._health_server.strata_port
        return self

    @property
    def address(self) -> str:
        """``HOST:PORT`` clients connect to."""
        return f"{self.config.host}:{self.port}"

    def stop(self, grace: float | None = 0.5) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        if self._health_server is not None:
            self._health_server.stop(None)
            self._health_server = None


class _Servicer:
    """Thin adapter from the generated interface to `ParameterServer`."""

    def __init__(self, server: ParameterServer) -> None:
        from functions._proto import strata_params_pb2 as pb

        self._srv = server
        self._pb = pb

    def Push(self, request: Any, context: Any) -> Any:  # gRPC method name
        import grpc

        try:
            weights = decode_weights(decode_bytes(request.weights))
            version, sha = self._srv.push(request.policy, weights, version=int(request.version))
        except (StrataError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return self._pb.PushReply(version=version, sha256=sha)

    def Pull(self, request: Any, context: Any) -> Any:  # gRPC method name
        a = self._srv.pull(request.policy, since_version=int(request.since_version),
                           since_sha256=request.since_sha256, lossy=bool(request.lossy))
        payload = self._pb.Tensors(data=a.payload, codec=a.codec, raw_size=a.raw_size)
        return self._pb.PullReply(version=a.version, kind=a.kind, base_version=a.base_version, payload=payload,
                                  sha256=a.sha256, full_size=a.full_size)

    def Latest(self, request: Any, context: Any) -> Any:  # gRPC method name
        version, sha = self._srv.latest(request.policy)
        return self._pb.LatestReply(version=version, sha256=sha)

