"""From credentials to a running node: the edge config file, provisioning kits and the systemd service.

::

    strata broker config --kits DIR      (Mosquitto)     ┐  kits/<node>/: edge.toml, credentials, signing key,
    strata infra apply --kits DIR        (AWS IoT Core)  ┘  every file 0600, nothing of another node's
          │ copy kits/<node>/ to the device
          v
    strata edge install --kit DIR        /etc/strata/<node>/ (config + secrets, 0600, owned by the service user)
                                         /var/lib/strata/<node>/ (cache, outbox; the only writable path)
                                         /etc/systemd/system/strata-edge-<node>.service (hardened)
          │ systemctl enable --now strata-edge-<node>
          v
    strata edge run --config /etc/strata/<node>/edge.toml   (ExecStartPre: strata edge config check)

`EDGE_LAYOUT` says which table of ``edge.toml`` holds each `EdgeAgentConfig` field; `device._config_file` merges
the file, ``STRATA_EDGE_*`` variables and flags. Install writes under ``--prefix`` (a staging root, like
``DESTDIR``) while every path inside the unit and the config names the final location.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device._atomic import write_atomic
from device._config_file import ConfigLayout, load_layered, read_config_file, to_toml
from device._config_file import write_kit as write_kit_folder
from device._keys import trusted_key_files
from device._names import identifier, inside, shown
from edge._agent import EdgeAgentConfig
from edge._errors import EdgeConfigError

EDGE_LAYOUT = ConfigLayout(
    cls=EdgeAgentConfig,
    groups={
        "identity": ("fleet", "node_id", "trust", "policy"),
        "broker": ("broker", "username", "password_file", "ca_file", "cert_file", "key_file"),
        "cache": ("cache_dir",),
        "simulator": ("env", "frame_stack", "obs_codec", "seed", "steps", "duration", "control_period_s",
                      "serve_devices"),
        "health": ("health_deadline_s", "health_latency_budget_ms", "health_min_return", "health_episodes"),
        "telemetry": ("telemetry_interval_s", "experience_steps", "experience_max_bytes_per_s",
                      "experience_max_steps_per_s", "experience_receipt_timeout_s", "outbox_max_records",
                      "outbox_overflow"),
    },
    env_prefix="STRATA_EDGE_",
    paths=frozenset({"trust", "cache_dir", "password_file", "ca_file", "cert_file", "key_file"}),
    command="strata edge",
)

KIT_CONFIG = "edge.toml"
"""The config file's name inside a kit and under /etc/strata/<node>/."""
SERVICE_USER = "strata-edge"
"""The unprivileged system user the service runs as."""
_SECRET_FIELDS = ("password_file", "key_file")


# ---- kits -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kit:
    """What one node needs, written to ``kits/<node>/``."""

    node: str
    """The node id."""
    directory: Path
    """Where the kit was written."""
    files: tuple[str, ...]
    """File names in the kit (all mode 0600)."""


def write_kit(out: Path, *, node: str, config: Mapping[str, Any], files: Mapping[str, bytes]) -> Kit:
    """Write ``out/<node>/`` holding `files` and an ``edge.toml`` made of `config` (field -> value).

    Paths in `config` that name one of `files` are written relative to the kit, so it works wherever it is
    copied. The folder is 0700 and every file 0600; a file already there is replaced atomically.
    """
    folder = inside(out, identifier(node, what="node id"), what="kit folder")
    for name in files:
        inside(folder, name, what="kit file")
    values = {"node_id": node, "cache_dir": "cache", **config}
    names = write_kit_folder(folder, {**files, KIT_CONFIG: to_toml(EDGE_LAYOUT, values).encode()})
    return Kit(node=node, directory=out / node, files=names)


# ---- the systemd unit ------------------------------------------------------------------------------------------

def unit_name(node: str) -> str:
    """The systemd unit of node `node`."""
    return f"strata-edge-{node}.service"


def strata_executable() -> str:
    """Absolute path of the ``strata`` console script this Python runs."""
    beside = Path(sys.executable).with_name("strata")
    found = str(beside) if beside.exists() else shutil.which("strata")
    if not found:
        raise EdgeConfigError("strata edge install: the `strata` command is not installed beside "
                              f"{sys.executable}; install strata into that environment first")
    return str(Path(found).absolute())


