#!/usr/bin/env bash
# Build, HERE (no GPU needed), the bundle bench/device_check.sh runs on a GPU machine, under bench/gpu_bundle/:
#   site/       trimmed tvm runtime (no libtvm_compiler.so, tvm-field-guide.md §6.3) + tvm_ffi + gguf + nextn sources
#   lib/        libcudart.so.13 (libtvm_runtime_cuda.so needs it; the driver must be R580+ for CUDA 13)
#   art/        CUDA artifacts of the BF16 fixture (sm_80,sm_90,sm_120 + PTX), with its GGUF beside it: bf16-cuda
#               (decode / draft steps replayed as CUDA graphs) and bf16-cuda-nograph (--no-cuda-graph)
#   refs/       reference.json + the reference logits device_check compares against
# usage: bash bench/make_gpu_bundle.sh [ARCHES]     (then carry bench/gpu_bundle; stays under 64 MB)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/../venv/bin/python}; [ -x "$PY" ] || PY=$ROOT/.venv/bin/python
ARCHES=${1:-sm_80,sm_90,sm_120}
FIX=${FIX:-$ROOT/../shared/fixtures/tiny-glm4moe}
B=$ROOT/bench/gpu_bundle; rm -rf "$B"; mkdir -p "$B/site/nextn" "$B/lib" "$B/art" "$B/refs"
SITE=$("$PY" -c "import tvm, os; print(os.path.dirname(os.path.dirname(tvm.__file__)))")
cp -r "$SITE/tvm" "$SITE/tvm_ffi" "$SITE/gguf" "$SITE/yaml" "$B/site/"   # gguf imports yaml
cp -r "$SITE"/apache_tvm_ffi-*.dist-info "$B/site/" 2>/dev/null || true
[ -f "$SITE/typing_extensions.py" ] && cp "$SITE/typing_extensions.py" "$B/site/"
find "$B/site" -name "__pycache__" -type d -prune -exec rm -rf {} +
rm -rf "$B/site/tvm/3rdparty" "$B/site/tvm/include" "$B/site/tvm/src" "$B/site/tvm/web" \
       "$B/site/tvm/lib/libtvm_compiler.so" "$B/site/tvm/lib/libtvm_runtime_extra.so" \
       "$B/site/tvm_ffi/3rdparty" "$B/site/tvm_ffi/include" "$B/site/tvm_ffi/src" "$B/site/tvm_ffi/cython" \
       "$B/site/tvm_ffi/stub" "$B/site/tvm_ffi/share" "$B/site/tvm_ffi/cmake"
for p in common compiler runtime schedules; do cp -r "$ROOT/$p" "$B/site/nextn/$p"; done
find "$B/site/nextn" -name "__pycache__" -type d -prune -exec rm -rf {} +
CUDART=$("$PY" -c "from nextn.compiler.gpu_build import _find_cudart; print(_find_cudart())")
cp -L "$CUDART" "$B/lib/libcudart.so.13"
cp "$FIX/tiny-glm4moe-BF16.gguf" "$B/art/"
"$PY" -m nextn.runtime.cli compile "$B/art/tiny-glm4moe-BF16.gguf" --target cuda --arch "$ARCHES" -o "$B/art/bf16-cuda"
"$PY" -m nextn.runtime.cli compile "$B/art/tiny-glm4moe-BF16.gguf" --target cuda --arch "$ARCHES" --no-cuda-graph \
  -o "$B/art/bf16-cuda-nograph"
for a in bf16-cuda bf16-cuda-nograph; do "$PY" -m nextn.compiler.check_device_code "$B/art/$a" >/dev/null; done
cp "$FIX/reference.json" "$B/refs/"
"$PY" - "$FIX/reference_logits.npz" "$B/refs/reference_logits.npz" <<'PYEOF'
import sys, numpy as np
z = np.load(sys.argv[1])
keep = {k: z[k] for k in z.files if k.endswith("last_logits") or k.startswith("code-short/")}
np.savez_compressed(sys.argv[2], **keep)
PYEOF
cp "$ROOT/bench/device_check.py" "$ROOT/bench/device_check.sh" "$B/"
du -sh "$B"
