"""Functions-tier commands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the functions tier's commands to the root parser."""
    from functions._envservice import register_cli as register_envs

    register_envs(sub)  # `strata envs serve` (the gRPC env service)
    _register_functions(sub)  # `strata functions serve` (the local Lambda runtime)
    _register_certs(sub)  # `strata certs` (the service plane's run CA and role certificates)


def _register_certs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`strata certs`: a run CA, a per-run token and one certificate per service-plane role."""
    from functions._secure import CERT_ROLES

    certs = sub.add_parser(
        "certs", help="make a run CA, a per-run token and per-role TLS certificates for the service plane",
        description="Write a run CA (ca.crt, ca.key), a per-run token and, for each --role, ROLE/tls.crt, "
        "ROLE/tls.key and ROLE/ca.crt (the layout of a kubernetes.io/tls Secret) valid for the role's hosts and "
        "loopback. Give a process its role's files as --tls-ca/--tls-cert/--tls-key and the token as "
        "--tls-token-file. Run it again with the same --out to add roles under the same CA; nothing is ever "
        "overwritten.")
    certs.add_argument("--out", required=True, metavar="DIR", help="folder of the run's certificates (created)")
    certs.add_argument("--role", action="append", required=True, metavar="ROLE=HOST[,HOST...]",
                       help=f"a role ({', '.join(CERT_ROLES)}) and the IP addresses or DNS names its services are "
                       "reached at (repeatable); broker: a Mosquitto TLS listener, which may call no strata service")
    certs.add_argument("--run", default="run", metavar="NAME",
                       help="run name written into the CA (default: %(default)s)")
    certs.add_argument("--days", type=int, default=90, metavar="N",
                       help="validity of new certificates in days, 1-3650 (default: %(default)s)")
    certs.set_defaults(func=_certs)


def _certs(args: argparse.Namespace) -> int:
    from device import ConfigError, shown
    from device._pki import issue_run_certificates
    from functions._secure import CERT_ROLES

    roles: dict[str, list[str]] = {}
    for entry in args.role:
        role, sep, hosts = entry.partition("=")
        if role not in CERT_ROLES:
            raise ConfigError(f"--role {shown(entry)}: the role must be one of {', '.join(CERT_ROLES)} "
                              "(e.g. --role env=10.0.0.5)")
        if role in roles:
            raise ConfigError(f"--role {role} is given twice; list all its hosts in one --role")
        roles[role] = [h.strip() for h in hosts.split(",") if h.strip()] if sep else []
    written = issue_run_certificates(args.out, roles=roles, run=args.run, days=args.days)
    print(f"run CA {written.ca_cert} (its key {written.ca_key} stays here), token {written.token}")
    for role, folder in written.roles.items():
        hosts = ", ".join(roles[role]) or "loopback only"
        print(f"{role}: {folder}/tls.crt, tls.key, ca.crt for {hosts}; pass --tls-ca {folder}/ca.crt "
              f"--tls-cert {folder}/tls.crt --tls-key {folder}/tls.key --tls-token-file {written.token}")
    return 0


def _register_functions(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`strata functions serve`: the local function runtime (Lambda's Invoke API on loopback)."""
    from device import finite_float, seconds

    functions = sub.add_parser("functions", help="serverless env functions: the local Lambda-compatible runtime")
    fsub = functions.add_subparsers(dest="functions_command", metavar="SUBCOMMAND", required=True)
    serve = fsub.add_parser(
        "serve", help="serve Lambda functions on loopback; drive it with boto3 endpoint_url or AWS_ENDPOINT_URL_LAMBDA",
        description="Serve functions over Lambda's Invoke API (POST /2015-03-31/functions/NAME/invocations) with "
        "warm awslambdaric worker processes. Without --function it serves strata-rollout "
        "(functions._handlers.rollout_handler) and strata-ping.")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=9001, help="TCP port; 0 picks a free one (default: %(default)s)")
    serve.add_argument("--function", action="append", default=[], metavar="NAME=HANDLER[,OPT=V...]",
                       help="a function to serve: NAME=module.handler with optional ,timeout=S ,memory=MB "
                       ",concurrency=N ,versions=1+2 ,alias=NAME:VERSION (a published version or $LATEST) "
                       ",on-failure=SQS_QUEUE_ARN ,retries=N (0-2, for Event invocations) (repeatable)")
    serve.add_argument("--from-endpoint", metavar="URL", help="read a deployment back from this AWS endpoint "
                       "(provided by the infra tier)")
    serve.add_argument("--stage", default=None, help="deployment stage to serve, with --from-endpoint only "
                       "(default: dev)")
    serve.add_argument("--throttle-rate", type=finite_float, default=0.0,
                       help="fault: fraction of invocations answered 429")
    serve.add_argument("--duplicate-rate", type=finite_float, default=0.0,
                       help="fault: fraction of Event invocations delivered twice")
    serve.add_argument("--cold-start-delay", type=seconds, default=0.0, metavar="S",
                       help="fault: extra seconds each new worker takes to start")
    serve.add_argument("--crash-rate", type=finite_float, default=0.0,
                       help="fault: fraction of invocations whose worker is killed mid-invocation")
    serve.add_argument("--service-error-rate", type=finite_float, default=0.0,
                       help="fault: fraction of invocations answered 500 ServiceException")
    serve.add_argument("--no-memory-limit", action="store_true", help="do not apply RLIMIT_AS to workers")
    serve.add_argument("--account-concurrency", type=int, default=1000,
                       help="concurrent executions across all functions; more get 429 (default: %(default)s)")
    serve.add_argument("--idle-timeout", type=seconds, default=900.0, metavar="S",
                       help="stop a warm worker idle this long, like a reclaimed Lambda environment "
                       "(default: %(default)s)")
    serve.set_defaults(func=_serve_functions)


