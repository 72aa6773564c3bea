"""The function-event contract: the JSON a rollout function accepts and the JSON it returns.

This module is the one place the contract lives. Producers (the serverless rollout source) build
events with `RolloutRequest.to_event`; the handler parses them with `parse_rollout_event`, which
raises `EventError` naming the field and the fix, so a bad event becomes an error result, never a
crash. Results travel back as `RolloutResult.to_dict` / `ErrorResult.to_dict`, read by `parse_result`.

Rollout event (JSON object; ``?`` marks optional fields)::

    {"rollout_id": "r-0001",                  de-duplication key chosen by the caller (1-128 chars)
     "env": {"id": "CartPole-v1", "kwargs"?: {...},
             "frame_stack"?: 1, "obs_codec"?: "raw"},   the observation pipeline (device._obs_pipeline): frames
                                               stacked per step, and the codec image observations travel with
                                               (png, webp, webp:90, jxl, jxl:90; a lossy one is applied where
                                               the frames are made, so the policy acts on the decoded frames)
     "num_envs"?: 1,                           env streams stepped in lockstep (1-1024)
     "seed"?: 0 | "seeds"?: [0, 1, ...],       base seed (env i gets seed + i) or one seed per env
     "steps": 128 | "episodes": 4,             steps per env, or complete episodes in total (exactly one)
     "max_steps"?: 100000,                     cap on steps per env in episodes mode
     "fragment_length"?: <steps>,              time steps per returned RolloutBatch fragment
     "policy": {"kind": "inline", "bundle_b64": "..."}            signed bundle bytes, base64 (<= 4 MB)
             | {"kind": "s3", "bucket": "b", "key": "k", "version_id"?: "..."}
             | {"kind": "parameter_server", "address": "host:port", "version": 7}
             | {"kind": "random"},             uniform random actions (smoke tests, benchmarks)
     "actions"?: "greedy" | "sample",          greedy: the bundle's "action" output; sample: draw from its
                                               "logits" (Discrete policies; what an on-policy learner needs),
                                               seeded by the streams' seeds so a redelivery repeats itself
     "source"?: "functions",                   transition id source name
     "stream_base"?: 0,                        env stream i is worker id stream_base + i
     "seq_base"?: 0,                           seq of every stream's first transition (a continued stream counts on)
     "carry"?: [null | "<base64>", ...],       per env stream: the running episode to continue (a carry an earlier
                                               invocation returned), or null to reset with the stream's seed;
                                               sending the field (even all nulls) asks for the carries back
     "result"?: {"s3_bucket"?: "b", "s3_prefix"?: "rollouts/", "mode"?: "auto" | "inline" | "s3"}}

Result (one JSON object)::

    {"ok": true, "rollout_id": ..., "request_id": ..., "policy_version": 3, "num_envs": N, "steps": T,
     "transitions": N*T, "episodes": k, "episode_returns": [...], "duration_s": 0.01,
     "encoding": "strata.rollout_batch.v1+base64", "obs_codec": "raw",
     "fragments": ["<RolloutBatch.to_bytes(codec) base64>", ...]                  inline, or
     "fragment_refs": [{"bucket": "b", "key": "rollouts/r-0001/000000.bin"}, ...],  when over 6 MB
     "carry"?: [null | "<base64>", ...],       when asked: each stream's running episode at the end (null: the
                                               env has no env-state codec, see functions._envstate)
     "carry_note"?: "..."}                     why carries are null (one line: how to register a codec)

A carry (`functions._envstate.encode_carry`) is a raw-array message: the env's state layer by layer
(arrays + JSON scalars, never pickle), the stream's next observation and its running episode return
and length. It always travels inline: it counts against the 6 MB limits of the event and of the result
(a result over the limit sends its fragments to S3 and keeps the carries).

    {"ok": false, "rollout_id": ... | null, "error": {"type": "EventError", "field": "steps",
     "message": "...", "fix": "..."}}

Every transition in a fragment carries its id ``(source, worker, seq)`` (see `device.RolloutBatch`);
a redelivered event with the same ``rollout_id`` and ``stream_base`` yields the same ids, which is
what lets consumers drop duplicates.

The ``parameter_server`` policy kind is part of the contract but resolved by a plug-in: the handler
answers it with a ``PolicyUnavailable`` error result until a resolver is registered with
`functions._handlers.register_policy_resolver` (the decoupled-training engineer's parameter-server client).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from device import ConfigError, ObsPipeline
from functions._errors import EventError

#: Encoding tag of the fragments in a result.
ENCODING = "strata.rollout_batch.v1+base64"
#: Lambda's synchronous response limit; a result larger than this is written to S3.
SYNC_RESPONSE_LIMIT = 6 * 1024 * 1024
#: Largest inline bundle (base64 characters): leaves room in a 6 MB request for the rest of the event.
INLINE_BUNDLE_LIMIT = 4 * 1024 * 1024
MAX_NUM_ENVS = 1024
MAX_STEPS = 1_000_000
POLICY_KINDS = ("inline", "s3", "parameter_server", "random")
RESULT_MODES = ("auto", "inline", "s3")

JSONDict: TypeAlias = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """Which gymnasium environment to make."""

    id: str
    """Registered gymnasium id, e.g. ``"CartPole-v1"``."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make`` (JSON values)."""
    pipeline: ObsPipeline = field(default_factory=ObsPipeline)
    """Frame stacking and the observation codec (also the codec of the result's fragments)."""


