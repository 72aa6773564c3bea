"""The local function runtime: Lambda's Invoke HTTP API on loopback, warm awslambdaric workers behind it.

Unmodified boto3 drives it (``endpoint_url=...`` or ``AWS_ENDPOINT_URL_LAMBDA``); the code path that
invokes AWS Lambda invokes this. One request's life:

    POST /2015-03-31/functions/{name}/invocations
      -> headers and name within the model's constraints    400 ValidationException (InvocationType, LogType,
                                                           FunctionName, Qualifier)
      -> resolve name[:qualifier] (FunctionSource)         404 ResourceNotFoundException; a Qualifier that
                                                           disagrees with the name's: 400
      -> payload limits (6 MB sync, 1 MB async)            413 RequestEntityTooLargeException (what AWS sends)
      -> JSON body, ClientContext (base64 JSON, 3583 B)    400 InvalidRequestContentException (never a 500)
      -> fault: throttle / service error                    429 TooManyRequestsException / 500 ServiceException
      -> DryRun: 204 | Event: queue, 202 | RequestResponse:
      -> take an idle warm worker of that version, or      429 when the function's concurrency is used up
         start one (cold)
      -> deliver through the worker's Runtime API shim     (GET /2018-06-01/runtime/invocation/next)
      -> wait for /response or /error, or the timeout      timeout or exit: kill worker, Unhandled error
      -> 200 + X-Amz-Executed-Version [+ X-Amz-Function-Error] [+ X-Amz-Log-Result for LogType Tail]

Workers are ``python -m functions._worker HANDLER`` processes running the official `awslambdaric`
runtime interface client, so handlers get real ``context`` objects and Lambda's error shapes. As in Lambda,
a worker runs one version of one function: ``context.function_version`` is the version an alias or number
resolved to, ``context.invoked_function_arn`` the ARN as invoked (alias ARN for an alias).
The read operations (GetFunction, ListFunctions, GetAlias, ...) are `functions._lambda_api`'s. A
worker's state machine: STARTING -> IDLE <-> BUSY -> DEAD (killed on timeout, crash or shutdown);
workers stay warm until idle for `RuntimeConfig.idle_timeout_s` or the runtime stops. Memory is
enforced as an address-space limit (RLIMIT_AS = memory_mb + `RuntimeConfig.address_space_slack_mb`,
because CPython + numpy reserve several hundred MB of untouched virtual memory); Lambda limits
resident memory, so this is looser.

``InvokeWithResponseStream`` (``POST /2021-11-15/functions/{name}/response-streaming-invocations``) runs the
same way and answers Lambda's event stream: the whole response as one ``PayloadChunk`` (as AWS does for a
function that does not stream, which no Python runtime does), then ``InvokeComplete``; ``InvokeAsync``
(``POST /2014-11-13/functions/{name}/invoke-async/``) is an Event invocation. Everything else (every write
API) is a JSON ``UnknownOperationException``, never an HTML page.

Event invocations are queued and run by the function's dispatcher threads, retried twice on a
function error (as Lambda does; a spec's ``async_retries`` overrides it), and may be delivered twice on
purpose (`FaultConfig.duplicate_rate`): async invocation is at-least-once. One whose retries are spent goes,
as Lambda's destination record, to the function's on-failure SQS queue (``FunctionSpec.on_failure``,
`functions._destinations`).

Functions come from a `FunctionSource`: `SourceTreeFunctions` serves handlers importable from the
source tree. Reading a deployment back from an AWS endpoint (GetFunction + the code zip) is the
infra tier's: it implements `FunctionSource` and registers a factory with `register_endpoint_source`.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import enum
import json
import os
import queue
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

from device._names import shown
from functions._errors import RuntimeConfigError
from functions._eventstream import stream_event
from functions._lambda_api import (
    INVOCATION_TYPES,
    LOG_TYPES,
    MAX_RETRY_ATTEMPTS,
    STREAM_INVOCATION_TYPES,
    Account,
    ApiError,
    FunctionSpec,
    check_enum,
    decode_client_context,
    function_arn,
    handle_get,
    invalid_content,
    not_found,
    parse_payload,
    split_qualifier,
    unknown_operation,
)
from functions._lifetime import PARENT_ENV

SYNC_PAYLOAD_LIMIT = 6 * 1024 * 1024
ASYNC_PAYLOAD_LIMIT = 1024 * 1024
STREAM_RESPONSE_LIMIT = 20 * 1024 * 1024
"""A streamed response may be larger than a buffered one (Lambda's soft limit is 20 MB)."""
_STREAM_PREFIX = "/2021-11-15/functions/"
_ASYNC_PREFIX = "/2014-11-13/functions/"
LOG_TAIL_BYTES = 4096
INIT_TIMEOUT_S = 10.0
_INVOKE_PREFIX = "/2015-03-31/functions/"
_RUNTIME_PREFIX = "/2018-06-01/runtime/"
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)


