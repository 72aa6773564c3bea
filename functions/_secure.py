"""The secure service plane: one TLS option set for every strata gRPC server and client, checked on every call.

Every gRPC service strata runs (the env service, the parameter server, the replay service) and every client of
one builds its server or channel here, from one `ServiceTLS`:

    ServiceTLS         --tls-ca --tls-cert --tls-key (mutual TLS), --tls-token-file (a per-run bearer token),
                       --insecure-plaintext-off-loopback; the same keys in a TOML ``[tls]`` table and in
                       ``STRATA_TLS_CA`` ... ``STRATA_INSECURE_PLAINTEXT_OFF_LOOPBACK`` (`TLS_LAYOUT`)
    new_server(...)    a grpc.Server whose interceptor checks each call (below); grpc.health.v1 is exempt
    bind(...)          mutual TLS when configured; plaintext on loopback; plaintext off loopback only with the
                       opt-out, said loudly on stderr; anything else is refused before the port opens
    open_channel(...)  the client side: TLS with the process's own certificate, the token on every call
    serve_health(...)  an optional plaintext port that answers grpc.health.v1 and nothing else, for probes
                       (Kubernetes' gRPC probes speak no TLS); it carries no data and takes no call of ours

Who may call what is one table, `ACCESS`: service -> method -> the certificate roles (`device._pki`) allowed to
call it. With TLS, a handshake needs a certificate of the run's CA (grpc refuses the others, and its core logs one
``Handshake failed`` line on the server); then each call's peer role (the certificate's ``spiffe://strata/ROLE``
name) must be in the table for the method, and with a token file each call must carry
``authorization: Bearer TOKEN``. A refused call gets UNAUTHENTICATED or PERMISSION_DENIED with one line saying
why, and the server logs one line per peer and reason (`SERVICE_LOG`).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from device import ConfigError, require, shown
from device._config_file import ConfigLayout, load_layered
from device._pki import TLSMaterial, check_tls_files, read_token
from functions._errors import FunctionsError

SERVICE_LOG = logging.getLogger("strata.service_plane")
"""Where servers log refused calls (one line per peer, method's service and reason, at most once a minute)."""

HEALTH_SERVICE = "grpc.health.v1.Health"

ROLES = ("learner", "env")
"""Certificate roles of the service plane: the learner (every hybrid unit too) and env hosts."""

CERT_ROLES = (*ROLES, "broker")
"""Roles `strata certs` issues: the service plane's, and ``broker`` (a Mosquitto TLS listener's certificate under
the run CA; `ACCESS` grants it no gRPC call)."""

ACCESS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "strata.env.v1.EnvService": {"*": ("learner",)},
    "strata.params.v1.ParameterServer": {"Push": ("learner",), "Pull": ("learner", "env"),
                                         "Latest": ("learner", "env")},
    "strata.replay.v1.ReplayService": {"*": ("learner", "env")},
}
"""Service -> method (``*``: every other method) -> the roles that may call it. grpc.health.v1 is open to any peer
that completed the handshake."""


class ServicePlaneError(FunctionsError, ConfigError):
    """A service-plane setting is refused: plaintext off loopback without the opt-out, half a TLS trio."""


class ServiceRefusedError(FunctionsError):
    """A service refused this client: TLS handshake, certificate identity or token (not a dead service)."""


