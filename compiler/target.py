"""Compile targets: the names `nextn compile --target` takes and the TVM target objects they become."""
from __future__ import annotations

from nextn.common.errors import NextnError

TARGETS = ("llvm", "cuda", "rocm")
GPU_TARGETS = ("cuda", "rocm")   # scratch-holding ops as separate kernels there (to_relax.SPLIT_OPS)


def make_target(target: str, arches: list[str] | None = None):
    """The TVM target for `target`; for GPUs, `arches` (see gpu_build.parse_arches): CUDA schedules for the lowest
    (its fatbin holds all), ROCm takes one arch per target (one library each)."""
    from tvm.target import Target

    if target in ("cuda", "rocm"):
        from .gpu_build import cuda_target, parse_arches, rocm_target

        arches = parse_arches(target, arches)
        return cuda_target(arches) if target == "cuda" else rocm_target(arches[0])
    if target == "llvm":
        # This host's CPU: the kernels use its vector ISA (the manifest records it; the runtime checks it).
        from tvm.target import codegen

        return Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
    raise NextnError(f"unsupported target '{target}' (supported: {', '.join(TARGETS)})")
