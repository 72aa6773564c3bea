"""The gRPC env service: K simulators in one process, stepped per env, per batch, or rolled out by the service.

Three ways to use it (schema: functions/proto/strata_env.proto):

    Step(envs=[i])     one env per call: the per-step baseline (one round trip per transition)
    Step(envs=[])      all K envs per call (batched stepping), autoreset "next_step" or "same_step"
    Rollout(F)         the service acts itself with the loaded policy bundle (`device.NumpyExecutor`)
                       for F steps of all K envs and answers one `device.RolloutBatch`, with a
                       (service id, env, seq) id and the acting policy version on every transition

The policy is pushed (`SetPolicy(bundle)`) or pulled from a parameter server by version, where the
learner stores the bundle bytes as the uint8 tensor ``"bundle"`` of the policy's weights.
Tensors travel as `device.pack_arrays` buffers inside ``bytes`` fields, compressed above a size
threshold; nothing is pickled. The standard ``grpc.health.v1`` service is served next to ours.

One lock serialises access to the envs: gRPC runs handlers on a thread pool, and a simulator is
not thread-safe. Clients (`EnvServiceClient`) put a deadline on every call; a call that passes its
deadline or finds the service gone raises `ServiceUnavailableError`, which rollout sources treat as
"this service is dead or hung: re-issue its work elsewhere".
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from device import (
    ObsPipeline,
    RolloutBatch,
    StrataError,
    is_image,
    pack_arrays,
    require,
    space_bounds,
    space_to_json,
    unpack_arrays,
)
from device._kinds import FRAME_STACK, OBS_CODEC, SEED, TRUST
from device._obs_codec import ObsCodec, decode_frames, encode_frames
from device._options import EnvId, Host, HostPort, Integer, Name, Port, Seconds, check_fields, declared
from functions._codec import CodecError, available_codecs, decode_bytes, encode_bytes
from functions._errors import FunctionsError
from functions._lifetime import signals_masked
from functions._secure import PLAINTEXT, ServiceTLS

if TYPE_CHECKING:
    import grpc

    from functions._paramclient import ParameterClient

AUTORESET_MODES = ("next_step", "same_step")


class EnvServiceError(FunctionsError):
    """A request to or a reply from the env service is invalid (the service is up)."""


class ServiceUnavailableError(EnvServiceError):
    """The env service is dead, unreachable or hung past the call's deadline; re-issue the work elsewhere."""


@dataclass(frozen=True, kw_only=True)
class EnvServiceConfig:
    """How `strata envs serve` hosts its simulators."""

    env: str = declared(EnvId(), "CartPole-v1")
    """gymnasium env id each simulator is made from."""
    envs: int = declared(Integer(min=1, max=4096), 8)
    """K: simulators hosted by this service."""
    host: str = declared(Host(), "127.0.0.1")
    """Address to listen on (loopback by default)."""
    port: int = declared(Port(), 0)
    """TCP port; 0 picks a free one (printed on start)."""
    seed: int = declared(SEED, 0)
    """Base seed: env i is reset with seed + i, and policy sampling is seeded from it."""
    max_workers: int = declared(Integer(min=1, max=256), 4)
    """gRPC handler threads."""
    compress_above: int = declared(Integer(min=0, max=1 << 31, unit="bytes"), 65536)
    """Replies whose raw tensors exceed this many bytes are compressed (zlib, or lz4 if installed)."""
    param_server: str = declared(HostPort(empty=True), "")
    """HOST:PORT of a parameter server to pull the policy bundle from (empty: wait for SetPolicy)."""
    policy: str = declared(Name(empty=True), "")
    """Policy name on the parameter server."""
    trust: tuple[str, ...] = declared(TRUST, ())
    """Public keys (PEM) policy bundles must be signed by; empty: bundles are parsed, not verified."""
    health_port: int | None = declared(Port(), None)
    """Also answer grpc.health.v1 in plaintext on this port (and nothing else), for probes that speak no TLS
    (Kubernetes' gRPC probes); 0 picks a free one. None: no such port."""
    tls: ServiceTLS = PLAINTEXT
    """Mutual TLS and the per-run token (`functions._secure`; the --tls-* flags)."""
    frame_stack: int = declared(FRAME_STACK, 1)
    """Observations stacked per step by the observation pipeline (device.ObsPipeline)."""
    obs_codec: str = declared(OBS_CODEC, "raw")
    """Observation codec of the pipeline and of the replies: raw, png, webp, webp:Q, jxl or jxl:Q (Q in 1-100)."""

    @property
    def pipeline(self) -> ObsPipeline:
        """The observation pipeline the service makes its envs with."""
        return ObsPipeline(frame_stack=self.frame_stack, obs_codec=self.obs_codec)

    def __post_init__(self) -> None:
        from device import ConfigError

        check_fields(self)
        try:
            self.pipeline  # noqa: B018  (checks frame_stack and obs_codec together)
        except ConfigError as exc:
            raise EnvServiceError(f"EnvServiceConfig: {exc}") from None
        if bool(self.param_server) != bool(self.policy):
            raise EnvServiceError("EnvServiceConfig: param_server and policy go together (the service pulls POLICY "
                                  "from PARAM_SERVER); pass both --param-server HOST:PORT and --policy NAME, or "
                                  "neither")


