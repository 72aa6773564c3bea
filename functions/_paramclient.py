"""Parameter-server client for env hosts and learners: versioned pulls, delta rebuild, hash check (no torch).

The pattern of Sample Factory's ParameterClient and Acme's VariableClient:

    update()            non-blocking: applies a finished fetch if there is one, and keeps one fetch in
                        flight; never waits on the network
    update_and_wait()   blocking: fetch now and apply before returning

A pull sends the version and the sha256 of the weights the client holds; the server answers
"none" (nothing newer), a full snapshot, or a delta against exactly those weights (lossless, or an
int8-quantised one with ``lossy=True``). The client reloads only when the server's version is newer,
rebuilds the weights, and checks their sha256 against the server's; on a mismatch it raises
`WeightsHashError`, drops its state and asks for a full snapshot next time.
Schema: functions/proto/strata_params.proto; codecs: `functions._codec`.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from device import require
from functions._codec import (
    CodecError,
    Weights,
    apply_delta,
    decode_bytes,
    decode_weights,
    encode_bytes,
    encode_weights,
    weights_sha256,
)
from functions._errors import FunctionsError
from functions._secure import PLAINTEXT, ServiceTLS


class ParamClientError(FunctionsError):
    """A parameter-server call failed (unreachable, deadline passed, or refused)."""


class WeightsHashError(ParamClientError):
    """The weights rebuilt from a pull do not hash to the server's sha256; the next pull is a full snapshot."""


@dataclass
class SyncStats:
    """What a client's pulls cost: bytes on the wire per applied sync, and which kind each was."""

    kinds: Counter[str] = field(default_factory=Counter)
    """Replies by kind: none, full, delta, lossy."""
    payload_bytes: list[int] = field(default_factory=list)
    """Payload bytes of every applied (non-"none") sync."""
    full_bytes: list[int] = field(default_factory=list)
    """What a full snapshot would have cost for the same syncs."""
    hash_mismatches: int = 0
    """Rebuilt weights whose sha256 did not match the server's."""


