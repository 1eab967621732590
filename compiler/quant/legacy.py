"""Q4_0, Q4_1, Q5_0, Q5_1 elements (layout and block bytes: nextn.common.quant.legacy).

    Q4_0  w = d * (q - 8)       Q4_1  w = d * q + m
    Q5_0  w = d * (q - 16)      Q5_1  w = d * q + m      (q = nibble | high bit << 4)
"""
from __future__ import annotations

from tvm import tirx

from nextn.common.quant.legacy import LAYOUTS

from .te import bits, element, f32


def _nibble(qs, lead, k):
    return bits(qs[(*lead, k // 32 * 16 + k % 16)], k % 32 // 16 * 4, 0x0F)


def _high_bit(qh, lead, k):
    return bits(qh[(*lead, k // 32)], k % 32, 1)


def _make(has_min: bool, has_high: bool):
    def expr(t, idx):
        *lead, k = idx
        qs, d = t[0], t[1]
        q = _nibble(qs, lead, k).astype("int32")
        if has_high:
            q = q | (_high_bit(t[-1], lead, k).astype("int32") << 4)
        scale = f32(d[(*lead, k // 32)])
        if has_min:   # gguf-py: d * q + m (d * q is exact, see te.py)
            return scale * f32(q) + f32(t[2][(*lead, k // 32)])
        return scale * f32(q - tirx.const(16 if has_high else 8, "int32"))

    return expr


for _name, (_size, _has_min, _has_high) in LAYOUTS.items():
    element(_name.lower())(_make(_has_min, _has_high))
