"""Compile targets: the names `nextn compile --target` takes and the TVM target objects they become."""
from __future__ import annotations

from nextn.common.compile_options import GPU_TARGETS, parse_arches
from nextn.common.errors import NextnError
from nextn.common.measure import cpu_flags

TARGETS = ("llvm", "cuda", "rocm")


def make_target(target: str, arches: list[str] | None = None):
    """The TVM target for `target`; for GPUs, `arches` (see common/compile_options.py parse_arches): CUDA schedules
    for the lowest (its fatbin holds all), ROCm takes one arch per target (one library each)."""
    from tvm.target import Target

    if target in ("cuda", "rocm"):
        from .gpu_build import cuda_target, rocm_target

        arches = parse_arches(target, arches)
        return cuda_target(arches) if target == "cuda" else rocm_target(arches[0])
    if target == "llvm":
        return Target(host_llvm())
    raise NextnError(f"unsupported target '{target}' (supported: {', '.join(TARGETS)})")


# LLVM feature -> /proc/cpuinfo flag, for the vector features an x86 `mcpu` implies that a virtual machine may mask:
# a Zen 4 guest without AVX-512 still reports mcpu znver4 (LLVM names the CPU by its CPUID family and model), and a
# kernel built for znver4 dies with SIGILL there.
MASKABLE = {"avx512f": "avx512f", "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512dq": "avx512dq",
            "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
            "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2", "avxvnni": "avx_vnni",
            "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
            "avx2": "avx2", "fma": "fma", "f16c": "f16c"}


def host_llvm(num_cores: int | None = None) -> dict:
    """This host's llvm target as a dict: `mcpu` (LLVM's name for the CPU) and `mattr` turning off each MASKABLE
    feature that mcpu implies but the CPU does not report in /proc/cpuinfo (none where it cannot be read, or off
    x86). The kernels use this ISA; the manifest and the tuning logs' target key record it."""
    from tvm.target import Target, codegen

    tgt = {"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()}
    flags = cpu_flags() if codegen.llvm_get_system_triple().startswith(("x86_64", "i686", "i386")) else None
    if flags is not None:
        implied = set(required_cpu_flags(Target(tgt)))
        off = [f"-{f}" for f, flag in MASKABLE.items() if flag in implied and flag not in flags]
        if off:
            tgt["mattr"] = off
    if num_cores is not None:
        tgt["num-cores"] = num_cores
    return tgt


def required_cpu_flags(tgt) -> list[str]:
    """The /proc/cpuinfo flags of the MASKABLE features an llvm target `tgt` compiles for (its kernels may use any):
    the manifest records them, and the runtime refuses an artifact on a CPU without one (instead of SIGILL)."""
    from tvm.target import codegen

    return [flag for f, flag in MASKABLE.items() if codegen.target_has_features(f, tgt)]