def space_from_json(spec: Mapping[str, Any]) -> Any:
    """Rebuild a gymnasium space from the manifest JSON form (`device.space_to_json`)."""
    spaces = require("gymnasium.spaces", extra="functions", purpose="env service spaces")
    if spec.get("type") == "Discrete":
        return spaces.Discrete(int(spec["n"]), start=int(spec.get("start", 0)))
    if spec.get("type") == "Box":
        low, high = space_bounds(spec)
        return spaces.Box(low=low.astype(spec["dtype"]), high=high.astype(spec["dtype"]), dtype=spec["dtype"])
    raise EnvServiceError(f"space_from_json: space type {spec.get('type')!r} is not 'Box' or 'Discrete'")


_OBS_ARRAYS = ("obs", "final_obs")


def encode_tensors(msg_cls: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], *,
                   compress_above: int = 65536, codec: str | None = None, obs_codec: ObsCodec | None = None) -> Any:
    """Pack arrays into a ``Tensors`` message, compressing when the raw size exceeds `compress_above`.

    With an `obs_codec` (not raw), image arrays ``obs`` and ``final_obs`` travel as one frame table
    (`device._obs_codec`), recorded in the header; `decode_tensors` decodes it.
    """
    meta, arrays = dict(meta), dict(arrays)
    if obs_codec is not None and not obs_codec.is_raw and "obs" in arrays:
        obs_shape = tuple(arrays["obs"].shape[1:])
        if is_image(obs_shape, arrays["obs"].dtype):
            names = [n for n in _OBS_ARRAYS if n in arrays]
            frames_meta, frame_arrays = encode_frames({n: arrays.pop(n) for n in names}, obs_codec,
                                                      obs_shape=obs_shape)
            meta["frames"] = frames_meta
            arrays.update(frame_arrays)
            codec = "" if codec is None else codec  # compressed frames: zlib on top would cost time and save nothing
    raw = pack_arrays(meta, arrays)
    return encode_bytes(msg_cls, raw, compress_above=compress_above, codec=codec)


