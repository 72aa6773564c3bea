"""Policy bundles: the file format round-trips, and the verifier refuses each bad case with its reason."""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from pathlib import Path

import pytest

from device import (
    Bundle,
    BundleFormatError,
    ExpiredBundleError,
    KeyFileError,
    Manifest,
    RollbackError,
    SigningKey,
    TamperedBundleError,
    TrustStore,
    UnknownKeyError,
    UnsignedBundleError,
    Verifier,
    VerifierStateError,
    WrongTierError,
    generate_keypair,
    load_public_key,
    load_signing_key,
    space_bounds,
    space_to_json,
)
from tests.device._bundles import NOW, OBS_SPACE, make_bundle


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture
def verifier(key: SigningKey) -> Verifier:
    return Verifier(trust=TrustStore([key.public_key]), tier="device", clock=lambda: NOW + 1)


def test_round_trip_is_byte_exact(key: SigningKey) -> None:
    bundle = make_bundle(key)
    data = bundle.to_bytes()
    back = Bundle.from_bytes(data)
    assert back == bundle
    assert back.to_bytes() == data
    assert data[:4] == b"STRB" and data[5] == 1 and data[6:22] == key.key_id.encode()


def test_unsigned_round_trips_too() -> None:
    bundle = make_bundle(None)
    assert not bundle.signed
    assert Bundle.from_bytes(bundle.to_bytes()) == bundle


def test_manifest_is_canonical_json_with_model_digest(key: SigningKey) -> None:
    bundle = make_bundle(key, model=b"abc")
    raw = bundle.manifest.to_bytes()
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert bundle.manifest.model_sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert bundle.manifest.producer["python"].startswith("3.")


def test_non_canonical_manifest_is_refused(key: SigningKey) -> None:
    data = make_bundle(None).to_bytes()
    bundle = Bundle.from_bytes(data)
    pretty = json.dumps(bundle.manifest.to_json_dict(), indent=1).encode()
    head = data[:24]
    forged = head + struct.pack("<I", len(pretty)) + pretty + struct.pack("<I", len(bundle.model)) + bundle.model
    with pytest.raises(BundleFormatError, match=re.escape("Manifest: is not in canonical form")):
        Bundle.from_bytes(forged)


def test_trailing_bytes_and_bad_magic_are_refused(key: SigningKey) -> None:
    data = make_bundle(key).to_bytes()
    with pytest.raises(BundleFormatError, match=re.escape("3 unexpected bytes after the model")):
        Bundle.from_bytes(data + b"xyz")
    with pytest.raises(BundleFormatError, match=re.escape("bad magic b'PK\\x03\\x04'")):
        Bundle.from_bytes(b"PK\x03\x04" + data[4:])


def test_verify_passes_a_good_bundle(key: SigningKey, verifier: Verifier) -> None:
    bundle = make_bundle(key)
    assert verifier.verify(bundle.to_bytes()) == bundle


def test_unsigned_is_refused(verifier: Verifier) -> None:
    with pytest.raises(UnsignedBundleError, match=re.escape("bundle 'cartpole' v1 is unsigned")):
        verifier.verify(make_bundle(None).to_bytes())


def test_unknown_key_is_refused(verifier: Verifier) -> None:
    other = SigningKey.generate()
    with pytest.raises(UnknownKeyError, match=re.escape(f"signed by key {other.key_id}, which is not in the trust")):
        verifier.verify(make_bundle(other).to_bytes())


def test_tampered_model_is_refused(key: SigningKey, verifier: Verifier) -> None:
    data = bytearray(make_bundle(key).to_bytes())
    data[-1] ^= 1
    with pytest.raises(TamperedBundleError, match=re.escape("(model was altered)")):
        verifier.verify(bytes(data))


def test_tampered_manifest_is_refused(key: SigningKey, verifier: Verifier) -> None:
    good = make_bundle(key)
    evil = Bundle(Manifest(**{**good.manifest.__dict__, "version": 99}), good.model, good.key_id, good.signature)
    with pytest.raises(TamperedBundleError, match=re.escape("does not match its manifest")):
        verifier.verify(evil.to_bytes())


def test_signature_from_another_trusted_key_is_tampered(key: SigningKey) -> None:
    other = SigningKey.generate()
    signed_by_other = make_bundle(other)
    claimed = Bundle(signed_by_other.manifest, signed_by_other.model, key.key_id, signed_by_other.signature)
    verifier = Verifier(trust=TrustStore([key.public_key, other.public_key]), tier="any", clock=lambda: NOW)
    with pytest.raises(TamperedBundleError, match=re.escape(f"altered after signing by key {key.key_id}")):
        verifier.verify(claimed.to_bytes())


def test_expired_is_refused(key: SigningKey) -> None:
    bundle = make_bundle(key, ttl_s=60)
    trust = TrustStore([key.public_key])
    assert Verifier(trust=trust, tier="edge", clock=lambda: NOW + 59).verify(bundle)
    with pytest.raises(ExpiredBundleError, match=re.escape("expired at 2026-09-21T")):
        Verifier(trust=trust, tier="edge", clock=lambda: NOW + 60).verify(bundle)


def test_wrong_tier_is_refused(key: SigningKey, verifier: Verifier) -> None:
    with pytest.raises(WrongTierError, match=re.escape("targets tier 'edge', but this verifier is for tier 'device'")):
        verifier.verify(make_bundle(key, target_tier="edge"))
    assert verifier.verify(make_bundle(key, target_tier="device"))
    with pytest.raises(WrongTierError, match=re.escape("tier must be one of")):
        Verifier(trust=TrustStore([]), tier="cloud")