@dataclass(frozen=True, kw_only=True)
class InlinePolicy:
    """A signed policy bundle carried in the event itself (small bundles)."""

    bundle: bytes
    """`device.Bundle.to_bytes()` of the policy."""
    kind: Literal["inline"] = "inline"


@dataclass(frozen=True, kw_only=True)
class S3Policy:
    """A signed policy bundle stored as an S3 object."""

    bucket: str
    """Bucket name."""
    key: str
    """Object key."""
    version_id: str | None = None
    """S3 object version, to pin an exact upload."""
    kind: Literal["s3"] = "s3"


@dataclass(frozen=True, kw_only=True)
class ParameterServerPolicy:
    """A policy version to fetch from the parameter server (resolved by a registered resolver)."""

    address: str
    """``host:port`` of the parameter server."""
    version: int
    """Policy version to fetch (>= 1)."""
    kind: Literal["parameter_server"] = "parameter_server"


@dataclass(frozen=True, kw_only=True)
class RandomPolicy:
    """Uniformly random actions from the env's action space (no bundle; version 0)."""

    kind: Literal["random"] = "random"


PolicyRef: TypeAlias = InlinePolicy | S3Policy | ParameterServerPolicy | RandomPolicy


@dataclass(frozen=True, kw_only=True)
class ResultSink:
    """Where a result goes when it is over the synchronous limit (or always, in ``"s3"`` mode)."""

    mode: Literal["auto", "inline", "s3"] = "auto"
    """``auto``: inline up to 6 MB, else S3; ``inline``: never S3 (too large is an error); ``s3``: always S3."""
    s3_bucket: str | None = None
    """Bucket for large results; falls back to the function's ``STRATA_RESULT_BUCKET`` environment variable."""
    s3_prefix: str = "rollouts/"
    """Key prefix; objects are ``<prefix><rollout_id>/<fragment:06d>.bin``."""


