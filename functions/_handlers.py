"""Lambda handlers: thin adapters from a function event to the pure simulator and back to a JSON result.

``rollout_handler(event, context)``:

    event ─> parse_rollout_event ─> resolve the policy (inline | S3 | parameter server | random)
          ─> verify the bundle (device.Verifier, tier "device") ─> device.NumpyExecutor
          ─> decode each stream's carry against its env (functions._envstate; a bad one is an EventError)
          ─> functions._simulate.simulate ─> fragments inline (<= 6 MB) or in S3, carries inline ─> result dict

A bad event, an untrusted bundle or an unknown env is answered with an `ErrorResult` dict (status 200,
no ``X-Amz-Function-Error``); only a bug raises. Heavy imports (gymnasium, boto3) happen on first use,
so a cold start pays only for what the event needs.

Function environment (Lambda configuration):

    STRATA_TRUSTED_KEYS       PEM text of one or more trusted Ed25519 public keys (bundle signers)
    STRATA_TRUSTED_KEYS_PATH  or: os.pathsep-separated paths of .pub files shipped with the function
    STRATA_RESULT_BUCKET      default S3 bucket for results over 6 MB (an event's result.s3_bucket wins)

The verifier uses tier ``"device"``: the function runs the numpy-only device executor, so it accepts
bundles built for ``"device"`` or ``"any"`` and refuses edge-only ones (which may need onnxruntime's
operator set). It keeps no anti-rollback state: a function instance is ephemeral, and the caller,
which picks the version, owns rollback protection.

Warm instances keep envs, verified bundles and executors in module caches, keyed by what makes them
equal (env id + kwargs, bundle sha256), so a warm invocation pays neither for gymnasium.make nor for
signature checks.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from device import BundleError, ConfigError, MissingDependencyError, UnsupportedOperatorError, WireError, require
from functions._envstate import StreamCarry, decode_carry
from functions._errors import EventError, FunctionsError
from functions._events import (
    SYNC_RESPONSE_LIMIT,
    ErrorResult,
    InlinePolicy,
    ParameterServerPolicy,
    PolicyRef,
    RandomPolicy,
    RolloutRequest,
    RolloutResult,
    S3Object,
    S3Policy,
    parse_rollout_event,
)
from functions._simulate import Act, Simulation, action_seed, env_key, make_envs, random_act, simulate

#: Room kept under the 6 MB limit for the JSON around the fragments.
_RESULT_SLACK = 64 * 1024

#: ``resolver(ref) -> bundle bytes`` for parameter-server references; see `register_policy_resolver`.
PolicyResolver = Callable[[ParameterServerPolicy], bytes]

_envs_cache: dict[str, list[Any]] = {}
_policy_cache: dict[str, tuple[Any, int, float | None]] = {}  # sha256 -> (NumpyExecutor, version, expiry)
_verifier_cache: list[Any] = []
_resolvers: list[PolicyResolver] = []


class PolicyUnavailableError(FunctionsError):
    """The event's policy reference cannot be resolved in this function."""


def register_policy_resolver(resolver: PolicyResolver) -> None:
    """Plug in how ``{"kind": "parameter_server"}`` references are fetched (the decoupled tier's client).

    The resolver returns signed bundle bytes for ``(address, version)``; they are verified like any bundle.
    """
    _resolvers[:] = [resolver]


def ping_handler(event: Any, context: Any) -> dict[str, Any]:
    """Answer at once (measures invoke overhead): ``{"ok": true, "echo": event}``."""
    return {"ok": True, "echo": event}


def rollout_handler(event: Any, context: Any) -> dict[str, Any]:
    """Run the rollout the event asks for and return the result dict (see `functions._events`)."""
    started = time.perf_counter()
    rollout_id = event.get("rollout_id") if isinstance(event, Mapping) else None
    rollout_id = rollout_id if isinstance(rollout_id, str) else None
    request_id = str(getattr(context, "aws_request_id", None) or uuid.uuid4())
    try:
        request = parse_rollout_event(event)
    except EventError as exc:
        return ErrorResult.from_event_error(exc, rollout_id).to_dict()
    try:
        envs = _envs(request)
        carries = _carries(request, envs)
        act, version = _policy(request.policy, envs, request.seeds, actions=request.actions, salt=request.seq_base)
        sim = simulate(request, envs, act, policy_version=version, carries=carries)
        return _result(request, sim, request_id=request_id, started=started)
    except EventError as exc:
        return ErrorResult.from_event_error(exc, rollout_id).to_dict()
    except BundleError as exc:
        return ErrorResult(type=type(exc).__name__, message=str(exc), rollout_id=rollout_id,
                           fix="send a bundle signed by a key in the function's STRATA_TRUSTED_KEYS").to_dict()
    except UnsupportedOperatorError as exc:
        return ErrorResult(type=type(exc).__name__, message=str(exc), rollout_id=rollout_id,
                           fix="install onnxruntime with the function (pip install 'strata[images]'), or send a "
                           "policy the device executor runs").to_dict()
    except (FunctionsError, MissingDependencyError, ConfigError) as exc:
        return ErrorResult(type=type(exc).__name__, message=str(exc), rollout_id=rollout_id).to_dict()


