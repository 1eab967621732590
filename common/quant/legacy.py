"""Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 weights (ggml/src/ggml-common.h block_q4_0 …, gguf-py gguf/quants.py).

Block bytes and the buffers they become (for a weight `[..., N, K]`, nb = K / 32 blocks per row):

    Q4_0  d f16 | qs[16]                 w = d * (q - 8)
    Q4_1  d f16 | m f16 | qs[16]         w = d * q + m
    Q5_0  d f16 | qh u32 | qs[16]        w = d * (q - 16),  q = nibble | bit << 4
    Q5_1  d f16 | m f16 | qh u32 | qs    w = d * q + m

    .qs uint8 [..., N, K/2]   byte 16*b + l holds element 32*b + l (low nibble) and 32*b + 16 + l (high nibble)
    .d / .m float16 [..., N, K/32]
    .qh uint32 [..., N, K/32] bit j = high bit of element 32*b + j

With the CPU schedule's 16-lane split of K, one vector step reads 16 consecutive bytes of .qs with one shift
for all lanes, and one scale per step (a broadcast).
"""
from __future__ import annotations

import numpy as np

from .format import QuantFormat, register
from .planes import blocks, field

# name: (type_size, has_min, has_high)
LAYOUTS = {"Q4_0": (18, False, False), "Q4_1": (20, True, False), "Q5_0": (22, False, True), "Q5_1": (24, True, True)}


def _make(name: str, type_size: int, has_min: bool, has_high: bool):
    off_qh = 4 if has_min else 2
    off_qs = off_qh + (4 if has_high else 0)
    assert off_qs + 16 == type_size

    def buffers(shape):
        *lead, k = shape
        out = [(".qs", "uint8", (*lead, k // 2)), (".d", "float16", (*lead, k // 32))]
        if has_min:
            out.append((".m", "float16", (*lead, k // 32)))
        if has_high:
            out.append((".qh", "uint32", (*lead, k // 32)))
        return out

    def pack(raw, shape):
        *lead, k = shape
        b = blocks(raw, shape, 32, type_size)
        out = [field(b, off_qs, type_size, np.uint8, (*lead, k // 2)), field(b, 0, 2, np.float16, (*lead, k // 32))]
        if has_min:
            out.append(field(b, 2, 4, np.float16, (*lead, k // 32)))
        if has_high:
            out.append(field(b, off_qh, off_qh + 4, np.uint32, (*lead, k // 32)))
        return tuple(out)

    return register(QuantFormat(name.lower(), name, 32, buffers, pack))


Q4_0, Q4_1, Q5_0, Q5_1 = (_make(name, *layout) for name, layout in LAYOUTS.items())
