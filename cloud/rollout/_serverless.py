"""Serverless rollout source: rollout functions invoked through Lambda's API, scaled to demand.

One code path for AWS Lambda and the local function runtime (`strata functions serve`): both are
driven by `infra.aws.LambdaInvoker` (boto3, SDK retries off, read timeout above the function
timeout, strata's own backoff on 429/5xx, a connection pool sized to the fan-out).

    fragments() loop:
      desired = Autoscaler.desired(remaining work)      demand / observed per-invocation throughput,
                                                         capped by the ramp (+scale_step per scale_period_s)
      while in flight < desired: submit one rollout     rollout id = "<run>-<k>", on a lane (below)
      wait for the first finished invocation:
        function error (timeout, crash)  -> re-issue the same event (same rollout id, same carry, same ids)
        result already accepted          -> dropped, counted (duplicate delivery, retried 5xx)
        otherwise                        -> accept, record duration + GB-s, move the lane on, yield fragments

Lanes carry episodes across invocations. A lane is E env streams with fixed worker ids
(``lane * E .. lane * E + E - 1``, seeds ``seed + worker``), the ``seq`` its next transition gets, and
the carries its last *accepted* invocation returned (`functions._envstate`: each stream's env state,
next observation and running return). A lane has at most one invocation in flight; a new rollout
takes the idle lane that has waited longest, or opens a new lane. So any function instance continues
any episode, a re-issued or duplicated invocation restarts from the last accepted carry, and every
transition id is still produced once. When the function answers without carries (the env has no
codec: its one-line note is logged once) or ``carry_episodes`` is off, the lane is closed after one
invocation: every rollout starts fresh episodes on fresh worker ids, as before carries existed.
The carries count against the 6 MB event limit; an event over it is refused before it is sent.

Invocation modes: ``sync`` (RequestResponse; the result, or S3 references for results over 6 MB,
comes back in the response) and ``async`` (Event; at-least-once, so the handler writes its result
to S3 under ``<prefix><rollout id>/<request id>`` and the source polls for the first marker).
Either way every transition keeps its ``(source, worker, seq)`` id and a rollout id is accepted once,
so duplicates and retries never count twice and a lost invocation is re-issued, never skipped. An async
rollout that failed after Lambda's own retries goes to the function's on-failure queue (``strata infra
apply`` creates ``strata-{stage}-rollout-failures``); with ``failure_queue_url`` set the source reads the
records there, counts them (``stats.async_failures``) and re-issues the rollout at once instead of waiting out
``async_result_timeout_s``.

Cost model (AWS Lambda, x86, us-east-1; see `PRICE_PER_GB_S`, `PRICE_PER_REQUEST`): billed duration
is the handler's duration rounded up to 1 ms, times the configured memory in GB, plus a per-request fee.

Wiring `strata train --mode decoupled --functions local|aws`: build a `ServerlessConfig` (its fields
are `device.add_config_arguments`-ready) and call `make_serverless_source("local" | "aws", config)`;
the returned source has FragmentSource's shape: ``set_policy(bundle) -> version``,
``fragments(count) -> Iterator[RolloutBatch]``, ``stats``, ``close()``.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from cloud._errors import CloudError
from device import Bundle, ConfigError, ObsPipeline, RolloutBatch
from device._kinds import FRAME_STACK, OBS_CODEC, SEED
from device._options import EnvId, Integer, Name, Number, Seconds, Text, Url, check_fields, declared
from functions._errors import EventError
from functions._events import (
    SYNC_RESPONSE_LIMIT,
    EnvSpec,
    ErrorResult,
    InlinePolicy,
    PolicyRef,
    RandomPolicy,
    ResultSink,
    RolloutRequest,
    RolloutResult,
    S3Object,
    S3Policy,
    parse_result,
)

#: AWS Lambda price per GB-second of billed duration (x86, us-east-1).
PRICE_PER_GB_S = 0.0000166667
#: AWS Lambda price per request: $0.20 per million (x86, us-east-1).
PRICE_PER_REQUEST = 0.20 / 1_000_000
#: Lambda's scaling rate per function: 1000 more execution environments every 10 s.
LAMBDA_SCALE_STEP = 1000
LAMBDA_SCALE_PERIOD_S = 10.0
#: Lambda's synchronous request limit (the event, carries included).
SYNC_REQUEST_LIMIT = SYNC_RESPONSE_LIMIT

log = logging.getLogger(__name__)


class ServerlessError(CloudError):
    """The serverless source cannot go on (the function refused the rollout, or it keeps failing)."""


@dataclass(frozen=True, kw_only=True)
class ServerlessConfig:
    """How the serverless rollout source invokes and scales rollout functions."""

    # what each invocation simulates
    function_name: str = declared(Text(max_chars=170, what="a Lambda function name or ARN"), "strata-rollout")
    """Lambda function running `functions._handlers.rollout_handler`."""
    qualifier: str = declared(Text(max_chars=128, empty=True, what="a version or alias"), "")
    """Version or alias to invoke; empty: $LATEST."""
    env_id: str = declared(EnvId(), "CartPole-v1")
    """gymnasium env id simulated by the function."""
    env_kwargs: str = declared(Text(max_chars=65_536, what="a JSON object"), "{}")
    """gymnasium.make keyword arguments, as a JSON object."""
    frame_stack: int = declared(FRAME_STACK, 1)
    """Observations stacked per step by the functions' observation pipeline (device.ObsPipeline)."""
    obs_codec: str = declared(OBS_CODEC, "raw")
    """Observation codec of the pipeline and of the fragments: raw, png, webp, webp:Q, jxl or jxl:Q."""
    envs_per_invocation: int = declared(Integer(min=1, max=4096), 8)
    """Env streams per invocation (stepped in lockstep inside the function)."""
    steps_per_invocation: int = declared(Integer(min=1, max=10**7), 256)
    """Steps per env stream per invocation."""
    fragment_length: int = declared(Integer(min=0, max=10**7), 0)
    """Time steps per yielded RolloutBatch; 0: one fragment per invocation."""
    seed: int = declared(SEED, 0)
    """Base seed; rollout k seeds its streams from seed + k * envs_per_invocation."""
    source: str = declared(Name(), "functions")
    """Source name in every transition id."""
    actions: Literal["greedy", "sample"] = "greedy"
    """How functions choose actions: the policy's greedy action, or a sample from its logits (training)."""
    carry_episodes: bool = True
    """Continue each stream's running episode in its next invocation (the env state travels with the event);
    off, or for an env without an env-state codec, every invocation starts fresh episodes."""

    # demand and scaling
    target_steps_per_s: float = declared(Number(min=0.0, max=1e12, min_open=True, unit="steps per second"),
                                        100_000.0)
    """Env steps per second wanted; concurrency is derived from it and the observed throughput."""
    min_concurrency: int = declared(Integer(min=1, max=100_000), 1)
    """Invocations kept in flight at least."""
    max_concurrency: int = declared(Integer(min=1, max=100_000), 8)
    """Invocations in flight at most (also the connection pool size); keep it within the function's limit."""
    scale_step: int = declared(Integer(min=1, max=100_000), LAMBDA_SCALE_STEP)
    """Concurrency the ramp may add per scale_period_s (Lambda: 1000 environments per 10 s)."""
    scale_period_s: float = declared(Seconds(max=3600.0, positive=True), LAMBDA_SCALE_PERIOD_S)
    """Ramp period, seconds."""
    prior_steps_per_s: float = declared(Number(min=0.0, max=1e12, min_open=True, unit="steps per second"),
                                       20_000.0)
    """Assumed env steps/s of one invocation before any has been observed."""
    cold_start_s: float = declared(Seconds(max=3600.0), 1.0)
    """Assumed cold-start cost before one has been observed; scaling up is skipped when the work left
    would be done before new instances could start."""

    # invocation
    invocation: Literal["sync", "async"] = "sync"
    """``sync``: RequestResponse; ``async``: Event, results through S3 (needs result_bucket)."""
    function_timeout_s: float = declared(Seconds(max=900.0, positive=True), 60.0)
    """The function's timeout; the read timeout is set above it."""
    memory_mb: int = declared(Integer(min=128, max=10_240, unit="MB"), 1769)
    """The function's memory size, for GB-seconds and cost (1769 MB = one vCPU)."""
    max_retries: int = declared(Integer(min=0, max=1000), 8)
    """strata's own retries of throttled / 5xx invocations (SDK retries are off)."""
    max_reissues: int = declared(Integer(min=0, max=1000), 3)
    """Times one rollout is re-issued after function errors (timeouts, crashes) before giving up."""
    lambda_endpoint_url: str = declared(Url(schemes=("http", "https"), path=True, empty=True), "")
    """Lambda endpoint (a local runtime's URL); empty: AWS_ENDPOINT_URL_LAMBDA or AWS itself."""
    region: str = declared(Text(max_chars=64, empty=True, what="an AWS region"), "")
    """AWS region; empty: boto3's default resolution."""
    unsigned: bool = False
    """Invoke without signing (no AWS credentials needed): only for strata's local function runtime."""
    result_bucket: str = declared(Text(max_chars=63, empty=True, what="an S3 bucket name"), "")
    """S3 bucket for async results, results over 6 MB and bundles too large to inline."""
    result_prefix: str = declared(Text(max_chars=512, empty=True, what="an S3 key prefix"), "strata-rollouts/")
    """Key prefix of results in result_bucket."""
    inline_bundle_bytes: int = declared(Integer(min=0, max=6 * 1024 * 1024, unit="bytes"), 256 * 1024)
    """Largest bundle sent inline in the event; larger ones go to S3."""
    async_result_timeout_s: float = declared(Seconds(max=86_400.0, positive=True), 120.0)
    """How long an async rollout's result may take before the rollout is re-issued."""
    async_poll_s: float = declared(Seconds(max=60.0, positive=True), 0.05)
    """Interval between S3 polls for async results."""
    failure_queue_url: str = declared(Url(schemes=("http", "https"), path=True, empty=True), "")
    """SQS queue of the function's on-failure destination (async): failed rollouts are read from it, counted and
    re-issued; empty: a failed async rollout is noticed only when async_result_timeout_s runs out."""

    def __post_init__(self) -> None:
        check_fields(self, error=ServerlessError)
        if not 1 <= self.min_concurrency <= self.max_concurrency:
            raise ServerlessError(f"ServerlessConfig: need 1 <= min_concurrency <= max_concurrency, got "
                                  f"{self.min_concurrency} and {self.max_concurrency}")
        if self.envs_per_invocation < 1 or self.steps_per_invocation < 1 or self.fragment_length < 0:
            raise ServerlessError("ServerlessConfig: envs_per_invocation and steps_per_invocation must be >= 1 "
                                  f"and fragment_length >= 0, got {self.envs_per_invocation}, "
                                  f"{self.steps_per_invocation}, {self.fragment_length}")
        if self.invocation not in ("sync", "async"):
            raise ServerlessError(f"ServerlessConfig: invocation must be 'sync' or 'async', got {self.invocation!r}")
        if self.invocation == "async" and not self.result_bucket:
            raise ServerlessError("ServerlessConfig: invocation='async' returns results through S3; set "
                                  "result_bucket")
        if self.scale_step < 1 or self.scale_period_s <= 0 or self.target_steps_per_s <= 0:
            raise ServerlessError(f"ServerlessConfig: scale_step ({self.scale_step}), scale_period_s "
                                  f"({self.scale_period_s}) and target_steps_per_s ({self.target_steps_per_s}) "
                                  "must be positive")
        try:
            ObsPipeline(frame_stack=self.frame_stack, obs_codec=self.obs_codec)
        except ConfigError as exc:
            raise ServerlessError(f"ServerlessConfig: {exc}") from None
        try:
            kwargs = json.loads(self.env_kwargs)
        except ValueError as exc:
            raise ServerlessError(f"ServerlessConfig: env_kwargs {self.env_kwargs!r} is not JSON ({exc})") from exc
        if not isinstance(kwargs, dict):
            raise ServerlessError(f"ServerlessConfig: env_kwargs must be a JSON object, got {self.env_kwargs!r}")

    @property
    def steps_per_rollout(self) -> int:
        """Env steps one invocation produces."""
        return self.envs_per_invocation * self.steps_per_invocation

    @property
    def fragments_per_rollout(self) -> int:
        """Fragments one invocation yields."""
        frag = self.fragment_length or self.steps_per_invocation
        return math.ceil(self.steps_per_invocation / frag)


