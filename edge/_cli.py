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
    from device._config import add_option
    from device._kinds import CA_FILE, CERT_FILE, FLEET, KEY_FILE, PASSWORD_FILE
    from device._options import Text, Url

    add_option(parser, "--broker", Url(schemes=("mqtt", "mqtts", "tcp", "ssl"), credentials=True), required=True,
               help="broker URL: mqtt://host:1883 or mqtts://host:8883")
    add_option(parser, "--fleet", FLEET, required=True, help="fleet name (topic namespace strata/FLEET/)")
    add_option(parser, "--username", Text(max_chars=256, what="a broker user name"), help=user_help)
    add_option(parser, "--password-file", PASSWORD_FILE, help="file holding the broker password")
    add_option(parser, "--ca-file", CA_FILE, as_path=False, help="CA bundle of the broker's TLS certificate")
    add_option(parser, "--cert-file", CERT_FILE, as_path=False, help="client certificate (TLS, AWS IoT)")
    add_option(parser, "--key-file", KEY_FILE, as_path=False, help="private key of the client certificate")


def _check_link(args: argparse.Namespace, command: str) -> str | None:
    """The link flags agree and their files are usable (TLS context built); return the password."""
    from device._mqtt import tls_context
    from edge._errors import EdgeConfigError

    if args.key_file and not args.cert_file:
        raise EdgeConfigError(f"{command}: --key-file without --cert-file; pass --cert-file too, or drop --key-file")
    if args.ca_file or args.cert_file or args.broker.startswith(("mqtts:", "ssl:")):
        try:
            tls_context(ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise EdgeConfigError(f"{command}: the TLS files (--ca-file, --cert-file, --key-file) cannot be used: "
                                  f"{exc}; pass PEM files of the broker's CA and this client's certificate") from None
    return _password(args)


def _password(args: argparse.Namespace) -> str | None:
    from edge._agent import read_password_file

    return None if args.password_file is None else read_password_file(args.password_file)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the edge tier's commands to the root parser."""
    from device._config import add_option, command
    from device._kinds import BUNDLE, FLEET, TRUST
    from device._options import (
        Choice,
        Host,
        InputFolder,
        Integer,
        Many,
        Name,
        Number,
        OutputFolder,
        Port,
        Seconds,
        Switch,
        Url,
    )
    from edge._agent import EdgeAgentConfig

    publish = sub.add_parser(
        "publish", help="publish a signed policy bundle to a fleet over MQTT",
        description="Publish BUNDLE retained to strata/FLEET/policies/POLICY/latest (in chunks when over 100 KB) "
        "and announce it; waits for the broker's acknowledgements.")
    add_option(publish, "bundle", BUNDLE, help="bundle file (from `strata export` or device.build_bundle)")
    _link_flags(publish, user_help="broker username (the cloud identity)")
    add_option(publish, "--timeout", Number(min=0.0, max=3600.0, min_open=True, unit="seconds"), default=10.0,
               help="seconds to wait for acks")
    add_option(publish, "--tier", Choice(values=("edge", "device")), default="edge",
               help="edge: a policy for edge agents; device: a micro policy (from `strata export "
               "--tier device`) published retained to strata/FLEET/device-policy, which every edge "
               "gateway verifies and relays to its devices")
    add_option(publish, "--trust", TRUST, takes="repeat", metavar="PUBFILE",
               help="verify the bundle against this public key (repeat for several) before anything is "
               "sent: a tampered, unsigned or foreign-signed bundle is refused here, not by every node")
    command(publish, check=_publish_check, run=_publish)

    edge = sub.add_parser("edge", help="run an edge node", description="Run an edge node.")
    edge_sub = edge.add_subparsers(dest="edge_command", metavar="COMMAND", required=True)
    run = edge_sub.add_parser(
        "run", help="run an edge agent: verified policy cache, local simulator, telemetry",
        description="Run an edge agent: follow the fleet's policy over MQTT (every bundle verified, A/B cache, "
        "health check, automatic revert), act with it on a local gymnasium simulator, report telemetry through "
        "a disk-backed outbox. Works offline on the cached policy. Everything `strata edge config check` checks is "
        "checked first.")
    _config_flags(run, EdgeAgentConfig)
    add_option(run, "--log-level", Choice(values=LOG_LEVELS), default="WARNING", help="logging level")
    add_option(run, "--json", Switch(), default=False, help="print the summary as one JSON line")
    command(run, check=_edge_checked, run=_edge_run)

    config_cmd = edge_sub.add_parser(
        "config", help="show or check an edge agent's merged config",
        description="Merge the config file, STRATA_EDGE_* variables and flags as `strata edge run` does.")
    config_sub = config_cmd.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    show = config_sub.add_parser("show", help="print the merged config and where each value came from",
                                 description="Print the merged config as TOML, each value followed by its "
                                 "source: default, file, env or flag.")
    _config_flags(show, EdgeAgentConfig)
    command(show, check=_edge_layered_check, run=_edge_config_show)
    check = config_sub.add_parser("check", help="validate a config exactly as `strata edge run` does (ExecStartPre)",
                                  description="Exit 0 when `strata edge run` would start with this config: the "
                                  "values, every file it names (trusted keys, password, TLS files), the cache "
                                  "folder, the env (registered, and makeable) and the cached policy's spaces against "
                                  "it. Otherwise one line, exit 2. It runs the very check `edge run` runs first.")
    _config_flags(check, EdgeAgentConfig)
    command(check, check=_edge_checked, run=_edge_config_check)

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
    add_option(ingest, "--log-level", Choice(values=LOG_LEVELS), default="WARNING", help="logging level")
    command(ingest, check=_edge_ingest_check, run=_edge_ingest)

    install = edge_sub.add_parser(
        "install", help="install a node's kit as a hardened systemd service",
        description="Place the kit's config and credentials under /etc/strata/NODE/ (0600), state under "
        "/var/lib/strata/NODE/, and a hardened unit strata-edge-NODE.service; create the unprivileged "
        "strata-edge user and start the service when systemd runs (as root, --prefix /).")
    add_option(install, "--kit", InputFolder(what="kit folder", content="kit"), required=True,
               help="kit folder (from `strata broker config --kits` or `strata infra apply --kits`)")
    add_option(install, "--prefix", InputFolder(what="root folder"), default=Path("/"),
               help="root to write under, for staging an image")
    add_option(install, "--dry-run", Switch(), default=False, help="print every folder and file it would write")
    add_option(install, "--no-start", Switch(), default=False, help="write the files, do not enable or start")
    command(install, check=_edge_install_check, run=_edge_install)
    uninstall = edge_sub.add_parser("uninstall", help="stop and remove a node's service and config",
                                    description="Stop, disable and remove strata-edge-NODE.service and "
                                    "/etc/strata/NODE/; the cache and outbox in /var/lib/strata/NODE/ stay "
                                    "unless --purge.")
    add_option(uninstall, "--node", Name(), required=True, help="node id")
    add_option(uninstall, "--prefix", InputFolder(what="root folder"), default=Path("/"), help="root")
    add_option(uninstall, "--purge", Switch(), default=False, help="delete the node's state (cache, outbox) too")
    command(uninstall, check=_edge_uninstall_check, run=_edge_uninstall)

    fleet = sub.add_parser(
        "fleet", help="show a fleet's nodes: online, policy version, lag, last telemetry",
        description="Listen to the fleet's retained status messages and telemetry for --wait seconds and print "
        "one row per node.")
    _link_flags(fleet, user_help="broker username (the cloud identity)")
    add_option(fleet, "--wait", Seconds(max=3600.0), default=1.0, help="seconds to listen")
    add_option(fleet, "--nodes", Many(item=Name(), min_items=1, unique=True), metavar="IDS",
               help="comma-separated node ids to watch exactly (needed on AWS IoT; default: all, wildcard)")
    add_option(fleet, "--json", Switch(), default=False, help="print JSON instead of a table")
    command(fleet, check=_fleet_check, run=_fleet)

    broker = sub.add_parser("broker", help="broker helpers", description="Broker helpers.")
    broker_sub = broker.add_subparsers(dest="broker_command", metavar="COMMAND", required=True)
    config = broker_sub.add_parser(
        "config", help="write Mosquitto password and ACL files for a fleet",
        description="Write passwd, acl, mosquitto.conf and generated credentials: each node reads policies and "
        "writes only its own status, telemetry and experience topics; only the cloud user publishes policies.")
    add_option(config, "--out", OutputFolder(what="broker config folder"), required=True, help="folder to write")
    add_option(config, "--fleet", FLEET, required=True, help="fleet name")
    add_option(config, "--nodes", Many(item=Name(), min_items=1, max_items=10_000, unique=True), required=True,
               metavar="IDS", help="comma-separated node ids")
    add_option(config, "--cloud-user", Many(item=Name(), min_items=1, max_items=64, unique=True), default=("cloud",),
               metavar="IDS",
               help="comma-separated identities that publish policies and watch the fleet; one per "
               "concurrently connected cloud tool, since each user has one client id")
    add_option(config, "--devices", Many(item=Name(), max_items=100_000, unique=True), default=(), metavar="IDS",
               help="comma-separated terminal device ids: each becomes a broker user that reads device "
               "bundles and sends its own escalations; each node's user then also may relay device "
               "bundles and answer its devices' escalations (its gateway)")
    add_option(config, "--learner", Name(), metavar="USER",
               help="also make the users of an edge-mode learner: USER (its policy publisher) and "
               "USER-ingest-K for each ingester, one password in credentials/USER.password; they read "
               "every node's experience and write receipts and policies (strata train --edge-username USER "
               "--edge-password-file credentials/USER.password)")
    add_option(config, "--ingesters", Integer(min=1, max=64), default=1, metavar="N",
               help="with --learner: the learner's ingesters (--edge-ingesters)")
    add_option(config, "--port", Port(zero=False), default=1883, help="listener port in mosquitto.conf")
    add_option(config, "--bind", Host(), default="127.0.0.1",
               help="listener address in mosquitto.conf; 0.0.0.0 serves other hosts")
    add_option(config, "--kits", OutputFolder(what="kits folder"),
               help="also write a provisioning kit per node into KITS/<node>/ (edge.toml, password, "
               "trusted key; files 0600) for `strata edge install --kit`")
    add_option(config, "--trust", TRUST, takes="repeat", metavar="PUBFILE",
               help="public signing key the nodes trust (strata-signing.pub); needed with --kits; repeat "
               "it to trust the old and the new key while rotating (a private key is refused)")
    add_option(config, "--broker-url", Url(schemes=("mqtt", "mqtts", "tcp", "ssl")),
               help="URL the nodes reach this broker at, written into the kits (default: mqtt://BIND:PORT; needed "
               "when --bind is a wildcard)")
    command(config, check=_broker_config_check, run=_broker_config)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "debug", "info", "warning", "error", "critical")