@dataclass(frozen=True, kw_only=True)
class ServiceTLS:
    """How a strata gRPC server or client secures its connections (one option set for all of them)."""

    tls_ca: str = ""
    """CA certificate (PEM) of the run: peers must present a certificate it issued (`strata certs` writes ca.crt).
    With --tls-cert and --tls-key, connections use mutual TLS."""
    tls_cert: str = ""
    """This process's certificate (PEM), issued by --tls-ca for its role (learner or env) and hosts."""
    tls_key: str = ""
    """Private key (PEM) of --tls-cert."""
    tls_token_file: str = ""
    """File holding the run's bearer token: servers require it on every call, clients send it (`strata certs`
    writes one)."""
    insecure_plaintext_off_loopback: bool = False
    """INSECURE: allow plaintext gRPC on a non-loopback address, where anyone who reaches the port can step envs,
    read weights or push transitions. Without it a non-loopback address needs --tls-*."""

    def __post_init__(self) -> None:
        given = {name: getattr(self, name) for name in ("tls_ca", "tls_cert", "tls_key")}
        if any(given.values()) and not all(given.values()):
            missing = ", ".join("--" + n.replace("_", "-") for n, v in given.items() if not v)
            raise ServicePlaneError(f"mutual TLS needs --tls-ca, --tls-cert and --tls-key together; {missing} "
                                    "missing (`strata certs` writes all three)")

    @property
    def enabled(self) -> bool:
        """Whether connections use mutual TLS."""
        return bool(self.tls_ca)

    def load(self, call: str) -> LoadedTLS:
        """Read and check the files (`device.check_tls_files`, the token); raise one line naming a bad one."""
        material = check_tls_files(self.tls_ca, self.tls_cert, self.tls_key, call=call) if self.enabled else None
        token = read_token(self.tls_token_file, call=call) if self.tls_token_file else None
        return LoadedTLS(material=material, token=token, opt_out=self.insecure_plaintext_off_loopback)

    def flags(self) -> list[str]:
        """The command-line flags that give a child process (`strata envs serve`) this same option set."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is True:
                out.append("--" + f.name.replace("_", "-"))
            elif value:
                out += ["--" + f.name.replace("_", "-"), str(Path(value).resolve())]
        return out


PLAINTEXT = ServiceTLS()
"""No TLS and no token: loopback only (the default of every service)."""

TLS_LAYOUT = ConfigLayout(
    cls=ServiceTLS, groups={"tls": tuple(f.name for f in fields(ServiceTLS))}, env_prefix="STRATA_",
    paths=frozenset({"tls_ca", "tls_cert", "tls_key", "tls_token_file"}), command="strata")
"""`ServiceTLS` as a TOML ``[tls]`` table and as ``STRATA_TLS_CA`` ... variables (`device._config_file`)."""


def service_tls_from(flags: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                     file: Path | None = None) -> ServiceTLS:
    """`ServiceTLS` from defaults < `file` ``[tls]`` < environment < `flags` (field -> value, None: not given).

    Only the variables of `TLS_LAYOUT` are read from `environ` (``STRATA_TLS_*`` and
    ``STRATA_INSECURE_PLAINTEXT_OFF_LOOPBACK``); an unknown ``STRATA_TLS_*`` variable is an error.
    """
    env = os.environ if environ is None else environ
    ours = {TLS_LAYOUT.env_name(f.name) for f in fields(ServiceTLS)}
    picked = {k: v for k, v in env.items() if k in ours or k.startswith("STRATA_TLS_")}
    wanted = {f.name: flags.get(f.name) for f in fields(ServiceTLS)}
    layered = load_layered(TLS_LAYOUT, file=file, environ=picked, flags=wanted)
    config: ServiceTLS = layered.config
    return config


def service_tls_from_args(args: Any, environ: Mapping[str, str] | None = None) -> ServiceTLS:
    """`service_tls_from` the flags `device.add_config_arguments(parser, ServiceTLS)` added to `args`."""
    return service_tls_from({f.name: getattr(args, f.name, None) for f in fields(ServiceTLS)}, environ)


@dataclass(frozen=True)
class LoadedTLS:
    """A `ServiceTLS` whose files were read and checked."""

    material: TLSMaterial | None
    token: str | None
    opt_out: bool


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or ``localhost``) is a loopback address; names other than localhost are not."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_target(target: str) -> tuple[str, str]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as ``(host, port)``."""
    host, _, port = target.rpartition(":")
    return host.strip("[]"), port


# -- servers -------------------------------------------------------------------------------------------------------


def check_listen(host: str, tls: LoadedTLS, *, call: str) -> None:
    """Refuse plaintext on a non-loopback `host` unless the opt-out is set (then say so loudly on stderr)."""
    if tls.material is not None or is_loopback(host):
        return
    if not tls.opt_out:
        raise ServicePlaneError(
            f"{call}: refusing to listen on {shown(host)} without TLS: anyone who reaches the port could use the "
            "service; pass --tls-ca/--tls-cert/--tls-key (make them with `strata certs`), listen on 127.0.0.1, or "
            "accept the risk with --insecure-plaintext-off-loopback")
    print(f"{call}: WARNING: INSECURE: plaintext gRPC on {host} (--insecure-plaintext-off-loopback): anyone who "
          "reaches this port can use the service", file=sys.stderr, flush=True)


def check_target(target: str, tls: LoadedTLS, *, call: str) -> None:
    """Refuse a plaintext connection to a non-loopback `target` unless the opt-out is set."""
    host, _ = split_target(target)
    if tls.material is None and not tls.opt_out and not is_loopback(host):
        raise ServicePlaneError(
            f"{call}: refusing to connect to {shown(target)} without TLS: pass --tls-ca/--tls-cert/--tls-key "
            "(`strata certs`), or accept the risk with --insecure-plaintext-off-loopback")