@dataclass(frozen=True, kw_only=True)
class RolloutRequest:
    """A validated rollout event (see the module docstring for the JSON form)."""

    rollout_id: str
    """De-duplication key chosen by the caller."""
    env: EnvSpec
    """Environment to simulate."""
    policy: PolicyRef
    """Policy that chooses the actions."""
    num_envs: int = 1
    """Env streams stepped in lockstep."""
    seeds: tuple[int, ...] = (0,)
    """One reset seed per env stream."""
    steps: int | None = None
    """Steps per env stream (steps mode)."""
    episodes: int | None = None
    """Complete episodes to collect across all streams (episodes mode)."""
    max_steps: int = 100_000
    """Cap on steps per env stream in episodes mode."""
    fragment_length: int | None = None
    """Time steps per returned fragment; None means one fragment."""
    actions: Literal["greedy", "sample"] = "greedy"
    """``greedy``: the policy's deterministic action; ``sample``: drawn from its logits."""
    source: str = "functions"
    """Source name in every transition id."""
    stream_base: int = 0
    """Worker id of env stream 0; stream i is ``stream_base + i``."""
    seq_base: int = 0
    """``seq`` of every stream's first transition in this rollout."""
    carry: tuple[bytes | None, ...] | None = None
    """Per env stream, an encoded carry to continue from (None: reset); None: no carries asked for."""
    result: ResultSink = field(default_factory=ResultSink)
    """Where large results go."""

    def to_event(self) -> JSONDict:
        """The JSON event for this request (what `parse_rollout_event` accepts)."""
        env: JSONDict = {"id": self.env.id, "kwargs": dict(self.env.kwargs)}
        if self.env.pipeline != ObsPipeline():
            env.update(self.env.pipeline.to_json())
        event: JSONDict = {"rollout_id": self.rollout_id, "env": env,
                           "num_envs": self.num_envs, "seeds": list(self.seeds),
                           "policy": policy_to_json(self.policy), "actions": self.actions, "source": self.source,
                           "stream_base": self.stream_base, "max_steps": self.max_steps,
                           "result": {"mode": self.result.mode, "s3_prefix": self.result.s3_prefix}}
        if self.steps is not None:
            event["steps"] = self.steps
        if self.episodes is not None:
            event["episodes"] = self.episodes
        if self.fragment_length is not None:
            event["fragment_length"] = self.fragment_length
        if self.result.s3_bucket is not None:
            event["result"]["s3_bucket"] = self.result.s3_bucket
        if self.seq_base:
            event["seq_base"] = self.seq_base
        if self.carry is not None:
            event["carry"] = encode_carries(self.carry)
        return event


def encode_carries(carries: tuple[bytes | None, ...]) -> list[str | None]:
    """The JSON form of per-stream carries (base64, null for none)."""
    return [None if c is None else base64.b64encode(c).decode("ascii") for c in carries]


def _decode_carries(value: object, where: str, count: int | None) -> tuple[bytes | None, ...]:
    fix = "send, per env stream, null or the carry string an earlier invocation for that stream returned"
    if not isinstance(value, list) or (count is not None and len(value) != count):
        raise EventError(where, f"must be a list of {'num_envs=' + str(count) if count else 'per-stream'} entries, "
                         f"got {str(value)[:80]!r}", fix)
    out: list[bytes | None] = []
    for i, item in enumerate(value):
        if item is None:
            out.append(None)
            continue
        if not isinstance(item, str):
            raise EventError(f"{where}[{i}]", f"must be null or a base64 string, got {type(item).__name__}", fix)
        try:
            out.append(base64.b64decode(item, validate=True))
        except binascii.Error as exc:
            raise EventError(f"{where}[{i}]", f"is not valid base64 ({exc})", fix) from exc
    return tuple(out)


def policy_to_json(policy: PolicyRef) -> JSONDict:
    """The JSON form of a policy reference."""
    if isinstance(policy, InlinePolicy):
        return {"kind": "inline", "bundle_b64": base64.b64encode(policy.bundle).decode("ascii")}
    if isinstance(policy, S3Policy):
        out: JSONDict = {"kind": "s3", "bucket": policy.bucket, "key": policy.key}
        if policy.version_id is not None:
            out["version_id"] = policy.version_id
        return out
    if isinstance(policy, ParameterServerPolicy):
        return {"kind": "parameter_server", "address": policy.address, "version": policy.version}
    return {"kind": "random"}


