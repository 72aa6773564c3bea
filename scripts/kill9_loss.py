"""What `kill -9` of a training run costs: updates (or SAC env steps) lost and processes left, per kind of run.

For each case, `--tries` times: start `strata train` in its own process group, wait until it has logged a few
updates and has a checkpoint on disk, SIGKILL the trainer (rank 0's launcher for hybrid), then count

    lost      the newest version in metrics.jsonl minus the version of the newest checkpoint (SAC: env steps;
              its metrics are logged every --log-every 25 steps, so the figure is a lower bound within 25)
    left      the trainer's descendants still running 30 s later (their parent-death watch has a 10 s grace)

Prints a table and ends with one JSON line.

    .venv/bin/python scripts/kill9_loss.py [--tries 3] [--cases colocated,decoupled+functions,hybrid,sac]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TINY = ["--num-envs", "2", "--num-steps", "16", "--update-epochs", "1", "--hidden-sizes", "16"]
CASES: dict[str, list[str]] = {
    "colocated": ["--env", "CartPole-v1", *TINY],
    "decoupled+functions": ["--env", "CartPole-v1", *TINY, "--modes", "decoupled", "functions",
                            "--fragment-steps", "16", "--phase-steps", "320"],
    "hybrid": ["--env", "CartPole-v1", *TINY, "--modes", "hybrid", "colocated", "--units", "2"],
    "sac": ["--algo", "sac", "--env", "Pendulum-v1", "--hidden-sizes", "16", "--batch-size", "16",
            "--learning-starts", "32", "--log-every", "25", "--replay", "local"],
}
WAIT_S = 300.0


def _children(root: int) -> dict[int, str]:
    """Live descendants of `root`: pid -> start time."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
            starts[int(entry.name)] = fields[19]
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def _alive(processes: dict[int, str]) -> list[int]:
    alive = []
    for pid, start in processes.items():
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z" and fields[19] == start:
            alive.append(pid)
    return alive


def _metrics_versions(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    versions = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError):  # a line torn by the kill
                versions.append(int(json.loads(line)["policy_version"]))
    return versions


def _checkpoint_version(run: Path) -> int | None:
    names = sorted(p.stem for p in (run / "checkpoints").glob("*.pt") if p.stem.isdigit())
    return int(names[-1]) if names else None


def one_try(case: str, work: Path, *, after: int) -> dict[str, Any]:
    """One run of `case`, killed after `after` logged updates and a checkpoint: what it lost and left."""
    run = work / "run"
    with (work / "out").open("w") as out, (work / "err").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cloud.cli", "train", "--total-steps", "100000000",
                                 "--run-dir", str(run), "--no-control", *CASES[case]], stdout=out, stderr=err,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while len(_metrics_versions(run)) < after or _checkpoint_version(run) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{case}: the run did not get going: {(work / 'err').read_text()[-800:]}")
            time.sleep(0.1)
        children = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30.0
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(children)
    for pid in left:  # leave nothing behind ourselves
        os.kill(pid, signal.SIGKILL)
    checkpoint = _checkpoint_version(run) or 0
    return {"lost": max(_metrics_versions(run)) - checkpoint, "left": len(left), "children": len(children)}


def main(argv: list[str] | None = None) -> int:
    """Run every case `--tries` times; print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            for i in range(args.tries):
                work = Path(tmp) / f"{case}-{i}"
                work.mkdir()
                # Kill at a different point each try: after 4, 7, 10 ... logged updates.
                results.setdefault(case, []).append(one_try(case, work, after=4 + 3 * i))
    print(f"{'case':<22} {'lost (each try)':<18} {'left (each try)':<16} unit")
    for case, tries in results.items():
        unit = "env steps" if case == "sac" else "updates"
        print(f"{case:<22} {' '.join(str(t['lost']) for t in tries):<18} "
              f"{' '.join(str(t['left']) for t in tries):<16} {unit}")
    print(json.dumps({"script": "kill9_loss", "tries": args.tries, "results": results,
                      "max_lost_updates": max((t["lost"] for c, ts in results.items() if c != "sac" for t in ts),
                                              default=None),
                      "max_lost_sac_steps": max((t["lost"] for t in results.get("sac", [])), default=None),
                      "processes_left": sum(t["left"] for ts in results.values() for t in ts)}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
