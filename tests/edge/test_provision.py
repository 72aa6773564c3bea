"""From `strata broker config --kits` to a running node: config files, kits, `strata edge install` and its unit."""

from __future__ import annotations

import datetime
import json
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from device import ConfigError, generate_keypair
from device._config_file import format_layered, load_layered, read_config_file
from edge import Publisher
from edge._provision import EDGE_LAYOUT, plan_install, render_unit, write_kit
from tests._cli import run_strata
from tests._services import free_port
from tests.conftest import MosquittoFactory
from tests.edge._policies import cartpole_bundle, make_keys
from tests.edge.test_tls import _cert, _write

KIT = """
[identity]
fleet = "f1"
node_id = "n1"
trust = ["keys/strata-signing.pub"]

[broker]
broker = "mqtt://127.0.0.1:1883"

[simulator]
steps = 100
"""


def _file(tmp_path: Path, text: str = KIT) -> Path:
    if not (tmp_path / "keys" / "strata-signing.pub").exists():  # the trust file is read where it is given
        generate_keypair(tmp_path / "keys", name="strata-signing")
    path = tmp_path / "edge.toml"
    path.write_text(text)
    return path


def test_file_then_environment_then_flags_each_value_with_its_source(tmp_path: Path) -> None:
    path = _file(tmp_path)
    layered = load_layered(EDGE_LAYOUT, file=path, flags={"steps": 7, "seed": None},
                           environ={"STRATA_EDGE_BROKER": "mqtt://127.0.0.1:2883", "STRATA_EDGE_STEPS": "50",
                                    "STRATA_EDGE_CACHE_DIR": "/var/cache/n1", "HOME": "/root"})
    config = layered.config
    assert (config.fleet, config.steps, config.broker, config.cache_dir) == ("f1", 7, "mqtt://127.0.0.1:2883",
                                                                            "/var/cache/n1")
    assert config.trust == (str(tmp_path / "keys" / "strata-signing.pub"),)  # relative to the file
    assert layered.sources["fleet"] == f"file {path}" and layered.sources["steps"] == "flag --steps"
    assert layered.sources["broker"] == "env STRATA_EDGE_BROKER" and layered.sources["env"] == "default"
    shown = format_layered(EDGE_LAYOUT, layered)
    assert re.search(r'^broker = "mqtt://127.0.0.1:2883" +# env STRATA_EDGE_BROKER$', shown, re.M)
    assert re.search(r"^# policy \(unset\) +# default$", shown, re.M)


@pytest.mark.parametrize(("text", "message"), [
    (KIT + "\n[brokr]\nbroker = 'x'\n", "unknown table [brokr]; the tables are [identity], [broker]"),
    (KIT.replace('broker = "mqtt', 'hots = "mqtt'), "unknown key broker.hots; the keys of [broker] are broker,"),
    (KIT + "\n[cache]\nenv = 'CartPole-v1'\n", "unknown key cache.env; it belongs in [simulator]"),
    (KIT.replace("steps = 100", "steps = '100'"), "[simulator] steps = '100': must be an integer from 0 to"),
    (KIT.replace("steps = 100", "steps = true"), "[simulator] steps = True: must be an integer from 0 to"),
    (KIT.replace('node_id = "n1"\n', ""), "identity.node_id is required: set it in the config file (--config), "
                                          "in STRATA_EDGE_NODE_ID or with --node-id"),
    ("[identity\n", "is not valid TOML"),
])
def test_a_bad_file_is_an_error_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_layered(EDGE_LAYOUT, file=_file(tmp_path, text), environ={}, flags={})


def test_a_bad_environment_variable_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("STRATA_EDGE_STEPS 'many': must be an integer from 0 to")):
        load_layered(EDGE_LAYOUT, file=_file(tmp_path), environ={"STRATA_EDGE_STEPS": "many"}, flags={})
    with pytest.raises(ConfigError, match=re.escape("unknown environment variable STRATA_EDGE_NODE")):
        load_layered(EDGE_LAYOUT, file=_file(tmp_path), environ={"STRATA_EDGE_NODE": "n2"}, flags={})


