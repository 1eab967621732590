"""GPU targets on a build machine without a GPU: target objects, arch lists, and the toolchain set-up.

CUDA (docs/design.md "TVM"): TVM only compiles device code to a cubin at build time when its CUDA runtime
plugin (`libtvm_runtime_cuda.so`) is loaded; that plugin needs a `libcuda.so.1`, which a GPU-less machine lacks,
and without it TVM silently embeds CUDA *source* (which would need a compiler where the artifact runs). So
before a CUDA build we load, in this process: the real `libcuda.so.1` if there is one, else a stub compiled
with gcc into the nextn cache (every entry point returns CUDA_ERROR_STUB_LIBRARY; nothing runs on it), then
`libcudart.so.13` from the CUDA toolkit, then the plugin. Loading by path with RTLD_GLOBAL works after `import
tvm` because the dynamic loader matches the plugin's NEEDED `libcuda.so.1` by soname. Device code is compiled by
nvcc through our `tvm_callback_cuda_compile`, one fatbin with SASS for every requested arch plus PTX of the
lowest (so newer GPUs can JIT it), restored to TVM's own callback afterwards.

ROCm (TVM `python/tvm/support/rocm.py`): LLVM's AMDGPU backend in the wheel plus `ld.lld-22` (Debian: `apt-get
install lld-22`); device libraries are used from `$ROCM_PATH/amdgcn/bitcode` when present, else none are linked (our
kernels call no `__ocml_*` function; the link runs with `--no-undefined`, so a missing one fails the build loudly).
One code object per arch, so one library per arch.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess

from nextn.common.errors import NextnError

_STUB_C = r"""
/* nextn build-machine stub of libcuda.so.1: lets TVM's CUDA plugin load so device code is compiled at build time.
   Every entry point fails with CUDA_ERROR_STUB_LIBRARY (34); nothing can run on it. */
#define STUB(name) int name() { return 34; }
STUB(cuDeviceGetName) STUB(cuFuncSetAttribute) STUB(cuLaunchKernelEx) STUB(cuModuleGetFunction)
STUB(cuModuleLoadData) STUB(cuModuleUnload) STUB(cuTensorMapEncodeTiled) STUB(cuLaunchKernel)
STUB(cuLaunchCooperativeKernel) STUB(cuModuleGetGlobal) STUB(cuInit) STUB(cuDriverGetVersion)
int cuGetErrorName(int e, const char** s) { *s = "CUDA_ERROR_STUB_LIBRARY"; return 0; }
int cuGetErrorString(int e, const char** s) { *s = "nextn build-machine libcuda stub"; return 0; }
"""


def _sm_number(arch: str) -> int:
    return int(re.match(r"sm_(\d+)", arch).group(1))


def cuda_target(arches: list[str]):
    from tvm.target import Target

    lowest = min(arches, key=_sm_number)
    # Kernels are scheduled once, for the lowest arch (dlight only branches on sm >= 70, for tensor cores, which the
    # float32 kernels never use), and compiled to SASS for every arch. The host side is generic x86-64 / aarch64.
    return Target({"kind": "cuda", "arch": lowest, "max_shared_memory_per_block": 49152, "max_threads_per_block": 1024,
                   "thread_warp_size": 32, "registers_per_block": 65536}, host={"kind": "llvm"})


def rocm_target(arch: str):
    from tvm.target import Target

    # thread_warp_size 1: cross-thread reductions go through shared memory. With the real wavefront size (64 / 32)
    # TVM 0.27's AMDGPU codegen emits `llvm.amdgcn.ds.bpermute` with an i64 lane index for our int64-indexed
    # kernels and LLVM's verifier rejects the module ("Call parameter type does not match function signature").
    return Target({"kind": "rocm", "mcpu": arch, "mtriple": "amdgcn-amd-amdhsa-hcc", "max_shared_memory_per_block": 65536,
                   "max_threads_per_block": 1024, "thread_warp_size": 1},
                  host={"kind": "llvm"})


# -- CUDA toolchain --------------------------------------------------------------------------------------------
def find_nvcc() -> str:
    for cand in (os.environ.get("CUDA_PATH") and os.path.join(os.environ["CUDA_PATH"], "bin", "nvcc"),
                 shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise NextnError("--target cuda needs nvcc (CUDA 12.8+ / 13) on PATH or in $CUDA_PATH/bin to compile device code")


def cuda_home() -> str:
    """The CUDA toolkit root (headers + libcudart): $CUDA_PATH, nvcc's parent, or /usr/local/cuda."""
    cands = [os.environ.get("CUDA_PATH"), os.path.dirname(os.path.dirname(os.path.realpath(find_nvcc()))),
             "/usr/local/cuda"]
    for home in cands:   # /usr/local/bin/nvcc may be a wrapper script: check for the toolkit's header
        if home and os.path.isfile(os.path.join(home, "include", "cuda_runtime.h")):
            return home
    raise NextnError(f"--target cuda: no CUDA toolkit found (looked for include/cuda_runtime.h under "
                     f"{', '.join(c for c in cands if c)}); set CUDA_PATH")


def _find_cudart() -> str:
    home = cuda_home()
    for d in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            p = os.path.join(home, d, name)
            if os.path.isfile(p):
                return p
    raise NextnError(f"--target cuda: no libcudart.so under {home} (the CUDA toolkit's runtime library is needed to build)")


