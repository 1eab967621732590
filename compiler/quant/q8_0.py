"""Q8_0 element: w = float32(d) * q (layout: nextn.common.quant.q8_0)."""
from __future__ import annotations

from .te import element


@element("q8_0")
def _element(t, idx):
    qs, d = t
    *lead, k = idx
    return d[(*lead, k // 32)].astype("float32") * qs[idx].astype("float32")
