"""K-quants Q2_K … Q6_K elements (layout, block bytes and index formulas: nextn.common.quant.k_quants).

Under the CPU schedule's 16-lane split of K, the 16 lanes of a step share every scale and shift and read 16
consecutive bytes of the quant planes, so the scale work is scalar, once per 16 weights.
"""
from __future__ import annotations

from nextn.common.quant.k_quants import QK

from .te import bits, element, f32


def _q2_bits(qs, lead, s, e):
    return bits(qs[(*lead, s * 64 + e // 128 * 32 + e % 32)], e % 128 // 32 * 2, 3).astype("int32")


def _hbit(h, lead, s, e):
    return bits(h[(*lead, s * 32 + e % 32)], e // 32, 1).astype("int32")


def _q4_nibble(qs, lead, s, e):
    return bits(qs[(*lead, s * 128 + e // 64 * 32 + e % 32)], e % 64 // 32 * 4, 0x0F).astype("int32")


@element("q2_k")
def _q2k_element(t, idx):
    qs, scales, d, dmin = t
    *lead, k = idx
    s, e = k // QK, k % QK
    sc = scales[(*lead, k // 16)]
    dl = f32(d[(*lead, s)]) * f32(bits(sc, 0, 0x0F))
    ml = f32(dmin[(*lead, s)]) * f32(bits(sc, 4, 0x0F))
    return dl * f32(_q2_bits(qs, lead, s, e)) - ml


@element("q3_k")
def _q3k_element(t, idx):
    qs, hmask, d, scales = t
    *lead, k = idx
    s, e = k // QK, k % QK
    q = _q2_bits(qs, lead, s, e) - ((_hbit(hmask, lead, s, e) ^ 1) << 2)
    dl = f32(d[(*lead, s)]) * f32(scales[(*lead, k // 16)])
    return dl * f32(q)


def _q45k_element(with_high):
    def expr(t, idx):
        *lead, k = idx
        if with_high:
            qs, qh, d, dmin, scs, mns = t
        else:
            qs, d, dmin, scs, mns = t
        s, e = k // QK, k % QK
        q = _q4_nibble(qs, lead, s, e)
        if with_high:
            q = q | (_hbit(qh, lead, s, e) << 4)
        sc, mn = f32(scs[(*lead, k // 32)]), f32(mns[(*lead, k // 32)])
        return f32(d[(*lead, s)]) * sc * f32(q) - f32(dmin[(*lead, s)]) * mn

    return expr


element("q4_k")(_q45k_element(False))
element("q5_k")(_q45k_element(True))


@element("q6_k")
def _q6k_element(t, idx):
    ql, qh, scales, d = t
    *lead, k = idx
    s, e = k // QK, k % QK
    h, r = e // 128, e % 128
    lo = bits(ql[(*lead, s * 128 + h * 64 + r % 64)], r // 64 * 4, 0x0F).astype("int32")
    hi = bits(qh[(*lead, s * 64 + h * 32 + r % 32)], r // 32 * 2, 0x3).astype("int32")
    dl = f32(d[(*lead, s)]) * f32(scales[(*lead, k // 16)])
    return dl * f32((lo | (hi << 4)) - 32)
