"""F16 and BF16 weights, kept 16-bit in memory and widened as they are read (exact: every 16-bit value is a float32)."""
from __future__ import annotations

from tvm import tirx

from .te import const, element, f32


@element("f16")
def _f16(t, idx):
    return f32(t[0](*idx))


@element("bf16")
def _bf16(t, idx):   # the buffer holds the bits (uint16): they are the float32's upper half
    return tirx.reinterpret("float32", t[0](*idx).astype("uint32") << const(16, "uint32"))
