"""`strata broker config` files on a real Mosquitto: nodes cannot publish policies or write other nodes' topics."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from edge import FleetTopics, LinkState, MqttLink, Publisher, mosquitto_hash, write_broker_config
from edge._mqtt import LinkConfig
from tests.conftest import MosquittoFactory
from tests.edge._agents import agent_config, running_agents, wait_until
from tests.edge._policies import cartpole_bundle, make_keys


def test_python_hash_has_mosquittos_format() -> None:
    h = mosquitto_hash("secret", salt=b"0123456789ab")
    assert h.startswith("$7$101$MDEyMzQ1Njc4OWFi$") and len(h.split("$")[4]) == 88


@pytest.mark.parametrize("use_binary", [True, False], ids=["mosquitto_passwd", "python-pbkdf2"])
def test_acl_confines_each_node_to_its_own_topics(tmp_path: Path, mosquitto_factory: MosquittoFactory,
                                                  use_binary: bool) -> None:
    fleet = "secure"
    files = write_broker_config(tmp_path / "bc", fleet=fleet, nodes=["a", "b"], cloud_user="cloud",
                                use_binary=use_binary)
    assert files.hashed_with == ("mosquitto_passwd" if use_binary else "python")
    broker = mosquitto_factory([f"password_file {files.passwd}", f"acl_file {files.acl}"], anonymous=False)
    pw = {u: p.read_text().strip() for u, p in files.credentials.items()}
    t = FleetTopics(fleet)
    key, pub = make_keys(tmp_path / "keys")

    seen: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def record(topic: str, payload: bytes, retained: bool) -> None:
        with lock:
            seen.append((topic, payload))

    observer = MqttLink(LinkConfig(broker=broker.url, client_id="observer", username="cloud", password=pw["cloud"]),
                        on_message=record)
    observer.subscribe(f"{t.root}/#")
    with observer.start(), Publisher(broker=broker.url, fleet=fleet, username="cloud",
                                     password=pw["cloud"]) as publisher:
        assert observer.wait_connected(60)
        publisher.publish(cartpole_bundle(key, 1))
        wait_until(lambda: any(topic == t.announce for topic, _ in seen), what="cloud publish allowed")
        with MqttLink(LinkConfig(broker=broker.url, client_id="a", username="a", password=pw["a"])) as node_a:
            assert node_a.wait_connected(60)
            forbidden = [t.policy_latest("cartpole"), t.announce, t.policy_chunk("cartpole", 0), t.control,
                         t.node("b", "status"), t.node("b", "telemetry"), t.node("b", "experience")]
            for topic in forbidden:
                node_a.publish(topic, b"evil", retain=True)
            node_a.publish(t.node("a", "telemetry"), b"mine")  # allowed; arrives after everything sent before
            wait_until(lambda: (t.node("a", "telemetry"), b"mine") in seen, what="own topic allowed")
        with lock:
            evil = [topic for topic, payload in seen if payload == b"evil"]
        assert evil == []
        # a wrong password and anonymous clients are refused
        for username, password in (("a", "wrong"), (None, None)):
            with MqttLink(LinkConfig(broker=broker.url, client_id=f"x{username}", username=username,
                                     password=password)) as intruder:
                wait_until(lambda intruder=intruder: intruder.state in (  # type: ignore[misc]
                    LinkState.REFUSED, LinkState.DISCONNECTED), what="refusal")
                assert not intruder.connected
    # and a real agent with node credentials still gets its policy (read access to policies) and reports
    config = agent_config(tmp_path, "b", pub, broker.url, fleet=fleet, username="b",
                          password_file=str(files.credentials["b"]))
    with running_agents([config]) as (agent,):
        wait_until(lambda: agent.version == 1, what="node b on v1")
        wait_until(lambda: agent.outbox.stats().pending == 0 and agent.counters.telemetry_records > 0,
                   what="telemetry accepted")


def test_the_generated_mosquitto_conf_runs_as_written(tmp_path: Path) -> None:
    import subprocess

    from tests._services import free_port, mosquitto_binary, wait_for_port

    port = free_port()
    files = write_broker_config(tmp_path / "bc", fleet="f", nodes=["a"], port=port)
    text = files.conf.read_text()
    assert f"listener {port} 127.0.0.1" in text  # loopback unless --bind says otherwise
    proc = subprocess.Popen([mosquitto_binary(), "-c", str(files.conf)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port)
        password = files.credentials["a"].read_text().strip()
        link = MqttLink(LinkConfig(broker=f"mqtt://127.0.0.1:{port}", client_id="a", username="a",
                                   password=password)).start()
        try:
            assert link.wait_connected(60), link.last_error
        finally:
            link.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert b"Unable to open pwfile" not in err


@pytest.mark.parametrize("bound", [True, False], ids=["generated-config", "without-binding"])
def test_a_node_cannot_take_over_another_nodes_client_id(tmp_path: Path, mosquitto_factory: MosquittoFactory,
                                                         bound: bool) -> None:
    """n1's credentials with client id n2 (``mosquitto_sub -u n1 -i n2``) must not disconnect n2 or fire its will.

    The unbound variant runs the same attack on a broker without ``use_username_as_clientid``: there it does
    take n2 over, which shows the test can fail.
    """
    files = write_broker_config(tmp_path / "bc", fleet="f", nodes=["n1", "n2"], cloud_user=("cloud", "monitor"))
    conf = files.conf.read_text()
    assert "use_username_as_clientid true" in conf
    assert files.acl.stat().st_mode & 0o777 == 0o600
    extra = [f"password_file {files.passwd}", f"acl_file {files.acl}"]
    broker = mosquitto_factory([*extra, "use_username_as_clientid true"] if bound else extra, anonymous=False)
    pw = {u: p.read_text().strip() for u, p in files.credentials.items()}
    t = FleetTopics("f")
    seen: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def record(topic: str, payload: bytes, retained: bool) -> None:
        with lock:
            seen.append((topic, payload))

    observer = MqttLink(LinkConfig(broker=broker.url, client_id="whatever", username="monitor",
                                   password=pw["monitor"]), on_message=record)
    observer.subscribe(t.node("n2", "status"))
    observer.subscribe(t.node("n1", "telemetry"))
    n2 = MqttLink(LinkConfig(broker=broker.url, client_id="n2", username="n2", password=pw["n2"]),
                  will=(t.node("n2", "status"), b"n2 offline (will)"))
    with observer.start(), n2.start():
        assert observer.wait_connected(10) and n2.wait_connected(10)
        with MqttLink(LinkConfig(broker=broker.url, client_id="n2", username="n1", password=pw["n1"],
                                 clean_session=True)) as intruder:  # as mosquitto_sub connects
            assert intruder.wait_connected(10), intruder.last_error
            intruder.publish(t.node("n1", "telemetry"), b"probe")
            # The broker handled the intruder's CONNECT (and any takeover, will included) before this PUBLISH.
            wait_until(lambda: (t.node("n1", "telemetry"), b"probe") in seen, what="the intruder's probe")
            if not bound:
                wait_until(lambda: (t.node("n2", "status"), b"n2 offline (will)") in seen, what="the takeover")
                return
            with lock:
                assert (t.node("n2", "status"), b"n2 offline (will)") not in seen
            assert n2.connected and n2.connects == 1
        # and n2's own connection still works (its session was not taken)
        n2.publish(t.node("n2", "status"), b"n2 still here", retain=True)
        wait_until(lambda: (t.node("n2", "status"), b"n2 still here") in seen, what="n2 still publishing")
        assert n2.connects == 1


def test_a_refused_publish_is_reported_with_its_mqtt5_reason_code(tmp_path: Path,
                                                                  mosquitto_factory: MosquittoFactory) -> None:
    import pytest as _pytest

    from edge import PublishError
    from tests._cli import run_strata

    files = write_broker_config(tmp_path / "bc", fleet="f", nodes=["n1"])
    broker = mosquitto_factory([f"password_file {files.passwd}", f"acl_file {files.acl}",
                                "use_username_as_clientid true"], anonymous=False)
    key, _ = make_keys(tmp_path / "keys")
    bundle = cartpole_bundle(key, 1)
    pw = {u: p.read_text().strip() for u, p in files.credentials.items()}
    with Publisher(broker=broker.url, fleet="f", username="n1", password=pw["n1"]) as publisher, \
            _pytest.raises(PublishError, match=r"refused .* on strata/f/policies/cartpole/latest: Not authorized "
                                               r"\(reason code 135\)"):
        publisher.publish(bundle)
    assert publisher.link.protocol == "5"
    with Publisher(broker=broker.url, fleet="f", username="cloud", password=pw["cloud"]) as publisher:
        publisher.publish(bundle)  # the cloud identity may
    path = tmp_path / "b.bundle"
    path.write_bytes(bundle.to_bytes())
    refused = run_strata("publish", str(path), "--broker", broker.url, "--fleet", "f", "--username", "n1",
                         "--password-file", str(files.credentials["n1"]))
    assert refused.returncode == 2 and "Not authorized (reason code 135)" in refused.stderr, refused.stderr
    assert "published" not in refused.stdout and "Traceback" not in refused.stderr
