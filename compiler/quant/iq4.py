"""IQ4_NL and IQ4_XS elements (layout: nextn.common.quant.iq4). The table lookup kvalues[q] is a Select tree with
constant leaves (vector blends; 5x faster on this CPU than a gather from a table buffer).

    IQ4_NL  w = d * kvalues[q]          IQ4_XS  w = (d * (ls - 32)) * kvalues[q]
"""
from __future__ import annotations

from tvm import tirx

from nextn.common.quant.iq4 import KVALUES

from .te import bits, element, f32


def _kvalue(nib):
    """kvalues[nib] as a float32 expression: a 4-level Select tree on the index bits with constant leaves
    (vector blends on the CPU; no table read, no gather)."""
    def tree(lo, width):
        if width == 1:
            return tirx.const(float(KVALUES[lo]), "float32")
        half = width // 2
        bit = (nib & tirx.const(half, "uint8")) != tirx.const(0, "uint8")
        return tirx.Select(bit, tree(lo + half, half), tree(lo, half))

    return tree(0, 16)


def _nibble(qs, lead, k):
    return bits(qs[(*lead, k // 32 * 16 + k % 16)], k % 32 // 16 * 4, 0x0F)


@element("iq4_nl")
def _nl_element(t, idx):
    qs, d = t
    *lead, k = idx
    return f32(d[(*lead, k // 32)]) * _kvalue(_nibble(qs, lead, k))


@element("iq4_xs")
def _xs_element(t, idx):
    qs, sl, sh, d = t
    *lead, k = idx
    s, ib = k // 256, k % 256 // 32
    lo = bits(sl[(*lead, s * 4 + ib // 2)], ib % 2 * 4, 0x0F).astype("int32")
    hi = bits(sh[(*lead, s)], ib * 2, 0x3).astype("int32")
    dl = f32(d[(*lead, s)]) * f32((lo | (hi << 4)) - 32)
    return dl * _kvalue(_nibble(qs, lead, k))
