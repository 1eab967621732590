"""The GGUF types nextn reads, each kept as the file's bytes (nextn.common.quant.format); block layouts in
ggml/src/ggml-common.h (block_q4_K …) and gguf-py's gguf/quants.py; the element expressions that decode them are
nextn.compiler.quant. Nothing is repacked: `bytes repacked` is 0 for every type (the two codebook types carry
their constant tables, 2.2 KB and 16 KB, once per tensor).

`activation = "q8"`: on the CPU these types' matmuls multiply int8-quantized activation rows (activation.py),
so they need K to be a multiple of 256 (always true for 256-weight super-blocks).
"""
from __future__ import annotations

import numpy as np

from .format import QuantFormat, register


def _iq2_xxs_tables():
    import gguf

    gguf.quants.IQ2_XXS.init_grid()
    return ((".grid", np.ascontiguousarray(gguf.quants.IQ2_XXS.grid.reshape(-1)).astype(np.uint8)),
            (".signs", np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8).copy()))


def _iq1_s_tables():
    import gguf

    gguf.quants.IQ1_S.init_grid()
    return ((".grid", np.ascontiguousarray(gguf.quants.IQ1_S.grid.reshape(-1)).astype(np.int8)),)


for _kind, _block, _size, _act in [
    ("q8_0", 32, 34, None), ("q4_0", 32, 18, None), ("q4_1", 32, 20, None), ("q5_0", 32, 22, None),
    ("q5_1", 32, 24, None), ("q2_k", 256, 84, None), ("q3_k", 256, 110, None), ("q4_k", 256, 144, "q8"),
    ("q5_k", 256, 176, "q8"), ("q6_k", 256, 210, "q8"), ("iq4_nl", 32, 18, None), ("iq4_xs", 256, 136, "q8"),
]:
    register(QuantFormat(_kind, _kind.upper(), _block, _size, activation=_act))
register(QuantFormat("iq2_xxs", "IQ2_XXS", 256, 66, tables=_iq2_xxs_tables))
register(QuantFormat("iq1_s", "IQ1_S", 256, 50, tables=_iq1_s_tables))
# 16-bit floats stay 16-bit in memory; the kernels widen as they read (matmul and embedding weights only:
# nextn.compiler.graphs.weight_kinds widens the others, e.g. norms, to float32 at load)
register(QuantFormat("f16", "F16", 1, 2, dtype="float16"))
register(QuantFormat("bf16", "BF16", 1, 2, dtype="uint16"))