def _config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    from device import add_config_arguments
    from device._config import add_option
    from device._kinds import config_file

    add_option(parser, "--config", config_file("edge-config"),
               help="TOML config file; STRATA_EDGE_* variables, then flags, override its values")
    add_config_arguments(parser, cls)


def _layered(args: argparse.Namespace) -> Any:
    import dataclasses

    from device._config_file import load_layered
    from edge._provision import EDGE_LAYOUT

    flags = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(EDGE_LAYOUT.cls) if f.init}
    return load_layered(EDGE_LAYOUT, file=args.config, environ=os.environ, flags=flags)


def _edge_layered_check(args: argparse.Namespace) -> Any:
    return _layered(args)


def edge_run_check(config: Any) -> Any:
    """Everything `strata edge run` can know before it starts, for `config` (an `EdgeAgentConfig`).

    The one validation of `edge run` and `edge config check` (systemd's ExecStartPre): the trusted keys, the
    password and TLS files, the cache folder, the env (made once), and the policy the cache would run against
    the env's spaces. Nothing is written. Returns the cached bundle (or None).

    Raises:
        EdgeConfigError: naming the value, the file or the mismatch, and the fix.
    """
    from device import TrustStore, load_public_key, shown
    from device._bundle import spaces_mismatch
    from device._mqtt import tls_context
    from device._obs_pipeline import make_checked_env
    from edge._agent import read_password_file
    from edge._cache import peek_active
    from edge._errors import EdgeConfigError

    trust = TrustStore([load_public_key(Path(p)) for p in config.trust])
    if config.password_file is not None:
        read_password_file(Path(config.password_file))
    if config.ca_file or config.cert_file or (config.broker or "").startswith(("mqtts:", "ssl:")):
        try:
            tls_context(ca_file=config.ca_file, cert_file=config.cert_file, key_file=config.key_file)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise EdgeConfigError(f"strata edge: the TLS files (ca_file, cert_file, key_file) cannot be used: "
                                  f"{shown(str(exc), 160)}; pass PEM files of the broker's CA and this node's "
                                  "certificate") from None
    cached = peek_active(Path(config.cache_dir), trust=trust) if Path(config.cache_dir).is_dir() else None
    if cached is None and config.broker is None:
        raise EdgeConfigError(f"no verified policy in --cache-dir {shown(config.cache_dir)} and no --broker to fetch "
                              "one from; pass --broker mqtt://HOST:1883")
    env: Any = make_checked_env(config.env, config.pipeline, command="strata edge", extra="edge")
    try:
        mismatch = None if cached is None else spaces_mismatch(cached.manifest, env.observation_space,
                                                               env.action_space)
    finally:
        env.close()
    if mismatch is not None:
        assert cached is not None
        m = cached.manifest
        raise EdgeConfigError(f"the cached policy {m.policy!r} v{m.version} in --cache-dir {shown(config.cache_dir)} "
                              f"cannot act on --env {config.env}: {mismatch}; pass the env it was trained on, or "
                              "another --cache-dir")
    return cached