def _envs(request: RolloutRequest) -> list[Any]:
    key = f"{env_key(request.env)}#{request.num_envs}"
    envs = _envs_cache.get(key)
    if envs is None:
        envs = make_envs(request.env, request.num_envs)
        _envs_cache[key] = envs
    return envs


def _carries(request: RolloutRequest, envs: list[Any]) -> list[StreamCarry | None] | None:
    if request.carry is None:
        return None
    out: list[StreamCarry | None] = []
    for i, (blob, env) in enumerate(zip(request.carry, envs, strict=True)):
        if blob is None:
            out.append(None)
            continue
        try:
            out.append(decode_carry(blob, env))
        except WireError as exc:
            raise EventError(f"carry[{i}]", str(exc), "send the carry the previous invocation of this stream "
                             "returned, unchanged, with the same env id and kwargs (or null to start afresh)") from exc
    return out


def _policy(ref: PolicyRef, envs: list[Any], seeds: tuple[int, ...], *, actions: str = "greedy", salt: int = 0
            ) -> tuple[Act, int]:
    if isinstance(ref, RandomPolicy):
        return random_act(envs, seeds, salt=salt), 0
    if isinstance(ref, InlinePolicy):
        data = ref.bundle
    elif isinstance(ref, S3Policy):
        data = _s3_get(ref)
    else:
        if not _resolvers:
            raise PolicyUnavailableError(
                f"rollout_handler: policy reference kind 'parameter_server' ({ref.address}, v{ref.version}) "
                "has no resolver in this function; register one with "
                "functions._handlers.register_policy_resolver, or send an inline or s3 bundle")
        data = _resolvers[0](ref)
    digest = hashlib.sha256(data).hexdigest()
    cached = _policy_cache.get(digest)
    if cached is None or (cached[2] is not None and time.time() >= cached[2]):
        from functions._executors import policy_executor

        bundle = _verifier().verify(data, allow_current=True)
        cached = (policy_executor(bundle), bundle.manifest.version, bundle.manifest.expires_at)
        _policy_cache[digest] = cached
    executor, version = cached[0], cached[1]
    if actions == "greedy":
        return executor.act, version
    if "logits" not in executor.output_names:
        raise EventError("actions", "'sample' needs a Discrete policy whose bundle has a 'logits' output; "
                         f"this one has {list(executor.output_names)}", "send actions 'greedy' for this policy")
    return sample_from_logits(executor, seeds, salt=salt), version


def sample_from_logits(executor: Any, seeds: tuple[int, ...], *, salt: int = 0) -> Act:
    """An ``act`` drawing each stream's action from the policy's logits (Gumbel-max), seeded by `seeds` (+ `salt`)."""
    rng = np.random.default_rng(action_seed(seeds, salt))

    def act(obs: np.ndarray) -> np.ndarray:
        logits = executor.run({"obs": np.asarray(obs, dtype=np.float32)})["logits"]
        gumbel = -np.log(-np.log(rng.uniform(1e-12, 1.0, size=logits.shape)))
        return np.asarray(np.argmax(logits + gumbel, axis=-1), dtype=np.int64)

    return act


def _verifier() -> Any:
    if _verifier_cache:
        return _verifier_cache[0]
    from device import KeyFileError, PublicKey, TrustStore, Verifier, load_public_key
    from device._keys import parse_public_keys

    keys: list[PublicKey] = []
    pem = os.environ.get("STRATA_TRUSTED_KEYS", "")
    try:  # the one trust-anchor parser: Ed25519 public keys only, a private key refused
        if pem.strip():
            keys += parse_public_keys(pem, source="STRATA_TRUSTED_KEYS")
        for path in filter(None, os.environ.get("STRATA_TRUSTED_KEYS_PATH", "").split(os.pathsep)):
            keys.append(load_public_key(path))
    except KeyFileError as exc:
        raise PolicyUnavailableError(f"rollout_handler: {exc}") from None
    if not keys:
        raise PolicyUnavailableError("rollout_handler: no trusted signing key is configured, so no bundle can "
                                     "be verified; set STRATA_TRUSTED_KEYS (PEM) or STRATA_TRUSTED_KEYS_PATH in "
                                     "the function's environment")
    verifier = Verifier(trust=TrustStore(keys), tier="device")
    _verifier_cache.append(verifier)
    return verifier


