#!/usr/bin/env bash
# Regenerate functions/_proto/ from functions/proto/*.proto with the grpcio-tools of .venv.
# The output is checked in; tests/functions/test_envservice_proto.py asserts this script reproduces it.
# Usage: scripts/gen_proto.sh [OUT_DIR]   (default: functions/_proto)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo/functions/_proto}"
python="${PYTHON:-$repo/.venv/bin/python}"
mkdir -p "$out"
cd "$repo/functions/proto"
"$python" -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    strata_env.proto strata_params.proto
# protoc writes `import strata_env_pb2` (a top-level module); make it a relative import so the code
# works as the functions._proto subpackage.
for f in "$out"/*_pb2_grpc.py; do
    sed -i -E 's/^import (strata_[a-z_]+_pb2) as /from . import \1 as /' "$f"
    sed -i '1i # mypy: ignore-errors' "$f"  # the grpc plugin writes untyped code; the _pb2.pyi stubs are typed
done
for f in "$out"/*_pb2.pyi; do
    sed -i '1i # mypy: ignore-errors' "$f"  # protoc's stubs leave Mapping unparametrised (strict mypy flags it)
done
printf '"""Generated gRPC code for strata; regenerate with scripts/gen_proto.sh, never edit."""\n' > "$out/__init__.py"