# ---- configuration ------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class FaultConfig:
    """Faults the runtime injects, to test callers against Lambda's failure modes."""

    throttle_rate: float = 0.0
    """Fraction of invocations answered 429 TooManyRequestsException before running."""
    service_error_rate: float = 0.0
    """Fraction of invocations answered 500 ServiceException before running."""
    duplicate_rate: float = 0.0
    """Fraction of Event invocations delivered twice (async invocation is at-least-once)."""
    cold_start_delay_s: float = 0.0
    """Extra seconds every new worker sleeps before it starts polling (a slow init)."""
    crash_rate: float = 0.0
    """Fraction of invocations whose worker is killed right after delivery (Runtime.ExitError)."""
    seed: int | None = None
    """Seed of the fault dice; None: random."""

    def __post_init__(self) -> None:
        for name in ("throttle_rate", "service_error_rate", "duplicate_rate", "crash_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise RuntimeConfigError(f"FaultConfig: {name} must be in [0, 1], got {value}")
        if self.cold_start_delay_s < 0:
            raise RuntimeConfigError(f"FaultConfig: cold_start_delay_s must be >= 0, got {self.cold_start_delay_s}")


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Settings of the local function runtime."""

    host: str = "127.0.0.1"
    """Interface to listen on (loopback only in strata's setups)."""
    port: int = 9001
    """TCP port; 0 picks a free one."""
    region: str = "us-east-1"
    """Region in the function ARNs and the workers' AWS_REGION."""
    account_concurrency: int = 1000
    """Concurrent executions across all functions (Lambda's regional default is 1000)."""
    enforce_memory: bool = True
    """Apply RLIMIT_AS to workers (see the module docstring)."""
    address_space_slack_mb: int = 2048
    """Virtual memory allowed on top of memory_mb (interpreter and library reservations)."""
    async_retries: int = 2
    """Retries of an Event invocation whose function failed (Lambda: 2)."""
    async_retry_delay_s: float = 0.2
    """Delay before each async retry (Lambda waits about a minute; short here)."""
    idle_timeout_s: float = 900.0
    """A warm worker idle for longer is stopped, like a reclaimed Lambda environment (checked on the next
    invocation of its function)."""

    def __post_init__(self) -> None:
        if self.account_concurrency < 1:
            raise RuntimeConfigError(f"RuntimeConfig: account_concurrency must be 1 or more (every invocation "
                                     f"would be throttled), got {self.account_concurrency}; pass "
                                     "--account-concurrency N with N >= 1")
        if not 0 <= self.port <= 65535:
            raise RuntimeConfigError(f"RuntimeConfig: port must be in [0, 65535] (0 picks a free one), got {self.port}")
        if not 0 <= self.async_retries <= MAX_RETRY_ATTEMPTS:
            raise RuntimeConfigError(f"RuntimeConfig: async_retries must be 0, 1 or 2 (Lambda's "
                                     f"MaximumRetryAttempts), got {self.async_retries}")
        if self.async_retry_delay_s < 0 or self.idle_timeout_s <= 0 or self.address_space_slack_mb < 0:
            raise RuntimeConfigError(f"RuntimeConfig: async_retry_delay_s ({self.async_retry_delay_s}) and "
                                     f"address_space_slack_mb ({self.address_space_slack_mb}) must be >= 0 and "
                                     f"idle_timeout_s ({self.idle_timeout_s}) > 0")


class FunctionSource(Protocol):
    """Where the runtime's functions come from (the source tree now; an AWS deployment via the infra tier)."""

    def get(self, name: str) -> FunctionSpec | None:
        """The function called `name` at ``$LATEST`` (with its versions and aliases), or None."""
        ...

    def names(self) -> list[str]:
        """Every function name served."""
        ...

    def version_spec(self, name: str, version: str) -> FunctionSpec | None:
        """The function `name` as published at `version` (a number; its own code and settings), or None."""
        ...


class SourceTreeFunctions:
    """Functions whose handlers are importable from the source tree (or their `FunctionSpec.code_dir`)."""

    def __init__(self, specs: list[FunctionSpec]) -> None:
        self._specs = {s.name: s for s in specs}
        if len(self._specs) != len(specs):
            raise RuntimeConfigError(f"SourceTreeFunctions: duplicate function names in {[s.name for s in specs]}")

    def get(self, name: str) -> FunctionSpec | None:
        """The function called `name`, or None."""
        return self._specs.get(name)

    def names(self) -> list[str]:
        """Every function name served."""
        return sorted(self._specs)

    def version_spec(self, name: str, version: str) -> FunctionSpec | None:
        """`name` at `version`: every listed version runs the source tree's code."""
        spec = self._specs.get(name)
        return spec if spec is not None and version in spec.versions else None


EndpointSourceFactory = Callable[[str, str], FunctionSource]
_endpoint_sources: list[EndpointSourceFactory] = []


def register_endpoint_source(factory: EndpointSourceFactory) -> None:
    """Register how ``--from-endpoint URL --stage S`` reads a deployment back (``factory(url, stage)``)."""
    _endpoint_sources[:] = [factory]


def endpoint_source(url: str, stage: str) -> FunctionSource:
    """The registered endpoint source for `url` and `stage`.

    Raises:
        RuntimeConfigError: no factory is registered (the infra tier provides it).
    """
    if not _endpoint_sources:
        raise RuntimeConfigError(f"functions serve --from-endpoint {url}: reading a deployment back from an AWS "
                                 "endpoint is provided by the infra tier and is not registered in this build; "
                                 "serve handlers from the source tree with --function NAME=module.handler")
    return _endpoint_sources[0](url, stage)


DEFAULT_FUNCTIONS = (
    FunctionSpec(name="strata-rollout", handler="functions._handlers.rollout_handler"),
    FunctionSpec(name="strata-ping", handler="functions._handlers.ping_handler"),
)


def parse_function_option(text: str) -> FunctionSpec:
    """Parse ``NAME=module.handler[,timeout=S][,memory=MB][,concurrency=N][,versions=1+2][,alias=A:V]...``.

    Also ``on-failure=ARN`` (the SQS queue failed Event invocations go to) and ``retries=N`` (0-2).

    Raises:
        RuntimeConfigError: the text does not have that form.
    """
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise RuntimeConfigError(f"--function {shown(text)}: expected NAME=module.handler[,timeout=S,memory=MB,"
                                 "concurrency=N,versions=1+2,alias=NAME:VERSION,on-failure=ARN,retries=N]")
    handler, *options = rest.split(",")
    kwargs: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    try:
        for option in options:
            key, _, value = option.partition("=")
            if key == "timeout":
                kwargs["timeout_s"] = float(value)
            elif key == "memory":
                kwargs["memory_mb"] = int(value)
            elif key == "concurrency":
                kwargs["reserved_concurrency"] = int(value)
            elif key == "versions":
                kwargs["versions"] = tuple(value.split("+"))
            elif key == "alias":
                alias, _, version = value.partition(":")
                aliases[alias] = version
            elif key == "on-failure":
                kwargs["on_failure"] = value
            elif key == "retries":
                kwargs["async_retries"] = int(value)
            else:
                raise RuntimeConfigError(f"--function {shown(text)}: unknown option {shown(key)}; use timeout, "
                                         "memory, concurrency, versions, alias, on-failure or retries")
    except ValueError as exc:
        if isinstance(exc, RuntimeConfigError):
            raise
        raise RuntimeConfigError(f"--function {shown(text)}: {exc}; numbers are expected for timeout, memory, "
                                 "concurrency and retries") from exc
    return FunctionSpec(name=name, handler=handler, aliases=aliases, **kwargs)


# ---- invocations and workers --------------------------------------------------------------------------------

@dataclass
class _Outcome:
    body: bytes
    error_type: str | None = None
    """None on success, else the function error (reported as ``X-Amz-Function-Error: Unhandled``)."""


class _Invocation:
    """One delivery of an event to a worker."""

    def __init__(self, spec: FunctionSpec, version: str, payload: bytes, client_context: str | None,
                 qualifier: str | None = None) -> None:
        self.spec = spec
        self.version = version
        self.qualifier = qualifier
        """The qualifier as invoked (an alias, a version or None): the invoked function ARN carries it."""
        self.payload = payload
        self.client_context = client_context
        self.request_id = str(uuid.uuid4())
        self.delivered = threading.Event()
        self.delivered_at = 0.0
        self.done = threading.Event()
        self.outcome: _Outcome | None = None
        self._lock = threading.Lock()

    def finish(self, outcome: _Outcome) -> bool:
        """Record the outcome unless one is already recorded; True when this call recorded it."""
        with self._lock:
            if self.outcome is not None:
                return False
            self.outcome = outcome
        self.done.set()
        self.delivered.set()  # nobody waits for a delivery any more (an init error or exit can end it early)
        return True


def _error_body(message: str, error_type: str) -> bytes:
    return json.dumps({"errorMessage": message, "errorType": error_type}).encode()


class WorkerState(enum.Enum):
    """Life of a worker process."""

    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    DEAD = "dead"


class _Worker:
    """One awslambdaric process and the Runtime API shim it polls."""

    def __init__(self, spec: FunctionSpec, runtime: LocalRuntime, version: str = "$LATEST") -> None:
        self.spec = spec
        self.version = version
        self.key = _pool_key(spec, version)
        self.state = WorkerState.STARTING
        self.invocations = 0
        self.last_used = time.monotonic()
        self._runtime = runtime
        # The worker's pending GET /next (its handler and a "written" event), or an invocation waiting for it:
        # deliver() writes the invocation straight onto a waiting poll, saving a thread wake-up per call.
        self._poll_lock = threading.Lock()
        self._poller: tuple[BaseHTTPRequestHandler, threading.Event] | None = None
        self._queued: _Invocation | None = None
        self._current: _Invocation | None = None
        self._init_error: bytes | None = None
        self._log = bytearray()
        self._log_dropped = 0  # bytes trimmed from the front of _log; marks are absolute offsets
        self._log_lock = threading.Lock()
        self._shim = _QuietServer(("127.0.0.1", 0), _make_shim_handler(self))
        threading.Thread(target=self._shim.serve_forever, name=f"shim-{spec.name}", daemon=True).start()
        env = self._environment(runtime.config, runtime.faults)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "functions._worker", spec.handler], env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, cwd=spec.code_dir or _REPO_ROOT,
                                         start_new_session=True)
        except OSError:
            self._shim.shutdown()
            self._shim.server_close()
            raise
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        threading.Thread(target=self._pump_logs, name=f"log-{spec.name}", daemon=True).start()
        threading.Thread(target=self._watch, name=f"watch-{spec.name}", daemon=True).start()

    def _environment(self, config: RuntimeConfig, faults: FaultConfig) -> dict[str, str]:
        spec = self.spec
        path = [p for p in (spec.code_dir, _REPO_ROOT, os.environ.get("PYTHONPATH")) if p]
        env = {**os.environ, **spec.environment}
        env.update({
            "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{self._shim.server_address[1]}",
            "AWS_LAMBDA_FUNCTION_NAME": spec.name, "AWS_LAMBDA_FUNCTION_VERSION": self.version,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": f"local/{uuid.uuid4().hex}",
            "AWS_REGION": config.region, "AWS_DEFAULT_REGION": env.get("AWS_DEFAULT_REGION", config.region),
            "AWS_EXECUTION_ENV": "AWS_Lambda_python3.11", "_HANDLER": spec.handler,
            "LAMBDA_TASK_ROOT": spec.code_dir or _REPO_ROOT, "PYTHONPATH": os.pathsep.join(path),
            # One Lambda vCPU per 1769 MB; a worker must not spawn a BLAS thread per core of the host.
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            PARENT_ENV: str(os.getpid()),  # the worker stops when the runtime is gone (functions._lifetime)
        })
        if config.enforce_memory:
            env["STRATA_RLIMIT_AS_BYTES"] = str((spec.memory_mb + config.address_space_slack_mb) * 1024 * 1024)
        if faults.cold_start_delay_s > 0:
            env["STRATA_COLD_START_DELAY_S"] = str(faults.cold_start_delay_s)
        return env

    # -- logs --
    def _pump_logs(self) -> None:
        while self.state is not WorkerState.DEAD:
            with contextlib.suppress(OSError, ValueError):
                ready, _, _ = select.select([self._fd], [], [], 0.2)
                if ready and not self.drain_logs():
                    return  # EOF: the process closed its stdout

    def drain_logs(self) -> bool:
        """Move whatever the worker has written into the log buffer; False at end of file."""
        with self._log_lock:
            while True:
                try:
                    chunk = os.read(self._fd, 65536)
                except BlockingIOError:
                    return True
                except OSError:
                    return False
                if not chunk:
                    return False
                self._log += chunk
                if len(self._log) > 256 * 1024:
                    cut = len(self._log) - 64 * 1024
                    del self._log[:cut]
                    self._log_dropped += cut

    def log_mark(self) -> int:
        """Current end of the log (an absolute byte offset)."""
        with self._log_lock:
            return self._log_dropped + len(self._log)

    def log_since(self, mark: int) -> bytes:
        """Log bytes written after `mark` (the part still buffered, when more than 64 KB came since)."""
        self.drain_logs()
        with self._log_lock:
            return bytes(self._log[max(mark - self._log_dropped, 0):])

    # -- invocation protocol (runtime side) --
    def deliver(self, invocation: _Invocation) -> None:
        """Hand `invocation` to the worker: onto its waiting poll, or queued for its next one."""
        self.state = WorkerState.BUSY
        self._current = invocation
        with self._poll_lock:
            poller, self._poller = self._poller, None
            if poller is None:
                self._queued = invocation
                return
        try:
            self.send_invocation(poller[0], invocation)
        finally:
            poller[1].set()

    def send_invocation(self, handler: BaseHTTPRequestHandler, inv: _Invocation) -> None:
        """Answer a GET /next with `inv` (Lambda's Runtime API headers)."""
        inv.delivered_at = time.monotonic()
        deadline_ms = int((time.time() + inv.spec.timeout_s) * 1000)
        arn = function_arn(self._runtime.config.region, inv.spec.name, inv.qualifier)
        headers = {"Lambda-Runtime-Aws-Request-Id": inv.request_id,
                   "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
                   "Lambda-Runtime-Invoked-Function-Arn": arn,
                   "Lambda-Runtime-Trace-Id": f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]}",
                   "Content-Type": "application/json"}
        if inv.client_context:
            headers["Lambda-Runtime-Client-Context"] = inv.client_context
        inv.delivered.set()
        with contextlib.suppress(OSError):  # a worker that died meanwhile is reported by _watch
            _write_response(handler, 200, inv.payload, headers)

    def poll(self, handler: BaseHTTPRequestHandler) -> bool:
        """Serve the worker's GET /next: return once an invocation was written onto it; False if it died first."""
        if self.state is WorkerState.STARTING:
            self.state = WorkerState.IDLE
        written = threading.Event()
        with self._poll_lock:
            queued, self._queued = self._queued, None
            if queued is None:
                self._poller = (handler, written)
        if queued is not None:
            self.send_invocation(handler, queued)
            return True
        while not written.wait(0.5):
            if self.state is WorkerState.DEAD:
                with self._poll_lock:
                    if self._poller is not None and self._poller[0] is handler:
                        self._poller = None
                        return False
                written.wait()  # deliver() took this poll and is writing onto it
                return True
        return True

    def _watch(self) -> None:
        self.proc.wait()
        self.state = WorkerState.DEAD
        self.drain_logs()
        with self._log_lock:
            assert self.proc.stdout is not None
            self.proc.stdout.close()
        current = self._current
        if current is not None:
            if self._init_error is not None:
                current.finish(_Outcome(self._init_error, "Unhandled"))
            else:
                code = self.proc.returncode
                how = f"signal: {signal.Signals(-code).name.lower()}" if code < 0 else f"exit status {code}"
                current.finish(_Outcome(_error_body(f"RequestId: {current.request_id} Error: Runtime exited "
                                                    f"with error: {how}", "Runtime.ExitError"), "Unhandled"))
        self._shim.shutdown()
        self._shim.server_close()
        self._runtime.worker_died(self)

    def kill(self) -> None:
        """Stop the process at once (timeout, crash injection, shutdown); it is never handed work again."""
        self.state = WorkerState.DEAD
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    # -- invocation protocol (worker side, called by the shim) --
    def complete(self, request_id: str, body: bytes, error_type: str | None) -> bool:
        current = self._current
        if current is None or current.request_id != request_id:
            return False
        current.finish(_Outcome(body, error_type))
        return True

    def init_failed(self, body: bytes) -> None:
        self._init_error = body

    def release(self) -> None:
        """Back to the idle pool after an invocation finished."""
        self._current = None
        self.invocations += 1
        self.last_used = time.monotonic()
        if self.state is WorkerState.BUSY:
            self.state = WorkerState.IDLE