@dataclass(frozen=True, kw_only=True)
class S3Object:
    """A reference to one S3 object."""

    bucket: str
    key: str


@dataclass(frozen=True, kw_only=True)
class RolloutResult:
    """A successful rollout: fragments inline, or references to them in S3."""

    rollout_id: str
    request_id: str
    policy_version: int
    num_envs: int
    steps: int
    transitions: int
    episodes: int
    episode_returns: tuple[float, ...]
    duration_s: float
    fragments: tuple[bytes, ...] = ()
    """`device.RolloutBatch.to_bytes()` of each fragment (empty when `fragment_refs` is used)."""
    fragment_refs: tuple[S3Object, ...] = ()
    """Where the fragments are when the result went to S3."""
    carry: tuple[bytes | None, ...] | None = None
    """Each stream's running episode at the end (None entries: no codec); None when not asked for."""
    carry_note: str | None = None
    """Why the carries are None (the env has no env-state codec)."""
    obs_codec: str = "raw"
    """The observation codec of the fragments (each fragment's header records it too)."""

    def to_dict(self) -> JSONDict:
        """The JSON result."""
        out: JSONDict = {"ok": True, "rollout_id": self.rollout_id, "request_id": self.request_id,
                         "policy_version": self.policy_version, "num_envs": self.num_envs, "steps": self.steps,
                         "transitions": self.transitions, "episodes": self.episodes,
                         "episode_returns": list(self.episode_returns), "duration_s": self.duration_s,
                         "encoding": ENCODING, "obs_codec": self.obs_codec}
        if self.fragment_refs:
            out["fragment_refs"] = [{"bucket": r.bucket, "key": r.key} for r in self.fragment_refs]
        else:
            out["fragments"] = [base64.b64encode(f).decode("ascii") for f in self.fragments]
        if self.carry is not None:
            out["carry"] = encode_carries(self.carry)
        if self.carry_note is not None:
            out["carry_note"] = self.carry_note
        return out


