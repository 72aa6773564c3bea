"""Mosquitto password and ACL files for a fleet: nodes read policies and write only their own topics.

`write_broker_config` writes into one folder:

    passwd                 Mosquitto password file (PBKDF2-SHA512, the ``$7$`` format of Mosquitto 2)
    acl                    per-user ACL (mode 0600): the cloud identities read and write strata/{fleet}/#; each
                           node reads the fleet's announcement, policies and control and its own receipts, and
                           writes only its own status, telemetry and experience topics; with ``learner``, the
                           learner's users (its policy publisher ``{learner}`` and its ingesters
                           ``{learner}-ingest-{k}``, one password) read every node's experience and write receipts
                           and policies, exactly the learner rows of ``device._mqtt_access`` and nothing else
    mosquitto.conf         a listener config that uses both (password required, client id bound to the
                           username, Nagle off, persistence on)
    credentials/USER.password   one generated password per user (mode 0600), for ``--password-file``

With ``devices`` (``strata broker config --devices d1,d2``), each device is a user too: it reads the device
bundle of any edge of the fleet (``edges/+/device-policy``) and writes its own escalation requests and reads its
own replies (``edges/+/devices/{device}/request|reply``), so a device can move between edges but never act as
another device. Each node's user then also gets its device gateway's topics (the gateway shares the agent's
connection, see below): it reads the fleet's device bundle, relays it to ``edges/{node}/device-policy`` (and
reads it back, which is how it confirms a relay), reads its devices' requests and writes their replies.

The hashes come from the ``mosquitto_passwd`` binary when it is installed, and are computed here otherwise
(same format: ``$7$101$<base64 salt>$<base64 PBKDF2-HMAC-SHA512>``).

A node can only be itself: ``use_username_as_clientid true`` makes Mosquitto replace the client id a client
sends with its username, so node n1's credentials can never take over client id ``n2`` (which would disconnect
n2, fire its last will and wipe its persistent session). The flip side: every connection of one user shares
one client id, and a second connection takes over the first. So each concurrently connected cloud tool (a
training run's publisher, `strata fleet`) needs a user of its own (``cloud_user=("cloud", "monitor")``). An edge
agent's device gateway shares the agent's connection for the same reason.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from device import mqtt_topic, write_atomic
from device._mqtt_access import MQTT_ACCESS
from device._names import HOST_FORM, is_host, shown
from edge._errors import EdgeConfigError
from edge._topics import FleetTopics, check_segment

PBKDF2_ITERATIONS = 101
SALT_BYTES = 12


def mosquitto_hash(password: str, *, salt: bytes | None = None, iterations: int = PBKDF2_ITERATIONS) -> str:
    """The Mosquitto 2 password-file hash of `password` (PBKDF2-HMAC-SHA512, ``$7$`` format)."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


@dataclass(frozen=True)
class BrokerFiles:
    """What `write_broker_config` wrote."""

    passwd: Path
    acl: Path
    conf: Path
    credentials: dict[str, Path]
    hashed_with: str
    """``"mosquitto_passwd"`` or ``"python"``."""


def _cloud_users(cloud_user: str | Sequence[str]) -> list[str]:
    return [cloud_user] if isinstance(cloud_user, str) else list(cloud_user)


def learner_users(learner: str, ingesters: int) -> list[str]:
    """The learner's broker users: its publisher and one per ingester (Mosquitto binds a client id to a user)."""
    return [learner, *(f"{learner}-ingest-{k}" for k in range(ingesters))]


def learner_acl(fleet: str) -> list[str]:
    """ACL lines of a learner user, from the learner rows of the MQTT access table (free segments are ``+``)."""
    lines = []
    for access in MQTT_ACCESS:
        if access.role == "learner":
            topic = mqtt_topic(fleet, access.topic, node="+", policy="+", index="+", device="+")
            lines.append(f"topic {'read' if access.op == 'subscribe' else 'write'} {topic}")
    return lines