def test_cli_config_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    path = _file(tmp_path, KIT.replace("steps = 100", "stepz = 100"))
    for argv in (["edge", "config", "show", "--config", str(path)],
                 ["edge", "run", "--config", str(path)],
                 ["edge", "config", "show", "--config", str(tmp_path / "missing.toml")],
                 ["edge", "install", "--kit", str(tmp_path), "--dry-run"]):
        r = run_strata(*argv)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_broker_config_writes_one_private_kit_per_node(tmp_path: Path) -> None:
    _, pub = make_keys(tmp_path / "keys")
    r = run_strata("broker", "config", "--out", str(tmp_path / "broker"), "--fleet", "f1", "--nodes", "n1,n2",
                   "--kits", str(tmp_path / "kits"), "--trust", str(pub), "--broker-url", "mqtt://localhost:2883")
    assert r.returncode == 0, r.stderr
    kits = tmp_path / "kits"
    for node in ("n1", "n2"):
        kit = kits / node
        assert stat.S_IMODE(kit.stat().st_mode) == 0o700
        assert sorted(p.name for p in kit.iterdir()) == sorted(["edge.toml", "password", pub.name])
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in kit.iterdir())
        values = read_config_file(EDGE_LAYOUT, kit / "edge.toml")
        assert (values["node_id"], values["username"], values["broker"]) == (node, node, "mqtt://localhost:2883")
        own = (tmp_path / "broker" / "credentials" / f"{node}.password").read_bytes()
        assert (kit / "password").read_bytes() == own
    assert (kits / "n1" / "password").read_bytes() != (kits / "n2" / "password").read_bytes()
    for secret in (kits / "n1" / "password").read_text().strip(), (kits / "n2" / "password").read_text().strip():
        assert secret not in r.stdout + r.stderr  # no key or password in any log line
    bad = run_strata("broker", "config", "--out", str(tmp_path / "b2"), "--fleet", "f1", "--nodes", "n1",
                     "--kits", str(tmp_path / "k2"))
    assert bad.returncode == 2 and "--kits needs --trust PUBKEY" in bad.stderr
    assert not (tmp_path / "b2").exists()  # nothing written before the flags were checked


def test_a_kit_runs_a_node_on_the_secure_broker(tmp_path: Path, mosquitto_factory: MosquittoFactory) -> None:
    key, pub = make_keys(tmp_path / "keys")
    port = free_port()
    r = run_strata("broker", "config", "--out", str(tmp_path / "broker"), "--fleet", "kitfleet", "--nodes", "n1",
                   "--port", str(port), "--kits", str(tmp_path / "kits"), "--trust", str(pub))
    assert r.returncode == 0, r.stderr
    broker_dir = tmp_path / "broker"
    mosquitto_factory([f"listener {port} 127.0.0.1", f"password_file {broker_dir / 'passwd'}",
                       f"acl_file {broker_dir / 'acl'}"], anonymous=False)
    cloud_password = (broker_dir / "credentials" / "cloud.password").read_text().strip()
    with Publisher(broker=f"mqtt://127.0.0.1:{port}", fleet="kitfleet", username="cloud",
                   password=cloud_password) as publisher:
        publisher.publish(cartpole_bundle(key, 3))
    # the kit copied elsewhere still works: its paths are relative to its edge.toml
    moved = shutil.copytree(tmp_path / "kits" / "n1", tmp_path / "device" / "n1")
    run = run_strata("edge", "run", "--config", str(moved / "edge.toml"), "--steps", "300", "--json", timeout=300)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["node"], summary["version"], summary["steps"]) == ("n1", 3, 300)
    assert (moved / "cache").is_dir()