def _edge_checked(args: argparse.Namespace) -> Any:
    config = _layered(args).config
    return config, edge_run_check(config)


def _edge_config_show(args: argparse.Namespace, layered: Any) -> int:
    from device._config_file import format_layered
    from edge._provision import EDGE_LAYOUT

    print(format_layered(EDGE_LAYOUT, layered), end="")
    return 0


def _edge_config_check(args: argparse.Namespace, checked: Any) -> int:
    config, cached = checked
    policy = "no cached policy" if cached is None else f"cached {cached.manifest.policy} v{cached.manifest.version}"
    print(f"{config.node_id}: config valid (fleet {config.fleet}, broker {config.broker or 'none: offline'}, "
          f"{policy})")
    return 0


def _edge_install_check(args: argparse.Namespace) -> Any:
    from edge._provision import plan_install

    return plan_install(args.kit, prefix=args.prefix)  # reads and validates the kit; writes nothing


def _edge_install(args: argparse.Namespace, plan: Any) -> int:
    from edge._provision import install

    if args.dry_run:
        print(plan.describe())
        return 0
    install(plan, prefix=args.prefix, start=not args.no_start)
    return 0


def _edge_uninstall_check(args: argparse.Namespace) -> None:
    from edge._provision import node_paths

    node_paths(args.prefix, args.node)  # every path stays inside its root, or nothing is touched