def render_unit(*, node: str, config_path: str, state_dir: str, executable: str, user: str = SERVICE_USER) -> str:
    """A hardened systemd unit running ``strata edge run --config config_path`` as `user`.

    The agent needs the network (MQTT), its config (read-only) and its state folder (read-write), nothing else:
    the file system is read-only but for `state_dir`, /home and /tmp are hidden, no privileges can be gained,
    and system calls are limited to those of an ordinary service. It restarts after any exit, with a delay.
    """
    return f"""# strata edge agent of node {node}, written by `strata edge install`; `strata edge uninstall` removes it.
[Unit]
Description=strata edge agent (node {node})
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=0

[Service]
Type=simple
User={user}
Group={user}
ExecStartPre={executable} edge config check --config {config_path}
ExecStart={executable} edge run --config {config_path}
Restart=always
RestartSec=5
TimeoutStopSec=30
Environment=PYTHONUNBUFFERED=1
StateDirectory={state_dir.removeprefix('/var/lib/')}
StateDirectoryMode=0700
ReadWritePaths={state_dir}
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
NoNewPrivileges=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
CapabilityBoundingSet=
AmbientCapabilities=
UMask=0077
RemoveIPC=yes
PrivateUsers=yes
DevicePolicy=closed
KeyringMode=private

[Install]
WantedBy=multi-user.target
"""


# ---- install / uninstall ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlannedFile:
    """One file `strata edge install` writes."""

    path: Path
    """Where it is written (under the prefix)."""
    mode: int
    """Its permission bits."""
    data: bytes
    """Its content."""
    secret: bool
    """Whether its content must never be printed."""


@dataclass(frozen=True)
class InstallPlan:
    """Everything `strata edge install` does for one node."""

    node: str
    config_path: str
    """The config's final path (what the unit names)."""
    state_dir: str
    """The node's final state folder."""
    files: tuple[PlannedFile, ...]
    directories: tuple[tuple[Path, int], ...]
    """Folders to create (under the prefix) and their modes."""

    def describe(self) -> str:
        """Every folder and file the install writes; secrets by size only."""
        lines = [f"strata edge install: node {self.node}"]
        lines += [f"  mkdir  {oct(mode)[2:]:>4}  {path}/" for path, mode in self.directories]
        for f in self.files:
            lines.append(f"  write  {oct(f.mode)[2:]:>4}  {f.path} ({len(f.data)} bytes)")
            if not f.secret:
                lines += [f"         | {line}" for line in f.data.decode().splitlines()]
        return "\n".join(lines)


