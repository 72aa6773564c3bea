"""Edge-tier commands: `strata publish`, `strata edge run|config|install|uninstall`, `strata fleet`, `strata broker`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _link_flags(parser: argparse.ArgumentParser, *, user_help: str) -> None:
    parser.add_argument("--broker", required=True, help="broker URL: mqtt://host:1883 or mqtts://host:8883")
    parser.add_argument("--fleet", required=True, help="fleet name (topic namespace strata/FLEET/)")
    parser.add_argument("--username", default=None, help=user_help)
    parser.add_argument("--password-file", default=None, type=Path, help="file holding the broker password")
    parser.add_argument("--ca-file", default=None, help="CA bundle of the broker's TLS certificate")
    parser.add_argument("--cert-file", default=None, help="client certificate (TLS, AWS IoT)")
    parser.add_argument("--key-file", default=None, help="private key of the client certificate")


def _password(args: argparse.Namespace) -> str | None:
    from edge._agent import read_password_file

    return None if args.password_file is None else read_password_file(args.password_file)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the edge tier's commands to the root parser."""
    from edge._agent import EdgeAgentConfig

    publish = sub.add_parser(
        "publish", help="publish a signed policy bundle to a fleet over MQTT",
        description="Publish BUNDLE retained to strata/FLEET/policies/POLICY/latest (in chunks when over 100 KB) "
        "and announce it; waits for the broker's acknowledgements.")
    publish.add_argument("bundle", type=Path, help="bundle file (from `strata export` or device.build_bundle)")
    _link_flags(publish, user_help="broker username (the cloud identity)")
    publish.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for acks (default: %(default)s)")
    publish.add_argument("--tier", choices=["edge", "device"], default="edge",
                         help="edge: a policy for edge agents (default); device: a micro policy (from `strata export "
                         "--tier device`) published retained to strata/FLEET/device-policy, which every edge "
                         "gateway verifies and relays to its devices")
    publish.add_argument("--trust", action="append", type=Path, metavar="PUBFILE", default=None,
                         help="verify the bundle against this public key (repeat for several) before anything is "
                         "sent: a tampered, unsigned or foreign-signed bundle is refused here, not by every node")
    publish.set_defaults(func=_publish)

    edge = sub.add_parser("edge", help="run an edge node", description="Run an edge node.")
    edge_sub = edge.add_subparsers(dest="edge_command", metavar="COMMAND", required=True)
    run = edge_sub.add_parser(
        "run", help="run an edge agent: verified policy cache, local simulator, telemetry",
        description="Run an edge agent: follow the fleet's policy over MQTT (every bundle verified, A/B cache, "
        "health check, automatic revert), act with it on a local gymnasium simulator, report telemetry through "
        "a disk-backed outbox. Works offline on the cached policy.")
    _config_flags(run, EdgeAgentConfig)
    run.add_argument("--log-level", default="WARNING", help="logging level (default: %(default)s)")
    run.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    run.set_defaults(func=_edge_run)

    config_cmd = edge_sub.add_parser(
        "config", help="show or check an edge agent's merged config",
        description="Merge the config file, STRATA_EDGE_* variables and flags as `strata edge run` does.")
    config_sub = config_cmd.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    show = config_sub.add_parser("show", help="print the merged config and where each value came from",
                                 description="Print the merged config as TOML, each value followed by its "
                                 "source: default, file, env or flag.")
    _config_flags(show, EdgeAgentConfig)
    show.set_defaults(func=_edge_config_show)
    check = config_sub.add_parser("check", help="validate a config and the files it names (for ExecStartPre)",
                                  description="Exit 0 when the merged config is valid and every file it names "
                                  "(trusted keys, password, TLS files) can be read; otherwise one line, exit 2.")
    _config_flags(check, EdgeAgentConfig)
    check.set_defaults(func=_edge_config_check)

    from device import add_config_arguments
    from edge._ingest import IngestConfig

    ingest = edge_sub.add_parser(
        "ingest", help="ingest the fleet's experience records into a learner's spool (started by edge-mode runs)",
        description="Subscribe to strata/FLEET/nodes/+/experience (an MQTT 5 shared subscription, so several "
        "ingesters split the fleet; the plain filter on a 3.1.1-only broker), validate every record against the "
        "learner's spaces, store it once in the spool (SQLite), then acknowledge it and send the node a receipt. "
        "`strata train --modes edge` starts and supervises its own ingesters (--edge-ingesters); runs until "
        "SIGTERM or Ctrl-C.")
    add_config_arguments(ingest, IngestConfig)
    ingest.add_argument("--log-level", default="WARNING", help="logging level (default: %(default)s)")
    ingest.set_defaults(func=_edge_ingest)

    install = edge_sub.add_parser(
        "install", help="install a node's kit as a hardened systemd service",
        description="Place the kit's config and credentials under /etc/strata/NODE/ (0600), state under "
        "/var/lib/strata/NODE/, and a hardened unit strata-edge-NODE.service; create the unprivileged "
        "strata-edge user and start the service when systemd runs (as root, --prefix /).")
    install.add_argument("--kit", required=True, type=Path, help="kit folder (from `strata broker config --kits` "
                         "or `strata infra apply --kits`)")
    install.add_argument("--prefix", default=Path("/"), type=Path,
                         help="root to write under, for staging an image (default: %(default)s)")
    install.add_argument("--dry-run", action="store_true", help="print every folder and file it would write")
    install.add_argument("--no-start", action="store_true", help="write the files, do not enable or start")
    install.set_defaults(func=_edge_install)
    uninstall = edge_sub.add_parser("uninstall", help="stop and remove a node's service and config",
                                    description="Stop, disable and remove strata-edge-NODE.service and "
                                    "/etc/strata/NODE/; the cache and outbox in /var/lib/strata/NODE/ stay "
                                    "unless --purge.")
    uninstall.add_argument("--node", required=True, help="node id")
    uninstall.add_argument("--prefix", default=Path("/"), type=Path, help="root (default: %(default)s)")
    uninstall.add_argument("--purge", action="store_true", help="delete the node's state (cache, outbox) too")
    uninstall.set_defaults(func=_edge_uninstall)

    fleet = sub.add_parser(
        "fleet", help="show a fleet's nodes: online, policy version, lag, last telemetry",
        description="Listen to the fleet's retained status messages and telemetry for --wait seconds and print "
        "one row per node.")
    _link_flags(fleet, user_help="broker username (the cloud identity)")
    fleet.add_argument("--wait", type=float, default=1.0, help="seconds to listen (default: %(default)s)")
    fleet.add_argument("--nodes", default=None,
                       help="comma-separated node ids to watch exactly (needed on AWS IoT; default: all, wildcard)")
    fleet.add_argument("--json", action="store_true", help="print JSON instead of a table")
    fleet.set_defaults(func=_fleet)

    broker = sub.add_parser("broker", help="broker helpers", description="Broker helpers.")
    broker_sub = broker.add_subparsers(dest="broker_command", metavar="COMMAND", required=True)
    config = broker_sub.add_parser(
        "config", help="write Mosquitto password and ACL files for a fleet",
        description="Write passwd, acl, mosquitto.conf and generated credentials: each node reads policies and "
        "writes only its own status, telemetry and experience topics; only the cloud user publishes policies.")
    config.add_argument("--out", required=True, type=Path, help="folder to write")
    config.add_argument("--fleet", required=True, help="fleet name")
    config.add_argument("--nodes", required=True, help="comma-separated node ids")
    config.add_argument("--cloud-user", default="cloud",
                        help="comma-separated identities that publish policies and watch the fleet; one per "
                        "concurrently connected cloud tool, since each user has one client id (default: %(default)s)")
    config.add_argument("--devices", default="",
                        help="comma-separated terminal device ids: each becomes a broker user that reads device "
                        "bundles and sends its own escalations; each node's user then also may relay device "
                        "bundles and answer its devices' escalations (its gateway)")
    config.add_argument("--learner", default=None, metavar="USER",
                        help="also make the users of an edge-mode learner: USER (its policy publisher) and "
                        "USER-ingest-K for each ingester, one password in credentials/USER.password; they read "
                        "every node's experience and write receipts and policies (strata train --edge-username USER "
                        "--edge-password-file credentials/USER.password)")
    config.add_argument("--ingesters", type=int, default=1, metavar="N",
                        help="with --learner: the learner's ingesters (--edge-ingesters; default: %(default)s)")
    config.add_argument("--port", type=int, default=1883, help="listener port in mosquitto.conf (default: %(default)s)")
    config.add_argument("--bind", default="127.0.0.1",
                        help="listener address in mosquitto.conf; 0.0.0.0 serves other hosts (default: %(default)s)")
    config.add_argument("--kits", default=None, type=Path,
                        help="also write a provisioning kit per node into KITS/<node>/ (edge.toml, password, "
                        "trusted key; files 0600) for `strata edge install --kit`")
    config.add_argument("--trust", default=None, type=Path, action="append", metavar="PUBFILE",
                        help="public signing key the nodes trust (strata-signing.pub); needed with --kits; repeat "
                        "it to trust the old and the new key while rotating (a private key is refused)")
    config.add_argument("--broker-url", default=None,
                        help="URL the nodes reach this broker at, written into the kits (default: "
                        "mqtt://BIND:PORT; needed when --bind is a wildcard)")
    config.set_defaults(func=_broker_config)