def _edge_uninstall(args: argparse.Namespace, checked: None) -> int:
    from edge._provision import uninstall

    uninstall(args.node, prefix=args.prefix, purge=args.purge)
    return 0


def _publish_check(args: argparse.Namespace) -> Any:
    """The bundle is read, parsed (and verified with --trust) and the link's files are usable: nothing is sent."""
    from device import Bundle
    from device._kinds import BUNDLE
    from edge._errors import EdgeConfigError

    data = BUNDLE.read(args.bundle, where="strata publish: bundle")
    if args.trust:  # the one trust-anchor parser; the consumers' own verifier, before anything goes on the wire
        from device import TrustStore, Verifier

        bundle = Verifier(trust=TrustStore.from_paths(args.trust), tier=args.tier).verify(data)
    else:
        bundle = Bundle.from_bytes(data)
    if args.tier == "device" and bundle.manifest.target_tier != "device":
        raise EdgeConfigError(f"strata publish --tier device: {args.bundle} targets tier "
                              f"{bundle.manifest.target_tier!r}; export a micro policy with `strata export --tier "
                              "device`, or publish this one without --tier")
    return data, bundle, _check_link(args, "strata publish")


def _publish(args: argparse.Namespace, checked: Any) -> int:
    from edge._publish import Publisher, publish_bundle

    data, bundle, password = checked
    if args.tier == "device":
        m = bundle.manifest
        with Publisher(broker=args.broker, fleet=args.fleet, username=args.username, password=password,
                       ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file,
                       ack_timeout_s=args.timeout) as publisher:
            publisher.publish_device_bundle(data)
        print(f"published device bundle {m.policy} v{m.version} ({len(data)} bytes) to strata/{args.fleet}/"
              f"device-policy at {args.broker}; edge gateways relay it to their devices")
        return 0
    ann = publish_bundle(data, broker=args.broker, fleet=args.fleet, username=args.username, password=password,
                         ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file,
                         ack_timeout_s=args.timeout)
    how = f"{ann.chunks} chunks" if ann.chunks else "one message"
    print(f"published {ann.policy} v{ann.version} ({ann.size} bytes, {how}) to fleet {args.fleet} "
          f"at {args.broker}")
    return 0