def plan_install(kit: Path, *, prefix: Path = Path("/"), executable: str | None = None,
                 user: str = SERVICE_USER) -> InstallPlan:
    """What installing the kit at `kit` writes under `prefix`; reads the kit and validates its config.

    A kit is self-contained: every file its config names must lie inside the kit folder (symbolic links
    resolved), so a kit cannot make a root install copy ``/etc/shadow`` into the node's 0600 files. Trusted keys
    go through the one trust-anchor parser (a private key is refused) and each keeps a file of its own (key
    rotation: two keys named ``signer.pub`` in two folders both survive).
    """
    config_file = kit / KIT_CONFIG
    if not config_file.is_file():
        raise EdgeConfigError(f"strata edge install: {kit} is not a kit (no {KIT_CONFIG}); make one with "
                              "`strata broker config --kits DIR` or `strata infra apply --kits DIR`")
    config: EdgeAgentConfig = load_layered(EDGE_LAYOUT, file=config_file, environ={}, flags={}).config
    node = identifier(config.node_id, what="strata edge install: identity.node_id")
    etc, state = f"/etc/strata/{node}", f"/var/lib/strata/{node}"
    etc_dir, state_dir = node_paths(prefix, node)
    files: list[PlannedFile] = []
    moved: dict[str, Any] = {}
    taken = {KIT_CONFIG}
    for name in sorted(EDGE_LAYOUT.paths - {"cache_dir"}):
        value = getattr(config, name)
        if value is None:
            continue
        paths = value if isinstance(value, tuple) else (value,)
        field = f"{EDGE_LAYOUT.group_of(name)}.{name}"
        for p in paths:
            _inside_kit(kit, Path(p), field)
        if name == "trust":  # the one trust-anchor parser; every key keeps a file of its own
            found = trusted_key_files(paths, what=f"strata edge install: {field}", taken=taken)
        else:
            found = {}
            for p in paths:
                data = _read_kit_file(Path(p), field)
                target = _unique(Path(p).name, taken)
                taken.add(target)
                found[target] = data
        final = []
        for target, data in found.items():
            taken.add(target)
            files.append(PlannedFile(path=inside(etc_dir, target, what="strata edge install"), mode=0o600,
                                     data=data, secret=name in _SECRET_FIELDS))
            final.append(f"{etc}/{target}")
        moved[name] = tuple(final) if isinstance(value, tuple) else final[0]
    values = {**read_config_file(EDGE_LAYOUT, config_file), **moved, "cache_dir": f"{state}/cache"}
    config_path = f"{etc}/{KIT_CONFIG}"
    files.append(PlannedFile(path=inside(etc_dir, KIT_CONFIG, what="strata edge install"), mode=0o600,
                             data=to_toml(EDGE_LAYOUT, values).encode(), secret=False))
    unit = render_unit(node=node, config_path=config_path, state_dir=state,
                       executable=executable or strata_executable(), user=user)
    files.append(PlannedFile(path=unit_path(prefix, node), mode=0o644, data=unit.encode(), secret=False))
    directories = ((etc_dir, 0o700), (state_dir, 0o700))
    return InstallPlan(node=node, config_path=config_path, state_dir=state, files=tuple(files),
                       directories=directories)


MAX_KIT_FILE_BYTES = 1024 * 1024
"""A file a kit names (password, certificate, key) above this size is refused unread."""


def _inside_kit(kit: Path, path: Path, field: str) -> None:
    if kit.resolve() not in path.resolve().parents:
        raise EdgeConfigError(f"strata edge install: {field} names {shown(str(path))}, outside the kit {kit}; a kit "
                              "holds every file it names (copy the file into the kit)")


