"""Run Gymnasium's own ``tests/vector`` twice, with AsyncVectorEnv and with `cloud.SharedMemoryVectorEnv` in its place.

Usage: ``scripts/gymnasium_conformance.sh PATH_TO_GYMNASIUM_CHECKOUT`` (a clone of Farama-Foundation/Gymnasium at
the release strata pins; its package-index sdist has no tests). The swap: this file is also a pytest plugin
(``-p gymnasium_conformance``); with ``STRATA_CONFORMANCE_SWAP=1`` it replaces ``gymnasium.vector.AsyncVectorEnv``
(and the name in ``gymnasium.vector.async_vector_env``) by the pool before the test modules import it, so every
``AsyncVectorEnv(...)`` in the suite, and ``gymnasium.make_vec(..., vectorization_mode="async")``, builds the pool
with the same arguments. Each test's outcome is appended to a JSON-lines file as it finishes; a test that kills
the interpreter is recorded as ``crashed`` and the run resumes after it. Prints per-file counts for both runs,
the tests that pass with AsyncVectorEnv and fail with the pool, and one JSON line; exits 1 if there are any.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SWAP_ENV = "STRATA_CONFORMANCE_SWAP"
LOG_ENV = "STRATA_CONFORMANCE_LOG"


# -- the pytest plugin (runs inside the pytest process) -----------------------------------------------------


def pytest_configure(config: Any) -> None:
    """Swap the pool in for AsyncVectorEnv before any test module is imported."""
    if os.environ.get(SWAP_ENV) != "1":
        return
    import gymnasium.vector
    import gymnasium.vector.async_vector_env

    from cloud.rollout._shm_pool import SharedMemoryVectorEnv

    gymnasium.vector.AsyncVectorEnv = SharedMemoryVectorEnv
    gymnasium.vector.async_vector_env.AsyncVectorEnv = SharedMemoryVectorEnv  # type: ignore[misc]


_outcomes: dict[str, str] = {}


def _log(record: dict[str, str]) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    """Mark the test as started: if the interpreter dies now, the driver knows which test killed it."""
    _log({"start": nodeid})


def pytest_runtest_logreport(report: Any) -> None:
    """Fold the setup/call/teardown reports of one test into one outcome."""
    current = _outcomes.get(report.nodeid, "passed")
    if report.failed:
        current = "failed"
    elif report.skipped and current != "failed":
        current = "skipped"
    _outcomes[report.nodeid] = current


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    """Write the test's outcome."""
    _log({"test": nodeid, "outcome": _outcomes.get(nodeid, "passed")})


# -- the driver ------------------------------------------------------------------------------------------------


def _pytest(checkout: Path, swap: bool, args: list[str], log: Path | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), str(REPO), str(HERE), env.get("PYTHONPATH", "")])
    env[SWAP_ENV] = "1" if swap else "0"
    if log is not None:
        env[LOG_ENV] = str(log)
    cmd = [sys.executable, "-m", "pytest", "-p", "gymnasium_conformance", "-p", "no:cacheprovider", "-q"]
    cmd += ["--rootdir", str(checkout), "--timeout", "120", *args]
    return subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)


def collect(checkout: Path, target: str, swap: bool) -> list[str]:
    """Node ids of the suite (a parametrised test named after its class gets the pool's name when swapped)."""
    done = _pytest(checkout, swap, ["--collect-only", target], None)
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line]
    if not ids:
        raise SystemExit(f"gymnasium_conformance: collected no tests under {checkout / target}:\n{done.stdout[-2000:]}")
    return ids


def run_suite(checkout: Path, ids: list[str], swap: bool) -> dict[str, str]:
    """Outcome of every test id; reruns the rest after a crash."""
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(len(ids) + 1):
            remaining = [i for i in ids if i not in results]
            if not remaining:
                break
            log = Path(tmp) / f"log{attempt}.jsonl"
            argfile = Path(tmp) / f"args{attempt}.txt"
            argfile.write_text("\n".join(remaining) + "\n")
            done = _pytest(checkout, swap, [f"@{argfile}"], log)
            started = None
            progressed = False
            for line in log.read_text().splitlines() if log.exists() else []:
                rec = json.loads(line)
                if "start" in rec:
                    started = rec["start"]
                else:
                    results[rec["test"]] = rec["outcome"]
                    progressed = True
                    started = None
            if started is not None:
                results[started] = "crashed"
                continue
            if not progressed:
                for i in remaining:
                    results[i] = "not run"
                print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                break
    return results


def _as_async(node_id: str) -> str:
    return node_id.replace("SharedMemoryVectorEnv", "AsyncVectorEnv")


def main() -> None:
    """Run the suite both ways and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a Gymnasium checkout (its tests/ directory is used)")
    parser.add_argument("--tests", default="tests/vector", help="the suite inside the checkout (default tests/vector)")
    parser.add_argument("--show", type=int, default=200, help="list at most this many regressions")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    if not (checkout / args.tests).is_dir():
        print(
            f"gymnasium_conformance: {checkout / args.tests} is not a directory; pass a Gymnasium checkout",
            file=sys.stderr,
        )
        raise SystemExit(2)
    ids = collect(checkout, args.tests, swap=False)
    pool_ids = collect(checkout, args.tests, swap=True)
    ref = run_suite(checkout, ids, swap=False)
    # Compare under AsyncVectorEnv's ids: `test_x[SharedMemoryVectorEnv]` is `test_x[AsyncVectorEnv]` swapped.
    pool = {_as_async(i): outcome for i, outcome in run_suite(checkout, pool_ids, swap=True).items()}
    for i in ids:
        pool.setdefault(i, "missing")

    files = sorted({i.split("::")[0] for i in ids})
    print(f"{'file':<52} {'AsyncVectorEnv pass/fail/skip':>30} {'SharedMemoryVectorEnv pass/fail/skip/crash':>44}")
    for f in files:
        a = Counter(ref[i] for i in ids if i.startswith(f + "::"))
        p = Counter(pool[i] for i in ids if i.startswith(f + "::"))
        print(
            f"{f:<52} {a['passed']:>14}/{a['failed'] + a['crashed']}/{a['skipped']:<13} "
            f"{p['passed']:>22}/{p['failed']}/{p['skipped']}/{p['crashed']}"
        )
    regressions = [i for i in ids if ref[i] == "passed" and pool[i] not in ("passed",)]
    a_all, p_all = Counter(ref.values()), Counter(pool[i] for i in ids)
    print(f"{'total':<52} {a_all['passed']:>14}/{a_all['failed'] + a_all['crashed']}/{a_all['skipped']:<13} "
          f"{p_all['passed']:>22}/{p_all['failed']}/{p_all['skipped']}/{p_all['crashed']}")
    print(f"\npass with AsyncVectorEnv, not with SharedMemoryVectorEnv: {len(regressions)}")
    for i in regressions[: args.show]:
        print(f"  {pool[i]:<8} {i}")
    print(
        json.dumps(
            {
                "benchmark": "gymnasium_conformance",
                "tests": len(ids),
                "async": dict(a_all),
                "pool": dict(p_all),
                "regressions": len(regressions),
                "pool_crashes": p_all["crashed"],
                "regressed": regressions,
            }
        )
    )
    raise SystemExit(1 if regressions else 0)


if __name__ == "__main__":
    main()
