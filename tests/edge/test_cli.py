"""Subprocess smoke tests of the edge commands: publish, edge run, fleet, broker config."""

from __future__ import annotations

import json
from pathlib import Path

from tests._cli import run_strata
from tests._services import Mosquitto
from tests.edge._policies import cartpole_bundle, make_keys


def test_publish_run_and_fleet(tmp_path: Path, mosquitto: Mosquitto) -> None:
    key, pub = make_keys(tmp_path / "keys")
    bundle = tmp_path / "cartpole-v1.bundle"
    bundle.write_bytes(cartpole_bundle(key, 1).to_bytes())
    published = run_strata("publish", str(bundle), "--broker", mosquitto.url, "--fleet", "cli")
    assert published.returncode == 0, published.stderr
    assert "published cartpole v1" in published.stdout
    ran = run_strata("edge", "run", "--broker", mosquitto.url, "--fleet", "cli", "--node-id", "n1", "--cache-dir",
                     str(tmp_path / "cache"), "--env", "CartPole-v1", "--trust", str(pub), "--steps", "1200",
                     "--telemetry-interval-s", "0.1", "--json")
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout.strip().splitlines()[-1])
    assert summary["version"] == 1 and summary["steps"] == 1200
    fleet = run_strata("fleet", "--broker", mosquitto.url, "--fleet", "cli", "--wait", "0.5")
    assert fleet.returncode == 0, fleet.stderr
    lines = fleet.stdout.splitlines()
    assert lines[0].split()[:4] == ["node", "online", "policy", "version"]
    assert lines[1].split()[:5] == ["n1", "no", "cartpole", "1", "1"]  # it exited cleanly: offline, on v1
    as_json = run_strata("fleet", "--broker", mosquitto.url, "--fleet", "cli", "--wait", "0.3", "--json")
    view = json.loads(as_json.stdout)[0]
    assert view["steps"] == 1200 and view["mean_return"] > 100  # the angle controller balances the pole


def test_edge_run_offline_on_the_cache(tmp_path: Path, mosquitto: Mosquitto) -> None:
    key, pub = make_keys(tmp_path / "keys")
    bundle = tmp_path / "b.bundle"
    bundle.write_bytes(cartpole_bundle(key, 1).to_bytes())
    assert run_strata("publish", str(bundle), "--broker", mosquitto.url, "--fleet", "off").returncode == 0
    args = ["edge", "run", "--fleet", "off", "--node-id", "n1", "--cache-dir", str(tmp_path / "cache"),
            "--trust", str(pub), "--json"]
    first = run_strata(*args, "--broker", mosquitto.url, "--steps", "50")
    assert first.returncode == 0, first.stderr
    nobody = Mosquitto(tmp_path / "nobody")  # never started: its port has no listener
    offline = run_strata(*args, "--broker", nobody.url, "--duration", "1")
    assert offline.returncode == 0, offline.stderr
    assert "acting on cached cartpole v1" in offline.stderr
    assert json.loads(offline.stdout.strip().splitlines()[-1])["steps"] > 0


def test_broker_config_writes_files(tmp_path: Path) -> None:
    result = run_strata("broker", "config", "--out", str(tmp_path / "bc"), "--fleet", "f", "--nodes", "a,b",
                        "--cloud-user", "cloud")
    assert result.returncode == 0, result.stderr
    for name in ("passwd", "acl", "mosquitto.conf", "credentials/a.password", "credentials/cloud.password"):
        assert (tmp_path / "bc" / name).exists(), name
    assert (tmp_path / "bc" / "credentials" / "a.password").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "bc" / "acl").stat().st_mode & 0o777 == 0o600
    assert "topic write strata/f/nodes/a/telemetry" in (tmp_path / "bc" / "acl").read_text()


def test_errors_are_one_clean_line(tmp_path: Path) -> None:
    missing = run_strata("publish", str(tmp_path / "nope.bundle"), "--broker", "mqtt://127.0.0.1:1", "--fleet", "f")
    assert missing.returncode == 2
    assert f"strata publish: error: FILE {str(tmp_path / 'nope.bundle')!r}: does not exist" in missing.stderr
    bad = run_strata("edge", "run", "--fleet", "a/b", "--node-id", "n", "--cache-dir", str(tmp_path), "--trust", "x")
    assert bad.returncode == 2
    assert "--fleet 'a/b': must be 1-64 letters, digits, '_', '-' or '.'" in bad.stderr
    assert "Traceback" not in bad.stderr + missing.stderr
    nopw = run_strata("fleet", "--broker", "mqtt://127.0.0.1:1", "--fleet", "f", "--password-file",
                      str(tmp_path / "missing.password"))
    assert nopw.returncode == 2 and "--password-file" in nopw.stderr and "does not exist" in nopw.stderr
    url = run_strata("fleet", "--broker", "http://x", "--fleet", "f")
    assert url.returncode == 2 and "--broker 'http://x': must be a URL mqtt://HOST[:PORT]" in url.stderr