def _config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    from device import add_config_arguments

    parser.add_argument("--config", default=None, type=Path,
                        help="TOML config file; STRATA_EDGE_* variables, then flags, override its values")
    add_config_arguments(parser, cls)


def _layered(args: argparse.Namespace) -> Any:
    import dataclasses
    import os

    from device._config_file import load_layered
    from edge._provision import EDGE_LAYOUT

    flags = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(EDGE_LAYOUT.cls) if f.init}
    return load_layered(EDGE_LAYOUT, file=args.config, environ=os.environ, flags=flags)


def _edge_config_show(args: argparse.Namespace) -> int:
    from device._config_file import format_layered
    from edge._provision import EDGE_LAYOUT

    print(format_layered(EDGE_LAYOUT, _layered(args)), end="")
    return 0


def _edge_config_check(args: argparse.Namespace) -> int:
    from device import TrustStore, load_public_key
    from edge._agent import read_password_file
    from edge._errors import EdgeConfigError

    config = _layered(args).config
    TrustStore([load_public_key(Path(p)) for p in config.trust])
    if config.password_file is not None:
        read_password_file(Path(config.password_file))
    for name in ("ca_file", "cert_file", "key_file"):
        path = getattr(config, name)
        if path is not None and not os.access(path, os.R_OK):
            raise EdgeConfigError(f"strata edge config check: {name} {path} cannot be read; fix the path or its "
                                  "permissions")
    print(f"{config.node_id}: config valid (fleet {config.fleet}, broker {config.broker or 'none: offline'})")
    return 0


