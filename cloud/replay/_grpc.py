"""The replay table over gRPC for the decoupled mode: `ReplayServer` hosts it, `GrpcReplayClient` speaks `Replay`.

Wire: cloud/replay/proto/strata_replay.proto. Arrays travel as `device.pack_arrays` bytes (never pickle);
whole-table state (for checkpoints and handovers between deployments) streams in chunks, so a table of
any size crosses without hitting gRPC's message limit. Rate-limited calls block in a server thread up
to the caller's timeout, and answer "not inserted" / "not sampled" rather than an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from cloud.replay._proto import strata_replay_pb2 as pb
from cloud.replay._proto import strata_replay_pb2_grpc as pb_grpc
from cloud.replay._tables import (
    ReplayConfig,
    ReplayError,
    ReplayStats,
    ReplayTable,
    SampleBatch,
    Signature,
    load_state_file,
    normalise_signature,
    save_state,
)
from device import WireError, pack_arrays, unpack_arrays
from functions._secure import PLAINTEXT, ServiceTLS, add_health, bind, new_server, open_channel, refusal

_MAX_MESSAGE = 64 << 20
_CHUNK = 1 << 20
_OPTIONS = [("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)]


def _timeout_s(timeout: float | None) -> float:
    return -1.0 if timeout is None else max(float(timeout), 0.0)


def _from_timeout_s(value: float) -> float | None:
    return None if value < 0 else value


class _Servicer(pb_grpc.ReplayServiceServicer):
    def __init__(self, table: ReplayTable) -> None:
        self.table = table

    def Insert(self, request: pb.InsertRequest, context: grpc.ServicerContext) -> pb.InsertReply:
        try:
            _, arrays = unpack_arrays(request.payload)
            ok = self.table.insert(arrays, timeout=_from_timeout_s(request.timeout_s))
        except (ReplayError, WireError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.InsertReply(inserted=ok)

    def Sample(self, request: pb.SampleRequest, context: grpc.ServicerContext) -> pb.SampleReply:
        try:
            batch = self.table.sample(
                request.batch_size, beta=request.beta, timeout=_from_timeout_s(request.timeout_s)
            )
        except ReplayError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if batch is None:
            return pb.SampleReply(sampled=False)
        arrays = {**batch.data, "_keys": batch.keys, "_weights": batch.weights, "_probabilities": batch.probabilities}
        return pb.SampleReply(sampled=True, payload=pack_arrays({}, arrays))

    def UpdatePriorities(
        self, request: pb.UpdatePrioritiesRequest, context: grpc.ServicerContext
    ) -> pb.UpdatePrioritiesReply:
        try:
            _, arrays = unpack_arrays(request.payload)
            self.table.update_priorities(arrays["keys"], arrays["priorities"])
        except (ReplayError, WireError, KeyError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"update_priorities: {exc}")
        return pb.UpdatePrioritiesReply()

    def Info(self, request: pb.InfoRequest, context: grpc.ServicerContext) -> pb.InfoReply:
        s = self.table.stats()
        return pb.InfoReply(
            size=s.size, capacity=s.capacity, inserts=s.inserts, samples=s.samples, nbytes=s.nbytes,
            item_nbytes=s.item_nbytes,
            signature_json=json.dumps({k: [list(shape), dt] for k, (shape, dt) in self.table.signature.items()}),
            config_json=json.dumps(asdict(self.table.config)),
        )

    def Dump(self, request: pb.DumpRequest, context: grpc.ServicerContext) -> Iterator[pb.StateChunk]:
        meta, arrays = self.table.export_state()
        data = pack_arrays(meta, arrays)
        step = request.chunk_bytes or _CHUNK
        for start in range(0, len(data), step):
            yield pb.StateChunk(data=data[start : start + step])

    def Load(self, request_iterator: Iterator[pb.StateChunk], context: grpc.ServicerContext) -> pb.LoadReply:
        data = b"".join(chunk.data for chunk in request_iterator)
        try:
            meta, arrays = unpack_arrays(data)
            self.table.load_state(meta, arrays)
        except (ReplayError, WireError, KeyError) as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.LoadReply(size=self.table.stats().size)


class ReplayServer:
    """A gRPC server hosting one replay table (start it where the decoupled learner can reach it).

    Args:
        signature: Fields of one transition.
        config: The table's configuration.
        address: ``host:port`` to bind; port 0 picks a free one (see `address` after `start`).
        seed: Seed of the table's sampling generator.
        max_workers: Server threads; rate-limited calls hold one each while they wait.
        tls: Mutual TLS and the per-run token (`functions._secure`); plaintext is for loopback only.
    """

    def __init__(
        self,
        signature: Signature,
        config: ReplayConfig,
        *,
        address: str = "127.0.0.1:0",
        seed: int | None = None,
        max_workers: int = 8,
        tls: ServiceTLS = PLAINTEXT,
    ) -> None:
        self._tls = tls.load("replay server")
        host, _, port = address.rpartition(":")
        if not port.isdigit():
            raise ReplayError(f"ReplayServer: address {address!r} is not host:port; use e.g. 127.0.0.1:0")
        self._host, self._port = host.strip("[]"), int(port)
        self.table = ReplayTable.create(signature, config, seed=seed)
        self._server = new_server(self._tls, name="replay server", max_workers=max_workers, options=_OPTIONS)
        pb_grpc.add_ReplayServiceServicer_to_server(_Servicer(self.table), self._server)  # type: ignore[no-untyped-call]
        add_health(self._server, ["strata.replay.v1.ReplayService"])
        self.address = ""

    def start(self) -> ReplayServer:
        """Bind and start serving; `address` then holds the bound ``host:port``."""
        try:
            port = bind(self._server, self._host, self._port, self._tls, call="replay server")
        except BaseException:
            self.table.close()
            raise
        if port == 0:
            raise ReplayError(f"ReplayServer.start: cannot bind {self._host}:{self._port}; pick a free port or use "
                              "port 0")
        self.address = f"{self._host}:{port}"
        self._server.start()
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving and release the table."""
        self._server.stop(grace).wait()
        self.table.close()

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GrpcReplayClient:
    """`Replay` over gRPC: the same calls as `ReplayTable`, answered by a `ReplayServer`.

    Args:
        address: ``host:port`` of the server.
        signature: The signature the caller expects; checked against the server's table on connect.
        config: Optional expected config; if given, checked against the server's as well.
        connect_timeout: Seconds to wait for the server to answer the first call.
        tls: Mutual TLS and the per-run token (`functions._secure`).
    """

    def __init__(
        self,
        address: str,
        *,
        signature: Signature,
        config: ReplayConfig | None = None,
        connect_timeout: float = 10.0,
        tls: ServiceTLS = PLAINTEXT,
    ) -> None:
        self.address = address
        self._tls = tls.load("replay client")
        self._channel = open_channel(address, self._tls, options=_OPTIONS, call="replay client")
        self._stub = pb_grpc.ReplayServiceStub(self._channel)  # type: ignore[no-untyped-call]
        try:
            info = self._stub.Info(pb.InfoRequest(), timeout=connect_timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            from functions._secure import unavailable_hint

            self.close()
            error = self._error(exc)
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # waiting for ready hides why: say both reasons
                error = ReplayError(f"replay server at {address} did not answer within {connect_timeout:g} s: is it "
                                    f"running?{unavailable_hint(self._tls)}")
            raise error from exc
        theirs = {k: (tuple(shape), dt) for k, (shape, dt) in json.loads(info.signature_json).items()}
        ours = normalise_signature(signature)
        if theirs != ours:
            self.close()
            raise ReplayError(
                f"GrpcReplayClient: the server at {address} holds signature {theirs}, the caller expects {ours}; "
                "connect to a server started with the same signature"
            )
        self.signature = ours
        self.config = ReplayConfig(**json.loads(info.config_json))
        if config is not None and config != self.config:
            self.close()
            raise ReplayError(
                f"GrpcReplayClient: the server at {address} runs {self.config}, the caller expects {config}"
            )

    def _call(self, method: Any, request: Any, *, timeout: float | None, wait_for_ready: bool = False) -> Any:
        try:
            return method(request, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as exc:
            raise self._error(exc) from exc

    def _error(self, exc: grpc.RpcError) -> ReplayError:
        code, details = exc.code(), exc.details()
        refused = refusal(exc, tls=self._tls)
        if refused is not None:
            return ReplayError(f"replay server at {self.address}: refused: {refused}")
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
            return ReplayError(details)
        return ReplayError(f"replay server at {self.address}: {code.name}: {details}; is the server running?")

    @staticmethod
    def _deadline(timeout: float | None) -> float | None:
        # The RPC deadline outlives the server-side wait so a "would block" answer arrives as an answer.
        return None if timeout is None else timeout + 30.0

    def insert(self, items: Mapping[str, np.ndarray], *, timeout: float | None = None) -> bool:
        """Append transitions on the server; False if its rate limiter held the call past `timeout`."""
        request = pb.InsertRequest(payload=pack_arrays({}, items), timeout_s=_timeout_s(timeout))
        return bool(self._call(self._stub.Insert, request, timeout=self._deadline(timeout)).inserted)

    def sample(self, batch_size: int, *, beta: float = 1.0, timeout: float | None = None) -> SampleBatch | None:
        """Draw a batch on the server; None if its rate limiter held the call past `timeout`."""
        request = pb.SampleRequest(batch_size=batch_size, beta=beta, timeout_s=_timeout_s(timeout))
        reply = self._call(self._stub.Sample, request, timeout=self._deadline(timeout))
        if not reply.sampled:
            return None
        _, views = unpack_arrays(reply.payload)
        arrays = {name: view.copy() for name, view in views.items()}  # writable, like a local table's batch
        keys = arrays.pop("_keys")
        weights = arrays.pop("_weights")
        probabilities = arrays.pop("_probabilities")
        return SampleBatch(data=arrays, keys=keys, weights=weights, probabilities=probabilities)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Send the learner's new priorities for sampled keys."""
        arrays = {"keys": np.asarray(keys, np.int64), "priorities": np.asarray(priorities, np.float64)}
        payload = pack_arrays({}, arrays)
        self._call(self._stub.UpdatePriorities, pb.UpdatePrioritiesRequest(payload=payload), timeout=30.0)

    def stats(self) -> ReplayStats:
        """Return the server table's counters and memory."""
        i = self._call(self._stub.Info, pb.InfoRequest(), timeout=30.0)
        return ReplayStats(size=i.size, capacity=i.capacity, inserts=i.inserts, samples=i.samples, nbytes=i.nbytes,
                           item_nbytes=i.item_nbytes)

    def export_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Stream the server table's state here."""
        try:
            data = b"".join(c.data for c in self._stub.Dump(pb.DumpRequest(chunk_bytes=_CHUNK), timeout=600.0))
        except grpc.RpcError as exc:
            raise self._error(exc) from exc
        return unpack_arrays(data)

    def load_state(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Stream `export_state` output (from any deployment) into the server's empty table."""
        data = pack_arrays(meta, arrays)
        chunks = (pb.StateChunk(data=data[i : i + _CHUNK]) for i in range(0, len(data), _CHUNK))
        try:
            self._stub.Load(chunks, timeout=600.0)
        except grpc.RpcError as exc:
            raise self._error(exc) from exc

    def checkpoint(self, path: Path) -> Path:
        """Write the server table's contents to `path` on this machine (temp file, then rename)."""
        meta, arrays = self.export_state()
        return save_state(path, meta, arrays)

    def restore(self, path: Path) -> None:
        """Fill the server's empty table from a checkpoint file on this machine."""
        meta, arrays = load_state_file(path)
        self.load_state(meta, arrays)

    def close(self) -> None:
        """Close the channel (the server and its table keep running)."""
        self._channel.close()