def stub_libcuda(cache: str | None = None) -> str:
    """Path of the build-machine stub `libcuda.so.1` (compiled with gcc into the nextn cache once)."""
    from nextn.common.paths import cache_dir

    d = os.path.join(cache or cache_dir(), "cudastub")
    so = os.path.join(d, "libcuda.so.1")
    if os.path.isfile(so):
        return so
    os.makedirs(d, exist_ok=True)
    src = os.path.join(d, "libcuda_stub.c")
    with open(src, "w") as f:
        f.write(_STUB_C)
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise NextnError("--target cuda on a machine without an NVIDIA driver needs gcc to build the libcuda stub")
    tmp = so + f".{os.getpid()}"
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", tmp, src, "-Wl,-soname,libcuda.so.1"], capture_output=True, text=True)
    if r.returncode != 0:
        raise NextnError(f"building the libcuda stub failed: {r.stderr.strip()[:300]}")
    os.replace(tmp, so)
    return so


def ensure_cuda_build_env() -> str:
    """Make TVM's CUDA plugin available in this process; returns 'loaded', 'driver' or the stub path used."""
    from nextn.common import cuda

    find_nvcc()
    if cuda.plugin_loaded():
        return "loaded"
    used = "driver"
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        used = stub_libcuda()
        ctypes.CDLL(used, mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(_find_cudart(), mode=ctypes.RTLD_GLOBAL)
    cuda.load_plugin("without it TVM cannot embed compiled device code")
    return used


def gencode_flags(arches: list[str]) -> list[str]:
    flags = []
    for a in sorted(arches, key=_sm_number):
        n = a[3:]
        flags += ["-gencode", f"arch=compute_{n},code=sm_{n}"]
    n = min(arches, key=_sm_number)[3:]
    flags += ["-gencode", f"arch=compute_{n},code=compute_{n}"]   # PTX of the lowest arch: JIT-able on newer GPUs
    return flags


@contextlib.contextmanager
def cuda_compile_callback(arches: list[str]):
    """Within the block, TVM's CUDA codegen compiles with nvcc to one fatbin holding every arch in `arches`."""
    import tvm_ffi
    from tvm.support import nvcc

    prev = tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True)
    flags = gencode_flags(arches)
    os.environ.setdefault("CUDA_PATH", cuda_home())

    def _compile(code, *_rest):
        return nvcc.compile_cuda(code, target_format="fatbin", arch=flags, compiler="nvcc")

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", _compile, override=True)
    try:
        yield
    finally:
        if prev is not None:
            tvm_ffi.register_global_func("tvm_callback_cuda_compile", prev, override=True)


# -- ROCm toolchain --------------------------------------------------------------------------------------------
LLD_CANDIDATES = ("ld.lld-22.0", "ld.lld-22", "ld.lld")


def find_lld() -> str | None:
    for c in LLD_CANDIDATES:
        p = shutil.which(c)
        if p:
            return p
    return None


_OCML_REGISTERED = []


def _register_ocml_f64():
    """Lower float64 exp/cos/sin (rope's angles) to the ROCm device library on the rocm target: the AMDGPU
    backend has no instruction or libcall for them ("no libcall available for fexp")."""
    if _OCML_REGISTERED:
        return
    from tvm import tirx
    from tvm.tirx.op import register_intrin_lowering

    def rule(name):
        def lower(op):
            x = op.args[0]
            dt = str(x.ty.dtype) if hasattr(x, "ty") and hasattr(x.ty, "dtype") else str(getattr(x, "dtype", op.dtype))
            if dt == "float64":
                return tirx.call_pure_extern("float64", f"__ocml_{name}_f64", x)
            if dt == "float32":
                return tirx.call_pure_extern("float32", f"__ocml_{name}_f32", x)
            return op
        return lower

    for name in ("exp", "cos", "sin"):
        register_intrin_lowering(f"tirx.{name}", "rocm", f=rule(name), level=99)
    _OCML_REGISTERED.append(True)


@contextlib.contextmanager
def rocm_build_env():
    """Check for ld.lld and pick device libraries; within the block TVM's ROCm codegen links with them."""
    import tvm_ffi

    if find_lld() is None:
        raise NextnError("--target rocm needs LLVM's linker ld.lld (version 22, the wheel's LLVM); on Debian/Ubuntu: "
                         "apt-get install lld-22")
    bitcode = None
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm", "/usr/lib/x86_64-linux-gnu"):
        if root and os.path.isfile(os.path.join(root, "amdgcn", "bitcode", "ocml.bc")):
            bitcode = root
            break
    if bitcode is not None:
        _register_ocml_f64()
    prev = tvm_ffi.get_global_func("tvm_callback_rocm_bitcode_path", allow_missing=True)
    old_env = os.environ.get("ROCM_PATH")
    if bitcode is None:
        # No device libraries: link none (every kernel must then be free of __ocml_* calls; lld says so if not).
        tvm_ffi.register_global_func("tvm_callback_rocm_bitcode_path", lambda *_: [], override=True)
    else:
        os.environ["ROCM_PATH"] = bitcode
    try:
        yield
    finally:
        if bitcode is None and prev is not None:
            tvm_ffi.register_global_func("tvm_callback_rocm_bitcode_path", prev, override=True)
        if old_env is None:
            os.environ.pop("ROCM_PATH", None)
        else:
            os.environ["ROCM_PATH"] = old_env


@contextlib.contextmanager
def build_scope(target: str, arches: list[str]):
    """Everything a `tvm.compile` for `target` / `arches` needs around it (nothing for llvm)."""
    if target == "cuda":
        ensure_cuda_build_env()
        with cuda_compile_callback(arches):
            yield
    elif target == "rocm":
        with rocm_build_env():
            yield
    else:
        yield