def decode_tensors(msg: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Unpack a ``Tensors`` message into ``(meta, arrays)`` (a frame table decoded into its arrays)."""
    meta, arrays = unpack_arrays(decode_bytes(msg))
    frames = meta.get("frames")
    if frames is not None:
        if not isinstance(frames, Mapping) or not set(frames.get("arrays") or ()) <= set(_OBS_ARRAYS):
            raise EnvServiceError("decode_tensors: the frame table may hold only obs and final_obs")
        decoded = decode_frames(frames, arrays)
        arrays = {k: v for k, v in arrays.items() if not k.startswith("frames:")}
        arrays.update(decoded)
    return meta, arrays


class _Policy:
    """A loaded policy bundle: the numpy executor plus how to turn its outputs into actions."""

    def __init__(self, bundle_bytes: bytes, rng: np.random.Generator, verifier: Any = None) -> None:
        from device import Bundle
        from functions._executors import policy_executor

        self.bundle = verifier.verify(bundle_bytes) if verifier is not None else Bundle.from_bytes(bundle_bytes)
        self.executor = policy_executor(self.bundle)
        self.version = int(self.bundle.manifest.version)
        self.name = str(self.bundle.manifest.policy)
        self.discrete = self.bundle.manifest.action_space.get("type") == "Discrete"
        self.sample = self.discrete and "logits" in self.executor.output_names
        self._rng = rng

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Actions for a batch of observations, and their log-probabilities when sampled."""
        out = self.executor.run({"obs": np.asarray(obs, dtype=np.float32)})
        if not self.sample:
            # A Box policy's graph gives the deterministic (clipped mean) action only: no std to sample from.
            return np.asarray(out["action"]), None
        logits = np.asarray(out["logits"], dtype=np.float64)
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        u = self._rng.random((logits.shape[0], 1))
        actions = (np.cumsum(np.exp(logp), axis=1) < u).sum(axis=1).clip(0, logits.shape[1] - 1)
        return actions.astype(np.int64), logp[np.arange(len(actions)), actions].astype(np.float32)


class EnvService:
    """K gymnasium envs served over gRPC (see the module docstring); `start()`, `stop()`."""

    def __init__(self, config: EnvServiceConfig, *, env_fn: Callable[[], Any] | None = None) -> None:
        if config.envs < 1:
            raise EnvServiceError(f"EnvService: envs={config.envs} must be at least 1")
        gym = require("gymnasium", extra="functions", purpose="the env service")
        from device._obs_pipeline import register_envs

        register_envs()
        if env_fn is None and ":" not in config.env and config.env not in gym.registry:
            raise EnvServiceError(f"EnvService: env {config.env!r} is not a registered gymnasium env id; list them "
                                  "with `python -c 'import gymnasium; gymnasium.pprint_registry()'`")
        from functions._secure import check_listen

        self._tls = config.tls.load("strata envs serve")  # before any env is made: a bad file is one line
        check_listen(config.host, self._tls, call="strata envs serve")
        self.config = config
        self.service_id = f"envsvc-{uuid.uuid4().hex[:8]}"
        from device import make_env

        make = env_fn or (lambda: make_env(config.env, config.pipeline))
        self._envs = [make() for _ in range(config.envs)]
        self.observation_space = self._envs[0].observation_space
        self.action_space = self._envs[0].action_space
        self._obs_dtype = np.dtype(self.observation_space.dtype or np.float32)
        self._obs = np.zeros((config.envs, *self.observation_space.shape), dtype=self._obs_dtype)
        self._needs_reset = np.ones(config.envs, dtype=bool)  # next_step autoreset: reset on the next call
        self._started = np.zeros(config.envs, dtype=bool)
        self._seq = np.zeros(config.envs, dtype=np.int64)
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(config.seed)
        self._policy: _Policy | None = None
        self._verifier: Any = None
        if config.trust:
            from device import TrustStore, Verifier

            # The service is a training-side consumer, not a deployment tier: "any" skips the tier check.
            self._verifier = Verifier(trust=TrustStore.from_paths(config.trust), tier="any")
        self._param_client: ParameterClient | None = None
        self.env_steps = 0
        self._server: grpc.Server | None = None
        self._health: Any = None
        self._health_server: Any = None
        self.port = 0
        self.health_port = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> EnvService:
        """Bind and start serving; `port` holds the bound port afterwards."""
        require("grpc", extra="functions", purpose="the env service")
        from functions._proto import strata_env_pb2_grpc
        from functions._secure import add_health, bind, new_server, serve_health

        server = new_server(self._tls, name="env service", max_workers=self.config.max_workers,
                            options=[("grpc.max_receive_message_length", 64 << 20),
                                     ("grpc.max_send_message_length", 64 << 20)])
        strata_env_pb2_grpc.add_EnvServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _Servicer(self), server)
        self._health = add_health(server, ["strata.env.v1.EnvService"])
        self.port = bind(server, self.config.host, self.config.port, self._tls, call="strata envs serve")
        if self.port == 0:
            server.stop(None)
            raise EnvServiceError(f"EnvService.start: cannot bind {self.config.host}:{self.config.port} (in use, or "
                                  "not an address of this host); pick a free port or pass --port 0")
        server.start()
        self._server = server
        if self.config.health_port is not None and self._health is not None:
            self._health_server = serve_health(self._health, self.config.host, self.config.health_port,
                                               call="strata envs serve")
            self.health_port = self._health_server.strata_port
        if self.config.param_server:
            self.load_from_param_server(self.config.param_server, self.config.policy, min_version=0, wait=False)
        return self

    @property
    def address(self) -> str:
        """``HOST:PORT`` clients connect to."""
        return f"{self.config.host}:{self.port}"

    def stop(self, grace: float | None = 0.5) -> None:
        """Stop serving and close the envs."""
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        if self._health_server is not None:
            self._health_server.stop(None)
            self._health_server = None
        if self._param_client is not None:
            self._param_client.close()
        for env in self._envs:
            env.close()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the server stops (or `timeout` seconds pass)."""
        if self._server is not None:
            self._server.wait_for_termination(timeout)

    # -- policy ------------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """Version of the loaded policy bundle; 0 when none is loaded."""
        return self._policy.version if self._policy is not None else 0

    def load_bundle(self, bundle_bytes: bytes) -> int:
        """Load a policy bundle for `rollout`; return its version."""
        policy = _Policy(bundle_bytes, self._rng, self._verifier)
        with self._lock:
            self._policy = policy
        return policy.version

    def load_from_param_server(self, target: str, policy: str, *, min_version: int, wait: bool = True,
                               timeout_s: float = 10.0) -> int:
        """Pull the policy's bundle from a parameter server (tensor ``"bundle"``); return the loaded version."""
        from functions._paramclient import ParameterClient

        if not policy:
            raise EnvServiceError(f"EnvService: param_server={target!r} needs a policy name; pass --policy NAME")
        if self._param_client is None or self._param_client.target != target or self._param_client.policy != policy:
            if self._param_client is not None:
                self._param_client.close()
            self._param_client = ParameterClient(target, policy=policy, tls=self.config.tls)
        client = self._param_client
        deadline = time.monotonic() + timeout_s
        while True:
            changed = client.update_and_wait(timeout_s=max(0.1, deadline - time.monotonic())) if wait \
                else client.update()
            if changed:
                self._load_from_client(client)
            if not wait or self.policy_version >= max(min_version, 1) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if wait and self.policy_version < max(min_version, 1):
            raise EnvServiceError(f"EnvService: parameter server {target} has no version >= {max(min_version, 1)} "
                                  f"of policy {policy!r} after {timeout_s} s (server at {client.server_version})")
        return self.policy_version

    def _load_from_client(self, client: ParameterClient) -> None:
        weights = client.weights
        if weights is None or "bundle" not in weights:
            raise EnvServiceError(f"EnvService: policy {client.policy!r} on the parameter server has no 'bundle' "
                                  "tensor; push the bundle bytes as a uint8 array named 'bundle'")
        self.load_bundle(weights["bundle"].tobytes())

    def _refresh_policy(self) -> None:
        client = self._param_client
        if client is not None and client.update():
            self._load_from_client(client)

    # -- env stepping ------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset every env (env i with ``seed + i``); return the observations ``[K, *S]``."""
        with self._lock:
            for i, env in enumerate(self._envs):
                obs, _ = env.reset(seed=None if seed is None else seed + i)
                self._obs[i] = obs
            self._needs_reset[:] = False
            self._started[:] = True
            return self._obs.copy()

    def _reset_one(self, i: int) -> None:
        seed = None if self._started[i] else self.config.seed + i
        self._obs[i], _ = self._envs[i].reset(seed=seed)
        self._started[i] = True
        self._needs_reset[i] = False

    def step(self, actions: np.ndarray, envs: Sequence[int] | None = None, *,
             autoreset: str = "next_step") -> dict[str, np.ndarray]:
        """Step `envs` (all when None) with `actions`; gymnasium vector-env semantics of `autoreset`."""
        if autoreset not in AUTORESET_MODES:
            raise EnvServiceError(f"Step: autoreset={autoreset!r} is not one of {AUTORESET_MODES}")
        idx = list(range(len(self._envs))) if not envs else [int(i) for i in envs]
        if any(i < 0 or i >= len(self._envs) for i in idx):
            raise EnvServiceError(f"Step: env indices {idx} out of range for envs={len(self._envs)}")
        if len(actions) != len(idx):
            raise EnvServiceError(f"Step: the length of actions must match the {len(idx)} envs stepped, "
                                  f"got length={len(actions)}")
        n = len(idx)
        rewards = np.zeros(n, dtype=np.float32)
        terms = np.zeros(n, dtype=bool)
        truncs = np.zeros(n, dtype=bool)
        out: dict[str, np.ndarray] = {}
        with self._lock:
            final_obs = np.zeros((n, *self._obs.shape[1:]), dtype=self._obs_dtype) \
                if autoreset == "same_step" else None
            for j, i in enumerate(idx):
                if self._needs_reset[i]:
                    self._reset_one(i)
                    if autoreset == "next_step":
                        continue  # gymnasium NEXT_STEP: this call only resets; reward 0, not done
                a = actions[j]
                obs, r, term, trunc, _ = self._envs[i].step(a.item() if a.ndim == 0 else a)
                self._seq[i] += 1
                rewards[j], terms[j], truncs[j] = r, term, trunc
                self._obs[i] = obs
                if term or trunc:
                    if final_obs is not None:
                        final_obs[j] = obs
                        self._reset_one(i)
                    else:
                        self._needs_reset[i] = True
            self.env_steps += n
            out["obs"] = self._obs[idx]
        out.update(rewards=rewards, terminations=terms, truncations=truncs)
        if final_obs is not None:
            out["final_obs"] = final_obs
        return out

    def rollout(self, steps: int, *, min_version: int = 0) -> RolloutBatch:
        """Act with the loaded policy for `steps` steps of all K envs; return the fragment."""
        if steps < 1:
            raise EnvServiceError(f"Rollout: steps={steps} must be at least 1")
        policy = self._policy
        if policy is None:
            raise EnvServiceError("Rollout: no policy is loaded; call SetPolicy with a bundle or start the "
                                  "service with --param-server HOST:PORT --policy NAME")
        if policy.version < min_version:
            raise EnvServiceError(f"Rollout: loaded policy version {policy.version} is older than "
                                  f"min_version={min_version}; push a newer bundle first")
        k = len(self._envs)
        shape = self._obs.shape[1:]
        obs_buf = np.zeros((steps, k, *shape), dtype=self._obs_dtype)
        final_buf = np.zeros_like(obs_buf)
        act_shape = self.action_space.shape or ()
        act_buf = np.zeros((steps, k, *act_shape), dtype=self.action_space.dtype or np.int64)
        rew = np.zeros((steps, k), dtype=np.float32)
        term = np.zeros((steps, k), dtype=bool)
        trunc = np.zeros((steps, k), dtype=bool)
        logp_buf = np.zeros((steps, k), dtype=np.float32)
        seq = np.zeros((steps, k), dtype=np.int64)
        envs = self._envs
        with self._lock:
            for i in np.flatnonzero(self._needs_reset).tolist():
                self._reset_one(i)
            for t in range(steps):
                obs_buf[t] = self._obs
                actions, logp = policy.act(self._obs)
                act_buf[t] = actions.reshape(act_buf[t].shape)
                if logp is not None:
                    logp_buf[t] = logp
                seq[t] = self._seq
                for i in range(k):
                    a = act_buf[t, i]
                    o, r, te, tr, _ = envs[i].step(a.item() if a.ndim == 0 else a)
                    rew[t, i], term[t, i], trunc[t, i] = r, te, tr
                    if te or tr:
                        final_buf[t, i] = o
                        o, _ = envs[i].reset()
                    self._obs[i] = o
                self._seq += 1
            self.env_steps += steps * k
            next_obs = self._obs.copy()
        return RolloutBatch(
            source=self.service_id, obs=obs_buf, actions=act_buf, rewards=rew, terminations=term,
            truncations=trunc, final_obs=final_buf, next_obs=next_obs,
            policy_version=np.full((steps, k), policy.version, dtype=np.int64),
            worker=np.arange(k, dtype=np.int64), seq=seq,
            logprobs=logp_buf if policy.sample else None,
        )

    def spec(self) -> dict[str, Any]:
        """What `Spec` answers, as a dict."""
        return {"env_id": self.config.env, "num_envs": len(self._envs), "service_id": self.service_id,
                "observation_space": space_to_json(self.observation_space),
                "action_space": space_to_json(self.action_space), "policy_version": self.policy_version}