def acl_text(fleet: str, nodes: Sequence[str], cloud_user: str | Sequence[str], devices: Sequence[str] = (),
             learners: Sequence[str] = ()) -> str:
    """The ACL file body (see the module docstring)."""
    t = FleetTopics(fleet)
    lines = ["# strata fleet ACL: written by `strata broker config`; edit with care.", ""]
    for user in _cloud_users(cloud_user):
        lines += [f"# cloud identity {user}: publishes policies and reads everything of fleet {fleet}",
                  f"user {user}", f"topic readwrite {t.root}/#", ""]
    for node in nodes:
        lines += [f"# node {node}: reads policies and control, writes only its own topics", f"user {node}",
                  f"topic read {t.announce}", f"topic read {t.control}", f"topic read {t.root}/policies/#",
                  f"topic read {t.node(node, 'control')}", f"topic read {t.node(node, 'receipt')}",
                  f"topic write {t.node(node, 'status')}",
                  f"topic write {t.node(node, 'telemetry')}", f"topic write {t.node(node, 'experience')}"]
        if devices:
            lines += _gateway_acl(fleet, node)
        lines.append("")
    for user in learners:
        lines += [f"# learner {user}: reads every node's experience (shared subscription), writes receipts and "
                  "policies", f"user {user}", *learner_acl(fleet), ""]
    for device in devices:
        lines += [f"# device {device}: reads device bundles, sends its own escalations, reads its own replies",
                  f"user {device}", f"topic read {t.root}/edges/+/device-policy",
                  f"topic write {t.root}/edges/+/devices/{device}/request",
                  f"topic read {t.root}/edges/+/devices/{device}/reply", ""]
    return "\n".join(lines)


def _gateway_acl(fleet: str, node: str) -> list[str]:
    """The node's device gateway: reads the fleet's device bundle, relays it (reading it back), answers escalations."""
    from device import DeviceTopics

    d = DeviceTopics(fleet, node)
    return [f"topic read {d.fleet_device_policy}", f"topic readwrite {d.device_policy}",
            f"topic read {d.all_requests}", f"topic write {FleetTopics(fleet).root}/edges/{node}/devices/+/reply"]


def write_broker_config(out: Path, *, fleet: str, nodes: Sequence[str], cloud_user: str | Sequence[str] = "cloud",
                        port: int = 1883, bind: str = "127.0.0.1", use_binary: bool = True,
                        devices: Sequence[str] = (), learner: str | None = None, ingesters: int = 1) -> BrokerFiles:
    """Write passwd, acl, mosquitto.conf and generated credentials for `fleet` into `out`.

    Args:
        out: Folder to write (created).
        fleet: Fleet name.
        nodes: Node ids; each becomes a broker user.
        cloud_user: The identity (or identities, one per concurrently connected cloud tool) that may
            publish policies and watch the fleet.
        port: Listener port written into mosquitto.conf.
        bind: Address the listener binds to: loopback by default; ``0.0.0.0`` (or an interface's
            address) to serve edge nodes on other hosts.
        use_binary: Hash with ``mosquitto_passwd`` when it is installed.
        devices: Terminal device ids; each becomes a broker user, and each node's user gets its device
            gateway's topics (see the module docstring).
        learner: The learner's user name for an ``edge``-mode run (`learner_users`); its users share one password,
            in ``credentials/{learner}.password``.
        ingesters: How many ingesters the learner runs (``--edge-ingesters``).
    """
    check_segment(fleet, "fleet")
    clouds = _cloud_users(cloud_user)
    users = [*(check_segment(u, "cloud user") for u in clouds), *(check_segment(n, "node id") for n in nodes)]
    if devices:
        users += [check_segment(d, "device id") for d in devices]
    if learner is not None:
        if not 1 <= ingesters <= 64:
            raise EdgeConfigError(f"strata broker config: --ingesters {ingesters} must lie in 1..64")
        users += [check_segment(u, "learner user") for u in learner_users(learner, ingesters)]
    if not nodes or not clouds or len(set(users)) != len(users):
        raise EdgeConfigError(f"strata broker config: need at least one node and distinct user names, got "
                              f"nodes={list(nodes)}, cloud user {cloud_user!r} and devices {list(devices)}")
    if not 1 <= port <= 65535:
        raise EdgeConfigError(f"strata broker config: port {port} must be between 1 and 65535")
    if not is_host(bind):  # it goes into mosquitto.conf: a space, ';' or newline would add a directive
        raise EdgeConfigError(f"strata broker config: --bind {shown(bind)} must be {HOST_FORM}; 0.0.0.0 serves "
                              "every interface")
    try:
        return _write(Path(out), fleet=fleet, nodes=nodes, cloud_user=cloud_user, users=users, port=port, bind=bind,
                      use_binary=use_binary, devices=devices,
                      learners=learner_users(learner, ingesters) if learner is not None else [])
    except OSError as exc:
        raise EdgeConfigError(f"strata broker config: cannot write into {str(out)!r}: {exc.strerror or exc} "
                              f"({exc.filename or out}); pass a writable --out folder") from None


