"""IQ2_XXS and IQ1_S: super-blocks of 256 weights whose groups of 8 are indices into a fixed codebook (grid)
(ggml/src/ggml-common.h block_iq2_xxs / block_iq1_s, iq2xxs_grid / iq1s_grid / ksigns_iq2xs; gguf-py gguf/quants.py).

    IQ2_XXS (66 B)  d f16 | 8 sub-blocks of 32 × (aux0 u32: 4 grid indices, one byte per group of 8;
                    aux1 u32: 4 × 7-bit sign-pattern indices, bits 28..31 scale s)
                    w = ((d * (0.5 + s)) * 0.25) * grid2[aux0 byte l][j] * (-1 if bit j of ksigns[sign index l])
    IQ1_S (50 B)    d f16 | qs[32] (low 8 index bits per group of 8) | qh u16[8] (per 32: 4 × 3 high index bits,
                    bits 12..14 scale s, bit 15 sign of delta)
                    w = (d * (2s + 1)) * (grid1[idx][j] + (±0.125))

Buffers (weight `[..., N, K]`, S = K / 256): IQ2_XXS `.qs` uint32 [..., N, 16S] (aux0, aux1 per sub-block), `.d`
float16 [..., N, S], `.grid` uint8 [256*8], `.signs` uint8 [128]; IQ1_S `.qs` uint8 [..., N, 32S], `.qh` uint16
[..., N, 8S], `.d` float16 [..., N, S], `.grid` int8 [2048*8]. The codebooks are gguf-py's (the reference the
dequantization is checked against); 2.1 KB / 16 KB per tensor. Codebook and sign reads are gathers, so these
kernels are slower per weight than the Q/K formats.
"""
from __future__ import annotations

import numpy as np

from .format import QuantFormat, register
from .planes import blocks, field

QK = 256


def _grid(cls, dtype) -> np.ndarray:
    cls.init_grid()
    return np.ascontiguousarray(cls.grid.reshape(-1)).astype(dtype)


# -- IQ2_XXS ----------------------------------------------------------------------------------------------------
def _iq2_buffers(shape):
    *lead, k = shape
    return [(".qs", "uint32", (*lead, k // QK * 16)), (".d", "float16", (*lead, k // QK)),
            (".grid", "uint8", (256 * 8,)), (".signs", "uint8", (128,))]


def _iq2_pack(raw, shape):
    import gguf

    *lead, k = shape
    b = blocks(raw, shape, QK, 66)
    signs = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8).copy()
    return (field(b, 2, 66, np.uint32, (*lead, k // QK * 16)), field(b, 0, 2, np.float16, (*lead, k // QK)),
            _grid(gguf.quants.IQ2_XXS, np.uint8), signs)


IQ2_XXS = register(QuantFormat("iq2_xxs", "IQ2_XXS", QK, _iq2_buffers, _iq2_pack))


# -- IQ1_S ------------------------------------------------------------------------------------------------------
def _iq1_buffers(shape):
    *lead, k = shape
    return [(".qs", "uint8", (*lead, k // QK * 32)), (".qh", "uint16", (*lead, k // QK * 8)),
            (".d", "float16", (*lead, k // QK)), (".grid", "int8", (2048 * 8,))]


def _iq1_pack(raw, shape):
    import gguf

    *lead, k = shape
    b = blocks(raw, shape, QK, 50)
    return (field(b, 2, 34, np.uint8, (*lead, k // QK * 32)), field(b, 34, 50, np.uint16, (*lead, k // QK * 8)),
            field(b, 0, 2, np.float16, (*lead, k // QK)), _grid(gguf.quants.IQ1_S, np.int8))


IQ1_S = register(QuantFormat("iq1_s", "IQ1_S", QK, _iq1_buffers, _iq1_pack))