def _abort_on_error(context: Any, exc: Exception) -> NoReturn:
    import grpc

    code = grpc.StatusCode.FAILED_PRECONDITION if "min_version" in str(exc) or "no policy" in str(exc) \
        else grpc.StatusCode.INVALID_ARGUMENT
    context.abort(code, str(exc))
    raise AssertionError("unreachable: context.abort raises")


class _Servicer:
    """Adapter from the generated servicer interface to `EnvService` (thin: parse, call, encode)."""

    def __init__(self, service: EnvService) -> None:
        from functions._proto import strata_env_pb2 as pb

        self._svc = service
        self._pb = pb

    def _reply(self, arrays: Mapping[str, np.ndarray]) -> Any:
        codec = self._svc.config.pipeline.codec
        return self._pb.StepReply(result=encode_tensors(self._pb.Tensors, {"obs_codec": codec.spec}, arrays,
                                                        compress_above=self._svc.config.compress_above,
                                                        obs_codec=codec))

    def Spec(self, request: Any, context: Any) -> Any:  # gRPC method name
        s = self._svc.spec()
        return self._pb.SpecReply(env_id=s["env_id"], num_envs=s["num_envs"], service_id=s["service_id"],
                                  observation_space=json.dumps(s["observation_space"]),
                                  action_space=json.dumps(s["action_space"]), policy_version=s["policy_version"])

    def Reset(self, request: Any, context: Any) -> Any:  # gRPC method name
        obs = self._svc.reset(int(request.seed) if request.has_seed else None)
        return self._reply({"obs": obs})

    def Step(self, request: Any, context: Any) -> Any:  # gRPC method name
        try:
            _, arrays = decode_tensors(request.actions)
            if "actions" not in arrays:
                raise EnvServiceError("Step: request tensors carry no 'actions' array")
            out = self._svc.step(arrays["actions"], list(request.envs), autoreset=request.autoreset or "next_step")
        except (EnvServiceError, CodecError, ValueError) as exc:
            _abort_on_error(context, exc)
        return self._reply(out)

    def SetPolicy(self, request: Any, context: Any) -> Any:  # gRPC method name
        try:
            if request.bundle:
                version = self._svc.load_bundle(bytes(request.bundle))
            else:
                version = self._svc.load_from_param_server(request.param_server, request.policy,
                                                           min_version=int(request.min_version))
        except (StrataError, ValueError) as exc:
            _abort_on_error(context, exc)
        policy = self._svc._policy
        return self._pb.PolicyReply(policy=policy.name if policy else "", version=version)

    def _rollout(self, request: Any, context: Any) -> Any:
        try:
            if request.refresh_policy:
                self._svc._refresh_policy()
            batch = self._svc.rollout(int(request.steps), min_version=int(request.min_version))
            codec = request.codec or ""
            if codec not in available_codecs():
                raise EnvServiceError(f"Rollout: codec {codec!r} is not available here; use one of "
                                      f"{available_codecs()}")
        except (StrataError, ValueError) as exc:
            _abort_on_error(context, exc)
        tensors = encode_bytes(self._pb.Tensors, batch.to_bytes(self._svc.config.pipeline.codec), codec=codec)
        return self._pb.RolloutReply(batch=tensors, policy_version=int(batch.policy_version[0, 0]))

    def Rollout(self, request: Any, context: Any) -> Any:  # gRPC method name
        return self._rollout(request, context)

    def StreamRollouts(self, request: Any, context: Any) -> Iterator[Any]:  # gRPC method name
        while context.is_active():
            yield self._rollout(request, context)

    def Status(self, request: Any, context: Any) -> Any:  # gRPC method name
        return self._pb.StatusReply(status="SERVING", env_steps=self._svc.env_steps)


