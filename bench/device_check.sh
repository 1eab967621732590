#!/usr/bin/env bash
# On the GPU machine: unpack the bundle bench/make_gpu_bundle.sh built (bench/gpu_bundle.tar.xz, carried with the
# repository) in place, then run its staged device check (python3 + an NVIDIA R580+ driver are all it needs there).
# Details land in $OUT (default ./device_check_out): device_check.json after every stage, the log; the table is
# printed last. usage: bash bench/device_check.sh [--device cuda:0] [--quick] [--only STAGE,...]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/bench/gpu_bundle
if [ ! -f "$B/bundle.json" ]; then
  [ -f "$B.tar.xz" ] || { echo "device_check: no bundle (run bench/make_gpu_bundle.sh on a build machine first)" >&2; exit 1; }
  python3 - "$B.tar.xz" "$ROOT/bench" <<'PY' || exit 1
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:   # our own archive; it holds relative links into the repository
    t.extractall(sys.argv[2], **({"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}))
PY
fi
OUT=${OUT:-$PWD/device_check_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 "$B/run.py" device-check --out "$OUT" "$@" 2>&1 | tee "$OUT/device_check.log"
exit "${PIPESTATUS[0]}"