def test_a_kit_with_a_tls_client_certificate_runs_a_node(tmp_path: Path, mosquitto_factory: MosquittoFactory
                                                         ) -> None:
    ca_key, ca_cert = _cert("strata test CA", None, None, ca=True)
    server_key, server_cert = _cert("127.0.0.1", ca_key, ca_cert.subject, ip="127.0.0.1")
    node_key, node_cert = _cert("n1", ca_key, ca_cert.subject)
    _, ca_file = _write(tmp_path / "ca", ca_key, ca_cert)
    server_key_file, server_cert_file = _write(tmp_path / "server", server_key, server_cert)
    node_key_file, node_cert_file = _write(tmp_path / "node", node_key, node_cert)
    port = free_port()
    mosquitto_factory([f"listener {port} 127.0.0.1", f"cafile {ca_file}", f"certfile {server_cert_file}",
                       f"keyfile {server_key_file}", "require_certificate true"])
    key, pub = make_keys(tmp_path / "keys")
    url = f"mqtts://127.0.0.1:{port}"
    with Publisher(broker=url, fleet="tls", ca_file=ca_file, cert_file=node_cert_file,
                   key_file=node_key_file) as publisher:
        publisher.publish(cartpole_bundle(key, 2))
    kit = write_kit(tmp_path / "kits", node="n1", config={
        "fleet": "tls", "broker": url, "trust": ("signing.pub",), "ca_file": "ca.pem", "cert_file": "n1.pem",
        "key_file": "n1.key"}, files={"signing.pub": pub.read_bytes(), "ca.pem": Path(ca_file).read_bytes(),
                                      "n1.pem": Path(node_cert_file).read_bytes(),
                                      "n1.key": Path(node_key_file).read_bytes()})
    run = run_strata("edge", "run", "--config", str(kit.directory / "edge.toml"), "--steps", "200", "--json",
                     timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["version"] == 2
    # a certificate from another CA, and an expired one from the right CA: refused, one line, non-zero exit
    other_key, other_ca = _cert("another CA", None, None, ca=True)
    wrong = _cert("n1", other_key, other_ca.subject)
    expired = _expired_cert("n1", ca_key, ca_cert)
    for label, (bad_key, bad_cert) in (("wrong", wrong), ("expired", expired)):
        bad_key_file, bad_cert_file = _write(tmp_path / label, bad_key, bad_cert)
        bad_kit = write_kit(tmp_path / label, node="n1", config={
            "fleet": "tls", "broker": url, "trust": ("signing.pub",), "ca_file": "ca.pem", "cert_file": "n1.pem",
            "key_file": "n1.key"}, files={"signing.pub": pub.read_bytes(), "ca.pem": Path(ca_file).read_bytes(),
                                          "n1.pem": Path(bad_cert_file).read_bytes(),
                                          "n1.key": Path(bad_key_file).read_bytes()})
        refused = run_strata("edge", "run", "--config", str(bad_kit.directory / "edge.toml"), "--steps", "200",
                             timeout=300)
        assert refused.returncode == 2, (label, refused.stderr)
        assert "Traceback" not in refused.stderr
        last = refused.stderr.strip().splitlines()[-1]
        assert "refused the client certificate" in last and "--cert-file" in last, (label, last)


def _expired_cert(subject: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate
                  ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=10)).not_valid_after(now - datetime.timedelta(days=1))
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def _kit(tmp_path: Path) -> Path:
    _, pub = make_keys(tmp_path / "keys")
    r = run_strata("broker", "config", "--out", str(tmp_path / "broker"), "--fleet", "f1", "--nodes", "n1",
                   "--kits", str(tmp_path / "kits"), "--trust", str(pub))
    assert r.returncode == 0, r.stderr
    return tmp_path / "kits" / "n1"