# -- client ------------------------------------------------------------------------------------------


class EnvServiceClient:
    """A connection to one env service; every call has a deadline (`timeout_s`)."""

    def __init__(self, target: str, *, timeout_s: float = 5.0, tls: ServiceTLS = PLAINTEXT,
                 server_name: str = "") -> None:
        grpc = require("grpc", extra="functions", purpose="the env service client")
        from functions._proto import strata_env_pb2 as pb
        from functions._proto import strata_env_pb2_grpc
        from functions._secure import open_channel

        self.target = target
        self.timeout_s = timeout_s
        self._grpc = grpc
        self._pb = pb
        self._tls = tls.load("env service client")
        self._channel = open_channel(target, self._tls, call="env service client", server_name=server_name,
                                     options=[("grpc.max_receive_message_length", 64 << 20),
                                              ("grpc.max_send_message_length", 64 << 20)])
        self._stub = strata_env_pb2_grpc.EnvServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._spec: dict[str, Any] | None = None

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def _call(self, name: str, request: Any, timeout_s: float | None = None) -> Any:
        try:
            with signals_masked():
                return getattr(self._stub, name)(request, timeout=timeout_s or self.timeout_s)
        except self._grpc.RpcError as exc:
            raise self._translate(name, exc) from exc

    def _translate(self, name: str, exc: Any) -> EnvServiceError:
        from functions._secure import refusal, unavailable_hint

        code = exc.code()
        refused = refusal(exc, tls=self._tls)
        if refused is not None:
            return EnvServiceError(f"{name} on env service {self.target}: refused: {refused}")
        if code in (self._grpc.StatusCode.DEADLINE_EXCEEDED, self._grpc.StatusCode.UNAVAILABLE,
                    self._grpc.StatusCode.CANCELLED):
            hint = unavailable_hint(self._tls) if "failed to connect" in str(exc.details()) else ""
            return ServiceUnavailableError(f"{name} on env service {self.target}: {code.name} ({exc.details()}); "
                                           f"the service is dead or hung: re-issue the work to another one{hint}")
        return EnvServiceError(f"{name} on env service {self.target}: {exc.details()}")

    def spec(self) -> dict[str, Any]:
        """The service's env id, K, spaces (JSON form), service id and loaded policy version."""
        r = self._call("Spec", self._pb.SpecRequest())
        self._spec = {"env_id": r.env_id, "num_envs": int(r.num_envs), "service_id": r.service_id,
                      "observation_space": json.loads(r.observation_space),
                      "action_space": json.loads(r.action_space), "policy_version": int(r.policy_version)}
        return self._spec

    def health(self, timeout_s: float | None = None) -> bool:
        """True when the standard health service (or our Status rpc) answers SERVING within the deadline."""
        return self.check_health(timeout_s)[0]

    def check_health(self, timeout_s: float | None = None, *, wait_for_ready: bool = True) -> tuple[bool, str]:
        """``(True, "SERVING")``, or ``(False, one line saying why not)``: not serving, refused, unreachable.

        With `wait_for_ready` a channel in reconnect backoff (the service restarted) waits for it up to the
        deadline; without, a refused connection answers at once with its reason.
        """
        try:
            from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped, unused-ignore]
        except ImportError:
            try:
                status = self._call("Status", self._pb.StatusRequest(), timeout_s).status
            except EnvServiceError as exc:
                return False, str(exc)
            return status == "SERVING", str(status)
        try:
            stub = health_pb2_grpc.HealthStub(self._channel)
            with signals_masked():
                reply = stub.Check(health_pb2.HealthCheckRequest(service="strata.env.v1.EnvService"),
                                   timeout=timeout_s or self.timeout_s, wait_for_ready=wait_for_ready)
        except self._grpc.RpcError as exc:
            from functions._secure import refusal, unavailable_hint

            refused = refusal(exc, tls=self._tls)
            if refused is not None:
                return False, f"refused: {refused}"
            hint = unavailable_hint(self._tls) if "failed to connect" in str(exc.details()) else ""
            return False, f"{exc.code().name} ({exc.details()}){hint}"
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return status == "SERVING", status

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset all K envs; return ``[K, *S]`` observations."""
        req = self._pb.ResetRequest(has_seed=seed is not None, seed=seed or 0)
        _, arrays = decode_tensors(self._call("Reset", req).result)
        return arrays["obs"]

    def step_future(self, actions: np.ndarray, envs: Sequence[int] = (), *, autoreset: str = "next_step") -> Any:
        """Start a Step call; finish it with `step_result`."""
        req = self._pb.StepRequest(envs=list(envs), autoreset=autoreset,
                                   actions=encode_tensors(self._pb.Tensors, {}, {"actions": np.asarray(actions)}))
        with signals_masked():
            return self._stub.Step.future(req, timeout=self.timeout_s)

    def step_result(self, future: Any) -> dict[str, np.ndarray]:
        """Wait for a Step call started by `step_future` and decode its arrays."""
        try:
            with signals_masked():
                reply = future.result()
        except self._grpc.RpcError as exc:
            raise self._translate("Step", exc) from exc
        return decode_tensors(reply.result)[1]

    def step(self, actions: np.ndarray, envs: Sequence[int] = (), *, autoreset: str = "next_step"
             ) -> dict[str, np.ndarray]:
        """Step `envs` (all K when empty) with `actions`; see `EnvService.step`."""
        return self.step_result(self.step_future(actions, envs, autoreset=autoreset))

    def step_one(self, env: int, action: Any, *, autoreset: str = "next_step") -> dict[str, np.ndarray]:
        """Step a single env: the per-step baseline (one round trip per transition)."""
        return self.step(np.asarray([action]), [env], autoreset=autoreset)

    def set_policy(self, bundle: bytes | None = None, *, param_server: str = "", policy: str = "",
                   min_version: int = 0) -> int:
        """Push a bundle, or have the service pull one from a parameter server; return the loaded version."""
        req = self._pb.PolicyRequest(bundle=bundle or b"", param_server=param_server, policy=policy,
                                     min_version=min_version)
        return int(self._call("SetPolicy", req, max(self.timeout_s, 10.0)).version)

    def rollout_future(self, steps: int, *, min_version: int = 0, codec: str = "", refresh_policy: bool = False
                       ) -> Any:
        """Start a Rollout call of `steps` steps; finish it with `rollout_result`."""
        req = self._pb.RolloutRequest(steps=steps, min_version=min_version, codec=codec,
                                      refresh_policy=refresh_policy)
        with signals_masked():
            return self._stub.Rollout.future(req, timeout=self.timeout_s)

    def rollout_result(self, future: Any) -> RolloutBatch:
        """Wait for a Rollout call and decode its fragment."""
        try:
            with signals_masked():
                reply = future.result()
        except self._grpc.RpcError as exc:
            raise self._translate("Rollout", exc) from exc
        return RolloutBatch.from_bytes(decode_bytes(reply.batch))

    def rollout(self, steps: int, *, min_version: int = 0, codec: str = "", refresh_policy: bool = False
                ) -> RolloutBatch:
        """One fragment of `steps` steps of all K envs, acted by the service's policy."""
        return self.rollout_result(self.rollout_future(steps, min_version=min_version, codec=codec,
                                                       refresh_policy=refresh_policy))

    def stream_rollouts(self, steps: int, *, codec: str = "", timeout_s: float | None = None
                        ) -> Iterator[RolloutBatch]:
        """Fragments streamed back to back until the caller stops iterating (or `timeout_s` passes)."""
        req = self._pb.RolloutRequest(steps=steps, codec=codec)
        call = self._stub.StreamRollouts(req, timeout=timeout_s)
        try:
            for reply in call:
                yield RolloutBatch.from_bytes(decode_bytes(reply.batch))
        except self._grpc.RpcError as exc:
            if exc.code() != self._grpc.StatusCode.CANCELLED:
                raise self._translate("StreamRollouts", exc) from exc
        finally:
            call.cancel()


