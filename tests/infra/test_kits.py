"""`strata infra apply --kits`: a provisioning kit per IoT node, from the moto server's certificates and endpoint."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from device._config_file import load_layered
from edge._provision import EDGE_LAYOUT
from tests._cli import run_strata
from tests._services import MotoServer
from tests.edge._policies import make_keys
from tests.infra.test_cli import flags


def test_apply_writes_one_private_kit_per_node(aws_env: MotoServer, tmp_path: Path, cache_dir: Path,
                                               source_snapshot: Path) -> None:
    _, pub = make_keys(tmp_path / "keys")
    base = flags(tmp_path / "state", cache_dir, source_snapshot, "--edge-nodes", "n1", "n2")
    refused = run_strata("infra", "apply", *base, "--kits", str(tmp_path / "kits"))
    assert refused.returncode == 2 and "--kits needs --trust PUBKEY" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    r = run_strata("infra", "apply", *base, "--kits", str(tmp_path / "kits"), "--trust", str(pub))
    assert r.returncode == 0, r.stderr
    for node in ("n1", "n2"):
        # moto answers DescribeEndpoint with a new address each time: the one apply recorded is the node's
        creds = json.loads((tmp_path / "state" / "smoke" / "iot" / node / "credentials.json").read_text())
        endpoint = creds["endpoint"]
        assert endpoint.endswith("-ats.iot.us-east-1.amazonaws.com")
        kit = tmp_path / "kits" / node
        assert sorted(p.name for p in kit.iterdir()) == sorted(
            ["AmazonRootCA1.pem", "certificate.pem.crt", "edge.toml", "private.pem.key", pub.name])
        assert stat.S_IMODE(kit.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in kit.iterdir())
        config = load_layered(EDGE_LAYOUT, file=kit / "edge.toml", environ={}, flags={}).config
        assert config.broker == f"mqtts://{endpoint}:8883" and config.node_id == node
        assert config.cert_file == str(kit / "certificate.pem.crt") and config.ca_file == str(kit / "AmazonRootCA1.pem")
        ca = x509.load_pem_x509_certificate((kit / "AmazonRootCA1.pem").read_bytes())
        assert ca.subject.rfc4514_string() == "CN=Amazon Root CA 1,O=Amazon,C=US"
        cert = x509.load_pem_x509_certificate((kit / "certificate.pem.crt").read_bytes())
        key = serialization.load_pem_private_key((kit / "private.pem.key").read_bytes(), password=None)
        assert cert.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
        assert (kit / "private.pem.key").read_text().strip() not in r.stdout + r.stderr  # never logged
    assert (tmp_path / "kits" / "n1" / "private.pem.key").read_bytes() != \
        (tmp_path / "kits" / "n2" / "private.pem.key").read_bytes()


def test_kits_and_credentials_hold_paths_relative_to_themselves_and_work_once_moved(
        aws_env: MotoServer, tmp_path: Path, cache_dir: Path, source_snapshot: Path) -> None:
    import shutil

    from edge._provision import plan_install

    _, pub = make_keys(tmp_path / "keys")
    work = tmp_path / "work"
    work.mkdir()
    # apply runs in a folder of its own with a relative --state-dir and --kits, as the docs show
    r = run_strata("infra", "apply", *flags(Path("state"), cache_dir, source_snapshot, "--edge-nodes", "n1"),
                   "--kits", "kits", "--trust", str(pub), cwd=work)
    assert r.returncode == 0, r.stderr
    creds_folder = work / "state" / "smoke" / "iot" / "n1"
    creds = json.loads((creds_folder / "credentials.json").read_text())
    assert (creds["certificate_file"], creds["private_key_file"]) == ("certificate.pem.crt", "private.pem.key")
    # Both folders travel to the node; nothing they hold names where they were made.
    node = tmp_path / "node"
    shutil.move(str(work / "kits" / "n1"), node / "kit")
    shutil.copytree(creds_folder, node / "creds")
    shutil.rmtree(work)
    moved = json.loads((node / "creds" / "credentials.json").read_text())
    for key in ("certificate_file", "private_key_file"):
        assert (node / "creds" / moved[key]).read_text() == moved[key.replace("_file", "_pem")]
    assert str(tmp_path) not in (node / "kit" / "edge.toml").read_text()
    config = load_layered(EDGE_LAYOUT, file=node / "kit" / "edge.toml", environ={}, flags={}).config
    for path in (config.cert_file, config.key_file, config.ca_file, *config.trust):
        assert Path(path).is_file() and Path(path).parent == node / "kit", path
    planned = plan_install(node / "kit", prefix=tmp_path / "root", executable="/usr/bin/strata", user="root")
    by_name = {f.path.name: f.data for f in planned.files}
    assert by_name["private.pem.key"] == (node / "kit" / "private.pem.key").read_bytes()