def test_install_dry_run_prints_every_file_and_no_secret(tmp_path: Path) -> None:
    kit = _kit(tmp_path)
    (tmp_path / "root").mkdir()  # --prefix is an existing folder to install under
    r = run_strata("edge", "install", "--kit", str(kit), "--prefix", str(tmp_path / "root"), "--dry-run")
    assert r.returncode == 0, r.stderr
    pub = next(kit.glob("*.pub")).name
    for path in ("/etc/strata/n1/edge.toml", "/etc/strata/n1/password", f"/etc/strata/n1/{pub}",
                 "/etc/systemd/system/strata-edge-n1.service", "/var/lib/strata/n1/"):
        assert path in r.stdout
    assert (kit / "password").read_text().strip() not in r.stdout
    assert "ExecStart=" in r.stdout and 'cache_dir = "/var/lib/strata/n1/cache"' in r.stdout
    assert not any((tmp_path / "root").iterdir())  # a dry run writes nothing


def test_install_then_uninstall_under_a_prefix(tmp_path: Path) -> None:
    kit = _kit(tmp_path)
    root = tmp_path / "root"
    root.mkdir()  # --prefix is an existing folder to install under
    r = run_strata("edge", "install", "--kit", str(kit), "--prefix", str(root))
    assert r.returncode == 0, r.stderr
    etc = root / "etc" / "strata" / "n1"
    assert stat.S_IMODE(etc.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in etc.iterdir())
    assert stat.S_IMODE((root / "var" / "lib" / "strata" / "n1").stat().st_mode) == 0o700
    # The installed file names paths of the target root (not under --prefix): read as plain TOML, not checked.
    installed = {k: v for table in tomllib.loads((etc / "edge.toml").read_text()).values() for k, v in table.items()}
    assert installed["password_file"] == "/etc/strata/n1/password"
    assert installed["trust"] == [f"/etc/strata/n1/{next(kit.glob('*.pub')).name}"]
    assert installed["cache_dir"] == "/var/lib/strata/n1/cache"
    unit = (root / "etc" / "systemd" / "system" / "strata-edge-n1.service").read_text()
    assert "ExecStart=" in unit and "edge run --config /etc/strata/n1/edge.toml" in unit
    (root / "var" / "lib" / "strata" / "n1" / "cache").mkdir()
    assert run_strata("edge", "uninstall", "--node", "n1", "--prefix", str(root)).returncode == 0
    assert not etc.exists() and (root / "var" / "lib" / "strata" / "n1" / "cache").exists()
    again = run_strata("edge", "uninstall", "--node", "n1", "--prefix", str(root))
    assert again.returncode == 2 and "is not installed" in again.stderr
    assert run_strata("edge", "install", "--kit", str(kit), "--prefix", str(root)).returncode == 0
    assert run_strata("edge", "uninstall", "--node", "n1", "--prefix", str(root), "--purge").returncode == 0
    assert not (root / "var" / "lib" / "strata" / "n1").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_verifies_and_its_exposure_is_ok(tmp_path: Path) -> None:
    kit = _kit(tmp_path)
    plan = plan_install(kit, prefix=tmp_path / "root")
    unit = next(f for f in plan.files if f.path.name.endswith(".service"))
    path = tmp_path / unit.path.name
    path.write_bytes(unit.data)
    verify = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr
    security = subprocess.run(["systemd-analyze", "security", "--offline=true", str(path)], capture_output=True,
                              text=True)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", security.stdout)
    assert found is not None, security.stdout + security.stderr
    assert float(found.group(1)) < 4.0 and found.group(2) in ("OK", "SAFE"), found.group(0)
    for directive in ("Restart=always", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
                      "ProtectHome=yes", "ReadWritePaths=/var/lib/strata/n1", "User=strata-edge",
                      "ExecStartPre="):
        assert directive in unit.data.decode()


def test_render_unit_names_the_paths_it_is_given() -> None:
    unit = render_unit(node="n9", config_path="/etc/strata/n9/edge.toml", state_dir="/var/lib/strata/n9",
                       executable="/opt/strata/bin/strata")
    assert "ExecStartPre=/opt/strata/bin/strata edge config check --config /etc/strata/n9/edge.toml" in unit
    assert "StateDirectory=strata/n9" in unit