def serve(config: EnvServiceConfig, *, duration_s: float = 0.0, announce: Callable[[str], None] | None = None) -> int:
    """Run an env service until interrupted (or for `duration_s` seconds when positive); return 0."""
    import signal

    service = EnvService(config).start()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    say = announce or (lambda line: print(line, flush=True))
    secured = " over mutual TLS" if config.tls.enabled else ""
    say(f"strata env service {service.service_id}: {config.envs} x {config.env}{secured} on {service.address}")
    if config.health_port is not None:
        say(f"strata env service {service.service_id}: grpc.health.v1 (plaintext, health only) on "
            f"{config.host}:{service.health_port}")
    try:
        stop.wait(duration_s if duration_s > 0 else None)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        service.stop()
    return 0


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `strata envs serve` and `strata envs health` to the root parser."""
    from device import add_config_arguments
    from device._config import add_option, command
    from device._options import HostPort, Text
    from functions._secure import ServiceTLS

    envs = sub.add_parser("envs", help="env simulators as gRPC services",
                          description="Host env simulators behind the strata env service (gRPC).")
    envs_sub = envs.add_subparsers(dest="envs_command", metavar="SUBCOMMAND", required=True)
    serve_p = envs_sub.add_parser("serve", help="serve K envs over gRPC until interrupted",
                                  description="Host K gymnasium envs behind gRPC: per-step, batched and "
                                  "rollout-fragment calls, with grpc.health.v1. Prints HOST:PORT when ready.")
    add_config_arguments(serve_p, EnvServiceConfig, skip={"tls"})
    add_config_arguments(serve_p.add_argument_group(TLS_GROUP_TITLE), ServiceTLS)
    add_option(serve_p, "--duration", Seconds(max=10 * 365 * 86400.0), default=0.0,
               help="stop after this many seconds (0: run until interrupted)")
    command(serve_p, check=_serve_check, run=_serve_command)
    health_p = envs_sub.add_parser(
        "health", help="ask an env service whether it is serving (exit 0) or say why not (exit 1)",
        description="Call grpc.health.v1 Check on an env service, with the same --tls-* options as its clients; "
        "prints SERVING and exits 0, or one line saying why not and exits 1 (an exec probe, or a check that a "
        "client without the run's certificate is refused).")
    add_option(health_p, "target", HostPort(), metavar="HOST:PORT", help="address of the env service")
    add_option(health_p, "--timeout", Seconds(max=3600.0, positive=True), default=5.0,
               help="deadline of the check")
    add_option(health_p, "--server-name", Text(max_chars=253, empty=True, what="a DNS name"), default="",
               metavar="NAME", help="name the service's certificate must carry when it is not HOST (default: HOST)")
    add_config_arguments(health_p.add_argument_group(TLS_GROUP_TITLE), ServiceTLS)
    command(health_p, check=_health_check, run=_health_command)


TLS_GROUP_TITLE = ("service-plane security (ServiceTLS; also STRATA_TLS_CA, STRATA_TLS_CERT, STRATA_TLS_KEY, "
                   "STRATA_TLS_TOKEN_FILE, STRATA_INSECURE_PLAINTEXT_OFF_LOOPBACK)")


def _serve_check(args: argparse.Namespace) -> EnvServiceConfig:
    from device import config_from_args
    from functions._secure import service_tls_from_args

    config = config_from_args(EnvServiceConfig, args, tls=service_tls_from_args(args))
    if config.trust:  # the trusted keys are read when the service starts; refuse a bad one before
        from device import TrustStore

        TrustStore.from_paths(config.trust)
    return config


def _serve_command(args: argparse.Namespace, config: EnvServiceConfig) -> int:
    return serve(config, duration_s=args.duration)


def _health_check(args: argparse.Namespace) -> Any:
    from functions._secure import service_tls_from_args

    return service_tls_from_args(args)


def _health_command(args: argparse.Namespace, tls: Any) -> int:
    client = EnvServiceClient(args.target, timeout_s=args.timeout, tls=tls, server_name=args.server_name)
    try:
        ok, why = client.check_health(args.timeout, wait_for_ready=False)
    finally:
        client.close()
    if ok:
        print(f"strata envs health: {args.target}: SERVING")
        return 0
    print(f"strata envs health: {args.target}: {why}", file=sys.stderr)
    return 1
