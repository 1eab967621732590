"""Hand-written x86 kernels for the CPU (llvm) target: quantized / 16-bit matmuls that read the GGUF's bytes.

`to_relax` routes `mul_mat` and `mul_mat_id` here when the target has AVX2 + FMA + F16C and the weight's kind is
in `KINDS` (2-D [N, K] dense weights, 3-D [X, N, K] routed experts); everything else keeps the TE element
expression path (`nextn.compiler.quant`). Integer kinds (`INT_KINDS`) multiply int8-quantized activation rows
(`quantize_rows`; semantics in `nextn.common.quant.activation`) when the artifact quantizes activations, and
fall back to the element path otherwise. Vector width: 64 bytes on AVX-512BW, else 32 (`vector_width`).
"""
from __future__ import annotations

from .formats import FLOAT_FORMATS, INT_FORMATS
from .loops import Knobs, act_args, matmul, matmul_id, weight_arg
from .quantize import quantize_rows

INT_KINDS = frozenset(INT_FORMATS)
FLOAT_KINDS = frozenset(FLOAT_FORMATS)
KINDS = INT_KINDS | FLOAT_KINDS


def vector_width(target) -> int | None:
    """64 (AVX-512BW), 32 (AVX2 + FMA + F16C) or None (no x86 kernels) for an llvm `target`."""
    from tvm.target import codegen

    if target.kind.name != "llvm":
        return None
    try:
        has = lambda f: codegen.llvm_cpu_has_features(f, target)   # noqa: E731
        if not all(has(f) for f in ("avx2", "fma", "f16c")):
            return None
        return 64 if has("avx512bw") else 32
    except Exception:       # not an x86 target
        return None


__all__ = ["FLOAT_KINDS", "INT_KINDS", "KINDS", "Knobs", "act_args", "matmul", "matmul_id", "quantize_rows",
           "vector_width", "weight_arg"]
