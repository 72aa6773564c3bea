"""A run's certificate authority: per-role TLS certificates for the service plane, and checks of PEM files.

`issue_run_certificates` writes one folder per run (``strata certs``)::

    ca.crt            the run CA's certificate: every process trusts it (``--tls-ca``)
    ca.key            the CA's private key (0600): only ``strata certs`` reads it, to add roles later
    token             a per-run bearer token (0600), for ``--tls-token-file``
    ROLE/tls.crt      the role's certificate (serverAuth and clientAuth), valid for the role's hosts
    ROLE/tls.key      its private key (0600)
    ROLE/ca.crt       a copy of the CA certificate

Each role folder has the layout of a Kubernetes ``kubernetes.io/tls`` Secret as cert-manager writes it
(``tls.crt``, ``tls.key``, ``ca.crt``), so ``kubectl create secret generic NAME --from-file=DIR/ROLE`` or a
cert-manager ``Certificate`` fill the same mount. A certificate names its role in a SPIFFE URI subject alternative
name (``spiffe://strata/ROLE``, `spiffe_id`), which servers read per call to decide what the peer may do; its
hosts (IP addresses and DNS names, loopback always included) are its other subject alternative names.

Keys are ECDSA P-256 (cheap handshakes); nothing is ever overwritten. `check_tls_files` validates a CA,
certificate and key trio before a process starts work: readable PEM, the certificate issued by the CA, in its
validity period, and the key matching it.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device._errors import ConfigError
from device._keys import _write_new
from device._names import identifier, shown

SPIFFE_PREFIX = "spiffe://strata/"
"""Prefix of the role identity a certificate carries (``spiffe://strata/env``)."""
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
"""Hosts every role certificate is valid for, so a role may also serve on loopback."""
MAX_PEM_BYTES = 1 << 20
"""PEM files larger than this are refused unread."""
_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


class TLSFileError(ConfigError):
    """A CA, certificate, key or token file is missing, malformed, expired or does not belong with the others."""


def spiffe_id(role: str) -> str:
    """The URI a certificate of `role` carries (``spiffe://strata/ROLE``)."""
    return SPIFFE_PREFIX + identifier(role, what="certificate role")


def role_of(uri: str) -> str | None:
    """The role named by a strata SPIFFE URI, or None when `uri` is not one."""
    if not uri.startswith(SPIFFE_PREFIX):
        return None
    role = uri[len(SPIFFE_PREFIX):]
    return role if role and "/" not in role else None


def host_entry(text: str) -> str:
    """`text` if it is an IP address or a DNS name a certificate can carry; else `TLSFileError` naming it."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    if not text or len(text) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise TLSFileError(f"host {shown(text)} is neither an IP address nor a DNS name; pass e.g. "
                           "10.0.0.5 or strata-envs.strata.svc")
    return text.rstrip(".").lower()


@dataclass(frozen=True)
class RunCertificates:
    """What `issue_run_certificates` wrote (or found and kept)."""

    ca_cert: Path
    ca_key: Path
    token: Path
    roles: dict[str, Path]
    """Role -> its folder (``tls.crt``, ``tls.key``, ``ca.crt``), for the roles issued by this call."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _name(common_name: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "strata"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def _new_ca(run: str, days: int) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"strata run CA {run}")
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(role: str, hosts: Sequence[str], ca_key: Any, ca_cert: Any, days: int) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(spiffe_id(role))]
    for host in dict.fromkeys([*hosts, *LOOPBACK_HOSTS]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = _now()
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (x509.CertificateBuilder().subject_name(_name(f"strata {role}")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def issue_run_certificates(out: Path | str, *, roles: Mapping[str, Sequence[str]], run: str = "run",
                           days: int = 90) -> RunCertificates:
    """Write a run CA (or reuse the one in `out`), a per-run token, and one certificate per role.

    Args:
        out: The run's certificate folder (created). A CA already there is reused, so roles can be added later.
        roles: Role -> the hosts (IP addresses, DNS names) its services are reached at.
        run: A name for the run, written into the CA's subject.
        days: Validity of new certificates (a role certificate never outlives its CA).

    Raises:
        TLSFileError: a role folder already exists (certificates are never overwritten), a role or host is
            malformed, or the folder cannot be written.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    if not roles:
        raise TLSFileError("no roles to issue; pass --role ROLE=HOST[,HOST...] (e.g. env=10.0.0.5)")
    if not 1 <= days <= 3650:
        raise TLSFileError(f"--days {days} must be between 1 and 3650")
    identifier(run, what="--run")
    checked = {identifier(role, what="role"): [host_entry(h) for h in hosts]
               for role, hosts in roles.items()}
    folder = Path(out)
    ca_cert_path, ca_key_path, token_path = folder / "ca.crt", folder / "ca.key", folder / "token"
    taken = [str(folder / role) for role in checked if (folder / role).exists()]
    if taken:
        raise TLSFileError(f"{taken[0]} already exists; certificates are never overwritten, pick "
                           "another --out folder or remove that role's folder first")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if ca_key_path.exists():
            ca_key = serialization.load_pem_private_key(read_pem(ca_key_path, what="CA key", call="--out"),
                                                        password=None)
            ca_cert = x509.load_pem_x509_certificate(read_pem(ca_cert_path, what="CA certificate",
                                                              call="--out"))
        else:
            ca_key, ca_cert = _new_ca(run, days)
            _write_new(ca_key_path, _pem_key(ca_key), 0o600)
            _write_new(ca_cert_path, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
        if not token_path.exists():
            _write_new(token_path, (secrets.token_urlsafe(32) + "\n").encode(), 0o600)
        ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
        written: dict[str, Path] = {}
        for role, hosts in checked.items():
            key, cert = _leaf(role, hosts, ca_key, ca_cert, days)
            role_dir = folder / role
            role_dir.mkdir(mode=0o700)
            _write_new(role_dir / "tls.key", _pem_key(key), 0o600)
            _write_new(role_dir / "tls.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)
            _write_new(role_dir / "ca.crt", ca_pem, 0o644)
            written[role] = role_dir
    except (OSError, ValueError) as exc:
        raise TLSFileError(f"cannot write into {str(folder)!r}: "
                           f"{getattr(exc, 'strerror', None) or exc}; pass a writable --out folder") from None
    return RunCertificates(ca_cert=ca_cert_path, ca_key=ca_key_path, token=token_path, roles=written)


def read_pem(path: Path | str, *, what: str, call: str) -> bytes:
    """The bytes of a PEM file (at most `MAX_PEM_BYTES`), or `TLSFileError` naming the file and the fix."""
    p = Path(path)
    try:
        if not p.is_file():
            raise TLSFileError(f"{call}: {what} {shown(str(p))} is not a file; pass the PEM file "
                               "`strata certs` wrote")
        if p.stat().st_size > MAX_PEM_BYTES:
            raise TLSFileError(f"{call}: {what} {shown(str(p))} is over {MAX_PEM_BYTES} bytes; it is not a PEM file")
        data = p.read_bytes()
    except OSError as exc:
        raise TLSFileError(f"{call}: cannot read {what} {shown(str(p))}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TLSFileError(f"{call}: {what} {shown(str(p))} is not a PEM file (no -----BEGIN line)")
    return data


@dataclass(frozen=True)
class TLSMaterial:
    """A checked CA, certificate and key, as PEM bytes, and the role the certificate names."""

    ca: bytes
    cert: bytes
    key: bytes
    role: str | None
    """The role of the certificate's ``spiffe://strata/ROLE`` name; None when it carries none."""
    hosts: tuple[str, ...]
    """The certificate's DNS and IP subject alternative names."""


def check_tls_files(ca: Path | str, cert: Path | str, key: Path | str, *, call: str) -> TLSMaterial:
    """Read and check a CA, certificate and key trio before any work starts (see the module docstring).

    Raises:
        TLSFileError: one line naming the file and what is wrong with it.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    ca_pem = read_pem(ca, what="CA certificate (--tls-ca)", call=call)
    cert_pem = read_pem(cert, what="certificate (--tls-cert)", call=call)
    key_pem = read_pem(key, what="private key (--tls-key)", call=call)
    try:
        ca_certs = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        raise TLSFileError(f"{call}: --tls-ca {shown(str(ca))} holds no PEM certificate") from None
    try:
        leaf = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError:
        raise TLSFileError(f"{call}: --tls-cert {shown(str(cert))} holds no PEM certificate") from None
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise TLSFileError(f"{call}: --tls-key {shown(str(key))} is not an unencrypted PEM private key") from None
    now = _now()
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        raise TLSFileError(f"{call}: --tls-cert {shown(str(cert))} is valid from {leaf.not_valid_before_utc:%Y-%m-%d} "
                           f"to {leaf.not_valid_after_utc:%Y-%m-%d}, not now; issue a new one with `strata certs`")
    if not any(_signed_by(leaf, issuer) for issuer in ca_certs):
        raise TLSFileError(f"{call}: --tls-cert {shown(str(cert))} was not issued by the CA in --tls-ca "
                           f"{shown(str(ca))}; pass the ca.crt of the run that issued it")
    if not isinstance(private, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) or \
            private.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo) != \
            leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        raise TLSFileError(f"{call}: --tls-key {shown(str(key))} is not the key of --tls-cert {shown(str(cert))}; "
                           "pass the tls.key from the same folder")
    role, hosts = None, []
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = [role_of(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
        role = next((r for r in uris if r), None)
        hosts = [*san.get_values_for_type(x509.DNSName), *map(str, san.get_values_for_type(x509.IPAddress))]
    except x509.ExtensionNotFound:
        pass
    return TLSMaterial(ca=ca_pem, cert=cert_pem, key=key_pem, role=role, hosts=tuple(hosts))


def _signed_by(cert: Any, issuer: Any) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):  # wrong issuer name, key type, or signature
        return False
    return True


def read_token(path: Path | str, *, call: str) -> str:
    """The per-run token in `path` (one line, at least 16 characters), or `TLSFileError`."""
    p = Path(path)
    try:
        if not p.is_file() or p.stat().st_size > 4096:
            raise TLSFileError(f"{call}: --tls-token-file {shown(str(p))} is not a small file; pass the token file "
                               "`strata certs` wrote")
        token = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TLSFileError(f"{call}: cannot read --tls-token-file {shown(str(p))}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None
    if len(token) < 16 or any(c.isspace() or not c.isprintable() for c in token):
        raise TLSFileError(f"{call}: --tls-token-file {shown(str(p))} must hold one token of at least 16 printable "
                           "characters without spaces")
    return token
