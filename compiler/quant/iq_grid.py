"""IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: super-blocks of 256 weights whose groups of 8 (IQ2, IQ1)
or 4 (IQ3) are indices into a fixed codebook (grid) (ggml/src/ggml-common.h block_iq2_xxs … block_iq1_m,
iq2xxs_grid … iq1s_grid, ksigns_iq2xs; gguf-py gguf/quants.py, whose `dequantize` these match bit for bit). The
codebooks (and the ksigns table) are gguf-py's, passed as the tables of nextn.common.quant.formats.

    IQ2_XXS (66 B)  d f16 | 8 sub-blocks of 32 × (aux0 u32: 4 grid indices, one byte per group of 8;
                    aux1 u32: 4 × 7-bit sign-pattern indices, bits 28..31 scale s)
                    w = ((d * (0.5 + s)) * 0.25) * grid[aux0 byte l][j] * (-1 if bit j of ksigns[sign index l])
    IQ2_XS (74 B)   d f16 | qs u16[32] (per 8: 9-bit grid index | 7-bit sign-pattern index << 9) | scales[8]
                    (4-bit s per 16)            w = ((d * (0.5 + s)) * 0.25) * grid[idx][j] * sign
    IQ2_S (82 B)    d f16 | qs[32] (low 8 index bits per 8) | signs[32] (one sign bit per weight) | qh[8] (2 high
                    index bits per 8) | scales[8] (4-bit s per 16)    w as IQ2_XS, 10-bit index
    IQ3_XXS (98 B)  d f16 | qs[64] (grid index per 4) | u32[8] (per 32: 4 × 7-bit sign-pattern indices, s << 28)
                    w = ((d * (0.5 + s)) * 0.5) * grid[idx][j] * sign
    IQ3_S (110 B)   d f16 | qs[64] (low 8 index bits per 4) | qh[8] (9th bit per 4) | signs[32] | scales[4]
                    (4-bit s per 32)            w = (d * (1 + 2s)) * grid[idx][j] * sign
    IQ1_S (50 B)    d f16 | qs[32] (low 8 index bits per group of 8) | qh u16[8] (per 32: 4 × 3 high index bits,
                    bits 12..14 scale s, bit 15 sign of delta)
                    w = (d * (2s + 1)) * (grid[idx][j] + (±0.125))
    IQ1_M (56 B)    qs[32] (low 8 index bits per 8) | qh[16] (nibble per 8: 3 high index bits, bit 3 sign of
                    delta) | scales u16[4] (3-bit s per 16; d f16 = the top nibbles of the four words)
                    w = (d * (2s + 1)) * (grid[idx][j] + (±0.125))

Every product is exact in float32 (at most 11 + 5 + 6 significant bits), so no fused multiply-add can change a
result (te.py). Codebook and sign reads are gathers, so these kernels are slower per weight than the Q/K formats.
"""
from __future__ import annotations

from tvm import tirx

from .te import F32, Block, bits, const, element, f32

I32 = "int32"


def _sign(sign_byte, j):
    """+1 / -1 by bit j of `sign_byte`."""
    return tirx.Select(bits(sign_byte, j, 1) == const(0, str(sign_byte.ty)), const(1.0, F32), const(-1.0, F32))


def _iq2_scale(d, s):
    """(d * (0.5 + s)) * 0.25: the IQ2 sub-block scale, d the float32 of the block's f16, s the 4-bit field."""
    return d * (const(0.5, F32) + f32(s)) * const(0.25, F32)


def _delta(negative):
    """IQ1's ±0.125 shift of the -1 / 0 / 1 codebook values."""
    return tirx.Select(negative, const(-0.125, F32), const(0.125, F32))


def _hi(v, shift):
    return v.astype(I32) << const(shift, I32)


@element("iq2_xxs")
def _iq2_xxs(t, idx):
    raw, grid, signs = t
    b = Block(raw, idx, 256, 66)
    ib, l, j = b.e // 32, b.e % 32 // 8, b.e % 8
    aux0, aux1 = b.u32(2 + ib * 8), b.u32(6 + ib * 8)
    g = grid(bits(aux0, l * 8, 0xFF).astype(I32) * 8 + j)
    sign = _sign(signs(bits(aux1, l * 7, 0x7F).astype(I32)), j)
    return _iq2_scale(b.f16(0), aux1 >> const(28, "uint32")) * f32(g) * sign


