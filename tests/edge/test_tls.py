"""Mutual TLS as on AWS IoT Core (CA file, client certificate and key), against a real Mosquitto TLS listener."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edge import LinkConfig, LinkState, MqttLink
from tests._services import free_port
from tests.conftest import MosquittoFactory
from tests.edge._agents import wait_until


def _cert(subject: str, issuer_key: ec.EllipticCurvePrivateKey | None, issuer: x509.Name | None, *,
          ca: bool = False, ip: str | None = None) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                                        critical=False)
    return key, builder.sign(issuer_key or key, hashes.SHA256())


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[str, str]:
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".pem")
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


def test_mutual_tls_with_client_certificate(tmp_path: Path, mosquitto_factory: MosquittoFactory) -> None:
    ca_key, ca_cert = _cert("strata test CA", None, None, ca=True)
    server_key, server_cert = _cert("127.0.0.1", ca_key, ca_cert.subject, ip="127.0.0.1")
    client_key, client_cert = _cert("n1", ca_key, ca_cert.subject)
    _, ca_file = _write(tmp_path / "ca", ca_key, ca_cert)
    server_key_file, server_cert_file = _write(tmp_path / "server", server_key, server_cert)
    client_key_file, client_cert_file = _write(tmp_path / "client", client_key, client_cert)
    port = free_port()
    mosquitto_factory([f"listener {port} 127.0.0.1", f"cafile {ca_file}", f"certfile {server_cert_file}",
                       f"keyfile {server_key_file}", "require_certificate true"])
    url = f"mqtts://127.0.0.1:{port}"
    got: list[bytes] = []
    config = LinkConfig(broker=url, client_id="n1", ca_file=ca_file, cert_file=client_cert_file,
                        key_file=client_key_file)
    with MqttLink(config, on_message=lambda t, p, r: got.append(p)) as link:
        link.subscribe("tls/echo")
        assert link.wait_connected(60), link.last_error
        link.publish("tls/echo", b"over tls")
        wait_until(lambda: got == [b"over tls"], what="message over TLS")
    # without a client certificate the broker refuses the handshake: a link state naming the cause, not an
    # exception (a refusal now, counted against the retry budget: issue 34)
    with MqttLink(LinkConfig(broker=url, client_id="n2", ca_file=ca_file)) as anonymous:
        wait_until(lambda: anonymous.state is LinkState.REFUSED, what="refusal")
        assert not anonymous.connected
        assert anonymous.last_error is not None and "client certificate" in anonymous.last_error