@dataclass(frozen=True, kw_only=True)
class ErrorResult:
    """A handled failure: the event was bad or the rollout could not run; nothing crashed."""

    type: str
    """Error class name, e.g. ``"EventError"``, ``"SimulationError"``, ``"TamperedBundleError"``."""
    message: str
    """What went wrong, naming the bad value."""
    fix: str | None = None
    """What to change."""
    field: str | None = None
    """The offending event field, for validation errors."""
    rollout_id: str | None = None
    """The event's rollout id when it could be read."""

    def to_dict(self) -> JSONDict:
        """The JSON result."""
        error: JSONDict = {"type": self.type, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        if self.fix is not None:
            error["fix"] = self.fix
        return {"ok": False, "rollout_id": self.rollout_id, "error": error}

    @classmethod
    def from_event_error(cls, exc: EventError, rollout_id: str | None) -> ErrorResult:
        """The error result for a validation failure."""
        return cls(type="EventError", message=str(exc), fix=exc.fix, field=exc.field, rollout_id=rollout_id)


# ---- validation ---------------------------------------------------------------------------------------------

_TOP_LEVEL = {"kind", "rollout_id", "env", "num_envs", "seed", "seeds", "steps", "episodes", "max_steps",
              "fragment_length", "policy", "actions", "source", "stream_base", "seq_base", "carry", "result"}


def _int(event: Mapping[str, Any], name: str, *, low: int, high: int, default: int | None = None,
         path: str | None = None) -> int | None:
    where = path or name
    if name not in event or event[name] is None:
        return default
    value = event[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(where, f"must be an integer, got {value!r} ({type(value).__name__})",
                         f"send an integer in [{low}, {high}]")
    if not low <= value <= high:
        raise EventError(where, f"must be in [{low}, {high}], got {value}", f"send an integer in [{low}, {high}]")
    return value


def _str(event: Mapping[str, Any], name: str, *, path: str, max_len: int = 1024, required: bool = True,
         fix: str = "send a non-empty string") -> str | None:
    if name not in event or event[name] is None:
        if required:
            raise EventError(path, "is missing", fix)
        return None
    value = event[name]
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise EventError(path, f"must be a non-empty string of at most {max_len} characters, got {value!r:.80}", fix)
    return value


def _object(event: Mapping[str, Any], name: str, *, path: str, required: bool, fix: str) -> Mapping[str, Any]:
    if name not in event or event[name] is None:
        if required:
            raise EventError(path, "is missing", fix)
        return {}
    value = event[name]
    if not isinstance(value, Mapping):
        raise EventError(path, f"must be a JSON object, got {type(value).__name__}", fix)
    return value


def _policy(event: Mapping[str, Any]) -> PolicyRef:
    fix = ('send {"kind": "inline", "bundle_b64": ...}, {"kind": "s3", "bucket": ..., "key": ...}, '
           '{"kind": "parameter_server", "address": ..., "version": ...} or {"kind": "random"}')
    spec = _object(event, "policy", path="policy", required=True, fix=fix)
    kind = spec.get("kind")
    if kind not in POLICY_KINDS:
        raise EventError("policy.kind", f"must be one of {list(POLICY_KINDS)}, got {kind!r}", fix)
    if kind == "inline":
        raw = spec.get("bundle_b64")
        if not isinstance(raw, str) or not raw:
            raise EventError("policy.bundle_b64", "is missing or not a string",
                             "send the bundle file bytes base64-encoded")
        if len(raw) > INLINE_BUNDLE_LIMIT:
            raise EventError("policy.bundle_b64", f"is {len(raw)} characters, over the inline limit of "
                             f"{INLINE_BUNDLE_LIMIT}", 'upload the bundle to S3 and send {"kind": "s3", ...}')
        try:
            return InlinePolicy(bundle=base64.b64decode(raw, validate=True))
        except binascii.Error as exc:
            raise EventError("policy.bundle_b64", f"is not valid base64 ({exc})",
                             "encode the bundle bytes with standard base64") from exc
    if kind == "s3":
        bucket = _str(spec, "bucket", path="policy.bucket", max_len=63, fix="name the bucket holding the bundle")
        key = _str(spec, "key", path="policy.key", fix="send the bundle's object key")
        version_id = _str(spec, "version_id", path="policy.version_id", required=False,
                          fix="send the S3 version id as a string, or leave it out")
        assert bucket is not None and key is not None
        return S3Policy(bucket=bucket, key=key, version_id=version_id)
    if kind == "parameter_server":
        address = _str(spec, "address", path="policy.address", fix='send the server address as "host:port"')
        version = _int(spec, "version", low=1, high=2**62, path="policy.version")
        if version is None:
            raise EventError("policy.version", "is missing", "send the policy version to fetch (>= 1)")
        assert address is not None
        return ParameterServerPolicy(address=address, version=version)
    return RandomPolicy()


def _seeds(event: Mapping[str, Any], num_envs: int) -> tuple[int, ...]:
    if "seed" in event and "seeds" in event:
        raise EventError("seeds", "both 'seed' and 'seeds' were sent", "send one of them")
    if "seeds" in event:
        seeds = event["seeds"]
        if (not isinstance(seeds, list) or len(seeds) != num_envs
                or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)):
            raise EventError("seeds", f"must be a list of num_envs={num_envs} non-negative integers, "
                             f"got {seeds!r:.80}", "send one seed per env, or a single 'seed'")
        return tuple(seeds)
    base = _int(event, "seed", low=0, high=2**32 - 1 - num_envs, default=0)
    assert base is not None
    return tuple(base + i for i in range(num_envs))


def _result_sink(event: Mapping[str, Any]) -> ResultSink:
    spec = _object(event, "result", path="result", required=False,
                   fix='send {"s3_bucket": ..., "s3_prefix": ..., "mode": "auto"} or leave it out')
    mode = spec.get("mode", "auto")
    if mode not in RESULT_MODES:
        raise EventError("result.mode", f"must be one of {list(RESULT_MODES)}, got {mode!r}",
                         'send "auto" (inline up to 6 MB, else S3), "inline" or "s3"')
    bucket = _str(spec, "s3_bucket", path="result.s3_bucket", max_len=63, required=False,
                  fix="name an S3 bucket the function may write, or leave it out")
    prefix = spec.get("s3_prefix", "rollouts/")
    if not isinstance(prefix, str) or len(prefix) > 512:
        raise EventError("result.s3_prefix", f"must be a string of at most 512 characters, got {prefix!r:.80}",
                         'send a key prefix such as "rollouts/"')
    return ResultSink(mode=mode, s3_bucket=bucket, s3_prefix=prefix)


def parse_rollout_event(event: object) -> RolloutRequest:
    """Validate a rollout event into a typed request.

    Raises:
        EventError: naming the first bad field and the fix.
    """
    if not isinstance(event, Mapping):
        raise EventError("<event>", f"must be a JSON object, got {type(event).__name__}",
                         "send a JSON object (see functions._events for the fields)")
    unknown = sorted(set(event) - _TOP_LEVEL)
    if unknown:
        raise EventError(unknown[0], f"is not a rollout event field (unknown: {unknown})",
                         f"remove it; known fields are {sorted(_TOP_LEVEL)}")
    if event.get("kind", "rollout") != "rollout":
        raise EventError("kind", f"must be 'rollout', got {event.get('kind')!r}", "send kind 'rollout' or leave it out")
    rollout_id = _str(event, "rollout_id", path="rollout_id", max_len=128,
                      fix="send a unique id per rollout (e.g. a uuid4 hex) so duplicates can be dropped")
    env_spec = _object(event, "env", path="env", required=True, fix='send {"id": "CartPole-v1", "kwargs": {}}')
    env_id = _str(env_spec, "id", path="env.id", max_len=256, fix='send a gymnasium env id such as "CartPole-v1"')
    kwargs = _object(env_spec, "kwargs", path="env.kwargs", required=False,
                     fix="send gymnasium.make keyword arguments as a JSON object")
    unknown_env = sorted(set(env_spec) - {"id", "kwargs", "frame_stack", "obs_codec"})
    if unknown_env:
        raise EventError(f"env.{unknown_env[0]}", f"is not an env field (unknown: {unknown_env})",
                         "send only id, kwargs, frame_stack and obs_codec")
    frame_stack = _int(env_spec, "frame_stack", low=1, high=64, default=1, path="env.frame_stack")
    obs_codec = _str(env_spec, "obs_codec", path="env.obs_codec", max_len=16, required=False,
                     fix="send raw, png, webp, webp:Q, jxl or jxl:Q (Q in 1-100)") or "raw"
    try:
        pipeline = ObsPipeline(frame_stack=frame_stack or 1, obs_codec=obs_codec)
    except ConfigError as exc:
        raise EventError("env.obs_codec", str(exc), "send raw, png, webp, webp:Q, jxl or jxl:Q (Q in 1-100)") from None
    num_envs = _int(event, "num_envs", low=1, high=MAX_NUM_ENVS, default=1)
    assert rollout_id is not None and env_id is not None and num_envs is not None
    steps = _int(event, "steps", low=1, high=MAX_STEPS)
    episodes = _int(event, "episodes", low=1, high=MAX_STEPS)
    if (steps is None) == (episodes is None):
        raise EventError("steps", "exactly one of 'steps' and 'episodes' must be sent, got "
                         f"{'both' if steps is not None else 'neither'}",
                         "send 'steps' (per env) or 'episodes' (in total)")
    max_steps = _int(event, "max_steps", low=1, high=MAX_STEPS, default=100_000)
    fragment_length = _int(event, "fragment_length", low=1, high=MAX_STEPS)
    source = _str(event, "source", path="source", max_len=64, required=False,
                  fix="send a short source name or leave it out") or "functions"
    stream_base = _int(event, "stream_base", low=0, high=2**62, default=0)
    seq_base = _int(event, "seq_base", low=0, high=2**62, default=0)
    carry = None if event.get("carry") is None else _decode_carries(event["carry"], "carry", num_envs)
    actions = event.get("actions", "greedy")
    if actions not in ("greedy", "sample"):
        raise EventError("actions", f"must be 'greedy' or 'sample', got {actions!r}",
                         "send 'sample' for on-policy training data, 'greedy' (the default) to evaluate")
    assert max_steps is not None and stream_base is not None and seq_base is not None
    if steps is not None and math.prod((steps, num_envs)) > MAX_STEPS * 16:
        raise EventError("steps", f"steps * num_envs = {steps * num_envs} is over {MAX_STEPS * 16}",
                         "split the rollout over more invocations")
    if episodes is not None and max_steps * num_envs > MAX_STEPS:
        raise EventError("max_steps", f"max_steps * num_envs = {max_steps * num_envs} is over {MAX_STEPS} "
                         "in episodes mode", "lower max_steps or num_envs, or send 'steps' instead")
    return RolloutRequest(rollout_id=rollout_id, env=EnvSpec(id=env_id, kwargs=dict(kwargs), pipeline=pipeline),
                          policy=_policy(event), num_envs=num_envs, seeds=_seeds(event, num_envs), steps=steps,
                          episodes=episodes, max_steps=max_steps, fragment_length=fragment_length, source=source,
                          actions=actions, stream_base=stream_base, seq_base=seq_base, carry=carry,
                          result=_result_sink(event))


def parse_result(payload: object) -> RolloutResult | ErrorResult:
    """Read a function's JSON result (the inverse of `RolloutResult.to_dict` / `ErrorResult.to_dict`).

    Raises:
        EventError: when the payload is not a result of this contract (field ``<result>``).
    """
    if not isinstance(payload, Mapping) or not isinstance(payload.get("ok"), bool):
        raise EventError("<result>", f"is not a rollout result (got {str(payload)[:120]!r})",
                         "invoke a strata rollout handler (functions._handlers.rollout_handler)")
    if not payload["ok"]:
        error = payload.get("error") or {}
        return ErrorResult(type=str(error.get("type", "Error")), message=str(error.get("message", "")),
                           fix=error.get("fix"), field=error.get("field"), rollout_id=payload.get("rollout_id"))
    try:
        if payload.get("encoding") != ENCODING:
            raise ValueError(f"encoding {payload.get('encoding')!r} is not {ENCODING!r}")
        fragments = tuple(base64.b64decode(f, validate=True) for f in payload.get("fragments", ()))
        refs = tuple(S3Object(bucket=str(r["bucket"]), key=str(r["key"])) for r in payload.get("fragment_refs", ()))
        carry = None if payload.get("carry") is None else _decode_carries(payload["carry"], "<result>.carry", None)
        note = payload.get("carry_note")
        return RolloutResult(rollout_id=str(payload["rollout_id"]), request_id=str(payload["request_id"]),
                             policy_version=int(payload["policy_version"]), num_envs=int(payload["num_envs"]),
                             steps=int(payload["steps"]), transitions=int(payload["transitions"]),
                             episodes=int(payload["episodes"]),
                             episode_returns=tuple(float(r) for r in payload["episode_returns"]),
                             duration_s=float(payload["duration_s"]), fragments=fragments, fragment_refs=refs,
                             carry=carry, carry_note=None if note is None else str(note),
                             obs_codec=str(payload.get("obs_codec", "raw")))
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise EventError("<result>", f"is a malformed rollout result ({exc})",
                         "check that the function and the caller run the same strata version") from exc
