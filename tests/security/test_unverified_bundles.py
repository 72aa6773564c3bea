"""Case 3 of issue 34: nothing is compiled from a bundle that has not been verified.

Before: ``strata device export-c --bundle tampered.bin`` wrote C from a model that ``strata bundle verify``
refuses ("model was altered"): it checked neither digest nor signature. Now it verifies against ``--trust``
first; ``--insecure-skip-verify`` is the loudly named opt-out for local experiments.
"""

from __future__ import annotations

from pathlib import Path

from device import build_bundle
from tests._cli import run_strata
from tests.device._models import mlp_policy
from tests.security._helpers import keypair, one_line_error

OBS = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}


def _bundles(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """``(good, tampered, unsigned, public key)`` bundle files of one micro policy."""
    key, _, public = keypair(tmp_path / "keys")
    model = mlp_policy(hidden=(8,))
    args = {"policy": "micro", "version": 1, "parent_version": None, "observation_space": OBS,
            "action_space": {"type": "Discrete", "n": 2}, "output_names": ("action", "logits"), "target_tier": "device"}
    good = build_bundle(model, signing_key=key, **args).to_bytes()  # type: ignore[arg-type]
    tampered = bytearray(good)
    tampered[-8] ^= 0x40  # a weight of the model changes; manifest and signature stay
    unsigned = build_bundle(model, signing_key=None, **args).to_bytes()  # type: ignore[arg-type]
    paths = []
    for name, data in (("good", good), ("tampered", bytes(tampered)), ("unsigned", unsigned)):
        path = tmp_path / f"{name}.bundle"
        path.write_bytes(data)
        paths.append(path)
    return paths[0], paths[1], paths[2], public


def _export(bundle: Path, out: Path, *extra: str) -> object:
    return run_strata("device", "export-c", "--bundle", str(bundle), "--out", str(out), *extra, timeout=120)


def test_export_c_writes_no_c_from_a_tampered_or_unsigned_bundle(tmp_path: Path) -> None:
    _, tampered, unsigned, public = _bundles(tmp_path)
    assert run_strata("bundle", "verify", str(tampered), "--trust", str(public)).returncode == 2
    one_line_error(_export(tampered, tmp_path / "c1", "--trust", str(public)), "model was altered")  # type: ignore[arg-type]
    one_line_error(_export(unsigned, tmp_path / "c2", "--trust", str(public)), "unsigned")  # type: ignore[arg-type]
    assert not (tmp_path / "c1").exists() and not (tmp_path / "c2").exists()


def test_export_c_needs_a_trust_key_or_the_loud_opt_out(tmp_path: Path) -> None:
    good, tampered, _, public = _bundles(tmp_path)
    one_line_error(_export(good, tmp_path / "c0"), "needs --trust PUBFILE", "--insecure-skip-verify")  # type: ignore[arg-type]
    assert not (tmp_path / "c0").exists()
    ok = _export(good, tmp_path / "c1", "--trust", str(public))
    assert ok.returncode == 0, ok.stderr  # type: ignore[attr-defined]
    assert (tmp_path / "c1" / "strata_policy.c").exists()
    # The opt-out writes C from anything, and says so on stderr.
    risky = _export(tampered, tmp_path / "c2", "--insecure-skip-verify")
    assert risky.returncode == 0, risky.stderr  # type: ignore[attr-defined]
    assert "WARNING: --insecure-skip-verify" in risky.stderr and "NOT verified" in risky.stderr  # type: ignore[attr-defined]
    one_line_error(_export(good, tmp_path / "c3", "--trust", str(public), "--insecure-skip-verify"),  # type: ignore[arg-type]
                   "contradict")
