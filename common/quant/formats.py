"""The GGUF types nextn reads, each kept as the file's bytes (nextn.common.quant.format); block layouts in
ggml/src/ggml-common.h (block_q4_K …) and gguf-py's gguf/quants.py; the element expressions that decode them are
nextn.compiler.quant. Nothing is repacked: `bytes repacked` is 0 for every type (the IQ codebook types carry
their constant tables, 1.1 to 16 KB, once per tensor).

`activation`: on the CPU these types' matmuls multiply int8-quantized activation rows (activation.py): "q8" (one
scale per 256 values: K a multiple of 256, always true for 256-weight super-blocks) or "q8_0" (one per 32).
"""
from __future__ import annotations

import numpy as np

from .format import QuantFormat, register


def _codebook(name: str, dtype, ksigns: bool):
    """() -> the tables of IQ format `name`: gguf-py's codebook `.grid` flattened (entry i, value j at
    [i * width + j]; uint8, int8 for IQ1's -1 / 0 / 1) and, where blocks hold 7-bit sign-pattern indices, the
    128-entry ksigns_iq2xs `.signs` (8 sign bits; the 8th makes the count of minus signs even)."""
    def tables():
        import gguf

        cls = getattr(gguf.quants, name)
        cls.init_grid()
        out = ((".grid", np.ascontiguousarray(cls.grid.reshape(-1)).astype(dtype)),)
        return out + (((".signs", np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8).copy()),) if ksigns else ())

    return tables


for _kind, _block, _size, _act in [
    ("q8_0", 32, 34, "q8_0"), ("q4_0", 32, 18, "q8_0"), ("q4_1", 32, 20, "q8_0"), ("q5_0", 32, 22, "q8_0"),
    ("q5_1", 32, 24, "q8_0"), ("q2_k", 256, 84, "q8"), ("q3_k", 256, 110, "q8"), ("q4_k", 256, 144, "q8"),
    ("q5_k", 256, 176, "q8"), ("q6_k", 256, 210, "q8"), ("iq4_nl", 32, 18, "q8_0"), ("iq4_xs", 256, 136, "q8"),
]:
    register(QuantFormat(_kind, _kind.upper(), _block, _size, activation=_act))
# the codebook formats (256-weight super-blocks) and their tables' bytes per tensor: IQ2_XXS 2048 + 128,
# IQ2_XS 4096 + 128, IQ2_S 8192, IQ3_XXS 1024 + 128, IQ3_S 2048, IQ1_S / IQ1_M 16384; "q8" where the CPU has an
# integer kernel for them (compiler/lower/x86/codebook.py)
for _name, _size, _dtype, _ksigns, _act in [
    ("IQ2_XXS", 66, np.uint8, True, "q8"), ("IQ2_XS", 74, np.uint8, True, "q8"), ("IQ2_S", 82, np.uint8, False, "q8"),
    ("IQ3_XXS", 98, np.uint8, True, "q8"), ("IQ3_S", 110, np.uint8, False, "q8"), ("IQ1_S", 50, np.int8, False, "q8"),
    ("IQ1_M", 56, np.int8, False, "q8"),
]:
    register(QuantFormat(_name.lower(), _name, 256, _size, activation=_act,
                         tables=_codebook(_name, _dtype, _ksigns)))
register(QuantFormat("mxfp4", "MXFP4", 32, 17, activation="q8_0"))
# NVFP4: "q8_0" rows as ggml-cpu's vec_dot_type for it (compiler/lower/x86/nvfp4.py); its per-tensor `.scale`
# multiplies the matmul output (nextn.compiler.graphs.apply_weight_scales)
register(QuantFormat("nvfp4", "NVFP4", 64, 36, activation="q8_0"))
# 16-bit floats stay 16-bit in memory; the kernels widen as they read (matmul and embedding weights only:
# nextn.compiler.graphs.weight_kinds widens the others, e.g. norms, to float32 at load)
register(QuantFormat("f16", "F16", 1, 2, dtype="float16"))
register(QuantFormat("bf16", "BF16", 1, 2, dtype="uint16"))