def test_rollback_is_refused_and_persists(key: SigningKey, tmp_path: Path) -> None:
    state = tmp_path / "state" / "accepted.json"
    trust = TrustStore([key.public_key])
    v = Verifier(trust=trust, tier="device", state_path=state, clock=lambda: NOW)
    v.accept(v.verify(make_bundle(key, version=3)))
    assert v.highest_accepted("cartpole") == 3 and v.highest_accepted("other") == 0
    # A restart reads the state back: 3 is current (not newer), 2 is a rollback, 4 passes.
    again = Verifier(trust=trust, tier="device", state_path=state, clock=lambda: NOW)
    for old in (2, 3):
        with pytest.raises(RollbackError, match=re.escape("is not newer than the highest accepted version 3")):
            again.verify(make_bundle(key, version=old))
    assert again.verify(make_bundle(key, version=3), allow_current=True).version == 3
    again.accept(again.verify(make_bundle(key, version=4)))
    with pytest.raises(RollbackError, match=re.escape("older than the highest accepted version 4")):
        again.accept(make_bundle(key, version=2))
    assert json.loads(state.read_text()) == {"format": 1, "highest_accepted": {"cartpole": 4}}
    assert [p.name for p in state.parent.iterdir()] == ["accepted.json"]


def test_corrupt_state_fails_closed(key: SigningKey, tmp_path: Path) -> None:
    state = tmp_path / "accepted.json"
    state.write_text("{not json")
    with pytest.raises(VerifierStateError, match=re.escape(f"state file {str(state)!r} is unreadable")):
        Verifier(trust=TrustStore([key.public_key]), tier="device", state_path=state)


def test_manifest_validation_names_the_field(key: SigningKey) -> None:
    with pytest.raises(BundleFormatError, match=re.escape("Manifest: version must be an int >= 1, got 0")):
        make_bundle(key, version=0, parent_version=None)
    with pytest.raises(BundleFormatError, match=re.escape("Manifest: policy must match")):
        make_bundle(key, policy="../etc")
    bad_space = {**OBS_SPACE, "low": [0.0]}
    with pytest.raises(BundleFormatError, match=re.escape("Box low must be a flat list of 4 numbers")):
        make_bundle(key, observation_space=bad_space)
    with pytest.raises(BundleFormatError, match=re.escape("build_bundle: preprocessing holds a value JSON cannot")):
        make_bundle(key, preprocessing={"eps": float("nan")})


def test_build_bundle_normalises_json_values(key: SigningKey) -> None:
    bundle = make_bundle(key, observation_space={**OBS_SPACE, "shape": (4,)}, preprocessing={"mean": (0.0, 1.0)})
    assert bundle.manifest.observation_space["shape"] == [4]
    assert Bundle.from_bytes(bundle.to_bytes()) == bundle


def test_space_json_helpers() -> None:
    import numpy as np

    class Box:
        shape = (2,)
        dtype = np.float32
        low = np.array([-np.inf, 0.0])
        high = np.array([np.inf, 1.0])

    class Discrete:
        n = 3
        start = 0

    box = space_to_json(Box())
    assert box == {"type": "Box", "shape": [2], "dtype": "float32", "low": ["-inf", 0.0], "high": ["inf", 1.0]}
    low, high = space_bounds(box)
    assert low[0] == -np.inf and high[1] == 1.0
    assert space_to_json(Discrete()) == {"type": "Discrete", "n": 3}


def test_4_64_64_2_bundle_is_small(key: SigningKey) -> None:
    # 4*64 + 64 + 64*64 + 64 + 64*2 + 2 fp32 parameters plus ONNX framing: the model is ~19 KB.
    model = os.urandom(4 * (4 * 64 + 64 + 64 * 64 + 64 + 64 * 2 + 2) + 2000)
    assert len(make_bundle(key, model=model).to_bytes()) < 32 * 1024


def test_keypair_files(tmp_path: Path) -> None:
    key_path, pub_path = generate_keypair(tmp_path / "keys", name="prod")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert key_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    signing, public = load_signing_key(key_path), load_public_key(pub_path)
    assert signing.key_id == public.key_id and re.fullmatch(r"[0-9a-f]{16}", public.key_id)
    assert TrustStore.from_paths([pub_path]).get(public.key_id) is not None
    with pytest.raises(KeyFileError, match=re.escape("already exists; keys are never overwritten")):
        generate_keypair(tmp_path / "keys", name="prod")
    with pytest.raises(KeyFileError, match=re.escape("is not a PEM public key")):
        load_public_key(_write(tmp_path, b"junk"))
    with pytest.raises(KeyFileError, match=re.escape("private key") + ".* is not a file"):
        load_signing_key(tmp_path / "missing.key")
    with pytest.raises(KeyFileError, match=re.escape("expected an Ed25519 key")):
        load_signing_key(_ec_pem(tmp_path))


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "junk.pub"
    path.write_bytes(data)
    return path


def _ec_pem(tmp_path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path = tmp_path / "ec.key"
    path.write_bytes(pem)
    return path


def test_importing_device_does_not_load_cryptography() -> None:
    import subprocess
    import sys

    code = "import sys, device; print('cryptography' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"
