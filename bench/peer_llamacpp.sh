#!/usr/bin/env bash
# Build the peer -- llama.cpp as vendored in the llama-cpp-python==0.3.36 sdist -- once into a cache folder and print
# one `name=path` line per tool on stdout (progress goes to stderr), so bench scripts can parse it:
#
#   bench/peer_llamacpp.sh            # builds on the first run (~15+ min on 2 cores), later runs only print paths
#   bench/peer_llamacpp.sh | sed -n 's/^llama-bench=//p'                # the path of one tool
#   bench/peer_llamacpp.sh --source   # only fetch and extract the sdist; prints `source=<llama.cpp tree>`
#
# CPU only: CMake Release, GGML_NATIVE (this machine's ISA), LLAMA_CURL=OFF, no GPU backends, static libraries so the
# binaries do not depend on the build tree. Nothing is downloaded but the sdist (the web UI is not fetched: the server
# still serves its API). Environment:
#   NEXTN_PEER_DIR   cache folder (default ~/.cache/nextn-peer); binaries land in $NEXTN_PEER_DIR/bin
#   NEXTN_PEER_JOBS  parallel compile jobs (default: all cores); the build runs under `nice`
#   NEXTN_PEER_SDIST a local llama-cpp-python-0.3.36 sdist (.tar.gz) to use instead of `pip download`
#   NEXTN_PEER_AMX   1: keep ggml's AMX kernels on a CPU that has AMX-INT8 (default: left out, see below)
# A rebuild happens only when a tool is missing or the recorded build settings differ; `--rebuild` forces one.
set -euo pipefail

VERSION=0.3.36
DIR=${NEXTN_PEER_DIR:-$HOME/.cache/nextn-peer}
BIN=$DIR/bin
TOOLS=(llama-bench llama-completion llama-speculative-simple llama-server llama-quantize llama-gguf-split)
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_SYCL=OFF -DGGML_OPENCL=OFF
)
# ggml's AMX matmul (ggml-cpu/amx/mmq.cpp, compiled in by -march=native where the CPU has AMX-INT8) takes llama.cpp's
# prompt batches on such a CPU; in this workplace's VMs it dies with SIGSEGV at its first ldtilecfg on a worker
# thread (llama-bench -p 64 exits 139; tg does not use it), so it is left out unless NEXTN_PEER_AMX=1. Without it
# the same build runs ggml's AVX-512 VNNI kernels. GCC lets an explicit -mno-amx-* win over -march=native.
if [[ ${NEXTN_PEER_AMX:-0} != 1 ]] && grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    CMAKE_FLAGS+=("-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
fi
STAMP="llama-cpp-python==$VERSION ${CMAKE_FLAGS[*]}"

say() { echo "peer_llamacpp: $*" >&2; }

built() {
    [[ -f $BIN/.stamp && "$(cat "$BIN/.stamp")" == "$STAMP" ]] || return 1
    local t
    for t in "${TOOLS[@]}"; do [[ -x $BIN/$t ]] || return 1; done
}

# Download (once) and extract the sdist's llama.cpp tree; sets TREE.
fetch_source() {
    local src=$DIR/src sdist
    mkdir -p "$src"
    sdist=${NEXTN_PEER_SDIST:-}
    if [[ -z $sdist ]]; then
        sdist=$src/llama_cpp_python-$VERSION.tar.gz
        if [[ ! -f $sdist ]]; then
            say "downloading the llama-cpp-python==$VERSION sdist"
            python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$src" >&2
        fi
    fi
    [[ -f $sdist ]] || { say "no sdist at $sdist (expected llama_cpp_python-$VERSION.tar.gz)"; exit 1; }
    TREE=$src/llama_cpp_python-$VERSION/vendor/llama.cpp
    if [[ ! -f $TREE/CMakeLists.txt ]]; then
        say "extracting $sdist"
        tar -xzf "$sdist" -C "$src" "llama_cpp_python-$VERSION/vendor/llama.cpp"
    fi
}

build() {
    local build=$DIR/build
    fetch_source
    say "configuring $TREE -> $build"
    cmake -S "$TREE" -B "$build" -G Ninja "${CMAKE_FLAGS[@]}" >&2
    say "building ${TOOLS[*]} (nice, ${NEXTN_PEER_JOBS:-$(nproc)} jobs)"
    nice -n 10 cmake --build "$build" -j "${NEXTN_PEER_JOBS:-$(nproc)}" --target "${TOOLS[@]}" >&2
    mkdir -p "$BIN"
    local t
    for t in "${TOOLS[@]}"; do install -m 755 "$build/bin/$t" "$BIN/$t"; done
    printf '%s' "$STAMP" > "$BIN/.stamp"
    say "built into $BIN"
}

if [[ ${1:-} == --source ]]; then
    mkdir -p "$DIR"
    exec 9> "$DIR/.build.lock"
    flock 9
    fetch_source
    echo "source=$TREE"
    exit 0
fi
if [[ ${1:-} == --rebuild ]]; then rm -f "$BIN/.stamp"; fi
if ! built; then
    mkdir -p "$DIR"
    # One build at a time per cache folder; a second caller waits and then finds the tools built.
    exec 9> "$DIR/.build.lock"
    flock 9
    built || build
fi
for t in "${TOOLS[@]}"; do echo "$t=$BIN/$t"; done
