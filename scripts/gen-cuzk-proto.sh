#!/usr/bin/env bash
# Regenerates cuzkd/cuzk/proving_pb2.py and .pyi from cuzkd/cuzk/proving.proto with grpcio-tools
# (the dev extra pins its version: another protoc writes other bytes). Usage:
#   scripts/gen-cuzk-proto.sh [OUT_DIR]   (default: the repository root, i.e. in place)
# tests/test_cuzk_proto.py runs it into a temporary folder and compares with the committed files.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
python="${PYTHON:-python3}"
mkdir -p "$out"
cd "$root"
"$python" -m grpc_tools.protoc -I . --python_out="$out" --pyi_out="$out" cuzkd/cuzk/proving.proto
