"""Every `strata edge`/`fleet`/`publish`/`broker` mistake is one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edge import write_broker_config
from tests._cli import STRATA, run_strata
from tests._services import Mosquitto
from tests.conftest import MosquittoFactory
from tests.edge._policies import cartpole_bundle, make_keys


def _one_clean_line(result: object, *expected: str, progress: int = 0) -> None:
    """Exit 2 and one error line (after `progress` lines the command printed before it failed)."""
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 2, (result.returncode, stderr)  # type: ignore[attr-defined]
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 + progress, stderr
    assert lines[-1].startswith("strata "), lines[-1]
    for text in expected:
        assert text in lines[-1], lines[-1]


@pytest.fixture
def pub(tmp_path: Path) -> Path:
    return make_keys(tmp_path / "keys")[1]


def test_edge_run_refuses_bad_cache_folders_envs_and_a_missing_broker(tmp_path: Path, pub: Path) -> None:
    base = ["edge", "run", "--fleet", "f", "--node-id", "n1", "--trust", str(pub), "--steps", "5"]
    regular = tmp_path / "a-file"
    regular.write_text("x")
    for cache_dir, why in ((regular / "cache", "to be a folder, but it is a file"),
                           (regular, "exists and is not a folder")):
        _one_clean_line(run_strata(*base, "--cache-dir", str(cache_dir)), f"--cache-dir {str(cache_dir)!r}", why)
    _one_clean_line(run_strata(*base, "--cache-dir", "/proc/strata-cache", "--broker", "mqtt://127.0.0.1:1"),
                    "--cache-dir '/proc/strata-cache'", "pass a writable folder")
    _one_clean_line(run_strata(*base, "--cache-dir", str(tmp_path / "c1"), "--env", "NoSuchEnv-v9"),
                    "--env 'NoSuchEnv-v9'", "CartPole-v1")
    _one_clean_line(run_strata(*base, "--cache-dir", str(tmp_path / "c2")), "no --broker", "--broker mqtt://")
    _one_clean_line(run_strata(*base, "--cache-dir", str(tmp_path / "c3"), "--broker", "mqtt://127.0.0.1:1",
                               "--ca-file", str(tmp_path / "missing.pem")), "--ca-file", "does not exist")
    bad_pem = tmp_path / "bad.pem"
    bad_pem.write_text("not a certificate\n")
    _one_clean_line(run_strata(*base, "--cache-dir", str(tmp_path / "c3"), "--broker", "mqtt://127.0.0.1:1",
                               "--ca-file", str(bad_pem)), "the TLS files", "cannot be used")
    _one_clean_line(run_strata(*base, "--cache-dir", str(tmp_path / "c4"), "--trust", str(tmp_path / "nokey.pub")))
    _one_clean_line(run_strata(*base, "--cache-dir", str(tmp_path / "c5"), "--broker", "mqtt://127.0.0.1:1",
                               "--password-file", str(tmp_path / "nopw")), "--password-file", "does not exist")
    assert not any((tmp_path / f"c{i}").exists() for i in range(1, 6))  # nothing made on a refusal


def test_publish_fleet_and_broker_config_refuse_bad_arguments(tmp_path: Path) -> None:
    not_a_bundle = tmp_path / "x.bundle"
    not_a_bundle.write_bytes(b"not a bundle")
    link = ["--broker", "mqtt://127.0.0.1:1", "--fleet", "f"]
    _one_clean_line(run_strata("publish", str(not_a_bundle), *link), "strata publish: error:")
    _one_clean_line(run_strata("publish", str(tmp_path), *link), "is a folder")
    _one_clean_line(run_strata("publish", str(not_a_bundle), *link, "--timeout", "-1"),
                    "--timeout '-1': must be a finite number of seconds above 0 and at most 3600")
    _one_clean_line(run_strata("publish", str(not_a_bundle), "--broker", "http://x", "--fleet", "f"),
                    "strata publish: error:")
    _one_clean_line(run_strata("fleet", *link, "--wait", "-1"), "--wait '-1': must be a finite number of seconds")
    _one_clean_line(run_strata("fleet", *link, "--nodes", "a/b"), "--nodes 'a/b': item 'a/b' must be 1-64 letters")
    _one_clean_line(run_strata("fleet", "--broker", "mqtt://127.0.0.1:1", "--fleet", "a+b"), "--fleet 'a+b'")
    _one_clean_line(run_strata("fleet", *link, "--ca-file", str(tmp_path / "missing.pem")),
                    "--ca-file", "does not exist")
    regular = tmp_path / "a-file"
    regular.write_text("x")
    _one_clean_line(run_strata("broker", "config", "--out", str(regular / "bc"), "--fleet", "f", "--nodes", "a"),
                    "--out", "to be a folder, but it is a file")
    _one_clean_line(run_strata("broker", "config", "--out", str(tmp_path / "bc"), "--fleet", "f", "--nodes", ""),
                    "--nodes '': must be a list of 1 to 10000 items")
    _one_clean_line(run_strata("broker", "config", "--out", str(tmp_path / "bc"), "--fleet", "f", "--nodes", "a",
                               "--port", "70000"), "--port '70000': must be a TCP port from 1 to 65535")
    _one_clean_line(run_strata("broker", "config", "--out", str(tmp_path / "bc"), "--fleet", "f", "--nodes",
                               "a,cloud"), "'cloud' named twice across --cloud-user, --nodes, --devices and --learner")
    assert not (tmp_path / "bc").exists()


def test_publish_exits_nonzero_when_the_broker_is_unreachable(tmp_path: Path) -> None:
    key, _ = make_keys(tmp_path / "keys")
    bundle = tmp_path / "b.bundle"
    bundle.write_bytes(cartpole_bundle(key, 1).to_bytes())
    nobody = Mosquitto(tmp_path / "nobody")  # never started
    _one_clean_line(run_strata("publish", str(bundle), "--broker", nobody.url, "--fleet", "f", "--timeout", "1"),
                    "not connected")


def test_edge_run_with_refused_credentials_exits_nonzero_after_its_retry_budget(
        tmp_path: Path, mosquitto_factory: MosquittoFactory, pub: Path) -> None:
    files = write_broker_config(tmp_path / "bc", fleet="f", nodes=["n1"])
    broker = mosquitto_factory([f"password_file {files.passwd}", f"acl_file {files.acl}"], anonymous=False)
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    result = run_strata("edge", "run", "--fleet", "f", "--node-id", "n1", "--trust", str(pub), "--cache-dir",
                        str(tmp_path / "c"), "--broker", broker.url, "--username", "n1", "--password-file",
                        str(wrong), "--log-level", "CRITICAL", "--json")
    _one_clean_line(result, "refused the connection 5 times", "--password-file", progress=1)  # "waiting for..."
    # and the right password works with the same command line
    ok = run_strata("edge", "run", "--fleet", "f", "--node-id", "n1", "--trust", str(pub), "--cache-dir",
                    str(tmp_path / "c"), "--broker", broker.url, "--username", "n1", "--password-file",
                    str(files.credentials["n1"]), "--duration", "0.5", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])["version"] is None


def test_deep_json_on_network_topics_never_reaches_a_user_as_a_traceback(
        tmp_path: Path, mosquitto: Mosquitto, pub: Path, caplog: pytest.LogCaptureFixture) -> None:
    from edge import FleetTopics, MqttLink, NodeStatus
    from edge._mqtt import LinkConfig
    from tests.edge._agents import agent_config, running_agents, wait_until

    fleet = "deep"
    t = FleetTopics(fleet)
    deep = b'{"kind":"status","node":' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    with MqttLink(LinkConfig(broker=mosquitto.url, client_id="evil")) as evil:
        assert evil.wait_connected(60)
        good = NodeStatus(node="n2", online=True, updated_at=1.0).encode()
        evil.publish(t.node("n2", "status"), good, retain=True)
        result = evil.publish(t.node("n1", "status"), deep[:60_000] + b"}", retain=True)
        with running_agents([agent_config(tmp_path, "n3", pub, mosquitto.url, fleet=fleet)]) as (agent,):
            wait_until(lambda: agent.link is not None and agent.link.connected, what="agent connected", timeout=60)
            for topic in (t.announce, t.control, t.node("n3", "control")):
                evil.publish(topic, deep[:60_000])
            wait_until(lambda: agent.counters.malformed >= 3, what="three malformed messages", timeout=60)
        assert result.accepted
    assert not [r for r in caplog.records if r.exc_info], "a decoder let a non-wire error through"
    fleet_view = run_strata("fleet", "--broker", mosquitto.url, "--fleet", fleet, "--wait", "0.5", "--json")
    assert fleet_view.returncode == 0 and "Traceback" not in fleet_view.stderr, fleet_view.stderr
    assert [v["node"] for v in json.loads(fleet_view.stdout)] == ["n2", "n3"]


def test_edge_run_on_a_read_only_filesystem_and_in_an_immutable_folder(tmp_path: Path, pub: Path) -> None:
    base = ["edge", "run", "--fleet", "f", "--node-id", "n1", "--trust", str(pub), "--steps", "5"]
    ro = tmp_path / "ro"
    ro.mkdir()
    # A private mount namespace: the read-only tmpfs vanishes with the process, nothing to clean up.
    mount = f"mount -t tmpfs -o ro,size=1m none {ro}"
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "sh", "-c", mount],
                                                         capture_output=True).returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs in a private mount namespace here (needs root)")
    for cache_dir in (ro, ro / "cache"):
        result = subprocess.run(["unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh", STRATA, *base,
                                 "--cache-dir", str(cache_dir)], capture_output=True, text=True, env=os.environ,
                                timeout=120)
        _one_clean_line(result, f"--cache-dir {str(cache_dir)!r}", "writable")
    immutable = tmp_path / "immutable"
    immutable.mkdir()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(immutable)],
                                                        capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute (chattr +i)")
    try:
        for cache_dir in (immutable, immutable / "cache"):
            _one_clean_line(run_strata(*base, "--cache-dir", str(cache_dir)), f"--cache-dir {str(cache_dir)!r}",
                            "writable")
    finally:
        subprocess.run(["chattr", "-i", str(immutable)], check=True)
