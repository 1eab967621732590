"""IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256): 4-bit indices into the non-linear table kvalues
(ggml/src/ggml-common.h kvalues_iq4nl, block_iq4_nl / block_iq4_xs; gguf-py gguf/quants.py IQ4_NL / IQ4_XS).

    IQ4_NL (18 B)   d f16 | qs[16]                              w = d * kvalues[q]
    IQ4_XS (136 B)  d f16 | scales_h u16 | scales_l[4] | qs[128]  w = (d * (ls - 32)) * kvalues[q],
                    ls (6 bits, per 32) = nibble ib%2 of scales_l[ib/2] | (2 bits 2ib of scales_h) << 4

Buffers (weight `[..., N, K]`): `.qs` uint8 [..., N, K/2] (nibbles as Q4_0: byte 16b + l holds elements
32b + l and 32b + 16 + l), `.d` float16 per block / super-block, for IQ4_XS `.scales_l` uint8 [..., N, K/64] and
`.scales_h` uint16 [..., N, K/256]: exactly the GGUF's bytes.
"""
from __future__ import annotations

import numpy as np

from .format import QuantFormat, register
from .planes import blocks, field

KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


# -- IQ4_NL -----------------------------------------------------------------------------------------------------
def _nl_buffers(shape):
    *lead, k = shape
    return [(".qs", "uint8", (*lead, k // 2)), (".d", "float16", (*lead, k // 32))]


def _nl_pack(raw, shape):
    *lead, k = shape
    b = blocks(raw, shape, 32, 18)
    return field(b, 2, 18, np.uint8, (*lead, k // 2)), field(b, 0, 2, np.float16, (*lead, k // 32))


IQ4_NL = register(QuantFormat("iq4_nl", "IQ4_NL", 32, _nl_buffers, _nl_pack))


# -- IQ4_XS -----------------------------------------------------------------------------------------------------
def _xs_buffers(shape):
    *lead, k = shape
    return [(".qs", "uint8", (*lead, k // 2)), (".scales_l", "uint8", (*lead, k // 64)),
            (".scales_h", "uint16", (*lead, k // 256)), (".d", "float16", (*lead, k // 256))]


def _xs_pack(raw, shape):
    *lead, k = shape
    b = blocks(raw, shape, 256, 136)
    return (field(b, 8, 136, np.uint8, (*lead, k // 2)), field(b, 4, 8, np.uint8, (*lead, k // 64)),
            field(b, 2, 4, np.uint16, (*lead, k // 256)), field(b, 0, 2, np.float16, (*lead, k // 256)))


IQ4_XS = register(QuantFormat("iq4_xs", "IQ4_XS", 256, _xs_buffers, _xs_pack))
