"""`strata device run --config`: the device's TOML file, STRATA_DEVICE_* variables and flags, merged."""

from __future__ import annotations

import re
from pathlib import Path

from device import generate_keypair
from tests._cli import run_strata

DEVICE_TOML = """
[identity]
fleet = "f1"
edge_node = "e1"
trust = ["keys/fleet.pub"]

[decisions]
budget_ms = 50
"""


def test_device_config_show_merges_file_environment_and_flags(tmp_path: Path) -> None:
    generate_keypair(tmp_path / "keys", name="fleet")
    path = tmp_path / "device.toml"
    path.write_text(DEVICE_TOML)
    r = run_strata("device", "config", "show", "--config", str(path), "--device-id", "d9",
                   env={"STRATA_DEVICE_THRESHOLD": "0.7"})
    assert r.returncode == 0, r.stderr
    assert re.search(rf'^fleet = "f1" +# file {re.escape(str(path))}$', r.stdout, re.M)
    assert re.search(rf'^trust = \["{re.escape(str(tmp_path))}/keys/fleet.pub"\]', r.stdout, re.M)
    assert re.search(r'^device_id = "d9" +# flag --device-id$', r.stdout, re.M)
    assert re.search(r"^threshold = 0.7 +# env STRATA_DEVICE_THRESHOLD$", r.stdout, re.M)
    assert re.search(r"^budget_ms = 50.0 +# file ", r.stdout, re.M)


def test_device_config_errors_are_one_line(tmp_path: Path) -> None:
    generate_keypair(tmp_path / "keys", name="fleet")
    path = tmp_path / "device.toml"
    path.write_text(DEVICE_TOML.replace("budget_ms = 50", "budget = 50"))
    for argv in (["device", "config", "show", "--config", str(path)],
                 ["device", "run", "--env", "CartPole-v1", "--config", str(path)]):
        r = run_strata(*argv)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines() == [r.stderr.strip()]
        assert "unknown key decisions.budget; the keys of [decisions] are confidence, threshold, budget_ms" in r.stderr
