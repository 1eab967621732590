#!/usr/bin/env bash
# Build, HERE (no GPU needed), the runtime bundle a GPU machine runs the device check from:
#   bench/gpu_bundle/ and bench/gpu_bundle.tar.xz (the one file a device run carries; the size it and the
#   repository's tracked files come to is printed, and the build fails above the 64 MiB a run may carry).
# Contents and hosts: bench/bundle.py. The real-width artifact reads /work/realwidth/glm45air-1.gguf (compiled
# under the shared lock). usage: bash bench/make_gpu_bundle.sh [--host h200|here] [--arch sm_90] [--checks ...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}; [ -x "$PY" ] || PY=python3
exec flock "${NEXTN_HEAVY_LOCK:-/work/realwidth/heavy.lock}" "$PY" "$ROOT/bench/bundle.py" "$@"
