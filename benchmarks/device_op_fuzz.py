"""Op fuzz: `device.NumpyExecutor` against onnxruntime on generated graphs for every operator it claims.

For each operator in `device.supported_operators()`, ``--cases`` graphs from `tests.device._opcases` (random
shapes, attributes, broadcasting, run-time vs initializer inputs, the op alone/first/middle/last, NaN/inf/-0 in
float inputs), each run by the executor and by onnxruntime (the baseline and oracle, same run, same inputs). Then
ONNX's own node tests for the claimed operators (``onnx.backend.test.case.node``), with their expected outputs,
and ``--chains`` small graphs of 2-6 chained operators (`make_chain_case`).

Counted per outcome: ``match``; ``match (NaN slices: propagated)`` (ArgMax/ArgMin/ReduceMax/ReduceMin of a slice
holding NaN, which onnxruntime does not define, see `device._executor`); ``refused: <reason>`` (the executor
refused the graph at load); ``invalid`` (onnxruntime itself rejects the generated graph); ``failure`` (any other
result: a crash or a different answer). Goal: 0 failures.

Usage (from the repository root, so the generator in ``tests/`` imports):
``python -m benchmarks.device_op_fuzz [--quick] [--cases N] [--seed S]``; the last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
import warnings

import numpy as np

from device import supported_operators
from tests.device._opcases import (
    Mismatch,
    RngDraw,
    check,
    check_node_test,
    make_case,
    make_chain_case,
    onnx_node_tests,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="25 cases per operator and no node tests (< 1 min)")
    parser.add_argument("--cases", type=int, default=250, help="generated graphs per operator")
    parser.add_argument("--seed", type=int, default=0, help="first seed; case i of op k uses seed + 100003*k + i")
    parser.add_argument("--chains", type=int, default=2000, help="small graphs of 2-6 chained operators")
    args = parser.parse_args()
    cases = 25 if args.quick else args.cases
    warnings.simplefilter("ignore")  # numpy's "invalid value" warnings on NaN/inf inputs are the point here
    start = time.perf_counter()
    per_op: dict[str, collections.Counter[str]] = {}
    failures: list[str] = []
    for k, op in enumerate(supported_operators()):
        counts: collections.Counter[str] = collections.Counter()
        for i in range(cases):
            case = make_case(op, RngDraw(args.seed + 100003 * k + i))
            try:
                outcome = check(case)
            except Mismatch as exc:
                outcome = "failure"
                failures.append(str(exc).splitlines()[0])
            except Exception as exc:  # any crash is a failure to count, not to stop on
                outcome = "failure"
                failures.append(f"{case.desc}: {type(exc).__name__}: {exc}")
            counts[outcome] += 1
        per_op[op] = counts
    totals: collections.Counter[str] = collections.Counter()
    for counts in per_op.values():
        totals.update(counts)
    chains: collections.Counter[str] = collections.Counter()
    for i in range(100 if args.quick else args.chains):
        case = make_chain_case(RngDraw(args.seed + 7_000_001 + i))
        try:
            chains[check(case)] += 1
        except Exception as exc:  # any crash or mismatch is a failure to count, not to stop on
            chains["failure"] += 1
            failures.append(f"{case.desc}: {type(exc).__name__}: {str(exc).splitlines()[0]}")

    node: collections.Counter[str] = collections.Counter()
    if not args.quick:
        with np.errstate(all="ignore"):
            for test in onnx_node_tests(supported_operators()):
                try:
                    node[check_node_test(test)] += 1
                except Mismatch as exc:
                    node["failure"] += 1
                    failures.append(str(exc).splitlines()[0])
    elapsed = time.perf_counter() - start

    print(f"{'operator':<20} {'cases':>6} {'match':>6} {'NaN-prop':>8} {'refused':>8} {'invalid':>8} {'fail':>5}")
    for op, counts in per_op.items():
        refused = sum(v for key, v in counts.items() if key.startswith("refused"))
        print(f"{op:<20} {sum(counts.values()):>6} {counts['match']:>6} "
              f"{counts['match (NaN slices: propagated)']:>8} {refused:>8} {counts['invalid']:>8} "
              f"{counts['failure']:>5}")
    refusals = {key[len("refused: "):]: v for key, v in sorted((totals + node).items()) if key.startswith("refused")}
    print("refusals by reason:")
    for reason, n in sorted(refusals.items(), key=lambda kv: -kv[1]):
        print(f"  {n:>5}  {reason}")
    for line in failures[:20]:
        print("FAILURE", line)
    generated = {
        "cases": sum(totals.values()), "operators": len(per_op), "match": totals["match"],
        "match_nan_propagated": totals["match (NaN slices: propagated)"], "invalid": totals["invalid"],
        "refused": sum(v for key, v in totals.items() if key.startswith("refused")), "failures": totals["failure"],
    }
    small_graphs = {"cases": sum(chains.values()), "match": chains["match"], "invalid": chains["invalid"],
                    "failures": chains["failure"],
                    "refused": sum(v for key, v in chains.items() if key.startswith("refused"))}
    print(f"small graphs (2-6 chained operators): {small_graphs}")
    node_tests = {"cases": sum(node.values()), "match": node["match"], "failures": node["failure"],
                  "refused": sum(v for key, v in node.items() if key.startswith("refused"))}
    print(json.dumps({"benchmark": "device_op_fuzz", "quick": args.quick, "cases_per_operator": cases,
                      "seed": args.seed, "generated": generated, "small_graphs": small_graphs,
                      "onnx_node_tests": node_tests,
                      "refusals_by_reason": refusals, "elapsed_s": round(elapsed, 1),
                      "goals": {"zero_failures": generated["failures"] + node_tests["failures"]
                                + small_graphs["failures"] == 0}},
                     sort_keys=True))


if __name__ == "__main__":
    main()
