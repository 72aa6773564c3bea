#!/usr/bin/env bash
# Regenerate cloud/replay/_proto/ from cloud/replay/proto/strata_replay.proto with the grpcio-tools of .venv.
# The output is checked in; tests/cloud/test_replay_grpc.py asserts this script reproduces it.
# Usage: scripts/gen_replay_proto.sh [OUT_DIR]   (default: cloud/replay/_proto)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo/cloud/replay/_proto}"
python="${PYTHON:-$repo/.venv/bin/python}"
mkdir -p "$out"
cd "$repo/cloud/replay/proto"
"$python" -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    strata_replay.proto
# protoc writes `import strata_replay_pb2` (a top-level module); make it relative for the subpackage.
sed -i -E 's/^import (strata_[a-z_]+_pb2) as /from . import \1 as /' "$out/strata_replay_pb2_grpc.py"
# The generated servicer code is untyped; mypy follows imports into it even though pyproject excludes
# the folder, so the file itself says so.
sed -i '1i # mypy: ignore-errors' "$out/strata_replay_pb2_grpc.py"
printf '"""Generated gRPC code of the replay service; regenerate with scripts/gen_replay_proto.sh, never edit."""\n' \
    > "$out/__init__.py"
