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
from tvm import tirx

from . import QuantFormat, register
from ._common import bits, blocks, f32, field

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


def _iq2_element(t, idx):
    qs, d, grid, signs = t
    *lead, k = idx
    s, e = k // QK, k % QK
    ib, l, j = e // 32, e % 32 // 8, e % 8
    aux0, aux1 = qs[(*lead, s * 16 + ib * 2)], qs[(*lead, s * 16 + ib * 2 + 1)]
    g = grid[bits(aux0, l * 8, 0xFF).astype("int32") * 8 + j]
    neg = bits(signs[bits(aux1, l * 7, 0x7F).astype("int32")], j, 1)
    db = f32(d[(*lead, s)]) * (tirx.const(0.5, "float32") + f32(aux1 >> tirx.const(28, "uint32"))) * tirx.const(0.25, "float32")
    sign = tirx.Select(neg == tirx.const(0, "uint8"), tirx.const(1.0, "float32"), tirx.const(-1.0, "float32"))
    return db * f32(g) * sign


IQ2_XXS = register(QuantFormat("iq2_xxs", "IQ2_XXS", QK, _iq2_buffers, _iq2_pack, _iq2_element))


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


def _iq1_element(t, idx):
    qs, qh, d, grid = t
    *lead, k = idx
    s, e = k // QK, k % QK
    ib, l, j = e // 32, e % 32 // 8, e % 8
    h = qh[(*lead, s * 8 + ib)]
    gi = qs[(*lead, s * 32 + ib * 4 + l)].astype("int32") | (bits(h, l * 3, 7).astype("int32") << 8)
    dl = f32(d[(*lead, s)]) * f32(bits(h, 12, 7).astype("int32") * 2 + 1)
    delta = tirx.Select(bits(h, 15, 1) == tirx.const(0, "uint16"), tirx.const(0.125, "float32"),
                        tirx.const(-0.125, "float32"))
    return dl * (f32(grid[gi * 8 + j]) + delta)


IQ1_S = register(QuantFormat("iq1_s", "IQ1_S", QK, _iq1_buffers, _iq1_pack, _iq1_element))
