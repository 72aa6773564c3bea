"""Case 2 of issue 34: identifiers follow one rule, every path built from one stays inside its root, and config
writers write only validated values.

Before: ``strata edge uninstall --node .. --prefix P --purge`` deleted ``P/etc`` and ``P/var/lib`` entirely and
``--node .`` every node's config; a kit could make an install copy any file of the machine into the node's
config; ``strata broker config --bind 'junk host;rm'`` wrote that text into mosquitto.conf; a node id with a
trailing newline passed the topic rule (a ``$`` regex).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from device import ConfigError, identifier
from edge import EdgeAgentConfig, EdgeConfigError, FleetTopics
from infra._iot import credentials_path
from infra._state import StateStore
from tests._cli import run_strata
from tests.security._helpers import keypair, one_line_error


def _installed_tree(root: Path, outside: Path) -> list[Path]:
    """Two installed nodes under `root`, plus files beside them that no uninstall may touch."""
    files = [root / "etc" / "strata" / "n1" / "edge.toml", root / "etc" / "strata" / "n2" / "edge.toml",
             root / "etc" / "hostname", root / "var" / "lib" / "strata" / "n1" / "cache" / "pointer.json",
             root / "var" / "lib" / "other" / "data", root / "etc" / "systemd" / "system" / "strata-edge-n1.service",
             outside / "precious"]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    return files


@pytest.mark.parametrize("node", ["..", ".", "../..", "n1/../..", "/", "", "n1\n"])
def test_uninstall_purge_never_deletes_outside_the_nodes_own_paths(tmp_path: Path, node: str) -> None:
    root = tmp_path / "root"
    files = _installed_tree(root, tmp_path / "outside")
    result = run_strata("edge", "uninstall", "--node", node, "--prefix", str(root), "--purge")
    one_line_error(result, "--node ", "': must be 1-64 letters")
    assert all(f.exists() for f in files), [str(f) for f in files if not f.exists()]


def test_uninstall_refuses_a_link_planted_out_of_its_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    files = _installed_tree(root, outside)
    (root / "etc" / "strata" / "n3").symlink_to(outside, target_is_directory=True)
    (root / "var" / "lib" / "strata" / "n3").symlink_to(outside, target_is_directory=True)
    result = run_strata("edge", "uninstall", "--node", "n3", "--prefix", str(root), "--purge")
    one_line_error(result, "leads outside")
    assert all(f.exists() for f in files)
    # and the plain case still works
    assert run_strata("edge", "uninstall", "--node", "n1", "--prefix", str(root), "--purge").returncode == 0
    assert not (root / "etc" / "strata" / "n1").exists() and (root / "etc" / "strata" / "n2").exists()


def test_an_install_copies_no_file_from_outside_its_kit(tmp_path: Path) -> None:
    _, _, public = keypair(tmp_path / "keys")
    secret = tmp_path / "elsewhere" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:$6$hash")
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "signer.pub").write_bytes(public.read_bytes())
    (kit / "edge.toml").write_text(f'[identity]\nfleet = "f"\nnode_id = "n1"\ntrust = ["signer.pub"]\n'
                                   f'[broker]\nbroker = "mqtts://127.0.0.1:8883"\nca_file = "{secret}"\n'
                                   '[cache]\ncache_dir = "cache"\n')
    root = tmp_path / "root"
    root.mkdir()  # --prefix is an existing folder to install under
    result = run_strata("edge", "install", "--kit", str(kit), "--prefix", str(root), "--no-start")
    one_line_error(result, "outside the kit")
    assert not any(root.iterdir())
    (kit / "ca.pem").symlink_to(secret)  # a link inside the kit that leads out is refused too
    (kit / "edge.toml").write_text((kit / "edge.toml").read_text().replace(str(secret), "ca.pem"))
    one_line_error(run_strata("edge", "install", "--kit", str(kit), "--prefix", str(root), "--no-start"),
                   "outside the kit")
    assert not any(root.iterdir())


def test_broker_config_writes_no_unvalidated_bind_address(tmp_path: Path) -> None:
    for i, bind in enumerate(["junk host;rm", "127.0.0.1\nlistener 1 0.0.0.0", "", "fe80::1%eth0 x", "a b"]):
        result = run_strata("broker", "config", "--out", str(tmp_path / f"bad{i}"), "--fleet", "f", "--nodes", "n1",
                            "--bind", bind)
        one_line_error(result, "--bind")
        assert not (tmp_path / f"bad{i}").exists()
    for i, bind in enumerate(["127.0.0.1", "::1", "0.0.0.0", "broker.example.com"]):
        result = run_strata("broker", "config", "--out", str(tmp_path / f"b{i}"), "--fleet", "f", "--nodes", "n1",
                            "--bind", bind)
        assert result.returncode == 0, result.stderr
        assert re.search(rf"^listener 1883 {re.escape(bind)}$", (tmp_path / f"b{i}" / "mosquitto.conf").read_text(),
                         re.M)


def test_kits_get_no_unvalidated_broker_url(tmp_path: Path) -> None:
    _, _, public = keypair(tmp_path / "keys")
    for url in ("mqtt://junk host;rm:1883", "mqtt://h:1883/x\nbroker = 'evil'", "mqtt://cloud:pw@h:1883", "http://h"):
        result = run_strata("broker", "config", "--out", str(tmp_path / "broker"), "--fleet", "f", "--nodes", "n1",
                            "--kits", str(tmp_path / "kits"), "--trust", str(public), "--broker-url", url)
        one_line_error(result, "--broker-url")
        assert not (tmp_path / "broker").exists() and not (tmp_path / "kits").exists()


def test_one_identifier_rule_for_nodes_fleets_and_topics(tmp_path: Path) -> None:
    # "n1\n" passed the old per-module topic rules (a regex ending in "$" matches before a final newline).
    for name in ["n1\n", "..", ".", "a/b", "a+b", "x" * 65, " n1", "n1\n\n"]:
        with pytest.raises(ConfigError):
            identifier(name, what="node")
        with pytest.raises(EdgeConfigError):
            EdgeAgentConfig(fleet="f", node_id=name, cache_dir=str(tmp_path), trust=("k.pub",))
        with pytest.raises(EdgeConfigError):
            FleetTopics(name)


@pytest.mark.parametrize("name", ["..", ".", "a/b", "s\n", ""])
def test_infra_paths_built_from_a_stage_or_node_stay_in_the_state_folder(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError):
        StateStore(tmp_path / "state", name)
    with pytest.raises(ConfigError):
        credentials_path(tmp_path / "state", name, "n1")
    with pytest.raises(ConfigError):
        credentials_path(tmp_path / "state", "dev", name)
