"""Deploy pipeline costs against a moto server: first apply vs the no-change re-apply, and the package caches.

Baselines in the same run: a re-apply that rebuilds the dependency tree with pip and re-zips the package
every time (what a tool without the requirement-hash cache and the zip fingerprint pays), against
strata's cached path. `--quick` uses a one-wheel requirement set; the full run builds numpy, gymnasium
and cryptography for Lambda (needs the package index) and reports the real artifact's sizes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small requirement set, 3 repeats (< 1 minute)")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # moto's werkzeug access log
    from moto.server import ThreadedMotoServer

    from infra import DeployConfig, apply, plan
    from infra._package import build_dependencies, build_package

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server._server.server_address[1]  # ThreadedMotoServer exposes the port only here (MEASURED.md)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    repeats = 3 if args.quick else 5
    requirements = ("six==1.17.0",) if args.quick else ("numpy", "gymnasium", "cryptography")
    root = Path(tempfile.mkdtemp(prefix="strata-bench-infra-"))
    # Package a frozen copy of the sources: the shared working tree changes under a minutes-long run.
    repo = Path(__file__).resolve().parent.parent
    for package in ("functions", "device"):
        shutil.copytree(repo / package, root / "src" / package, ignore=shutil.ignore_patterns("__pycache__"))
    rows: dict[str, list[float]] = {k: [] for k in ("first_apply", "noop_apply", "noop_plan", "pip_cold",
                                                    "deps_cached", "zip_fresh", "zip_reused")}
    changes_second: list[int] = []
    artifact = None
    for i in range(repeats):
        cache = root / f"cache{i}"
        t = time.perf_counter()
        deps = build_dependencies(requirements, cache_dir=cache, architecture="x86_64")
        rows["pip_cold"].append(time.perf_counter() - t)
        t = time.perf_counter()
        build_dependencies(requirements, cache_dir=cache, architecture="x86_64")
        rows["deps_cached"].append(time.perf_counter() - t)
        t = time.perf_counter()
        artifact = build_package(deps, root / f"zip{i}" / "f.zip", what="bench", source_dir=root / "src")
        rows["zip_fresh"].append(time.perf_counter() - t)
        t = time.perf_counter()
        build_package(deps, root / f"zip{i}" / "f.zip", what="bench", source_dir=root / "src")
        rows["zip_reused"].append(time.perf_counter() - t)

        config = DeployConfig(stage=f"bench{i}", requirements=requirements, cache_dir=str(cache),
                              source_dir=str(root / "src"),
                              edge_nodes=("n1", "n2"), reserved_concurrency=5)
        state = root / "state"
        t = time.perf_counter()
        apply(config, state_dir=state)
        rows["first_apply"].append(time.perf_counter() - t)
        t = time.perf_counter()
        changes_second.append(len(apply(config, state_dir=state).changes))
        rows["noop_apply"].append(time.perf_counter() - t)
        t = time.perf_counter()
        plan(config, state_dir=state)
        rows["noop_plan"].append(time.perf_counter() - t)
    server.stop()
    shutil.rmtree(root, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in rows.items()}
    uncached_reapply = med["noop_apply"] + med["pip_cold"] + med["zip_fresh"]
    print(f"infra deploy pipeline vs moto ({repeats} repeats, medians; requirements: {' '.join(requirements)})")
    print(f"{'step':<34}{'seconds':>10}")
    for label, key in [("first apply (12 resources)", "first_apply"), ("second apply (no change)", "noop_apply"),
                       ("plan (no change)", "noop_plan"), ("pip build, cold", "pip_cold"),
                       ("dependency tree, cache hit", "deps_cached"), ("zip, fresh", "zip_fresh"),
                       ("zip, reused (fingerprint)", "zip_reused")]:
        print(f"{label:<34}{med[key]:>10.3f}")
    print(f"{'baseline: re-apply rebuilding all':<34}{uncached_reapply:>10.3f}")
    assert artifact is not None
    figures = {
        "benchmark": "infra_deploy", "quick": args.quick, "repeats": repeats,
        "first_apply_s": round(med["first_apply"], 3), "noop_apply_s": round(med["noop_apply"], 3),
        "noop_plan_s": round(med["noop_plan"], 3), "noop_apply_changes": max(changes_second),
        "pip_cold_s": round(med["pip_cold"], 3), "deps_cache_hit_s": round(med["deps_cached"], 4),
        "zip_fresh_s": round(med["zip_fresh"], 3), "zip_reused_s": round(med["zip_reused"], 4),
        "reapply_vs_uncached_ratio": round(med["noop_apply"] / uncached_reapply, 3),
        "package_zipped_mb": round(artifact.zipped_bytes / 2**20, 2),
        "package_unzipped_mb": round(artifact.unzipped_bytes / 2**20, 2),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
