"""Ed25519 signing keys and the trust store that bundle consumers verify against.

Keys are PEM files: ``<name>.key`` holds the private key (PKCS8, unencrypted, mode 0600) and
``<name>.pub`` the public key (SubjectPublicKeyInfo). A key's id is the first 16 hex characters of
the sha256 of its 32 raw public bytes; bundles name the key that signed them by this id.

A trust anchor (``--trust``, ``--trusted-public-key``, a kit's or an install's trusted keys) is parsed by one
function, `parse_public_keys`: PEM ``PUBLIC KEY`` blocks of Ed25519 keys and nothing else. A private key is
refused loudly, naming only the file (never its content), so it is never copied into a kit, a config or a
function's environment; anything else (an RSA key, a certificate, plain text, an empty file) is one line.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from device._bundle_errors import KeyFileError
from device._names import shown

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


MAX_KEY_FILE_BYTES = 64 * 1024
"""A trust-anchor file above this size is refused unread (a PEM public key is 113 bytes)."""
_PEM_PUBLIC_BEGIN = b"-----BEGIN PUBLIC KEY-----"
_PEM_PUBLIC_END = b"-----END PUBLIC KEY-----"


def _private_marker(data: bytes) -> bool:
    """Whether `data` holds a private key in any PEM or OpenSSH form (PKCS8, encrypted, RSA, EC, OpenSSH)."""
    return b"PRIVATE KEY-----" in data or b"PuTTY-User-Key-File" in data


def parse_public_keys(data: bytes | str, *, source: str) -> list[PublicKey]:
    """The Ed25519 public keys of `data`: one or more PEM ``PUBLIC KEY`` blocks and nothing else.

    This is the one parser of trust anchors; `load_public_key` and every ``--trust`` go through it.

    Args:
        data: The text (a ``.pub`` file's content, or PEM given inline).
        source: What `data` is, for messages (``--trust keys/x.pub``); never the content itself.

    Raises:
        KeyFileError: `data` holds a private key (refused loudly: pass the ``.pub`` file), no PEM public key,
            text outside the PEM blocks, or a key that is not Ed25519.
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
    if _private_marker(raw):
        raise KeyFileError(f"{source} is a PRIVATE key; pass the .pub file (the public half, e.g. "
                           "strata-signing.pub) and keep the private key on the signing machine only")
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{source} is over {MAX_KEY_FILE_BYTES:,} bytes, not a public key file; pass the .pub "
                           "file `strata keys generate` wrote")
    keys: list[PublicKey] = []
    rest = raw.strip()
    while rest:
        if not rest.startswith(_PEM_PUBLIC_BEGIN) or _PEM_PUBLIC_END not in rest:
            what = "holds text outside its PEM blocks" if keys else "is not a PEM public key"
            raise KeyFileError(f"{source} {what}; pass the .pub file `strata keys generate` wrote "
                               "(-----BEGIN PUBLIC KEY----- ...)")
        end = rest.index(_PEM_PUBLIC_END) + len(_PEM_PUBLIC_END)
        block, rest = rest[:end], rest[end:].strip()
        try:
            key = serialization.load_pem_public_key(block + b"\n")
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise KeyFileError(f"{source} is not a valid PEM public key ({type(exc).__name__}: its content is not "
                               "a key); pass the .pub file `strata keys generate` wrote") from None
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFileError(f"{source} holds a key of type {type(key).__name__.lstrip('_')}, not Ed25519; strata "
                               "signs bundles with Ed25519 (`strata keys generate`)")
        keys.append(PublicKey(key))
    if not keys:
        raise KeyFileError(f"{source} is empty; pass the .pub file `strata keys generate` wrote")
    return keys


def read_public_key_file(path: Path | str, *, what: str = "public key") -> tuple[bytes, list[PublicKey]]:
    """The bytes of the trust-anchor file `path` (size-capped) and its public keys (`parse_public_keys`).

    Raises:
        KeyFileError: The file cannot be read, is not a regular file, or does not hold only Ed25519 public keys.
    """
    p = Path(path)
    source = f"{what} {shown(str(p))}"
    try:
        if not p.is_file():
            raise KeyFileError(f"{source} is not a file (missing, a folder or a device); pass the .pub file "
                               "`strata keys generate` wrote")
        with p.open("rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"cannot read {source}: {exc.strerror or exc}") from None
    return data, parse_public_keys(data, source=source)


def load_public_key(path: Path | str) -> PublicKey:
    """Load the one Ed25519 public key of a PEM file (`parse_public_keys`; a private key is refused loudly).

    Raises:
        KeyFileError: The file cannot be read, holds a private key, holds no or several keys, or a non-Ed25519 key.
    """
    _, keys = read_public_key_file(path)
    if len(keys) != 1:
        raise KeyFileError(f"public key {shown(str(path))} holds {len(keys)} keys; put one key in each .pub file")
    return keys[0]


def trusted_key_files(paths: Iterable[Path | str], *, what: str = "--trust",
                      taken: Iterable[str] = ()) -> dict[str, bytes]:
    """Every trusted key of `paths` under a file name of its own, for a kit or an install: ``{name: PEM}``.

    Each file goes through `read_public_key_file` (a private key is refused, never copied). Key rotation puts
    the old and the new key side by side, often with the same file name from two folders: every key keeps
    its own file (``signer.pub``, then ``signer-<key id>.pub``), and the same key given twice is kept once.

    Args:
        paths: The ``.pub`` files.
        what: The flag or field, for messages.
        taken: File names already used beside them (``edge.toml``, ``password``).

    Raises:
        KeyFileError: a file cannot be read or is not an Ed25519 public key.
    """
    used = set(taken)
    seen: set[str] = set()
    out: dict[str, bytes] = {}
    for path in paths:
        p = Path(path)
        _, keys = read_public_key_file(p, what=what)
        for key in keys:
            if key.key_id in seen:
                continue
            seen.add(key.key_id)
            name = p.name if p.name.endswith(".pub") else f"{p.name}.pub"
            if name in used or name.startswith("."):
                name = f"{Path(name).stem.lstrip('.') or 'trusted'}-{key.key_id}.pub"
            used.add(name)
            out[name] = key.to_pem()
    return out
