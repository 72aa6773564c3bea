"""What the security tests share: keys (public, private, foreign), one-line CLI errors, and TLS certificates."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from device import SigningKey, generate_keypair, load_signing_key


def keypair(folder: Path, name: str = "signer") -> tuple[SigningKey, Path, Path]:
    """``(signing key, private key file, public key file)`` written into `folder`."""
    private, public = generate_keypair(folder, name=name)
    return load_signing_key(private), private, public


def one_line_error(result: subprocess.CompletedProcess[str], *expected: str, progress: int = 0) -> str:
    """Assert exit 2, no traceback and one error line (after `progress` lines) holding `expected`; return it."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 + progress, result.stderr
    for text in expected:
        assert text in lines[-1], lines[-1]
    return lines[-1]


def certificate(subject: str, issuer_key: ec.EllipticCurvePrivateKey | None = None,
                issuer: x509.Name | None = None, *, ca: bool = False, ip: str | None = None,
                dns: str | None = None, expired: bool = False) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """An EC certificate (self-signed without an issuer): a CA, or a server certificate for `ip` / `dns`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    begin, end = ((now - datetime.timedelta(days=3), now - datetime.timedelta(days=2)) if expired
                  else (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)))
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(begin).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    names: list[x509.GeneralName] = []
    if ip:
        names.append(x509.IPAddress(ipaddress.ip_address(ip)))
    if dns:
        names.append(x509.DNSName(dns))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(issuer_key or key, hashes.SHA256())


def write_pem(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[str, str]:
    """Write ``path.key`` and ``path.pem``; return their paths."""
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".pem")
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)