def _edge_install(args: argparse.Namespace) -> int:
    from edge._provision import install, plan_install

    plan = plan_install(args.kit, prefix=args.prefix)
    if args.dry_run:
        print(plan.describe())
        return 0
    install(plan, prefix=args.prefix, start=not args.no_start)
    return 0


def _edge_uninstall(args: argparse.Namespace) -> int:
    from edge._provision import uninstall

    uninstall(args.node, prefix=args.prefix, purge=args.purge)
    return 0


def _publish(args: argparse.Namespace) -> int:
    from edge._errors import EdgeConfigError
    from edge._publish import publish_bundle

    if not 0 < args.timeout <= 3600:
        raise EdgeConfigError(f"--timeout {args.timeout} must be above 0 and at most 3600 seconds")
    try:
        data = args.bundle.read_bytes()
    except OSError as exc:
        raise EdgeConfigError(f"strata publish: cannot read {args.bundle}: {exc.strerror or exc}") from None
    if args.trust:  # the one trust-anchor parser; the consumers' own verifier, before anything goes on the wire
        from device import TrustStore, Verifier

        Verifier(trust=TrustStore.from_paths(args.trust), tier=args.tier).verify(data)
    if args.tier == "device":
        return _publish_device(args, data)
    ann = publish_bundle(data, broker=args.broker, fleet=args.fleet, username=args.username,
                         password=_password(args), ca_file=args.ca_file, cert_file=args.cert_file,
                         key_file=args.key_file, ack_timeout_s=args.timeout)
    how = f"{ann.chunks} chunks" if ann.chunks else "one message"
    print(f"published {ann.policy} v{ann.version} ({ann.size} bytes, {how}) to fleet {args.fleet} "
          f"at {args.broker}")
    return 0