def _read_kit_file(path: Path, field: str) -> bytes:
    try:
        if not path.is_file():
            raise EdgeConfigError(f"strata edge install: {field} names {shown(str(path))}, which is not a file")
        with path.open("rb") as f:
            data = f.read(MAX_KIT_FILE_BYTES + 1)
    except OSError as exc:
        raise EdgeConfigError(f"strata edge install: {field} names {shown(str(path))}, which cannot be read: "
                              f"{exc.strerror or exc}") from None
    if len(data) > MAX_KIT_FILE_BYTES:
        raise EdgeConfigError(f"strata edge install: {field} names {shown(str(path))}, over "
                              f"{MAX_KIT_FILE_BYTES:,} bytes; a kit file is a password, a certificate or a key")
    return data


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or ``stem-2.suffix``, ``stem-3.suffix``... when a file of that name is already planned."""
    if name not in taken and not name.startswith("."):
        return name
    stem, suffix = Path(name).stem.lstrip(".") or "file", Path(name).suffix
    n = 2
    while f"{stem}-{n}{suffix}" in taken:
        n += 1
    return f"{stem}-{n}{suffix}"


def node_paths(prefix: Path, node: str) -> tuple[Path, Path]:
    """``(PREFIX/etc/strata/NODE, PREFIX/var/lib/strata/NODE)``, each checked to stay inside its root.

    Raises:
        ConfigError: `node` is not an identifier, or a path would leave ``etc/strata`` or ``var/lib/strata``
            under `prefix` (``..``, ``.``, a planted symbolic link).
    """
    node = identifier(node, what="node id")
    paths = []
    for root, what in (("etc/strata", "node config folder"), ("var/lib/strata", "node state folder")):
        inside(prefix, *root.split("/"), node, what=what)  # a link planted under the prefix cannot lead out
        paths.append(inside(prefix / root, node, what=what))
    return paths[0], paths[1]


def unit_path(prefix: Path, node: str) -> Path:
    """``PREFIX/etc/systemd/system/strata-edge-NODE.service``, checked to stay inside that folder."""
    unit = unit_name(identifier(node, what="node id"))
    inside(prefix, "etc", "systemd", "system", unit, what="systemd unit")
    return inside(prefix / "etc/systemd/system", unit, what="systemd unit")


def _under(prefix: Path, path: str) -> Path:
    return prefix / path.lstrip("/")


def _systemd_running() -> bool:
    return Path("/run/systemd/system").is_dir()


def install(plan: InstallPlan, *, prefix: Path, user: str = SERVICE_USER, start: bool = True,
            log: Callable[[str], None] = print) -> None:
    """Carry out `plan`: folders, files (atomically), the service user and, on a live systemd, the service."""
    real_root = prefix.resolve() == Path("/")
    owner: pwd.struct_passwd | None = None
    if real_root and os.geteuid() == 0:
        owner = _ensure_user(user, log)
    elif real_root:
        raise EdgeConfigError("strata edge install: installing into / needs root (run it with sudo), or stage "
                              "the files with --prefix DIR")
    try:
        for path, mode in plan.directories:
            path.mkdir(parents=True, exist_ok=True, mode=mode)
            os.chmod(path, mode)
            if owner is not None:
                os.chown(path, owner.pw_uid, owner.pw_gid)
        for f in plan.files:
            f.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(f.path, f.data, mode=f.mode)
            if owner is not None and f.mode == 0o600:
                os.chown(f.path, owner.pw_uid, owner.pw_gid)
    except OSError as exc:
        raise EdgeConfigError(f"strata edge install: cannot write under {prefix}: {exc.strerror or exc} "
                              f"({getattr(exc, 'filename', '')})") from None
    for f in plan.files:
        log(f"wrote {f.path} ({oct(f.mode)[2:]})")
    unit = unit_name(plan.node)
    if real_root and _systemd_running() and start:
        _systemctl("daemon-reload")
        _systemctl("enable", "--now", unit)
        log(f"started {unit}; follow it with: journalctl -u {unit} -f")
    else:
        log(f"next: systemctl daemon-reload && systemctl enable --now {unit}")


def _ensure_user(user: str, log: Callable[[str], None]) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(user)
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is None:
        raise EdgeConfigError(f"strata edge install: no user {user!r} and no useradd to create it; create a "
                              f"system user named {user} first")
    subprocess.run([useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                    "/usr/sbin/nologin", user], check=True, capture_output=True)
    log(f"created system user {user}")
    return pwd.getpwnam(user)


def _systemctl(*args: str) -> None:
    result = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise EdgeConfigError(f"systemctl {' '.join(args)} failed: {result.stderr.strip() or result.returncode}")


def uninstall(node: str, *, prefix: Path = Path("/"), purge: bool = False,
              log: Callable[[str], None] = print) -> None:
    """Stop and remove node `node`'s service and config; its state too with `purge`.

    `node` must be an identifier and every path it builds must stay inside its root (``etc/strata``,
    ``var/lib/strata``, ``etc/systemd/system`` under `prefix`), or nothing is touched.
    """
    node = identifier(node, what="strata edge uninstall: --node")
    unit = unit_name(node)
    real_root = prefix.resolve() == Path("/")
    etc, state = node_paths(prefix, node)
    unit_file = unit_path(prefix, node)
    if not unit_file.exists() and not etc.exists():
        raise EdgeConfigError(f"strata edge uninstall: node {node!r} is not installed under {prefix} "
                              f"(no {unit_file}); `ls {_under(prefix, '/etc/strata')}` lists installed nodes")
    if real_root and _systemd_running():
        _systemctl("disable", "--now", unit)
    unit_file.unlink(missing_ok=True)
    shutil.rmtree(etc, ignore_errors=True)
    log(f"removed {unit_file} and {etc}/")
    if purge:
        shutil.rmtree(state, ignore_errors=True)
        log(f"removed {state}/ (cache and outbox)")
    else:
        log(f"kept {state}/ (cache and outbox); --purge deletes it")
    if real_root and _systemd_running():
        _systemctl("daemon-reload")
