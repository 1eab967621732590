"""Q8_0 (34 B per 32 weights): d f16 | qs int8[32]; w = float32(d) * q (block_q8_0)."""
from __future__ import annotations

from .te import Block, element, f32


@element("q8_0")
def _element(t, idx):
    b = Block(t[0], idx, 32, 34)
    return b.f16(0) * f32(b.i8(2 + b.e))
