"""IQ2_XXS and IQ1_S: super-blocks of 256 weights whose groups of 8 are indices into a fixed codebook (grid)
(ggml-common.h block_iq2_xxs / block_iq1_s, iq2xxs_grid / iq1s_grid / ksigns_iq2xs; gguf-py gguf/quants.py).
The codebooks are gguf-py's, passed as the tables of nextn.common.quant.formats.

    IQ2_XXS (66 B)  d f16 | 8 sub-blocks of 32 × (aux0 u32: 4 grid indices, one byte per group of 8;
                    aux1 u32: 4 × 7-bit sign-pattern indices, bits 28..31 scale s)
                    w = ((d * (0.5 + s)) * 0.25) * grid2[aux0 byte l][j] * (-1 if bit j of ksigns[sign index l])
    IQ1_S (50 B)    d f16 | qs[32] (low 8 index bits per group of 8) | qh u16[8] (per 32: 4 × 3 high index bits,
                    bits 12..14 scale s, bit 15 sign of delta)
                    w = (d * (2s + 1)) * (grid1[idx][j] + (±0.125))

Codebook and sign reads are gathers, so these kernels are slower per weight than the Q/K formats.
"""
from __future__ import annotations

from tvm import tirx

from .te import F32, Block, bits, const, element, f32


@element("iq2_xxs")
def _iq2(t, idx):
    raw, grid, signs = t
    b = Block(raw, idx, 256, 66)
    ib, l, j = b.e // 32, b.e % 32 // 8, b.e % 8
    aux0, aux1 = b.u32(2 + ib * 8), b.u32(6 + ib * 8)
    g = grid(bits(aux0, l * 8, 0xFF).astype("int32") * 8 + j)
    neg = bits(signs(bits(aux1, l * 7, 0x7F).astype("int32")), j, 1)
    db = b.f16(0) * (const(0.5, F32) + f32(aux1 >> const(28, "uint32"))) * const(0.25, F32)
    sign = tirx.Select(neg == const(0, "uint8"), const(1.0, F32), const(-1.0, F32))
    return db * f32(g) * sign


@element("iq1_s")
def _iq1(t, idx):
    raw, grid = t
    b = Block(raw, idx, 256, 50)
    ib, l, j = b.e // 32, b.e % 32 // 8, b.e % 8
    h = b.u16(34 + ib * 2)
    gi = b.u8(2 + ib * 4 + l).astype("int32") | (bits(h, l * 3, 7).astype("int32") << const(8, "int32"))
    dl = b.f16(0) * f32(bits(h, 12, 7).astype("int32") * const(2, "int32") + const(1, "int32"))
    delta = tirx.Select(bits(h, 15, 1) == const(0, "uint16"), const(0.125, F32), const(-0.125, F32))
    return dl * (f32(grid(gi * 8 + j)) + delta)