def _publish_device(args: argparse.Namespace, data: bytes) -> int:
    from device import Bundle
    from edge._errors import EdgeConfigError
    from edge._publish import Publisher

    bundle = Bundle.from_bytes(data)
    m = bundle.manifest
    if m.target_tier != "device":
        raise EdgeConfigError(f"strata publish --tier device: {args.bundle} targets tier {m.target_tier!r}; export "
                              "a micro policy with `strata export --tier device`, or publish this one without --tier")
    with Publisher(broker=args.broker, fleet=args.fleet, username=args.username, password=_password(args),
                   ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file,
                   ack_timeout_s=args.timeout) as publisher:
        publisher.publish_device_bundle(data)
    print(f"published device bundle {m.policy} v{m.version} ({len(data)} bytes) to strata/{args.fleet}/device-policy "
          f"at {args.broker}; edge gateways relay it to their devices")
    return 0


def _edge_run(args: argparse.Namespace) -> int:
    from edge._agent import EdgeAgent

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = _layered(args).config
    agent = EdgeAgent(config)

    def on_signal(signum: int, frame: Any) -> None:
        agent.stop()

    previous = signal.signal(signal.SIGTERM, on_signal)
    started = time.monotonic()
    try:
        agent.start()
        if agent.version is None and config.broker is None:
            from edge._errors import EdgeConfigError

            raise EdgeConfigError(f"no verified policy in --cache-dir {config.cache_dir!r} and no --broker to fetch "
                                  "one from; pass --broker mqtt://HOST:1883")
        if agent.version is None:
            print(f"{config.node_id}: no cached policy yet; waiting for one from {config.broker}", file=sys.stderr)
        else:
            print(f"{config.node_id}: acting on cached {agent.policy_name} v{agent.version}", file=sys.stderr)
        counters = agent.run()
    finally:
        agent.close()
        signal.signal(signal.SIGTERM, previous)
    summary = {"node": config.node_id, "policy": agent.policy_name, "version": agent.version,
               "steps": counters.steps, "episodes": counters.episodes, "updates": counters.updates,
               "refused": len(counters.refused), "health_failures": len(counters.health_failures),
               "telemetry_records": counters.telemetry_records, "seconds": round(time.monotonic() - started, 3),
               "last_error": agent.last_error, "cache_repairs": agent.cache_repairs}
    if args.json:
        print(json.dumps(summary))
    else:
        policy = (f"on {agent.policy_name} v{agent.version}" if agent.version is not None
                  else "with no policy yet (nothing published to this fleet, or every bundle refused)")
        print(f"{config.node_id}: {counters.steps} steps, {counters.episodes} episodes {policy}; {counters.updates} "
              f"policy loads, {len(counters.refused)} bundles refused, {counters.telemetry_records} telemetry records")
    return 0


def _edge_ingest(args: argparse.Namespace) -> int:
    import dataclasses
    import threading

    from device import config_from_args
    from edge._agent import read_password_file
    from edge._errors import EdgeConfigError
    from edge._ingest import IngestConfig, run_ingester

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    missing = [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(IngestConfig)
               if f.default is dataclasses.MISSING and getattr(args, f.name, None) is None]
    if missing:
        raise EdgeConfigError(f"strata edge ingest: {', '.join(missing)} required")
    config = config_from_args(IngestConfig, args)
    password = read_password_file(config.password_file) if config.password_file else None
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        counters = run_ingester(config, password=password, stop=stop, on_ready=lambda ingester: print(
            f"strata edge ingest: {config.name} ingesting {config.fleet} into {config.spool}", flush=True))
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"strata edge ingest: {config.name}: {counters.received} received, {counters.stored} stored, "
          f"{counters.duplicates} duplicates, {counters.refused} refused")
    return 0


