#!/usr/bin/env bash
# Gymnasium's own tests/vector with AsyncVectorEnv, then with cloud.SharedMemoryVectorEnv swapped in; prints both
# counts side by side and the tests that pass with AsyncVectorEnv but not with the pool (exit 1 if any).
#   scripts/gymnasium_conformance.sh PATH_TO_GYMNASIUM_CHECKOUT [--tests tests/vector]
# The checkout must be Gymnasium at the release strata pins (1.4.0: the commit "Update to v1.4.0"); the
# package-index sdist has no tests. Run from anywhere; uses the repository's .venv unless PYTHON is set.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 PATH_TO_GYMNASIUM_CHECKOUT [--tests tests/vector]" >&2
    exit 2
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
exec "$python" "$repo/scripts/gymnasium_conformance.py" "$@"