def local_scaling(config: ServerlessConfig) -> ServerlessConfig:
    """`config` with the ramp scaled down for a local runtime: +2 concurrent invocations per 0.5 s."""
    import dataclasses

    return dataclasses.replace(config, scale_step=2, scale_period_s=0.5, cold_start_s=0.3)


# ---- the autoscaler (pure) -----------------------------------------------------------------------------------

class Autoscaler:
    """Concurrency from demand: ``ceil(target / per-invocation throughput)``, ramped and cold-start aware.

    Args:
        config: Targets, bounds and the ramp.
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(self, config: ServerlessConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._started = clock()
        self.per_invocation_steps_per_s = config.prior_steps_per_s
        self.cold_start_s = config.cold_start_s
        self.observed = 0
        self._warm_overhead_s: float | None = None
        self._current = config.min_concurrency

    def ceiling(self) -> int:
        """The most concurrency the ramp allows now: +scale_step per scale_period_s since start."""
        periods = int((self._clock() - self._started) // self.config.scale_period_s)
        return min(self.config.max_concurrency, self.config.scale_step * (periods + 1))

    def observe(self, *, steps: int, invoke_s: float, handler_s: float) -> None:
        """Record one finished invocation: env steps, wall time seen by the caller, time inside the handler."""
        if invoke_s <= 0:
            return
        rate = steps / invoke_s
        overhead = max(invoke_s - handler_s, 0.0)
        warm = self._warm_overhead_s
        if warm is not None and overhead > max(5 * warm, 0.05):
            # A cold start: it tells us the cold-start cost, not the warm throughput.
            self.cold_start_s = 0.5 * self.cold_start_s + 0.5 * overhead
            return
        self._warm_overhead_s = overhead if warm is None else 0.8 * warm + 0.2 * overhead
        alpha = 0.5 if self.observed < 4 else 0.2
        self.per_invocation_steps_per_s = (rate if self.observed == 0
                                           else (1 - alpha) * self.per_invocation_steps_per_s + alpha * rate)
        self.observed += 1

    def desired(self, *, remaining_steps: float | None = None) -> int:
        """Invocations to keep in flight now.

        Args:
            remaining_steps: Env steps still wanted (None: unbounded); scaling up is skipped when the
                in-flight concurrency finishes them sooner than a new instance could cold-start.
        """
        c = self.config
        want = math.ceil(c.target_steps_per_s / max(self.per_invocation_steps_per_s, 1e-9))
        want = max(c.min_concurrency, min(want, self.ceiling()))
        if remaining_steps is not None:
            finish_s = remaining_steps / max(self._current * self.per_invocation_steps_per_s, 1e-9)
            if want > self._current and finish_s < self.cold_start_s:
                want = self._current
            # never more invocations than the work left needs
            want = max(c.min_concurrency, min(want, math.ceil(remaining_steps / c.steps_per_rollout)))
        self._current = want
        return want


# ---- the source ---------------------------------------------------------------------------------------------

@dataclass
class ServerlessStats:
    """What the serverless source did, and what it would cost on AWS Lambda."""

    invocations: int = 0
    """Invocations that ran the function (billed requests)."""
    attempts: int = 0
    """HTTP attempts, throttled and retried ones included."""
    reissued: int = 0
    """Rollouts re-issued after a function error."""
    function_errors: int = 0
    async_failures: int = 0
    """Async rollouts the on-failure queue reported failed after Lambda's retries (each one re-issued)."""
    duplicates_dropped: int = 0
    """Results of an already accepted rollout id (duplicate delivery, retried 5xx), dropped."""
    rollouts: int = 0
    fragments: int = 0
    transitions: int = 0
    gb_seconds: float = 0.0
    durations_s: list[float] = field(default_factory=list)
    """Handler duration of each accepted invocation."""
    carry_bytes_sent: int = 0
    """Bytes of carries (base64, as on the wire) in the events of accepted rollouts."""
    carry_bytes_received: int = 0
    """Bytes of carries (base64) in accepted results."""
    episodes_continued: int = 0
    """Env streams that started an accepted rollout from a carry rather than a reset."""
    concurrency: list[tuple[float, int, int]] = field(default_factory=list)
    """``(seconds since start, desired, in flight)`` after each scaling decision."""

    def cost_usd(self) -> float:
        """AWS Lambda cost of the invocations so far (x86, us-east-1 prices)."""
        return self.gb_seconds * PRICE_PER_GB_S + self.invocations * PRICE_PER_REQUEST

    def summary(self) -> dict[str, Any]:
        """Counters and the cost estimate as one JSON-ready dict."""
        return {"invocations": self.invocations, "attempts": self.attempts, "reissued": self.reissued,
                "function_errors": self.function_errors, "async_failures": self.async_failures,
                "duplicates_dropped": self.duplicates_dropped,
                "rollouts": self.rollouts, "fragments": self.fragments, "transitions": self.transitions,
                "gb_seconds": round(self.gb_seconds, 6), "cost_usd": self.cost_usd(),
                "carry_bytes_sent": self.carry_bytes_sent, "carry_bytes_received": self.carry_bytes_received,
                "episodes_continued": self.episodes_continued,
                "cost_usd_per_million_steps": self.cost_usd() / self.transitions * 1e6 if self.transitions else 0.0,
                "max_concurrency": max((c[2] for c in self.concurrency), default=0)}


