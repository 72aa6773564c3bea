"""Ed25519 signing keys and the trust store that bundle consumers verify against.

Keys are PEM files: ``<name>.key`` holds the private key (PKCS8, unencrypted, mode 0600) and
``<name>.pub`` the public key (SubjectPublicKeyInfo). A key's id is the first 16 hex characters of
the sha256 of its 32 raw public bytes; bundles name the key that signed them by this id.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from device._bundle_errors import KeyFileError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

# cryptography is imported inside the functions that use it: `import device` (for the wire formats, in a
# Lambda cold start) should not pay for loading OpenSSL.


def _key_id(public: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


class PublicKey:
    """An Ed25519 public key that verifies bundle signatures."""

    def __init__(self, key: Ed25519PublicKey) -> None:
        self._key = key
        self.key_id: str = _key_id(key)
        """16 hex characters of the sha256 of the raw public bytes."""

    def verify(self, signature: bytes, message: bytes) -> bool:
        """Return whether `signature` is this key's signature of `message`."""
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def to_pem(self) -> bytes:
        """The key as a PEM SubjectPublicKeyInfo block."""
        from cryptography.hazmat.primitives import serialization

        return self._key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def __repr__(self) -> str:
        return f"PublicKey(key_id={self.key_id!r})"


class SigningKey:
    """An Ed25519 private key that signs bundles."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public_key = PublicKey(key.public_key())
        """The matching public key."""
        self.key_id: str = self.public_key.key_id
        """The id of the matching public key."""

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh random key (in memory; `generate_keypair` writes one to disk)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate())

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of `message`."""
        return self._key.sign(message)

    def to_pem(self) -> bytes:
        """The key as an unencrypted PEM PKCS8 block (keep it secret)."""
        from cryptography.hazmat.primitives import serialization

        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def __repr__(self) -> str:
        return f"SigningKey(key_id={self.key_id!r})"


class TrustStore:
    """The public keys a consumer trusts, looked up by key id."""

    def __init__(self, keys: Iterable[PublicKey]) -> None:
        self._keys = {key.key_id: key for key in keys}

    @classmethod
    def from_paths(cls, paths: Iterable[Path | str]) -> TrustStore:
        """Load every public-key PEM file in `paths`."""
        return cls(load_public_key(Path(p)) for p in paths)

    def get(self, key_id: str) -> PublicKey | None:
        """The trusted key with this id, or None."""
        return self._keys.get(key_id)

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of the trusted keys, sorted."""
        return tuple(sorted(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"TrustStore(key_ids={list(self.key_ids)})"


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to a temp file created with `mode`, then rename it to `path` (never replacing a key)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed it; make it exact
        # os.link fails if `path` exists, so a concurrent writer can never replace a key.
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def generate_keypair(out_dir: Path | str, *, name: str = "strata-signing") -> tuple[Path, Path]:
    """Write a new Ed25519 key pair to ``out_dir/<name>.key`` (mode 0600) and ``out_dir/<name>.pub``.

    Returns:
        ``(private_key_path, public_key_path)``.

    Raises:
        KeyFileError: either file already exists (keys are never overwritten) or `name` is not a plain name.
    """
    out = Path(out_dir)
    if not name or "/" in name or name.startswith("."):
        raise KeyFileError(f"generate_keypair: name {name!r} must be a plain file name such as 'strata-signing'")
    key_path, pub_path = out / f"{name}.key", out / f"{name}.pub"
    for path in (key_path, pub_path):
        if path.exists():
            raise KeyFileError(f"generate_keypair: {path} already exists; keys are never overwritten, "
                               "choose another --out folder or --name")
    key = SigningKey.generate()
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write_new(key_path, key.to_pem(), 0o600)
        _write_new(pub_path, key.public_key.to_pem(), 0o644)
    except FileExistsError as exc:
        raise KeyFileError(f"generate_keypair: {exc.filename} appeared while writing; keys are never "
                           "overwritten") from exc
    except OSError as exc:
        raise KeyFileError(f"generate_keypair: cannot write keys into {out}: {exc.strerror or exc}") from exc
    return key_path, pub_path


def _read(path: Path, what: str, call: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{call}: cannot read {what} {path}: {exc.strerror or exc}") from exc


def load_signing_key(path: Path | str) -> SigningKey:
    """Load an Ed25519 private key from a PEM PKCS8 file written by `generate_keypair`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    p = Path(path)
    data = _read(p, "private key", "load_signing_key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"load_signing_key: {p} is not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"load_signing_key: {p} holds a {type(key).__name__}, expected an Ed25519 key")
    return SigningKey(key)


def load_public_key(path: Path | str) -> PublicKey:
    """Load an Ed25519 public key from a PEM file written by `generate_keypair`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    p = Path(path)
    data = _read(p, "public key", "load_public_key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"load_public_key: {p} is not a PEM public key ({exc})") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"load_public_key: {p} holds a {type(key).__name__}, expected an Ed25519 key")
    return PublicKey(key)