def _fleet(args: argparse.Namespace) -> int:
    from edge._errors import EdgeConfigError
    from edge._fleet import FleetMonitor, format_fleet_table

    if not 0 <= args.wait <= 3600:
        raise EdgeConfigError(f"--wait {args.wait} must be between 0 and 3600 seconds")
    nodes = [n for n in args.nodes.split(",") if n] if args.nodes else None
    with FleetMonitor(broker=args.broker, fleet=args.fleet, nodes=nodes, username=args.username,
                      password=_password(args), ca_file=args.ca_file, cert_file=args.cert_file,
                      key_file=args.key_file) as monitor:
        connected = monitor.link.wait_connected(min(args.wait + 5.0, 15.0))
        if connected:
            time.sleep(args.wait)
        views = monitor.snapshot()
        state = monitor.link.state.value
        error = monitor.link.last_error
    if not connected:
        from edge._errors import EdgeError

        raise EdgeError(f"strata fleet: cannot reach {args.broker} (state {state}: {error})")
    if args.json:
        print(json.dumps([{"node": v.node, "online": v.online, "policy": v.policy, "version": v.version,
                           "latest_version": v.latest_version, "lag": v.lag, "steps": v.steps,
                           "mean_return": v.mean_return, "latency_p99_us": v.latency_p99_us,
                           "last_error": v.last_error} for v in views]))
    else:
        print(format_fleet_table(views))
    return 0


def _broker_config(args: argparse.Namespace) -> int:
    from device._keys import trusted_key_files
    from edge._broker_config import write_broker_config
    from edge._errors import EdgeConfigError
    from edge._mqtt import check_broker_url
    from edge._provision import KIT_CONFIG, write_kit

    nodes = [n for n in args.nodes.split(",") if n]
    trusted: dict[str, bytes] = {}
    if args.kits is not None:  # check the kit flags before writing anything
        if not args.trust:
            raise EdgeConfigError("strata broker config: --kits needs --trust PUBKEY, the signing key the nodes "
                                  "trust (strata-signing.pub from `strata keys generate`)")
        if args.broker_url is None and args.bind in ("0.0.0.0", "::"):
            raise EdgeConfigError(f"strata broker config: --bind {args.bind} serves every interface; say which "
                                  "address the nodes use with --broker-url mqtt://HOST:PORT")
        if args.broker_url is not None:
            check_broker_url(args.broker_url, what="strata broker config: --broker-url", credentials=False)
        trusted = trusted_key_files(args.trust, what="strata broker config: --trust",
                                    taken=(KIT_CONFIG, "password"))
    files = write_broker_config(args.out, fleet=args.fleet, nodes=nodes,
                                cloud_user=[u for u in args.cloud_user.split(",") if u], port=args.port,
                                bind=args.bind, devices=[d for d in args.devices.split(",") if d],
                                learner=args.learner, ingesters=args.ingesters)
    print(f"wrote {files.passwd} (hashed with {files.hashed_with}), {files.acl}, {files.conf}")
    print(f"passwords (mode 0600) in {args.out / 'credentials'}/: pass one with --username USER "
          "--password-file FILE")
    if args.kits is not None:
        bind = f"[{args.bind}]" if ":" in args.bind else args.bind
        url = args.broker_url or f"mqtt://{bind}:{args.port}"
        for node in nodes:
            config: dict[str, object] = {"fleet": args.fleet, "broker": url, "username": node,
                                         "password_file": "password", "trust": tuple(trusted)}
            kit_files = {"password": files.credentials[node].read_bytes(), **trusted}
            if args.devices:  # the node serves the devices (its gateway shares the node's connection)
                config["serve_devices"] = True
            kit = write_kit(args.kits, node=node, config=config, files=kit_files)
            print(f"kit for {node}: {kit.directory}/ ({', '.join(kit.files)})")
    return 0
