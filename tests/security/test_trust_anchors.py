"""Case 1 of issue 34: every trust anchor is an Ed25519 public key; a private key is refused loudly, never copied.

Before: ``strata infra apply --trusted-public-key keys/signer.key`` deployed the private key into every function's
environment (and ``infra template`` embedded it twice); a missing file, a folder or plain text went out as the
literal string; kits copied whatever ``--trust`` named; a kit or an install kept one of two keys that share a
file name (key rotation broke).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import boto3
import pytest

from device import TrustStore, load_public_key
from device._config_file import load_layered
from edge._provision import EDGE_LAYOUT
from infra._errors import DeployConfigError
from infra._kits import write_iot_kits
from infra._models import DeployConfig, desired_resources
from tests._cli import run_strata
from tests._services import MotoServer
from tests.edge._policies import cartpole_bundle
from tests.infra.conftest import prebuilt_cache
from tests.security._helpers import keypair, one_line_error

REPO = Path(__file__).resolve().parents[2]


def _template(tmp_path: Path, key_value: str) -> tuple[object, Path]:
    out = tmp_path / "stack.json"
    cache = tmp_path / "cache"
    prebuilt_cache(cache)
    result = run_strata("infra", "template", "--stage", "sec", "--cache-dir", str(cache), "--source-dir", str(REPO),
                        "--trusted-public-key", key_value, "--out", str(out), timeout=300)
    return result, out


def test_infra_template_refuses_a_private_key_and_anything_but_a_public_key(tmp_path: Path) -> None:
    _, private, public = keypair(tmp_path / "keys")
    secret = private.read_text()
    result, out = _template(tmp_path, str(private))
    one_line_error(result, "is a PRIVATE key", "pass the .pub file")
    assert not out.exists() and secret not in result.stdout + result.stderr
    (tmp_path / "plain.txt").write_text("trust me")
    for bad, why in ((str(tmp_path / "missing.pub"), "does not exist"), (str(tmp_path), "is a folder"),
                     (str(tmp_path / "plain.txt"), "is not a PEM public key"),
                     ("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----", "not a valid PEM public key"),
                     (secret, "is a PRIVATE key")):
        result, out = _template(tmp_path, bad)
        one_line_error(result, why)
        assert not out.exists()
    # the public key is what gets deployed, and nothing private is in the template
    result, out = _template(tmp_path, str(public))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "PRIVATE" not in text and json.dumps(public.read_text())[1:-1] in text


def test_a_deploy_config_holding_a_private_key_never_becomes_a_function_environment(tmp_path: Path) -> None:
    _, private, _ = keypair(tmp_path / "keys")
    config = DeployConfig(stage="sec", trusted_public_key=private.read_text())
    with pytest.raises(DeployConfigError, match="is a PRIVATE key"):
        desired_resources(config, account="123456789012", region="us-east-1", artifacts=None)


def test_infra_apply_deploys_no_private_key(aws_env: MotoServer, tmp_path: Path) -> None:
    _, private, _ = keypair(tmp_path / "keys")
    cache = tmp_path / "cache"
    prebuilt_cache(cache)
    result = run_strata("infra", "apply", "--stage", "sec", "--state-dir", str(tmp_path / "state"), "--cache-dir",
                        str(cache), "--source-dir", str(REPO), "--trusted-public-key", str(private), timeout=300)
    one_line_error(result, "is a PRIVATE key")
    assert boto3.client("lambda").list_functions()["Functions"] == []


def _bundle_file(tmp_path: Path) -> Path:
    key, _, _ = keypair(tmp_path / "bundle-keys", name="fleet")
    path = tmp_path / "p.bundle"
    path.write_bytes(cartpole_bundle(key, 1).to_bytes())
    return path


@pytest.mark.parametrize("command", ["edge run", "edge config check", "bundle verify", "device export-c",
                                     "device run", "broker config --kits", "publish"])
def test_every_trust_flag_refuses_a_private_key_loudly(tmp_path: Path, command: str) -> None:
    _, private, _ = keypair(tmp_path / "keys")
    bundle = _bundle_file(tmp_path)
    node = ["--fleet", "f", "--node-id", "n1", "--cache-dir", str(tmp_path / "cache"), "--trust", str(private)]
    argv = {
        "edge run": ["edge", "run", *node, "--steps", "1"],
        "edge config check": ["edge", "config", "check", *node],
        "bundle verify": ["bundle", "verify", str(bundle), "--trust", str(private)],
        "device export-c": ["device", "export-c", "--bundle", str(bundle), "--out", str(tmp_path / "c"), "--trust",
                            str(private)],
        "device run": ["device", "run", "--env", "CartPole-v1", "--broker", "mqtt://127.0.0.1:1", "--trust",
                       str(private)],
        "broker config --kits": ["broker", "config", "--out", str(tmp_path / "broker"), "--fleet", "f", "--nodes",
                                 "n1", "--kits", str(tmp_path / "kits"), "--trust", str(private)],
        "publish": ["publish", str(bundle), "--broker", "mqtt://127.0.0.1:1", "--fleet", "f", "--trust",
                    str(private)],
    }[command]
    result = run_strata(*argv, timeout=120)
    one_line_error(result, "is a PRIVATE key", "pass the .pub file")
    assert private.read_text() not in result.stdout + result.stderr
    for written in ("broker", "kits", "c"):
        assert not (tmp_path / written).exists(), written


def _rotation_keys(tmp_path: Path) -> tuple[Path, Path]:
    """An old and a new key, both named signer.pub, in two folders (as a rotation hands them out)."""
    return keypair(tmp_path / "old")[2], keypair(tmp_path / "new")[2]


def test_broker_kits_keep_both_keys_of_a_rotation(tmp_path: Path) -> None:
    old, new = _rotation_keys(tmp_path)
    result = run_strata("broker", "config", "--out", str(tmp_path / "broker"), "--fleet", "f", "--nodes", "n1",
                        "--kits", str(tmp_path / "kits"), "--trust", str(old), "--trust", str(new))
    assert result.returncode == 0, result.stderr
    config = load_layered(EDGE_LAYOUT, file=tmp_path / "kits" / "n1" / "edge.toml", environ={}, flags={}).config
    assert len(config.trust) == 2
    trusted = TrustStore.from_paths(config.trust)
    assert set(trusted.key_ids) == {load_public_key(old).key_id, load_public_key(new).key_id}


def test_an_install_keeps_both_keys_of_a_rotation(tmp_path: Path) -> None:
    old, new = _rotation_keys(tmp_path)
    kit = tmp_path / "kit"
    for name, key in (("old", old), ("new", new)):
        (kit / "keys" / name).mkdir(parents=True)
        (kit / "keys" / name / "signer.pub").write_bytes(key.read_bytes())
    (kit / "edge.toml").write_text('[identity]\nfleet = "f"\nnode_id = "n1"\n'
                                   'trust = ["keys/old/signer.pub", "keys/new/signer.pub"]\n'
                                   '[cache]\ncache_dir = "cache"\n')
    root = tmp_path / "root"
    root.mkdir()  # --prefix is an existing folder to install under
    result = run_strata("edge", "install", "--kit", str(kit), "--prefix", str(root), "--no-start")
    assert result.returncode == 0, result.stderr
    # The installed file names paths of the target root (not under --prefix): read as plain TOML, not checked.
    text = (root / "etc" / "strata" / "n1" / "edge.toml").read_text()
    installed = {k: v for table in tomllib.loads(text).values() for k, v in table.items()}
    assert len(set(installed["trust"])) == 2, installed["trust"]
    on_disk = [root / p.lstrip("/") for p in installed["trust"]]
    assert {load_public_key(p).key_id for p in on_disk} == {load_public_key(old).key_id, load_public_key(new).key_id}


def _iot_credentials(state: Path) -> None:
    path = state / "sec" / "iot" / "n1" / "credentials.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"fleet": "sec.default", "endpoint": "x-ats.iot.us-east-1.amazonaws.com", "port": 8883,
                                "certificate_pem": "CERT", "private_key_pem": "THING KEY"}))


def test_iot_kits_refuse_a_private_key_and_keep_both_keys_of_a_rotation(tmp_path: Path) -> None:
    _iot_credentials(tmp_path / "state")
    _, private, _ = keypair(tmp_path / "signing")
    with pytest.raises(DeployConfigError, match="is a PRIVATE key"):
        write_iot_kits(tmp_path / "bad", state_dir=tmp_path / "state", stage="sec", nodes=("n1",), trust=[private])
    assert not (tmp_path / "bad").exists()
    old, new = _rotation_keys(tmp_path)
    (kit,) = write_iot_kits(tmp_path / "kits", state_dir=tmp_path / "state", stage="sec", nodes=("n1",),
                            trust=[old, new])
    config = load_layered(EDGE_LAYOUT, file=kit / "edge.toml", environ={}, flags={}).config
    assert {load_public_key(p).key_id for p in config.trust} == {load_public_key(old).key_id,
                                                                load_public_key(new).key_id}
