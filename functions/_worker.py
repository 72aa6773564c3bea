"""Entry point of a local-runtime worker process: apply Lambda's limits, then hand over to awslambdaric.

Run as ``python -m functions._worker HANDLER`` with ``AWS_LAMBDA_RUNTIME_API`` pointing at the
worker's Runtime API shim (see `functions._runtime`). The official runtime interface client then
polls ``/2018-06-01/runtime/invocation/next`` and posts ``/response`` or ``/error`` exactly as in Lambda.
"""

from __future__ import annotations

import os
import resource
import sys
import time


def main(argv: list[str]) -> None:
    """Set the address-space limit and the injected cold-start delay, then run awslambdaric's loop."""
    from functions._lifetime import watch_parent

    watch_parent()  # die with the runtime that started us, even when it is killed with SIGKILL
    limit = int(os.environ.pop("STRATA_RLIMIT_AS_BYTES", "0") or 0)
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    delay = float(os.environ.pop("STRATA_COLD_START_DELAY_S", "0") or 0)
    if delay > 0:
        time.sleep(delay)  # fault injection: a slow init (large package, heavy imports)
    from awslambdaric.__main__ import main as ric_main

    ric_main([argv[0], *argv[1:2]])


if __name__ == "__main__":
    main(sys.argv)
