#!/usr/bin/env bash
# Regenerates the gRPC stubs committed under src/ctxd_client/_proto from ../../proto, so that
# `pip install` never needs codegen. Run it after every change to the proto (the test
# tests/test_stubs.py fails until you do). Needs the test extra: pip install -e '.[test]'.
#
#   ./generate.sh [OUT_DIR]      OUT_DIR defaults to src/ctxd_client/_proto
#   PYTHON=/path/to/python ./generate.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/src/ctxd_client/_proto}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
python="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cd "$here"
"$python" -m grpc_tools.protoc -I ../../proto \
    --python_out="$tmp" --grpc_python_out="$tmp" --pyi_out="$tmp" \
    ctxd/v1/ctxd.proto

# protoc writes `from ctxd.v1 import ctxd_pb2`, an absolute import of a package that does not
# exist here: make it relative to the package the stubs live in.
sed 's/^from ctxd\.v1 import ctxd_pb2 as /from . import ctxd_pb2 as /' \
    "$tmp/ctxd/v1/ctxd_pb2_grpc.py" >"$tmp/ctxd_pb2_grpc.py"
if ! grep -q '^from \. import ctxd_pb2 as ' "$tmp/ctxd_pb2_grpc.py"; then
    echo "generate.sh: the generated import was not found; update the sed above" >&2
    exit 1
fi
cp "$tmp/ctxd/v1/ctxd_pb2.py" "$tmp/ctxd/v1/ctxd_pb2.pyi" "$tmp/ctxd_pb2_grpc.py" "$out/"