@element("iq2_xs")
def _iq2_xs(t, idx):
    raw, grid, signs = t
    b = Block(raw, idx, 256, 74)
    q = b.u16(2 + b.e // 8 * 2)                         # 9-bit grid index | 7-bit sign index << 9
    g = grid(bits(q, 0, 0x1FF).astype(I32) * 8 + b.e % 8)
    sign = _sign(signs((q >> const(9, "uint16")).astype(I32)), b.e % 8)
    sc = bits(b.u8(66 + b.e // 32), b.e // 16 % 2 * 4, 0x0F)
    return _iq2_scale(b.f16(0), sc) * f32(g) * sign


@element("iq2_s")
def _iq2_s(t, idx):
    raw, grid = t
    b = Block(raw, idx, 256, 82)
    g8 = b.e // 8
    gi = b.u8(2 + g8).astype(I32) | _hi(bits(b.u8(66 + g8 // 4), g8 % 4 * 2, 3), 8)
    sign = _sign(b.u8(34 + g8), b.e % 8)
    sc = bits(b.u8(74 + b.e // 32), b.e // 16 % 2 * 4, 0x0F)
    return _iq2_scale(b.f16(0), sc) * f32(grid(gi * 8 + b.e % 8)) * sign


@element("iq3_xxs")
def _iq3_xxs(t, idx):
    raw, grid, signs = t
    b = Block(raw, idx, 256, 98)
    aux = b.u32(66 + b.e // 32 * 4)                     # 4 × 7-bit sign indices, scale in bits 28..31
    db = b.f16(0) * (const(0.5, F32) + f32(aux >> const(28, "uint32"))) * const(0.5, F32)
    g = grid(b.u8(2 + b.e // 4).astype(I32) * 4 + b.e % 4)
    sign = _sign(signs(bits(aux, b.e % 32 // 8 * 7, 0x7F).astype(I32)), b.e % 8)
    return db * f32(g) * sign


@element("iq3_s")
def _iq3_s(t, idx):
    raw, grid = t
    b = Block(raw, idx, 256, 110)
    g4 = b.e // 4
    gi = b.u8(2 + g4).astype(I32) | _hi(bits(b.u8(66 + g4 // 8), g4 % 8, 1), 8)
    sc = bits(b.u8(106 + b.e // 64), b.e // 32 % 2 * 4, 0x0F).astype(I32)
    db = b.f16(0) * f32(sc * const(2, I32) + const(1, I32))
    sign = _sign(b.u8(74 + b.e // 8), b.e % 8)
    return db * f32(grid(gi * 4 + b.e % 4)) * sign


def iq1s_parts(b):
    """(grid index int32, dl float32, whether the delta is negative) of element b.e of an IQ1_S block: the element
    is dl * (grid[index][b.e % 8] + delta)."""
    ib, l = b.e // 32, b.e % 32 // 8
    h = b.u16(34 + ib * 2)
    gi = b.u8(2 + ib * 4 + l).astype(I32) | _hi(bits(h, l * 3, 7), 8)
    dl = b.f16(0) * f32(bits(h, 12, 7).astype(I32) * const(2, I32) + const(1, I32))
    return gi, dl, bits(h, 15, 1) != const(0, "uint16")


def iq1m_parts(b):
    """(grid index int32, dl float32, whether the delta is negative) of element b.e of an IQ1_M block: the element
    is dl * (grid[index][b.e % 8] + delta)."""
    g8 = b.e // 8
    w = [b.u16(48 + 2 * i) for i in range(4)]
    u16 = lambda v: const(v, "uint16")  # noqa: E731
    d16 = (w[0] >> u16(12)) | ((w[1] >> u16(8)) & u16(0x00F0)) | ((w[2] >> u16(4)) & u16(0x0F00)) | (w[3] & u16(0xF000))
    sc = bits(b.u16(48 + b.e // 64 * 2), b.e // 16 % 4 * 3, 7).astype(I32)
    dl = f32(tirx.reinterpret("float16", d16)) * f32(sc * const(2, I32) + const(1, I32))
    h = bits(b.u8(32 + g8 // 2), g8 % 2 * 4, 0x0F)      # 3 high index bits | delta sign << 3
    gi = b.u8(g8).astype(I32) | _hi(h & const(7, "uint8"), 8)
    return gi, dl, (h & const(8, "uint8")) != const(0, "uint8")


def _iq1(kind: str, type_size: int, parts):
    @element(kind)
    def expr(t, idx):
        raw, grid = t
        b = Block(raw, idx, 256, type_size)
        gi, dl, negative = parts(b)
        return dl * (f32(grid(gi * 8 + b.e % 8)) + _delta(negative))

    return expr


_iq1("iq1_s", 50, iq1s_parts)
_iq1("iq1_m", 56, iq1m_parts)