def _write(out: Path, *, fleet: str, nodes: Sequence[str], cloud_user: str | Sequence[str], users: list[str],
           port: int, bind: str, use_binary: bool, devices: Sequence[str], learners: Sequence[str]) -> BrokerFiles:
    creds_dir = out / "credentials"
    creds_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(creds_dir, 0o700)
    passwords = {u: secrets.token_urlsafe(18) for u in users}
    for user in learners[1:]:  # one secret for the learner's users: one --edge-password-file
        passwords[user] = passwords[learners[0]]
    credentials = {}
    for user, password in passwords.items():
        if user in learners[1:]:
            continue
        path = creds_dir / f"{user}.password"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        credentials[user] = path
    passwd = out / "passwd"
    binary = shutil.which("mosquitto_passwd") if use_binary else None
    tmp = out / ".passwd.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        if binary:
            # Plain "user:password" lines, hashed in place by `mosquitto_passwd -U` (no passwords in argv).
            f.write("".join(f"{u}:{p}\n" for u, p in passwords.items()))
        else:
            f.write("".join(f"{u}:{mosquitto_hash(p)}\n" for u, p in passwords.items()))
    if binary:
        result = subprocess.run([binary, "-U", str(tmp)], capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise EdgeConfigError(f"strata broker config: {binary} -U failed: {result.stderr.strip()}")
    os.replace(tmp, passwd)
    acl = out / "acl"
    write_atomic(acl, acl_text(fleet, nodes, cloud_user, devices, learners).encode(), mode=0o600)
    conf = out / "mosquitto.conf"
    conf.write_text("\n".join([
        "# strata fleet broker: written by `strata broker config`",
        f"listener {port} {bind}",
        "# Started as root, mosquitto switches to this user, which must be able to read the 0600 files above",
        f"user {getpass.getuser()}",
        "allow_anonymous false",
        "# A node can only be itself: the client id is replaced by the username, so n1 cannot take over n2",
        "use_username_as_clientid true",
        f"password_file {passwd.resolve()}",
        f"acl_file {acl.resolve()}",
        "# Nagle off: otherwise a QoS 1 round trip takes ~40-90 ms (MEASURED.md)",
        "set_tcp_nodelay true",
        "persistence true",
        "# Mosquitto drops silently past 1000 queued messages per client by default",
        "max_queued_messages 100000",
        "# QoS 1 messages in flight to one client (an experience ingester acknowledges a batch at a time)",
        "max_inflight_messages 1000",
        "",
    ]))
    return BrokerFiles(passwd=passwd, acl=acl, conf=conf, credentials=credentials,
                       hashed_with="mosquitto_passwd" if binary else "python")