def _edge_run(args: argparse.Namespace, checked: Any) -> int:
    from edge._agent import EdgeAgent

    config, _ = checked
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = EdgeAgent(config)

    def on_signal(signum: int, frame: Any) -> None:
        agent.stop()

    previous = signal.signal(signal.SIGTERM, on_signal)
    started = time.monotonic()
    try:
        agent.start()
        if agent.version is None and config.broker is None:  # the check saw a policy the cache then refused
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


def _edge_ingest_check(args: argparse.Namespace) -> tuple[Any, str | None]:
    """The ingester's config, its password and its spaces file, read before it connects. Nothing is written."""
    import dataclasses

    from device import config_from_args
    from edge._agent import read_password_file
    from edge._errors import EdgeConfigError
    from edge._ingest import IngestConfig, read_spec

    missing = [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(IngestConfig)
               if f.default is dataclasses.MISSING and getattr(args, f.name, None) is None]
    if missing:
        raise EdgeConfigError(f"strata edge ingest: {', '.join(missing)} required")
    config = config_from_args(IngestConfig, args)
    password = read_password_file(config.password_file) if config.password_file else None
    read_spec(config.spaces)
    return config, password


def _edge_ingest(args: argparse.Namespace, checked: tuple[Any, str | None]) -> int:
    import threading

    from edge._ingest import run_ingester

    config, password = checked
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
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


def _fleet_check(args: argparse.Namespace) -> str | None:
    return _check_link(args, "strata fleet")


def _fleet(args: argparse.Namespace, password: str | None) -> int:
    from edge._fleet import FleetMonitor, format_fleet_table

    nodes = list(args.nodes) if args.nodes else None
    with FleetMonitor(broker=args.broker, fleet=args.fleet, nodes=nodes, username=args.username,
                      password=password, ca_file=args.ca_file, cert_file=args.cert_file,
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


def _broker_config_check(args: argparse.Namespace) -> dict[str, bytes]:
    """The kit flags agree and the users are distinct; returns the trusted keys for the kits. Nothing is written."""
    from device._keys import trusted_key_files
    from edge._broker_config import learner_users
    from edge._errors import EdgeConfigError
    from edge._provision import KIT_CONFIG
    from edge._topics import check_segment

    learner = [check_segment(u, "learner user") for u in learner_users(args.learner, args.ingesters)] \
        if args.learner else []
    if args.learner is None and args.ingesters != 1:
        raise EdgeConfigError("strata broker config: --ingesters counts the users of --learner; add --learner USER, "
                              "or drop --ingesters")
    users = [*args.cloud_user, *args.nodes, *args.devices, *learner]
    twice = sorted({u for u in users if users.count(u) > 1})
    if twice:
        raise EdgeConfigError(f"strata broker config: {shown_list(twice)} named twice across --cloud-user, --nodes, "
                              "--devices and --learner; every broker user needs a name of its own")
    if args.kits is None:
        if args.trust or args.broker_url:
            raise EdgeConfigError("strata broker config: --trust and --broker-url go into kits and do nothing "
                                  "without --kits DIR; add --kits, or drop them")
        return {}
    if not args.trust:
        raise EdgeConfigError("strata broker config: --kits needs --trust PUBKEY, the signing key the nodes "
                              "trust (strata-signing.pub from `strata keys generate`)")
    if args.broker_url is None and args.bind in ("0.0.0.0", "::"):
        raise EdgeConfigError(f"strata broker config: --bind {args.bind} serves every interface; say which "
                              "address the nodes use with --broker-url mqtt://HOST:PORT")
    return trusted_key_files(args.trust, what="strata broker config: --trust", taken=(KIT_CONFIG, "password"))


def shown_list(names: list[str]) -> str:
    """Names for a message: each quoted and cut, at most five."""
    from device import shown

    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(shown(n) for n in names[:5]) + more


def _broker_config(args: argparse.Namespace, trusted: dict[str, bytes]) -> int:
    from edge._broker_config import write_broker_config
    from edge._provision import write_kit

    nodes = list(args.nodes)
    files = write_broker_config(args.out, fleet=args.fleet, nodes=nodes, cloud_user=list(args.cloud_user),
                                port=args.port, bind=args.bind, devices=list(args.devices), learner=args.learner,
                                ingesters=args.ingesters)
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
