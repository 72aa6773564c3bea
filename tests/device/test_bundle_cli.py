"""`strata keys generate`, `strata bundle inspect` and `strata bundle verify` as a user runs them."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from device import load_signing_key
from tests._cli import run_strata
from tests.device._bundles import make_bundle


def test_keys_generate_inspect_verify(tmp_path: Path) -> None:
    result = run_strata("keys", "generate", "--out", str(tmp_path / "keys"))
    assert result.returncode == 0, result.stderr
    key_path, pub_path = tmp_path / "keys" / "strata-signing.key", tmp_path / "keys" / "strata-signing.pub"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    key = load_signing_key(key_path)
    assert f"key id:      {key.key_id}" in result.stdout

    again = run_strata("keys", "generate", "--out", str(tmp_path / "keys"))
    assert again.returncode == 2 and "already exists; keys are never overwritten" in again.stderr

    bundle_path = tmp_path / "cartpole.bundle"
    bundle_path.write_bytes(make_bundle(key, version=2, target_tier="edge", ttl_s=1e9).to_bytes())
    inspect = run_strata("bundle", "inspect", str(bundle_path), "--json")
    assert inspect.returncode == 0, inspect.stderr
    summary = json.loads(inspect.stdout)
    assert summary["key_id"] == key.key_id and summary["manifest"]["version"] == 2
    assert summary["numpy_executor"]["ok"] is False  # the fake model bytes are not ONNX
    table = run_strata("bundle", "inspect", str(bundle_path))
    assert "target_tier       \"edge\"" in table.stdout
    assert "numpy executor    cannot run it: NumpyExecutor: malformed ONNX model" in table.stdout

    state = tmp_path / "state.json"
    ok = run_strata("bundle", "verify", str(bundle_path), "--trust", str(pub_path), "--tier", "edge",
                    "--state", str(state), "--accept")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"OK cartpole v2 signed by {key.key_id}")
    rollback = run_strata("bundle", "verify", str(bundle_path), "--trust", str(pub_path), "--state", str(state))
    assert rollback.returncode == 2
    assert "not newer than the highest accepted version 2" in rollback.stderr and "Traceback" not in rollback.stderr
    wrong = run_strata("bundle", "verify", str(bundle_path), "--trust", str(pub_path), "--tier", "device")
    assert wrong.returncode == 2 and "targets tier 'edge'" in wrong.stderr


def test_inspect_reports_the_executor_plan(tmp_path: Path) -> None:
    from tests.device._models import mlp_policy

    path = tmp_path / "real.bundle"
    path.write_bytes(make_bundle(None, model=mlp_policy(seed=0)).to_bytes())
    result = run_strata("bundle", "inspect", str(path))
    assert result.returncode == 0, result.stderr
    assert "signed            NO (every verifier refuses it)" in result.stdout
    assert "numpy executor    loads (12 plan steps)" in result.stdout


def test_bad_files_exit_2_with_reason(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bundle"
    junk.write_bytes(b"not a bundle at all, definitely")
    result = run_strata("bundle", "inspect", str(junk))
    assert result.returncode == 2 and "bad magic" in result.stderr and "Traceback" not in result.stderr
    missing = run_strata("bundle", "verify", str(tmp_path / "nope.bundle"), "--trust", str(junk))
    assert missing.returncode == 2 and "nope.bundle': does not exist" in missing.stderr