class ParameterClient:
    """Pulls (and pushes) one named policy's weights from a parameter server at `target` (``HOST:PORT``)."""

    def __init__(self, target: str, *, policy: str, lossy: bool = False, timeout_s: float = 5.0,
                 tls: ServiceTLS = PLAINTEXT) -> None:
        grpc = require("grpc", extra="functions", purpose="the parameter-server client")
        from functions._proto import strata_params_pb2 as pb
        from functions._proto import strata_params_pb2_grpc
        from functions._secure import open_channel

        self.target = target
        self.policy = policy
        self.lossy = lossy
        self.timeout_s = timeout_s
        self._grpc = grpc
        self._pb = pb
        self._tls = tls.load("parameter-server client")
        self._channel = open_channel(target, self._tls, call="parameter-server client",
                                     options=[("grpc.max_receive_message_length", 256 << 20),
                                              ("grpc.max_send_message_length", 256 << 20)])
        self._stub = strata_params_pb2_grpc.ParameterServerStub(self._channel)  # type: ignore[no-untyped-call]
        self.version = 0
        """Version of the weights held; 0 before the first pull."""
        self.weights: Weights | None = None
        self.sha256 = ""
        self.server_version = 0
        """The server's latest version as of the last reply."""
        self.stats = SyncStats()
        self._inflight: Any = None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Cancel a fetch in flight and close the channel."""
        if self._inflight is not None:
            self._inflight.cancel()
        self._channel.close()

    # -- pulling -----------------------------------------------------------------------------------

    def _request(self) -> Any:
        return self._pb.PullRequest(policy=self.policy, since_version=self.version, since_sha256=self.sha256,
                                    lossy=self.lossy)

    def update(self) -> bool:
        """Apply a finished fetch if one is ready and keep one fetch in flight; never blocks.

        Returns:
            True when newer weights were applied by this call.
        """
        with self._lock:
            changed = False
            if self._inflight is not None and self._inflight.done():
                future, self._inflight = self._inflight, None
                changed = self._apply(self._result(future))
            if self._inflight is None:
                self._inflight = self._stub.Pull.future(self._request(), timeout=self.timeout_s)
            return changed

    def update_and_wait(self, timeout_s: float | None = None) -> bool:
        """Fetch and apply the server's latest weights before returning (waits for a fetch in flight first).

        Returns:
            True when newer weights were applied.
        """
        with self._lock:
            changed = False
            if self._inflight is not None:
                future, self._inflight = self._inflight, None
                # A stale in-flight fetch failing is not this call's answer: fetch again below.
                with contextlib.suppress(ParamClientError):
                    changed = self._apply(self._result(future))
            try:
                reply = self._stub.Pull(self._request(), timeout=timeout_s or self.timeout_s)
            except self._grpc.RpcError as exc:
                raise self._error("Pull", exc) from exc
            return self._apply(reply) or changed

    def _result(self, future: Any) -> Any:
        try:
            return future.result()
        except self._grpc.RpcError as exc:
            raise self._error("Pull", exc) from exc

    def _error(self, name: str, exc: Any) -> ParamClientError:
        from functions._secure import refusal, unavailable_hint

        refused = refusal(exc, tls=self._tls)
        if refused is not None:
            return ParamClientError(f"{name} of policy {self.policy!r} on parameter server {self.target}: refused: "
                                    f"{refused}")
        hint = unavailable_hint(self._tls) if "failed to connect" in str(exc.details()) else ""
        return ParamClientError(f"{name} of policy {self.policy!r} on parameter server {self.target}: "
                                f"{exc.code().name} ({exc.details()}); check that the server is running{hint}")

    def _apply(self, reply: Any) -> bool:
        self.server_version = max(self.server_version, int(reply.version))
        self.stats.kinds[reply.kind] += 1
        if reply.kind == "none" or int(reply.version) <= self.version:
            return False  # reload only when the server's version is newer
        payload = decode_bytes(reply.payload)
        if reply.kind == "full":
            weights = decode_weights(payload)
        elif reply.kind in ("delta", "lossy"):
            if self.weights is None or int(reply.base_version) != self.version:
                raise ParamClientError(f"Pull of policy {self.policy!r}: delta against version "
                                       f"{reply.base_version} but this client holds {self.version}")
            try:
                weights = apply_delta(self.weights, payload)
            except CodecError:
                self._drop()
                raise
        else:
            raise ParamClientError(f"Pull of policy {self.policy!r}: unknown reply kind {reply.kind!r}")
        sha = weights_sha256(weights)
        if sha != reply.sha256:
            self.stats.hash_mismatches += 1
            self._drop()
            raise WeightsHashError(f"Pull of policy {self.policy!r} version {reply.version} ({reply.kind}): rebuilt "
                                   f"weights hash to {sha[:16]}..., server says {reply.sha256[:16]}...; "
                                   "state dropped, the next pull fetches a full snapshot")
        self.weights, self.version, self.sha256 = weights, int(reply.version), sha
        self.stats.payload_bytes.append(len(reply.payload.data))
        self.stats.full_bytes.append(int(reply.full_size))
        return True

    def _drop(self) -> None:
        self.weights, self.version, self.sha256 = None, 0, ""

    # -- pushing and asking ------------------------------------------------------------------------

    def push(self, weights: Mapping[str, np.ndarray], *, version: int = 0) -> tuple[int, str]:
        """Store new weights (as the next version when `version` is 0); return ``(version, sha256)``."""
        req = self._pb.PushRequest(policy=self.policy, version=version,
                                   weights=encode_bytes(self._pb.Tensors, encode_weights(weights), codec=""))
        try:
            reply = self._stub.Push(req, timeout=self.timeout_s)
        except self._grpc.RpcError as exc:
            raise self._error("Push", exc) from exc
        return int(reply.version), str(reply.sha256)

    def latest(self) -> tuple[int, str]:
        """The server's latest ``(version, sha256)`` of this policy; ``(0, "")`` when it has none."""
        try:
            reply = self._stub.Latest(self._pb.LatestRequest(policy=self.policy), timeout=self.timeout_s)
        except self._grpc.RpcError as exc:
            raise self._error("Latest", exc) from exc
        return int(reply.version), str(reply.sha256)