@dataclass
class _Lane:
    """Env streams whose episodes continue from invocation to invocation (module docstring)."""

    id: int
    stream_base: int
    seeds: tuple[int, ...]
    next_seq: int = 0
    carry: tuple[bytes | None, ...] | None = None
    """What the last accepted invocation returned; None: the streams start with a reset."""


@dataclass(frozen=True)
class _Issued:
    lane: _Lane
    event: dict[str, Any]
    payload: bytes
    carry_bytes: int


@dataclass(frozen=True)
class _Done:
    index: int
    result: RolloutResult | ErrorResult | None
    """None: the function failed (error or timeout) and the rollout must be re-issued."""
    invoke_s: float
    billed: int
    attempts: int
    extra_markers: int = 0
    async_failed: bool = False
    """The on-failure queue reported this async rollout failed."""


class ServerlessRolloutSource:
    """`device.RolloutBatch` fragments from rollout functions, concurrency scaled to demand (module docstring).

    Args:
        config: What to simulate, the demand and the scaling rule.
        invoker: A ready `infra.aws.LambdaInvoker`; None builds one from the config.
        s3: A boto3 S3 client (async results, large results, large bundles); None builds one when needed.
        clock: Monotonic seconds (injectable).
    """

    def __init__(self, config: ServerlessConfig, *, invoker: Any = None, s3: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from infra.aws import LambdaInvoker

        self.config = config
        self.invoker = invoker or LambdaInvoker(
            function_timeout_s=config.function_timeout_s, region=config.region or None,
            endpoint_url=config.lambda_endpoint_url or None, max_pool_connections=config.max_concurrency + 2,
            max_retries=config.max_retries, unsigned=config.unsigned)
        self._s3 = s3
        self._clock = clock
        self.autoscaler = Autoscaler(config, clock=clock)
        self.stats = ServerlessStats()
        self.run_id = uuid.uuid4().hex[:12]
        self.policy: PolicyRef = RandomPolicy()
        self.policy_version = 0
        self._next_index = 0
        self._next_lane = 0
        self._idle_lanes: deque[_Lane] = deque()
        self._issued: dict[int, _Issued] = {}
        self._noted = False
        self._accepted: set[str] = set()
        self._reissues: dict[int, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=config.max_concurrency, thread_name_prefix="serverless")
        self._lock = threading.Lock()
        self._owned: list[Any] = []
        self._closed = False
        self._sqs: Any = None
        self._failed_async: set[str] = set()

    # -- policy --
    def set_policy(self, bundle: bytes) -> int:
        """Act with this signed bundle from the next rollout on; return its version.

        Small bundles travel inline in the event; larger ones are uploaded to ``result_bucket``.
        """
        manifest = Bundle.from_bytes(bundle).manifest
        if len(bundle) <= self.config.inline_bundle_bytes:
            self.policy = InlinePolicy(bundle=bundle)
        else:
            if not self.config.result_bucket:
                raise ServerlessError(f"ServerlessRolloutSource.set_policy: the bundle is {len(bundle)} bytes, "
                                      f"over inline_bundle_bytes={self.config.inline_bundle_bytes}; set "
                                      "result_bucket so it can be passed by S3 reference")
            key = f"{self.config.result_prefix}policies/{manifest.policy}/{manifest.version:09d}.bundle"
            self.s3().put_object(Bucket=self.config.result_bucket, Key=key, Body=bundle)
            self.policy = S3Policy(bucket=self.config.result_bucket, key=key)
        self.policy_version = manifest.version
        return manifest.version

    def s3(self) -> Any:
        """The S3 client (built on first use through `infra.aws.client`)."""
        if self._s3 is None:
            from infra.aws import client

            self._s3 = client("s3", region=self.config.region or None,
                              max_pool_connections=self.config.max_concurrency + 2)
        return self._s3

    # -- rollouts --
    def _request(self, index: int, lane: _Lane) -> RolloutRequest:
        c = self.config
        carry = None
        if c.carry_episodes:
            carry = lane.carry if lane.carry is not None else (None,) * c.envs_per_invocation
        return RolloutRequest(
            rollout_id=f"{self.run_id}-{index:08d}",
            env=EnvSpec(id=c.env_id, kwargs=json.loads(c.env_kwargs),
                        pipeline=ObsPipeline(frame_stack=c.frame_stack, obs_codec=c.obs_codec)),
            policy=self.policy, num_envs=c.envs_per_invocation, seeds=lane.seeds,
            steps=c.steps_per_invocation, fragment_length=c.fragment_length or None, source=c.source,
            actions=c.actions, stream_base=lane.stream_base, seq_base=lane.next_seq, carry=carry,
            result=ResultSink(mode="s3" if c.invocation == "async" else "auto", s3_bucket=c.result_bucket or None,
                              s3_prefix=c.result_prefix))

    def _issue(self, index: int) -> _Issued:
        """The event of a new rollout, on the idle lane that waited longest or on a new lane."""
        c = self.config
        if self._idle_lanes:
            lane = self._idle_lanes.popleft()
        else:
            base = self._next_lane * c.envs_per_invocation
            lane = _Lane(id=self._next_lane, stream_base=base,
                         seeds=tuple(c.seed + base + i for i in range(c.envs_per_invocation)))
            self._next_lane += 1
        event = self._request(index, lane).to_event()
        payload = json.dumps(event).encode()
        if len(payload) > SYNC_REQUEST_LIMIT:
            raise ServerlessError(f"ServerlessRolloutSource: the event of rollout {index} is {len(payload)} bytes, "
                                  f"over Lambda's {SYNC_REQUEST_LIMIT}-byte request limit (carries "
                                  f"{sum(len(x) for x in event.get('carry') or () if x)} bytes); lower "
                                  "envs_per_invocation, pass the bundle by S3 (inline_bundle_bytes), or set "
                                  "carry_episodes=False")
        carry_bytes = sum(len(x) for x in event.get("carry") or () if x)
        issued = _Issued(lane=lane, event=event, payload=payload, carry_bytes=carry_bytes)
        self._issued[index] = issued
        return issued

    def _release(self, index: int) -> None:
        """An issued rollout that will not be accepted: its lane goes back idle, on its last accepted carry."""
        issued = self._issued.pop(index, None)
        if issued is not None and (issued.lane.carry is not None or issued.lane.next_seq == 0):
            self._idle_lanes.appendleft(issued.lane)

    def _run(self, index: int, event: dict[str, Any], payload: bytes) -> _Done:
        from botocore.exceptions import BotoCoreError

        from infra import InfraError

        started = time.monotonic()
        invocation_type = "Event" if self.config.invocation == "async" else "RequestResponse"
        try:
            out = self.invoker.invoke(self.config.function_name, payload, invocation_type=invocation_type,
                                      qualifier=self.config.qualifier or None)
        except InfraError as exc:
            raise ServerlessError(f"ServerlessRolloutSource: invoking {self.config.function_name!r} failed: "
                                  f"{exc}") from exc
        except BotoCoreError as exc:  # no credentials, bad region: nothing a retry would fix
            raise ServerlessError(f"ServerlessRolloutSource: invoking {self.config.function_name!r} failed: "
                                  f"{type(exc).__name__}: {exc}; configure AWS credentials and region (any "
                                  "non-empty credentials work for the local runtime)") from exc
        if self.config.invocation == "async":
            return self._await_async(index, event["rollout_id"], started, out.attempts)
        if not out.ok:
            return _Done(index, None, time.monotonic() - started, 1, out.attempts)
        return _Done(index, _decode(out.payload), time.monotonic() - started, 1, out.attempts)

    def _await_async(self, index: int, rollout_id: str, started: float, attempts: int) -> _Done:
        prefix = f"{self.config.result_prefix}{rollout_id}/"
        deadline = started + self.config.async_result_timeout_s
        s3 = self.s3()
        while time.monotonic() < deadline and not self._closed:
            listing = s3.list_objects_v2(Bucket=self.config.result_bucket, Prefix=prefix)
            markers = sorted(o["Key"] for o in listing.get("Contents", ()) if o["Key"].endswith(".json"))
            if markers:
                body = s3.get_object(Bucket=self.config.result_bucket, Key=markers[0])["Body"].read()
                return _Done(index, _decode(body), time.monotonic() - started, 1, attempts,
                             extra_markers=len(markers) - 1)
            if self.config.failure_queue_url and self._reported_failed(rollout_id):
                return _Done(index, None, time.monotonic() - started, 1, attempts, async_failed=True)
            time.sleep(self.config.async_poll_s)
        return _Done(index, None, time.monotonic() - started, 1, attempts)

    def _reported_failed(self, rollout_id: str) -> bool:
        """Whether the on-failure queue holds a record of `rollout_id` (read, and its records consumed).

        Records of this run are deleted once read; another run's are left for it (visible again at once).
        """
        with self._lock:
            if rollout_id in self._failed_async:
                self._failed_async.discard(rollout_id)
                return True
        if self._sqs is None:
            from infra.aws import client

            self._sqs = client("sqs", region=self.config.region or None)
        got = self._sqs.receive_message(QueueUrl=self.config.failure_queue_url, MaxNumberOfMessages=10,
                                        WaitTimeSeconds=0, VisibilityTimeout=0)
        for message in got.get("Messages", []):
            try:
                failed = json.loads(message["Body"])["requestPayload"]["rollout_id"]
            except (ValueError, KeyError, TypeError):
                failed = None  # not a Lambda destination record of a rollout: not ours to judge
            if isinstance(failed, str) and failed.startswith(f"{self.run_id}-"):
                with self._lock:
                    self._failed_async.add(failed)
                self._sqs.delete_message(QueueUrl=self.config.failure_queue_url,
                                         ReceiptHandle=message["ReceiptHandle"])
        with self._lock:
            if rollout_id in self._failed_async:
                self._failed_async.discard(rollout_id)
                return True
        return False

    def _fetch(self, refs: tuple[S3Object, ...]) -> list[bytes]:
        s3 = self.s3()
        return [bytes(s3.get_object(Bucket=r.bucket, Key=r.key)["Body"].read()) for r in refs]

    def fragments(self, count: int | None = None) -> Iterator[RolloutBatch]:
        """Yield fragments (up to `count`, forever when None) as invocations finish, each transition once."""
        c = self.config
        pending: dict[Future[_Done], int] = {}
        retry: list[int] = []
        in_hand: list[_Done] = []
        yielded = 0
        t0 = self._clock()
        try:
            while count is None or yielded < count:
                # Refill before decoding what came back, so the functions never wait for the caller.
                remaining = None
                if count is not None:
                    # failed ones in hand are re-issued under their own index, so they count as coming too
                    coming = (len(pending) + len(in_hand)) * c.fragments_per_rollout
                    left = max(count - yielded - coming, 0)
                    remaining = left * (c.fragment_length or c.steps_per_invocation) * c.envs_per_invocation
                desired = self.autoscaler.desired(remaining_steps=remaining)
                while len(pending) < desired and (retry or remaining is None or remaining > 0):
                    if retry:
                        index = retry.pop(0)
                        issued = self._issued[index]  # the same event: same rollout id, same carry
                    else:
                        index = self._new_index()
                        issued = self._issue(index)
                    pending[self._pool.submit(self._run, index, issued.event, issued.payload)] = index
                    if remaining is not None:
                        remaining -= c.steps_per_rollout
                self.stats.concurrency.append((self._clock() - t0, desired, len(pending)))
                for outcome in in_hand:
                    if count is not None and yielded >= count:
                        self._abandon(outcome)  # finished after the last fragment asked for: not accepted
                        continue
                    for batch in self._accept(outcome, retry):
                        if count is not None and yielded >= count:
                            break  # an extra fragment of the last rollout: not asked for
                        yielded += 1
                        yield batch
                in_hand = []
                if count is not None and yielded >= count:
                    break
                if not pending:
                    if retry:
                        continue
                    break
                done, _ = wait(list(pending), timeout=1.0, return_when=FIRST_COMPLETED)
                for future in done:
                    pending.pop(future)
                    in_hand.append(future.result())
        finally:
            for future in pending:
                future.cancel()
            # Whatever is still issued (in flight, to be re-issued, or finished but not read) will not be
            # accepted: its lane goes back idle on the last accepted carry.
            for index in sorted(self._issued, reverse=True):
                self._release(index)

    def _new_index(self) -> int:
        with self._lock:
            index = self._next_index
            self._next_index += 1
        return index

    def _abandon(self, outcome: _Done) -> None:
        """Bill an invocation whose result is not used, and put its lane back on its last accepted carry."""
        self.stats.attempts += outcome.attempts
        self.stats.invocations += outcome.billed + outcome.extra_markers
        duration = outcome.result.duration_s if isinstance(outcome.result, RolloutResult) else outcome.invoke_s
        self.stats.gb_seconds += self.config.memory_mb / 1024 * duration * (1 + outcome.extra_markers)
        self._release(outcome.index)

    def _accept(self, outcome: _Done, retry: list[int]) -> list[RolloutBatch]:
        c = self.config
        self.stats.attempts += outcome.attempts
        self.stats.invocations += outcome.billed
        self.stats.duplicates_dropped += outcome.extra_markers
        result = outcome.result
        if result is None:
            self.stats.function_errors += 1
            self.stats.async_failures += outcome.async_failed
            self.stats.gb_seconds += c.memory_mb / 1024 * outcome.invoke_s
            tries = self._reissues.get(outcome.index, 0) + 1
            if tries > c.max_reissues:
                raise ServerlessError(f"ServerlessRolloutSource: rollout {outcome.index} failed {tries} times "
                                      f"in {c.function_name!r} (timeouts or crashes); check the function's logs, "
                                      "timeout and memory")
            self._reissues[outcome.index] = tries
            self.stats.reissued += 1
            retry.append(outcome.index)
            return []
        if isinstance(result, ErrorResult):
            raise ServerlessError(f"ServerlessRolloutSource: {c.function_name!r} refused the rollout: "
                                  f"{result.type}: {result.message}")
        billed_s = math.ceil(result.duration_s * 1000) / 1000
        # Extra async deliveries ran (and were billed) too; assume they took as long as this one.
        self.stats.invocations += outcome.extra_markers
        self.stats.gb_seconds += c.memory_mb / 1024 * billed_s * (1 + outcome.extra_markers)
        self.autoscaler.observe(steps=result.transitions, invoke_s=outcome.invoke_s, handler_s=result.duration_s)
        if result.rollout_id in self._accepted:
            self.stats.duplicates_dropped += 1
            return []
        self._accepted.add(result.rollout_id)
        self._advance(outcome.index, result)
        blobs = list(result.fragments) or self._fetch(result.fragment_refs)
        batches = [RolloutBatch.from_bytes(b) for b in blobs]
        self.stats.rollouts += 1
        self.stats.durations_s.append(result.duration_s)
        self.stats.fragments += len(batches)
        self.stats.transitions += sum(b.size for b in batches)
        return batches

    def _advance(self, index: int, result: RolloutResult) -> None:
        """Move the rollout's lane on: its next seq, and the carries to continue from (or close it)."""
        issued = self._issued.pop(index, None)
        if issued is None:
            return
        lane = issued.lane
        lane.next_seq += result.steps
        self.stats.carry_bytes_sent += issued.carry_bytes
        self.stats.episodes_continued += sum(1 for x in issued.event.get("carry") or () if x)
        carries = result.carry
        if carries is not None and len(carries) == self.config.envs_per_invocation and all(
                x is not None for x in carries):
            self.stats.carry_bytes_received += sum(4 * ((len(x) + 2) // 3) for x in carries if x is not None)
            lane.carry = carries
            self._idle_lanes.append(lane)
            return
        # No carries: the lane's streams cannot continue; the next rollout starts fresh ones on a new lane.
        lane.carry = None
        if result.carry_note and not self._noted:
            self._noted = True
            log.warning("%s", result.carry_note)

    def forget_episodes(self) -> None:
        """Drop every idle lane's running episodes: the next rollouts start fresh ones on new worker ids."""
        self._idle_lanes.clear()

    def close(self) -> None:
        """Stop issuing, wait for in-flight invocations, stop anything this source started."""
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        for owned in self._owned:
            owned.stop()
        self._owned.clear()

    def __enter__(self) -> ServerlessRolloutSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode(payload: bytes) -> RolloutResult | ErrorResult | None:
    """A function's reply as a result, or None when it is torn or garbled.

    None is a function error: re-issued and de-duplicated as any other, so no decode error reaches the learner.
    """
    try:
        return parse_result(json.loads(payload))
    except (ValueError, EventError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def make_serverless_source(functions: Literal["local", "aws"], config: ServerlessConfig, *,
                           bundle: bytes | None = None, environment: Mapping[str, str] | None = None,
                           ) -> ServerlessRolloutSource:
    """The serverless source for ``--functions local|aws`` (the one factory `strata train` calls).

    ``local`` starts `strata functions serve` in a subprocess (`LocalRuntimeProcess`: its HTTP threads stay
    out of the learner's GIL) serving ``config.function_name`` with `functions._handlers.rollout_handler`,
    unless ``config.lambda_endpoint_url`` points at a running one, and uses the local ramp (`local_scaling`).
    ``aws`` invokes the deployed function through boto3's normal resolution and credential chain. The
    embedded local runtime is invoked unsigned, so a laptop needs no AWS credentials for it.

    Args:
        functions: ``"local"`` or ``"aws"``.
        config: The source's settings.
        bundle: A signed policy bundle to act with; None acts randomly until `set_policy`.
        environment: Extra environment of a ``local`` runtime's functions (e.g. ``STRATA_TRUSTED_KEYS``,
            the public keys the rollout handler verifies bundles with); a deployed function has its own.
    """
    import dataclasses

    if functions not in ("local", "aws"):
        raise ServerlessError(f"make_serverless_source: functions must be 'local' or 'aws', got {functions!r}")
    owned: list[Any] = []
    if functions == "local":
        config = local_scaling(config)
        if not config.lambda_endpoint_url:
            runtime = LocalRuntimeProcess(config, environment=environment)
            owned.append(runtime)
            config = dataclasses.replace(config, lambda_endpoint_url=runtime.url, unsigned=True)
    source = ServerlessRolloutSource(config)
    source._owned.extend(owned)
    if bundle is not None:
        source.set_policy(bundle)
    return source



class LocalRuntimeProcess:
    """`strata functions serve` in a subprocess serving the rollout function, stopped with `stop`.

    Args:
        config: Its function name, timeout, memory and max_concurrency (the function's reserved concurrency).
        start_timeout_s: How long the runtime may take to report its URL.
        environment: Extra environment variables of the runtime and its functions.
    """

    def __init__(self, config: ServerlessConfig, *, start_timeout_s: float = 30.0,
                 environment: Mapping[str, str] | None = None) -> None:
        import os
        import subprocess
        import sys
        import tempfile

        from functions._lifetime import child_environment  # the runtime stops when this process is gone

        timeout = min(config.function_timeout_s, 900.0)
        memory = min(max(config.memory_mb, 128), 10240)
        spec = (f"{config.function_name}=functions._handlers.rollout_handler,timeout={timeout:g},"
                f"memory={memory},concurrency={config.max_concurrency}")
        # stderr to a file, not a pipe: a pipe nobody reads would block the runtime once it fills
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the process; closed in stop)
        self.proc = subprocess.Popen([sys.executable, "-m", "cloud.cli", "functions", "serve", "--port", "0",
                                      "--function", spec], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True,
                                     env=child_environment({**os.environ, **(environment or {})}))
        first: list[str] = []
        stdout = self.proc.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: first.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(start_timeout_s)
        try:
            self.url = str(json.loads(first[0])["url"]) if first and first[0] else ""
        except (ValueError, KeyError):
            self.url = ""
        if not self.url:
            self._terminate()
            self._stderr.seek(0)
            err = self._stderr.read().decode(errors="replace")[-2000:]
            self.stop()
            raise ServerlessError(f"LocalRuntimeProcess: `strata functions serve` did not report its URL within "
                                  f"{start_timeout_s:g} s; its stderr: {err}")

    def stop(self) -> None:
        """SIGTERM the runtime (it stops its workers); SIGKILL it if it does not exit within 15 s."""
        self._terminate()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def _terminate(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
