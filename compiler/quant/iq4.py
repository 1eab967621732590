"""IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256): 4-bit indices into the non-linear table kvalues
(ggml-common.h kvalues_iq4nl, block_iq4_nl / block_iq4_xs). Nibbles as Q4_0: byte 16b + l of qs holds elements
32b + l (low) and 32b + 16 + l (high).

    IQ4_NL (18 B)   d f16 | qs[16]                                w = d * kvalues[q]
    IQ4_XS (136 B)  d f16 | scales_h u16 | scales_l[4] | qs[128]  w = (d * (ls - 32)) * kvalues[q],
                    ls (6 bits, per 32) = nibble ib%2 of scales_l[ib/2] | (2 bits 2ib of scales_h) << 4

The table lookup is te.lut16 (a Select tree with constant leaves).
"""
from __future__ import annotations

from .te import Block, bits, const, element, f32, lut16

KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


@element("iq4_nl")
def _nl(t, idx):
    b = Block(t[0], idx, 32, 18)
    return b.f16(0) * lut16(KVALUES, bits(b.u8(2 + b.e % 16), b.e // 16 * 4, 0x0F))


def iq4xs_factor(b, ib):
    """d · (ls - 32) of sub-block ib (32 weights) of an IQ4_XS block, float32: the element is that · kvalues[q]."""
    lo = bits(b.u8(4 + ib // 2), ib % 2 * 4, 0x0F).astype("int32")
    hi = bits(b.u16(2), ib * 2, 0x3).astype("int32")
    return b.f16(0) * f32((lo | (hi << const(4, "int32"))) - const(32, "int32"))


@element("iq4_xs")
def _xs(t, idx):
    b = Block(t[0], idx, 256, 136)
    ib = b.e // 32
    return iq4xs_factor(b, ib) * lut16(KVALUES, bits(b.u8(8 + ib * 16 + b.e % 16), b.e % 32 // 16 * 4, 0x0F))