def new_server(tls: LoadedTLS, *, name: str, max_workers: int, options: Sequence[tuple[str, Any]]) -> Any:
    """A grpc.Server for service `name` (for log lines) that checks every call against `ACCESS` and the token."""
    from concurrent import futures

    grpc = require("grpc", extra="functions", purpose=name)
    interceptors = []
    if tls.material is not None or tls.token is not None:
        interceptors.append(_interceptor_class()(name=name, tls=tls.material is not None, token=tls.token))
    return grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=list(options),
                       interceptors=interceptors)


def bind(server: Any, host: str, port: int, tls: LoadedTLS, *, call: str) -> int:
    """Open `host`:`port` on `server`, with mutual TLS when configured; return the bound port (0: failed)."""
    check_listen(host, tls, call=call)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if tls.material is None:
        return int(server.add_insecure_port(address))
    grpc = require("grpc", extra="functions", purpose=call)
    credentials = grpc.ssl_server_credentials([(tls.material.key, tls.material.cert)],
                                              root_certificates=tls.material.ca, require_client_auth=True)
    return int(server.add_secure_port(address, credentials))


def add_health(server: Any, services: Sequence[str]) -> Any:
    """Serve grpc.health.v1 (SERVING for "" and each of `services`); return the servicer, or None without it."""
    try:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *services):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return servicer


def serve_health(servicer: Any, host: str, port: int, *, call: str) -> Any:
    """A plaintext server on `host`:`port` that answers grpc.health.v1 from `servicer` and nothing else.

    It may listen off loopback without TLS: the health status is all it tells, and it takes no other call.
    Returns the started server; its bound port is ``server.strata_port``.
    """
    from concurrent import futures

    grpc = require("grpc", extra="functions", purpose=call)
    from grpc_health.v1 import health_pb2_grpc  # type: ignore[import-untyped, unused-ignore]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_insecure_port(address)
    if bound == 0:
        raise ServicePlaneError(f"{call}: cannot bind the health port {address}; pick a free --health-port")
    server.start()
    server.strata_port = bound
    return server


def allowed_roles(method: str) -> tuple[str, ...] | None:
    """The roles that may call `method` (``/package.Service/Method``); None for grpc.health.v1 (any peer)."""
    service, _, name = method.lstrip("/").partition("/")
    if service == HEALTH_SERVICE:
        return None
    table = ACCESS.get(service, {})
    return table.get(name, table.get("*", ()))


class _Refusals:
    """Logs one line per (peer host, service, reason), at most once a minute each: a flood stays readable."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    def log(self, key: tuple[str, str, str], line: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -1e9) < 60.0:
                return
            self._last[key] = now
        SERVICE_LOG.warning(line)


_INTERCEPTOR: type | None = None


def _interceptor_class() -> type:
    """The server interceptor class, built on first use so importing this module does not import grpc."""
    global _INTERCEPTOR
    if _INTERCEPTOR is None:
        import grpc

        _INTERCEPTOR = type("CallAuthorizer", (_CallAuthorizer, grpc.ServerInterceptor),
                            {"__module__": __name__, "__doc__": _CallAuthorizer.__doc__})
    return _INTERCEPTOR


class _CallAuthorizer:
    """Checks each call's certificate role (`ACCESS`) and bearer token before the handler runs."""

    def __init__(self, *, name: str, tls: bool, token: str | None) -> None:
        self._name = name
        self._tls = tls
        self._token = token
        self._refusals = _Refusals()

    def _why_not(self, method: str, context: Any) -> tuple[Any, str] | None:
        """None when the call may go on, else ``(status code, one-line reason)``."""
        import grpc

        roles = allowed_roles(method)
        if roles is None:
            return None
        if self._token is not None:
            sent = dict(context.invocation_metadata()).get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {self._token}".encode()):
                what = "no per-run token" if not sent else "a wrong per-run token"
                return (grpc.StatusCode.UNAUTHENTICATED,
                        f"the call carries {what}; pass --tls-token-file with the run's token")
        if self._tls:
            auth = context.auth_context()
            ids = [v.decode(errors="replace") for v in auth.get("peer_spiffe_id", [])]
            from device._pki import role_of

            role = next((r for r in map(role_of, ids) if r), None)
            if role not in roles:
                shown_id = ids[0] if ids else "no spiffe://strata/ROLE name"
                return (grpc.StatusCode.PERMISSION_DENIED,
                        f"the client certificate ({shown(shown_id, 60)}) is not of a role that may call it "
                        f"({', '.join(roles)}); issue the client one with `strata certs --role {roles[0]}=HOST`")
        return None

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        """Wrap the method's handler so the check runs first, with the call's context."""
        import grpc

        handler = continuation(details)
        if handler is None or allowed_roles(details.method) is None:
            return handler
        method = details.method

        def guard(behaviour: Callable[..., Any]) -> Callable[..., Any]:
            def checked(request: Any, context: Any) -> Any:
                refused = self._why_not(method, context)
                if refused is not None:
                    code, reason = refused
                    peer = context.peer()
                    host = peer.rsplit(":", 1)[0]
                    self._refusals.log((host, method.rsplit("/", 1)[0], reason),
                                       f"strata {self._name}: refused {method} from {peer}: {reason}")
                    context.abort(code, f"strata {self._name} refused {method}: {reason}")
                return behaviour(request, context)

            return checked

        kinds = (("unary_unary", grpc.unary_unary_rpc_method_handler),
                 ("unary_stream", grpc.unary_stream_rpc_method_handler),
                 ("stream_unary", grpc.stream_unary_rpc_method_handler),
                 ("stream_stream", grpc.stream_stream_rpc_method_handler))
        for attr, make in kinds:
            behaviour = getattr(handler, attr)
            if behaviour is not None:
                return make(guard(behaviour), request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)
        return handler


