#!/usr/bin/env bash
# Build, HERE (no GPU needed), the runtime bundle a GPU machine runs the device check from:
#   bench/gpu_bundle/ and bench/gpu_bundle.tar.xz (the one file a device run carries; the size it and the
#   repository's tracked files come to is printed, and the build fails above the 64 MiB a run may carry).
# Contents and hosts: bench/bundle.py. The real-width artifacts read glm45air-1-a0.1.gguf and glm45air-4-a0.1.gguf from
# bench/realwidth_files.py's folder ($NEXTN_REALWIDTH, default ~/.cache/nextn-realwidth; made there when missing),
# compiled under the heavy-bench lock ($NEXTN_HEAVY_LOCK, default in that folder). usage: bash bench/make_gpu_bundle.sh [--host h200|here] [--arch sm_90] [--checks ...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}; [ -x "$PY" ] || PY=python3
LOCK=${NEXTN_HEAVY_LOCK:-${NEXTN_REALWIDTH:-$HOME/.cache/nextn-realwidth}/heavy.lock}
mkdir -p "$(dirname "$LOCK")"
exec flock "$LOCK" "$PY" "$ROOT/bench/bundle.py" "$@"
