"""The test services are real: Mosquitto routes MQTT, moto answers boto3 over HTTP on loopback."""

from __future__ import annotations

import threading
from pathlib import Path

import boto3
import paho.mqtt.client as mqtt

from tests._services import Mosquitto, MotoServer
from tests.conftest import MosquittoFactory


def test_mosquitto_delivers_a_retained_message(mosquitto: Mosquitto) -> None:
    got = threading.Event()
    received: list[bytes] = []

    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="t-pub")
    pub.connect(mosquitto.host, mosquitto.port)
    pub.loop_start()
    pub.publish("strata-test/retained", b"hello", qos=1, retain=True).wait_for_publish(5)
    pub.loop_stop()
    pub.disconnect()

    def on_message(client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        received.append(msg.payload)
        got.set()

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="t-sub")
    sub.on_message = on_message
    sub.connect(mosquitto.host, mosquitto.port)
    sub.subscribe("strata-test/retained", qos=1)
    sub.loop_start()
    assert got.wait(60)
    sub.loop_stop()
    sub.disconnect()
    assert received == [b"hello"]


def test_a_test_can_start_its_own_broker_with_passwords(mosquitto_factory: MosquittoFactory,
                                                        tmp_path: Path) -> None:
    import subprocess

    pwfile = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(pwfile), "alice", "s3cret"], check=True)
    broker = mosquitto_factory([f"password_file {pwfile}"], anonymous=False)
    refused = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    refused.username_pw_set("alice", "wrong")
    assert refused.connect(broker.host, broker.port) == 0
    rc = refused.loop(timeout=2)
    assert rc != 0 or not refused.is_connected()
    ok = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    ok.username_pw_set("alice", "s3cret")
    ok.connect(broker.host, broker.port)
    ok.loop(timeout=2)
    assert ok.is_connected()
    ok.disconnect()
    broker.restart()
    assert broker.running


def test_boto3_reaches_moto_over_http(aws_env: MotoServer) -> None:
    assert aws_env.url.startswith("http://127.0.0.1:")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="strata-test")
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["strata-test"]
    assert s3.meta.endpoint_url == aws_env.url
