#!/usr/bin/env bash
# On a GPU machine: correctness of the CUDA path vs the fixture references, greedy spec-on == spec-off, then
# decode tokens/s spec off / on, fraction of the copy-bandwidth floor, MTP speedup (table printed last).
# Builds nothing and needs no compiler: run it from the bundle that bench/make_gpu_bundle.sh builds on a
# build machine (python3 + numpy + an NVIDIA R580+ driver are all it needs on the GPU machine):
#   bash bench/gpu_bundle/device_check.sh [cuda:0]        # details in $OUT (default ./device_check_out)
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
[ -d "$D/site" ] || D=$D/gpu_bundle
[ -d "$D/site" ] || { echo "device_check: no bundle (run bench/make_gpu_bundle.sh on a build machine first)" >&2; exit 1; }
export PYTHONPATH=$D/site${PYTHONPATH:+:$PYTHONPATH} LD_LIBRARY_PATH=$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OUT=${OUT:-$PWD/device_check_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1 || true
# without CUDA graphs first (details in $OUT/nograph), then with them: the table printed last is the graph one
rc=0
python3 "$D/device_check.py" "$D/art/bf16-cuda-nograph" --model "$D/art/tiny-glm4moe-BF16.gguf" --refs "$D/refs" \
  --device "${1:-cuda:0}" --out "$OUT/nograph" 2>&1 | tee "$OUT/device_check_nograph.log" || rc=1
python3 "$D/device_check.py" "$D/art/bf16-cuda" --model "$D/art/tiny-glm4moe-BF16.gguf" --refs "$D/refs" \
  --device "${1:-cuda:0}" --out "$OUT" 2>&1 | tee "$OUT/device_check.log" || rc=1
exit $rc