def _make_shim_handler(worker: _Worker) -> type[BaseHTTPRequestHandler]:
    class Shim(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None) -> None:
            _write_response(self, status, body, headers or {})

        def do_GET(self) -> None:
            if self.path != _RUNTIME_PREFIX + "invocation/next":
                self._reply(404, b'{"errorMessage": "unknown runtime API path"}')
                return
            if not worker.poll(self):
                self._reply(500, b'{"errorMessage": "runtime is shutting down"}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            parts = self.path[len(_RUNTIME_PREFIX):].split("/")
            if len(body) < length and len(parts) == 3 and parts[0] == "invocation":
                # The worker died mid-reply (its connection closed early): a torn result is no result. Lambda
                # reports a runtime that fails this way as an Unhandled function error; so do we.
                worker.complete(parts[1], _error_body(
                    f"RequestId: {parts[1]} Error: the runtime's reply was cut short ({len(body)} of {length} "
                    "bytes); the worker exited mid-reply", "Runtime.ExitError"), "Unhandled")
                return
            if parts == ["init", "error"]:
                worker.init_failed(body)
                self._reply(202, b'{"status": "OK"}')
                return
            if len(parts) == 3 and parts[0] == "invocation" and parts[2] in ("response", "error"):
                worker.drain_logs()  # the handler's prints reached the pipe before this POST was sent
                ok = worker.complete(parts[1], body, None if parts[2] == "response" else "Unhandled")
                self._reply(202 if ok else 400, b'{"status": "OK"}' if ok else b'{"errorMessage": "unknown id"}')
                return
            self._reply(404, b'{"errorMessage": "unknown runtime API path"}')

    return Shim


class _QuietServer(ThreadingHTTPServer):
    """A threading HTTP server that does not print a traceback when a peer goes away mid-request."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | OSError):
            return  # a killed worker or a client that gave up: nothing to report
        super().handle_error(request, client_address)


def _write_response(handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: Mapping[str, str]) -> None:
    # One write for status line, headers and body: with separate writes Nagle + delayed ACK add ~40 ms.
    lines = [f"HTTP/1.1 {status} {handler.responses.get(status, ('',))[0]}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += [f"Content-Length: {len(body)}", "Date: " + handler.date_time_string(), "", ""]
    handler.wfile.write("\r\n".join(lines).encode("latin-1") + body)
    handler.wfile.flush()


# ---- the runtime --------------------------------------------------------------------------------------------

@dataclass
class FunctionStats:
    """Counters of one function."""

    invocations: int = 0
    cold_starts: int = 0
    throttles: int = 0
    timeouts: int = 0
    errors: int = 0
    async_deliveries: int = 0
    duplicates_injected: int = 0
    async_failures: int = 0
    """Event invocations whose retries were spent (each sent to the on-failure queue when there is one)."""
    destination_errors: int = 0
    """Destination records that could not be sent (the queue unreachable); each is also printed to stderr."""


class _Throttled(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_ApiError = ApiError


def _pool_key(spec: FunctionSpec, version: str) -> tuple[str, str, str]:
    """Workers are pooled per function, version and code: a worker never runs another version's code."""
    return spec.name, version, f"{spec.code_dir}\0{spec.code_sha256}\0{spec.handler}"


class LocalRuntime:
    """Lambda's Invoke API on loopback, backed by warm awslambdaric worker processes (see the module docstring).

    Args:
        functions: What to serve.
        config: Listening address and limits.
        faults: Faults to inject (none by default).
    """

    def __init__(self, functions: FunctionSource, *, config: RuntimeConfig | None = None,
                 faults: FaultConfig | None = None) -> None:
        self.functions = functions
        self.config = config or RuntimeConfig()
        self.faults = faults or FaultConfig()
        self.stats: dict[str, FunctionStats] = collections.defaultdict(FunctionStats)
        self._rng = random.Random(self.faults.seed)
        self._lock = threading.Condition()
        self._workers: dict[tuple[str, str, str], list[_Worker]] = collections.defaultdict(list)
        self._busy = 0
        self._async: dict[str, queue.Queue[tuple[_Invocation, int] | None]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._closed = False
        self._stop_requested = False

    # -- lifecycle --
    def start(self) -> LocalRuntime:
        """Bind and serve in a background thread; returns self."""
        self._server = _QuietServer((self.config.host, self.config.port), _make_api_handler(self))
        threading.Thread(target=self._server.serve_forever, name="lambda-api", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        """``http://host:port`` to pass as boto3's ``endpoint_url``."""
        assert self._server is not None, "LocalRuntime.url: call start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        """Stop serving and kill every worker."""
        self._closed = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for q in self._async.values():
            q.put(None)
        with self._lock:
            workers = [w for ws in self._workers.values() for w in ws]
            self._lock.notify_all()
        for w in workers:
            w.kill()
        for w in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=5)

    def __enter__(self) -> LocalRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def warm_workers(self, name: str) -> int:
        """Live worker processes of function `name`."""
        with self._lock:
            return sum(1 for key, ws in self._workers.items() if key[0] == name
                       for w in ws if w.state is not WorkerState.DEAD)

    # -- pool --
    def _acquire(self, spec: FunctionSpec, version: str = "$LATEST", *, wait: bool) -> tuple[_Worker, bool]:
        """An idle worker (or a new one, cold) for `spec` at `version`, and whether it is cold.

        The function's reserved concurrency counts the workers of all its versions; an idle worker of another
        version (or of replaced code) gives its place up when this version needs one.

        Raises:
            _Throttled: at a concurrency cap and not waiting (the reason is Lambda's ThrottleReason).
        """
        with self._lock:
            while not self._closed:
                workers = self._workers[_pool_key(spec, version)]
                self._reap_idle(workers)
                if self._busy >= self.config.account_concurrency:
                    reason = "ConcurrentInvocationLimitExceeded"
                else:
                    for w in workers:
                        if w.state is WorkerState.IDLE:
                            w.state = WorkerState.BUSY
                            self._busy += 1
                            return w, False
                    others = [w for key, ws in self._workers.items() if key[0] == spec.name and ws is not workers
                              for w in ws if w.state is not WorkerState.DEAD]
                    live = sum(1 for w in workers if w.state is not WorkerState.DEAD) + len(others)
                    idle_other = next((w for w in others if w.state is WorkerState.IDLE), None)
                    if live >= spec.reserved_concurrency and idle_other is not None:
                        idle_other.kill()
                        live -= 1
                    if live < spec.reserved_concurrency:
                        worker = _Worker(spec, self, version)
                        worker.state = WorkerState.BUSY
                        workers.append(worker)
                        self._busy += 1
                        self.stats[spec.name].cold_starts += 1  # under self._lock
                        return worker, True
                    reason = "ReservedFunctionConcurrentInvocationLimitExceeded"
                if not wait:
                    raise _Throttled(reason)
                self._lock.wait(timeout=0.5)
        raise _Throttled("ConcurrentInvocationLimitExceeded")  # shutting down

    def _reap_idle(self, workers: list[_Worker]) -> None:
        """Kill workers idle for longer than `RuntimeConfig.idle_timeout_s` (Lambda reclaims idle environments)."""
        now = time.monotonic()
        for w in workers:
            if w.state is WorkerState.IDLE and now - w.last_used > self.config.idle_timeout_s:
                w.kill()

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            self._busy -= 1
            worker.release()
            self._lock.notify_all()

    def worker_died(self, worker: _Worker) -> None:
        """Drop a dead worker from its pool (called by the worker's watcher thread)."""
        with self._lock:
            workers = self._workers[worker.key]
            if worker in workers:
                workers.remove(worker)
            self._lock.notify_all()

    # -- invoking --
    def run(self, spec: FunctionSpec, version: str, payload: bytes, *, client_context: str | None = None,
            wait_for_worker: bool = False, qualifier: str | None = None) -> tuple[_Outcome, _Invocation, bytes]:
        """Run one invocation to its outcome.

        Raises:
            _Throttled: no worker is free and `wait_for_worker` is False.
        """
        worker, cold = self._acquire(spec, version, wait=wait_for_worker)
        self._count(spec.name, "invocations")
        inv = _Invocation(spec, version, payload, client_context, qualifier)
        mark = worker.log_mark()
        started = time.monotonic()
        worker.deliver(inv)
        try:
            init_allowance = INIT_TIMEOUT_S + self.faults.cold_start_delay_s if cold else 0.0
            if self.faults.crash_rate and self._roll(self.faults.crash_rate) and inv.delivered.wait(
                    init_allowance + spec.timeout_s):
                worker.kill()
            if not inv.delivered.wait(init_allowance + spec.timeout_s) and not inv.done.is_set():
                worker.kill()
                inv.finish(_Outcome(_error_body(f"RequestId: {inv.request_id} Error: the function did not "
                                                f"initialise within {init_allowance:g} s",
                                                "Runtime.InitTimeout"), "Unhandled"))
            remaining = spec.timeout_s - (time.monotonic() - (inv.delivered_at or started))
            if not inv.done.wait(max(remaining, 0.0)):
                worker.kill()
                self._count(spec.name, "timeouts")
                inv.finish(_Outcome(_error_body(f"{time.strftime('%Y-%m-%dT%H:%M:%S')}Z {inv.request_id} "
                                                f"Task timed out after {spec.timeout_s:.2f} seconds",
                                                "Sandbox.Timedout"), "Unhandled"))
            inv.done.wait()
        finally:
            self._release(worker)
        outcome = inv.outcome
        assert outcome is not None
        if outcome.error_type is not None:
            self._count(spec.name, "errors")
        duration_ms = (time.monotonic() - (inv.delivered_at or started)) * 1000
        logs = (f"START RequestId: {inv.request_id} Version: {version}\n".encode() + worker.log_since(mark)
                + f"END RequestId: {inv.request_id}\nREPORT RequestId: {inv.request_id}\tDuration: "
                  f"{duration_ms:.2f} ms\tBilled Duration: {max(1, int(duration_ms + 0.999))} ms\tMemory Size: "
                  f"{spec.memory_mb} MB\n".encode())
        return outcome, inv, logs

    def _count(self, name: str, counter: str, by: int = 1) -> None:
        with self._lock:
            stats = self.stats[name]
            setattr(stats, counter, getattr(stats, counter) + by)

    def _roll(self, rate: float) -> bool:
        with self._lock:
            return rate > 0 and self._rng.random() < rate

    def enqueue_async(self, spec: FunctionSpec, version: str, payload: bytes, client_context: str | None,
                      qualifier: str | None = None) -> str:
        """Queue an Event invocation (and, by `FaultConfig.duplicate_rate`, a duplicate of it); return its id."""
        with self._lock:
            q = self._async.get(spec.name)
            if q is None:
                q = self._async[spec.name] = queue.Queue()
                for i in range(spec.reserved_concurrency):
                    threading.Thread(target=self._dispatch, args=(spec.name, q), name=f"async-{spec.name}-{i}",
                                     daemon=True).start()
        copies = 2 if self._roll(self.faults.duplicate_rate) else 1
        self._count(spec.name, "duplicates_injected", copies - 1)
        event = _Invocation(spec, version, payload, client_context, qualifier)
        for _ in range(copies):
            q.put((event, 0))
        return event.request_id

    def _dispatch(self, name: str, q: queue.Queue[tuple[_Invocation, int] | None]) -> None:
        while not self._closed:
            item = q.get()
            if item is None:
                return
            template, attempt = item
            try:
                outcome = self.run(template.spec, template.version, template.payload,
                                   client_context=template.client_context, wait_for_worker=True,
                                   qualifier=template.qualifier)[0]
            except _Throttled:
                return  # the runtime is shutting down
            self._count(name, "async_deliveries")
            if outcome.error_type is None:
                continue
            retries = self.config.async_retries if template.spec.async_retries is None else template.spec.async_retries
            if attempt < retries:
                time.sleep(self.config.async_retry_delay_s * (attempt + 1))
                q.put((template, attempt + 1))
            else:
                self._count(name, "async_failures")
                if template.spec.on_failure:
                    self._send_failure(template, outcome, attempt + 1)

    def _send_failure(self, event: _Invocation, outcome: _Outcome, attempts: int) -> None:
        """Send the destination record of an Event invocation whose retries are spent to its on-failure queue."""
        from functions._destinations import failure_record, send_to_queue

        record = failure_record(request_id=event.request_id, function_arn=function_arn(
            self.config.region, event.spec.name, event.qualifier or event.version), attempts=attempts,
            payload=event.payload, executed_version=event.version, function_error=outcome.error_type or "Unhandled",
            response=outcome.body)
        try:
            send_to_queue(event.spec.on_failure, record, region=self.config.region)
        except Exception as exc:  # the queue or its endpoint is gone: count it, say it, keep serving
            self._count(event.spec.name, "destination_errors")
            print(f"strata functions: could not send the failure record of {event.spec.name} request "
                  f"{event.request_id} to {event.spec.on_failure}: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)

    def request_stop(self) -> None:
        """Ask `serve_forever` to return (safe from a signal handler)."""
        self._stop_requested = True

    def serve_forever(self) -> None:
        """Block until `request_stop` or an interrupt, then stop (the CLI's loop)."""
        try:
            while not self._closed and not self._stop_requested:
                time.sleep(0.2)
        finally:
            self.stop()

    # -- the HTTP API --
    @property
    def account(self) -> Account:
        """What the read operations report of the runtime itself."""
        return Account(region=self.config.region, concurrency=self.config.account_concurrency,
                       async_retries=self.config.async_retries)

    def _resolve(self, function: str, query: Mapping[str, list[str]]) -> tuple[FunctionSpec, str, str | None]:
        """``(spec, version, qualifier)`` of an invocation's target; raises Lambda's 400 / 404."""
        name, qualifier = split_qualifier(function, query)
        latest = self.functions.get(name)
        version = latest.resolve(qualifier) if latest is not None else None
        spec = latest if version == "$LATEST" else (
            self.functions.version_spec(name, version) if version is not None else None)
        if spec is None or version is None or latest is None:
            raise not_found(self.config.region, name, qualifier)
        if (spec.on_failure, spec.async_retries) != (latest.on_failure, latest.async_retries):
            # One event-invoke config per function here (Lambda keeps one per qualifier): every version and
            # alias fails over to the function's queue.
            spec = dataclasses.replace(spec, on_failure=latest.on_failure, async_retries=latest.async_retries)
        return spec, version, qualifier

    def _admit(self, name: str, payload: bytes, limit: int) -> bytes:
        """The payload checks and injected faults every invocation passes before it runs."""
        if len(payload) > limit:
            # AWS answers an oversized Invoke with this code (not the modelled RequestTooLargeException), so
            # callers must catch it by code or by the 413 status; infra.aws.LambdaInvoker does both.
            raise _ApiError(413, "RequestEntityTooLargeException", {
                "Type": "User", "message": f"Request must be smaller than {limit} bytes for the InvokeFunction "
                                           "operation"})
        payload = parse_payload(payload)
        if self._roll(self.faults.throttle_rate):
            self._count(name, "throttles")
            raise _ApiError(429, "TooManyRequestsException", {
                "Type": "User", "message": "Rate Exceeded.", "Reason": "CallerRateLimitExceeded"},
                {"Retry-After": "1"})
        if self._roll(self.faults.service_error_rate):
            raise _ApiError(500, "ServiceException", {"Type": "Service", "Message": "injected service error"})
        return payload

    def _run_sync(self, spec: FunctionSpec, version: str, payload: bytes, client_context: str | None,
                  qualifier: str | None) -> tuple[_Outcome, bytes]:
        try:
            outcome, _, logs = self.run(spec, version, payload, client_context=client_context, qualifier=qualifier)
        except _Throttled as exc:
            self._count(spec.name, "throttles")
            raise _ApiError(429, "TooManyRequestsException", {
                "Type": "User", "message": "Rate Exceeded.", "Reason": exc.reason}, {"Retry-After": "1"}) from exc
        return outcome, logs

    def handle_invoke(self, function: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
                      payload: bytes) -> tuple[int, bytes, dict[str, str]]:
        """Answer one Invoke request: ``(status, body, headers)`` (raises `_ApiError` for AWS error shapes)."""
        invocation_type = check_enum("invocationType", headers.get("x-amz-invocation-type", "RequestResponse"),
                                     INVOCATION_TYPES)
        log_type = check_enum("logType", headers.get("x-amz-log-type", "None"), LOG_TYPES)
        spec, version, qualifier = self._resolve(function, query)
        payload = self._admit(spec.name, payload, ASYNC_PAYLOAD_LIMIT if invocation_type == "Event"
                              else SYNC_PAYLOAD_LIMIT)
        client_context = decode_client_context(headers.get("x-amz-client-context"))
        if invocation_type == "DryRun":
            return 204, b"", {}
        if invocation_type == "Event":
            request_id = self.enqueue_async(spec, version, payload, client_context, qualifier)
            return 202, b"", {"x-amzn-RequestId": request_id}
        outcome, logs = self._run_sync(spec, version, payload, client_context, qualifier)
        body, error_type = outcome.body, outcome.error_type
        if len(body) > SYNC_PAYLOAD_LIMIT:
            body = _error_body(f"Response payload size ({len(body)} bytes) exceeded maximum allowed payload size "
                               f"({SYNC_PAYLOAD_LIMIT} bytes).", "Function.ResponseSizeTooLarge")
            error_type = "Unhandled"
        out = {"X-Amz-Executed-Version": version, "Content-Type": "application/json"}
        if error_type is not None:
            out["X-Amz-Function-Error"] = error_type
        if log_type == "Tail":
            out["X-Amz-Log-Result"] = base64.b64encode(logs[-LOG_TAIL_BYTES:]).decode("ascii")
        return 200, body, out

    def handle_invoke_stream(self, function: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
                             payload: bytes) -> tuple[int, bytes, dict[str, str]]:
        """Answer one InvokeWithResponseStream: the response as one ``PayloadChunk``, then ``InvokeComplete``.

        A Python handler returns its whole result, so there is nothing to stream as it is made; this is what AWS
        answers for a function that does not stream its response (every Python runtime).
        """
        invocation_type = check_enum("invocationType", headers.get("x-amz-invocation-type", "RequestResponse"),
                                     STREAM_INVOCATION_TYPES)
        log_type = check_enum("logType", headers.get("x-amz-log-type", "None"), LOG_TYPES)
        spec, version, qualifier = self._resolve(function, query)
        payload = self._admit(spec.name, payload, SYNC_PAYLOAD_LIMIT)
        client_context = decode_client_context(headers.get("x-amz-client-context"))
        if invocation_type == "DryRun":
            return 204, b"", {}
        outcome, logs = self._run_sync(spec, version, payload, client_context, qualifier)
        body, error_type = outcome.body, outcome.error_type
        if len(body) > STREAM_RESPONSE_LIMIT:
            body = _error_body(f"Response payload size ({len(body)} bytes) exceeded maximum allowed payload size "
                               f"({STREAM_RESPONSE_LIMIT} bytes).", "Function.ResponseSizeTooLarge")
            error_type = "Unhandled"
        complete: dict[str, str] = {}
        if error_type is not None:
            complete["ErrorCode"] = error_type
            complete["ErrorDetails"] = body.decode("utf-8", errors="replace")
        if log_type == "Tail":
            complete["LogResult"] = base64.b64encode(logs[-LOG_TAIL_BYTES:]).decode("ascii")
        stream = stream_event("PayloadChunk", body) + stream_event(
            "InvokeComplete", json.dumps(complete).encode(), content_type="application/json")
        return 200, stream, {"X-Amz-Executed-Version": version,
                             "Content-Type": "application/vnd.amazon.eventstream"}

    def handle_invoke_async(self, function: str, payload: bytes) -> tuple[int, bytes, dict[str, str]]:
        """Answer the deprecated InvokeAsync: an Event invocation of ``$LATEST`` (or the name's qualifier)."""
        spec, version, qualifier = self._resolve(function, {})
        payload = self._admit(spec.name, payload, ASYNC_PAYLOAD_LIMIT)
        request_id = self.enqueue_async(spec, version, payload, None, qualifier)
        return 202, json.dumps({"Status": 202}).encode(), {"Content-Type": "application/json",
                                                            "x-amzn-RequestId": request_id}


def _make_api_handler(runtime: LocalRuntime) -> type[BaseHTTPRequestHandler]:
    class Api(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _error(self, exc: _ApiError, *, body: bool = True) -> None:
            headers = {"x-amzn-ErrorType": exc.error_type, "Content-Type": "application/json",
                       "x-amzn-RequestId": str(uuid.uuid4()), **exc.headers}
            _write_response(self, exc.status, json.dumps(exc.body).encode() if body else b"", headers)

        def _answer(self, call: Callable[[], tuple[int, bytes, dict[str, str]]]) -> None:
            """Write what `call` answers; AWS's error shape for an `ApiError`, Lambda's 500 for anything else."""
            try:
                status, body, out = call()
            except _ApiError as exc:
                self._error(exc)
                return
            except Exception as exc:  # a runtime bug, a worker that cannot start, a source that cannot be read
                self._error(_ApiError(500, "ServiceException", {
                    "Type": "Service", "Message": f"local runtime failed: {type(exc).__name__}: {exc}"}))
                return
            _write_response(self, status, body, {"x-amzn-RequestId": str(uuid.uuid4()), **out})

        def _drain(self) -> bytes:
            """The request body; one over the sync limit is read in chunks and dropped, as ``limit + 1`` bytes.

            The client sends the whole body before it reads the 413.
            """
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:  # the body's end is unknown: answer, and close rather than misread what follows
                self.close_connection = True
                raise invalid_content(f"Content-Length {shown(self.headers.get('Content-Length'))} is not a "
                                      "number of bytes")
            if length <= SYNC_PAYLOAD_LIMIT:
                return self.rfile.read(length)
            left = length
            while left > 0:
                left -= len(self.rfile.read(min(left, 1 << 20))) or left
            return b"\0" * (SYNC_PAYLOAD_LIMIT + 1)

        def do_GET(self) -> None:
            if self.path == "/health":
                _write_response(self, 200, json.dumps({"functions": runtime.functions.names()}).encode(),
                                {"Content-Type": "application/json"})
                return
            url = urlparse(self.path)

            def read() -> tuple[int, bytes, dict[str, str]]:
                body = handle_get(runtime.functions, runtime.account, url.path, parse_qs(url.query))
                return 200, json.dumps(body).encode(), {"Content-Type": "application/json"}

            self._answer(read)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """Answer http.server's own refusals in AWS's JSON shape rather than its HTML page, then close.

            They are a header line over 64 KB, a garbled request line and a method with no ``do_*``.
            """
            self.close_connection = True
            if code == 501:  # a method http.server has no do_* for
                method, path = str(getattr(self, "command", "") or "?"), str(getattr(self, "path", ""))
                exc = unknown_operation(method, urlparse(path).path)
            else:
                exc = invalid_content(f"the request could not be read: {message or code}")
            self._error(_ApiError(exc.status, exc.error_type, exc.body, {**exc.headers, "Connection": "close"}))

        def do_POST(self) -> None:
            try:
                payload = self._drain()
            except _ApiError as exc:
                self._error(exc)
                return
            url = urlparse(self.path)
            query = parse_qs(url.query)
            headers = {k.lower(): v for k, v in self.headers.items()}
            path = url.path
            if path.startswith(_INVOKE_PREFIX) and path.endswith("/invocations"):
                function = path[len(_INVOKE_PREFIX):-len("/invocations")]
                self._answer(lambda: runtime.handle_invoke(function, query, headers, payload))
            elif path.startswith(_STREAM_PREFIX) and path.endswith("/response-streaming-invocations"):
                function = path[len(_STREAM_PREFIX):-len("/response-streaming-invocations")]
                self._answer(lambda: runtime.handle_invoke_stream(function, query, headers, payload))
            elif path.startswith(_ASYNC_PREFIX) and path.rstrip("/").endswith("/invoke-async"):
                function = path.rstrip("/")[len(_ASYNC_PREFIX):-len("/invoke-async")]
                self._answer(lambda: runtime.handle_invoke_async(function, payload))
            else:
                self._error(unknown_operation("POST", path))

        def _unknown(self) -> None:
            with contextlib.suppress(_ApiError):  # an unreadable body: the connection closes after this answer
                self._drain()
            self._error(unknown_operation(self.command, urlparse(self.path).path))

        # Every write API (CreateFunction is a POST, answered above), and any other method: AWS's JSON refusal
        # of an unknown operation, not http.server's HTML 501 page.
        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _unknown

        def do_HEAD(self) -> None:
            self._error(unknown_operation("HEAD", urlparse(self.path).path), body=False)

    return Api