# -- clients -------------------------------------------------------------------------------------------------------


def open_channel(target: str, tls: LoadedTLS, *, options: Sequence[tuple[str, Any]] = (), call: str,
                 server_name: str = "") -> Any:
    """A channel to `target`: mutual TLS with this process's certificate when configured, the token on every call.

    Args:
        target: ``HOST:PORT``.
        tls: The loaded option set.
        options: grpc channel options.
        call: Who connects, for error lines.
        server_name: The name the server's certificate must carry when it differs from the target's host (an
            address found through a headless Service's DNS name is checked against that name).
    """
    grpc = require("grpc", extra="functions", purpose=call)
    check_target(target, tls, call=call)
    opts = list(options)
    if tls.material is None:
        channel = grpc.insecure_channel(target, options=opts)
    else:
        if server_name:
            opts.append(("grpc.ssl_target_name_override", server_name))
        credentials = grpc.ssl_channel_credentials(root_certificates=tls.material.ca,
                                                   private_key=tls.material.key,
                                                   certificate_chain=tls.material.cert)
        channel = grpc.secure_channel(target, credentials, options=opts)
    if tls.token is not None:
        channel = grpc.intercept_channel(channel, _token_interceptor_class()(tls.token))
    return channel


_TOKEN_INTERCEPTOR: type | None = None


def _token_interceptor_class() -> type:
    global _TOKEN_INTERCEPTOR
    if _TOKEN_INTERCEPTOR is None:
        import grpc

        bases = (_TokenSender, grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor)
        _TOKEN_INTERCEPTOR = type("TokenSender", bases, {"__module__": __name__, "__doc__": _TokenSender.__doc__})
    return _TOKEN_INTERCEPTOR


class _TokenSender:
    """Adds ``authorization: Bearer TOKEN`` to every call of a channel."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or ()), self._header])

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        """Send the token with a unary call."""
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        """Send the token with a server-streaming call."""
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        """Send the token with a client-streaming call."""
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        """Send the token with a bidirectional call."""
        return continuation(self._with_token(details), requests)


_TLS_MARKERS = ("SSL_ERROR", "Tls handshake", "Hostname Verification", "CERTIFICATE", "certificate")


def refusal(exc: Any, *, tls: LoadedTLS) -> str | None:
    """A one-line reason when a grpc.RpcError is a refusal of this client (TLS or authorization), else None."""
    import grpc

    code, details = exc.code(), str(exc.details() or "")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return details
    if code != grpc.StatusCode.UNAVAILABLE or not any(m in details for m in _TLS_MARKERS):
        return None
    if "WRONG_VERSION_NUMBER" in details:
        return "the service speaks plaintext, this client TLS: start the service with --tls-* too, or drop them here"
    if "Hostname Verification" in details:
        return ("the service's certificate is not valid for the address dialled; issue it for that host "
                "(`strata certs --role ROLE=HOST`)")
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return "the service's certificate was not issued by --tls-ca (another run's CA?); pass the run's ca.crt"
    return f"TLS handshake failed: {shown(details, 160)}"


def unavailable_hint(tls: LoadedTLS) -> str:
    """What to add to a connection failure's line: a TLS service closes a client without its run's certificate."""
    if tls.material is None:
        return ("; a service started with --tls-* closes plaintext clients: pass --tls-ca/--tls-cert/--tls-key if "
                "it uses TLS")
    return "; a TLS service also closes clients whose certificate another CA issued: check --tls-ca and --tls-cert"
