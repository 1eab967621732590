"""Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 weights (block_q4_0 …). Byte e % 16 of qs holds element e (low nibble)
and element e + 16 (high nibble); Q5 types add bit e of the u32 qh as bit 4.

    Q4_0 (18 B)  d f16 | qs[16]                 w = d * (q - 8)
    Q4_1 (20 B)  d f16 | m f16 | qs[16]         w = d * q + m
    Q5_0 (22 B)  d f16 | qh u32 | qs[16]        w = d * (q - 16)
    Q5_1 (24 B)  d f16 | m f16 | qh u32 | qs    w = d * q + m
"""
from __future__ import annotations

from .te import Block, bits, const, element, f32


def _make(kind: str, type_size: int, has_min: bool, has_high: bool):
    at_qh = 4 if has_min else 2
    at_qs = at_qh + (4 if has_high else 0)

    @element(kind)
    def expr(t, idx):
        b = Block(t[0], idx, 32, type_size)
        q = bits(b.u8(at_qs + b.e % 16), b.e // 16 * 4, 0x0F).astype("int32")
        if has_high:
            q = q | (bits(b.u32(at_qh), b.e, 1).astype("int32") << const(4, "int32"))
        if has_min:   # gguf-py: d * q + m (d * q is exact, see te.py)
            return b.f16(0) * f32(q) + b.f16(2)
        return b.f16(0) * f32(q - const(16 if has_high else 8, "int32"))

    return expr


_make("q4_0", 18, False, False)
_make("q4_1", 20, True, False)
_make("q5_0", 22, False, True)
_make("q5_1", 24, True, True)
