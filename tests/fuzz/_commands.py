"""What the fuzz harness and the census run each command on: a base command line that gets past its required options.

Each option is then given hostile values on top of it, so a command's deeper checks (a config file's values, a
run dir's checkpoint) are reached too. ``{tag}`` is a fixture of that content (`tests.fuzz._fixtures`); ``{out-dir}``
and ``{out-file}`` are fresh output paths in the case's sandbox.
"""

from __future__ import annotations

import re

try:
    from tests.fuzz._values import Places
except ImportError:  # the census imports this module from its own folder
    from _values import Places  # type: ignore[no-redef]

BASELINES: dict[str, list[str]] = {
    "demo": ["--total-steps", "512", "--switch-at", "256", "--edge-nodes", "1", "--devices", "1",
             "--out", "{out-dir}"],
    "train": ["--env", "CartPole-v1", "--run-dir", "{out-dir}", "--total-steps", "256", "--num-envs", "2",
              "--num-steps", "64", "--env-mode", "sync", "--update-epochs", "1", "--confirm-episodes", "0",
              "--preset", "none"],
    "switch": ["{run-dir}", "--to", "sync", "--timeout", "1"],
    "status": ["{run-dir}"],
    "runs": ["--root", "{fixtures}"],
    "export": ["--run", "{run-dir}", "--out", "{out-file}"],
    "keys generate": ["--out", "{out-dir}"],
    "bundle inspect": ["{bundle}"],
    "bundle verify": ["{bundle}", "--trust", "{public-key}"],
    "device run": ["--env", "CartPole-v1", "--steps", "5", "--policy-wait-s", "0.5", "--trust", "{public-key}",
                   "--broker", "mqtt://127.0.0.1:9"],
    "device config show": [],
    "device config check": ["--trust", "{public-key}"],
    "device export-c": ["--bundle", "{device-bundle}", "--out", "{out-dir}", "--trust", "{public-key}"],
    "publish": ["{bundle}", "--broker", "mqtt://127.0.0.1:9", "--fleet", "fleet", "--timeout", "1"],
    "edge run": ["--config", "{edge-config}"],
    "edge config show": ["--config", "{edge-config}"],
    "edge config check": ["--config", "{edge-config}"],
    "edge ingest": ["--broker", "mqtt://127.0.0.1:9", "--fleet", "fleet", "--spool", "{out-file}", "--spaces",
                    "{spaces}"],
    "edge install": ["--kit", "{kit}", "--prefix", "{out-dir}", "--dry-run"],
    "edge uninstall": ["--node", "node-1", "--prefix", "{out-dir}"],
    "fleet": ["--broker", "mqtt://127.0.0.1:9", "--fleet", "fleet", "--wait", "0"],
    "broker config": ["--out", "{out-dir}", "--fleet", "fleet", "--nodes", "node-1"],
    "envs serve": ["--duration", "0.5", "--envs", "1"],
    "functions serve": ["--port", "0"],
    "infra plan": ["--stage", "dev", "--region", "us-east-1"],
    "infra apply": ["--stage", "dev", "--region", "us-east-1", "--dry-run"],
    "infra destroy": ["--stage", "dev", "--region", "us-east-1", "--dry-run"],
    "infra rollback": ["--stage", "dev", "--region", "us-east-1", "--yes"],
    "infra template": ["--out", "{out-file}"],
    "infra k8s render": ["--out", "{out-dir}"],
    "envs health": ["127.0.0.1:9", "--timeout", "0.5"],
    "certs": ["--out", "{out-dir}", "--role", "env=127.0.0.1"],
}


def fill(argv: list[str], places: Places) -> list[str]:
    """`argv` with its ``{tag}`` placeholders replaced by the sandbox's paths."""
    out = []
    for word in argv:
        match = re.fullmatch(r"\{([a-z-]+)\}", word)
        if match:
            tag = match.group(1)
            special = {"out-dir": places.root / "out-dir", "out-file": places.root / "out.file",
                       "fixtures": places.fixtures_root}
            path = special.get(tag) or places.fixture(tag)
            assert path is not None, tag
            word = str(path)
        out.append(word)
    return out