def reset_caches() -> None:
    """Forget cached envs, policies and the verifier (tests; a changed STRATA_TRUSTED_KEYS)."""
    for envs in _envs_cache.values():
        for env in envs:
            env.close()
    _envs_cache.clear()
    _policy_cache.clear()
    _verifier_cache.clear()


def _s3() -> Any:
    # boto3 is in every AWS Lambda Python runtime; elsewhere the [infra] extra installs it.
    boto3 = require("boto3", extra="infra", purpose="S3 policy references and large results")
    return boto3.client("s3", region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                        or "us-east-1")


def _s3_get(ref: S3Policy) -> bytes:
    kwargs = {"Bucket": ref.bucket, "Key": ref.key}
    if ref.version_id is not None:
        kwargs["VersionId"] = ref.version_id
    try:
        return bytes(_s3().get_object(**kwargs)["Body"].read())
    except MissingDependencyError:
        raise
    except Exception as exc:  # botocore's ClientError and connection errors; report them as a result
        raise PolicyUnavailableError(f"rollout_handler: cannot read policy s3://{ref.bucket}/{ref.key}: "
                                     f"{type(exc).__name__}: {exc}; check the reference and the function's "
                                     "S3 permissions") from exc


def _result(request: RolloutRequest, sim: Simulation, *, request_id: str, started: float) -> dict[str, Any]:
    blobs = tuple(f.to_bytes(request.env.pipeline.codec) for f in sim.fragments)
    common: dict[str, Any] = {
        "rollout_id": request.rollout_id, "request_id": request_id,
        "policy_version": int(sim.fragments[0].policy_version[0, 0]) if sim.fragments else 0,
        "num_envs": request.num_envs, "steps": sim.steps, "transitions": sim.steps * request.num_envs,
        "episodes": sim.episodes, "episode_returns": sim.episode_returns, "obs_codec": request.env.pipeline.obs_codec,
        "carry": sim.carries, "carry_note": sim.carry_note}
    # Carries always travel inline: they count against the limit whether or not the fragments go to S3.
    carry_size = sum(4 * ((len(c) + 2) // 3) + 4 for c in sim.carries or () if c is not None)
    if carry_size > SYNC_RESPONSE_LIMIT - _RESULT_SLACK:
        raise EventError("carry", f"the streams' carries are ~{carry_size} bytes, over Lambda's 6 MB response limit",
                         "send fewer env streams per invocation")
    encoded_size = sum(4 * ((len(b) + 2) // 3) for b in blobs) + 16 * len(sim.episode_returns) + carry_size
    sink = request.result
    to_s3 = sink.mode == "s3" or (sink.mode == "auto" and encoded_size > SYNC_RESPONSE_LIMIT - _RESULT_SLACK)
    if not to_s3:
        if encoded_size > SYNC_RESPONSE_LIMIT - _RESULT_SLACK:
            raise EventError("result.mode", f"the result is ~{encoded_size} bytes, over Lambda's 6 MB response "
                             "limit, and mode is 'inline'", "send mode 'auto' with an s3_bucket, or fewer steps")
        return RolloutResult(**common, duration_s=time.perf_counter() - started, fragments=blobs).to_dict()
    bucket = sink.s3_bucket or os.environ.get("STRATA_RESULT_BUCKET")
    if not bucket:
        raise EventError("result.s3_bucket", f"the result is ~{encoded_size} bytes (over 6 MB) or mode is 's3', "
                         "but no bucket is known", "send result.s3_bucket or set STRATA_RESULT_BUCKET on the function")
    client = _s3()
    # Each delivery writes under its own request id: an at-least-once duplicate never overwrites a result a
    # consumer may be reading, and the consumer keeps one result per rollout id.
    base = f"{sink.s3_prefix}{request.rollout_id}/{request_id}"
    refs = []
    for k, blob in enumerate(blobs):
        key = f"{base}/{k:06d}.bin"
        client.put_object(Bucket=bucket, Key=key, Body=blob)
        refs.append(S3Object(bucket=bucket, key=key))
    result = RolloutResult(**common, duration_s=time.perf_counter() - started, fragment_refs=tuple(refs)).to_dict()
    # The JSON marker is written last: its presence means every fragment object is complete.
    client.put_object(Bucket=bucket, Key=f"{base}.json", Body=json.dumps(result).encode())
    return result


def encode_bundle(data: bytes) -> str:
    """Base64 text of bundle bytes, for ``{"kind": "inline", "bundle_b64": ...}``."""
    return base64.b64encode(data).decode("ascii")