def _serve_functions(args: argparse.Namespace) -> int:
    import json
    import signal

    from device._names import identifier, shown
    from functions._errors import RuntimeConfigError
    from functions._runtime import (
        DEFAULT_FUNCTIONS,
        FaultConfig,
        FunctionSource,
        LocalRuntime,
        RuntimeConfig,
        SourceTreeFunctions,
        endpoint_source,
        parse_function_option,
    )

    # Everything is checked before anything is read or started. Options that would do nothing in this
    # combination are refused, not ignored.
    if args.stage is not None and not args.from_endpoint:
        raise RuntimeConfigError(f"--stage {shown(args.stage)} names a deployed stage and does nothing without "
                                 "--from-endpoint URL; drop it, or add --from-endpoint")
    if args.function and args.from_endpoint:
        raise RuntimeConfigError(f"--function {shown(args.function[0])} does nothing with --from-endpoint, which "
                                 "serves the stage's deployed functions; drop one of them")
    stage = identifier("dev" if args.stage is None else args.stage, what="--stage")
    faults = FaultConfig(throttle_rate=args.throttle_rate, duplicate_rate=args.duplicate_rate,
                         cold_start_delay_s=args.cold_start_delay, crash_rate=args.crash_rate,
                         service_error_rate=args.service_error_rate)
    config = RuntimeConfig(host=args.host, port=args.port, enforce_memory=not args.no_memory_limit,
                           account_concurrency=args.account_concurrency, idle_timeout_s=args.idle_timeout)
    source: FunctionSource
    if args.from_endpoint:
        source = endpoint_source(args.from_endpoint, stage)
    else:
        specs = [parse_function_option(text) for text in args.function] or list(DEFAULT_FUNCTIONS)
        source = SourceTreeFunctions(specs)
    try:
        names = source.names()  # a dead endpoint fails here, as one error line
        if not names:  # a stage that is not deployed there (a typo, another account or region)
            raise RuntimeConfigError(f"functions serve --from-endpoint {shown(args.from_endpoint)}: stage "
                                     f"{shown(stage)} has no functions there; deploy it with `strata infra apply "
                                     f"--stage {stage}`, or check --stage and the endpoint")
        runtime = LocalRuntime(source, config=config, faults=faults)
        runtime.start()
        signal.signal(signal.SIGTERM, lambda signum, frame: runtime.request_stop())
        print(json.dumps({"event": "serving", "url": runtime.url, "functions": names}), flush=True)
        runtime.serve_forever()
    finally:
        close = getattr(source, "close", None)  # a deployment read back unpacked its code into a temp folder
        if close is not None:
            close()
    return 0
