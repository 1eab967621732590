"""IQ2_XXS and IQ1_S elements (layout and codebooks: nextn.common.quant.iq_grid).

    IQ2_XXS  w = ((d * (0.5 + s)) * 0.25) * grid2[aux0 byte l][j] * (-1 if bit j of ksigns[sign index l])
    IQ1_S    w = (d * (2s + 1)) * (grid1[idx][j] + (±0.125))
"""
from __future__ import annotations

from tvm import tirx

from nextn.common.quant.iq_grid import QK

from .te import bits, element, f32


@element("iq2_xxs")
def _iq2_element(t, idx):
    qs, d, grid, signs = t
    *lead, k = idx
    s, e = k // QK, k % QK
    ib, l, j = e // 32, e % 32 // 8, e % 8
    aux0, aux1 = qs[(*lead, s * 16 + ib * 2)], qs[(*lead, s * 16 + ib * 2 + 1)]
    g = grid[bits(aux0, l * 8, 0xFF).astype("int32") * 8 + j]
    neg = bits(signs[bits(aux1, l * 7, 0x7F).astype("int32")], j, 1)
    db = f32(d[(*lead, s)]) * (tirx.const(0.5, "float32") + f32(aux1 >> tirx.const(28, "uint32"))) * tirx.const(0.25, "float32")
    sign = tirx.Select(neg == tirx.const(0, "uint8"), tirx.const(1.0, "float32"), tirx.const(-1.0, "float32"))
    return db * f32(g) * sign


@element("iq1_s")
def _iq1_element(t, idx):
    qs, qh, d, grid = t
    *lead, k = idx
    s, e = k // QK, k % QK
    ib, l, j = e // 32, e % 32 // 8, e % 8
    h = qh[(*lead, s * 8 + ib)]
    gi = qs[(*lead, s * 32 + ib * 4 + l)].astype("int32") | (bits(h, l * 3, 7).astype("int32") << 8)
    dl = f32(d[(*lead, s)]) * f32(bits(h, 12, 7).astype("int32") * 2 + 1)
    delta = tirx.Select(bits(h, 15, 1) == tirx.const(0, "uint16"), tirx.const(0.125, "float32"),
                        tirx.const(-0.125, "float32"))
    return dl * (f32(grid[gi * 8 + j]) + delta)
