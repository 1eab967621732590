"""TE building blocks of the element expressions, and the registry `ELEMENTS` (format kind → expression).

An element expression reads the weight's GGUF bytes (`Block`: typed little-endian reads at byte offsets inside
the block that holds logical element k of a row) and reproduces gguf-py's float32 arithmetic operation by
operation, in its order. LLVM contracts `a*b + c` into a fused multiply-add (one rounding instead of two); that
cannot change a result here, because every product that feeds an add (float16 scale × ≤ 6-bit sub-block scale
× ≤ 5-bit quant) has at most 11 + 6 + 5 = 22 significant bits and is exact in float32. Formats whose products can
round (Q6_K: 11 + 8 + 6 bits) have no add.
"""
from __future__ import annotations

from typing import Callable

from tvm import tirx

F32 = "float32"

# kind (nextn.common.quant.FORMATS) → (TE tensors, one per buffer in the format's order; index tuple) → f32 PrimExpr
ELEMENTS: dict[str, Callable] = {}


def element(kind: str):
    """Register the decorated function as the element expression of format `kind`."""
    def put(fn):
        ELEMENTS[kind] = fn
        return fn

    return put


def const(v, dtype: str):
    return tirx.const(v, dtype)


def bits(word, shift, mask: int):
    """(word >> shift) & mask for an unsigned load; `shift` is an index expression."""
    dt = str(word.ty)
    return (word >> tirx.Cast(dt, shift)) & tirx.const(mask, dt)


def f32(e):
    return e.astype(F32)


def lut16(values, nib):
    """values[nib] (16 constants) as a float32 expression of a uint8 4-bit index: a 4-level Select tree on the
    index bits with constant leaves (vector blends on the CPU; 5x faster on this CPU than a gather from a table)."""
    def tree(lo, width):
        if width == 1:
            return const(float(values[lo]), F32)
        half = width // 2
        bit = (nib & const(half, "uint8")) != const(0, "uint8")
        return tirx.Select(bit, tree(lo + half, half), tree(lo, half))

    return tree(0, 16)


class Block:
    """Reads inside the GGUF block that holds logical element k of row (*lead, n). `raw` is the weight's bytes
    (uint8 [..., N, K / block * type_size]), offsets are bytes from the block's start, values little-endian;
    `e` = k % block is the element's position in its block."""

    def __init__(self, raw, idx, block: int, type_size: int):
        *pre, k = idx
        self.raw, self.pre, self.base, self.e = raw, tuple(pre), k // block * type_size, k % block

    def u8(self, off):
        return self.raw(*self.pre, self.base + off)

    def i8(self, off):
        return tirx.reinterpret("int8", self.u8(off))

    def u16(self, off):
        return self.u8(off).astype("uint16") | (self.u8(off + 1).astype("uint16") << const(8, "uint16"))

    def u32(self, off):
        v = self.u8(off).astype("uint32")
        for i in (1, 2, 3):
            v = v | (self.u8(off + i).astype("uint32") << const(8 * i, "uint32"))
        return v

    def f16(self, off):
        """The float16 at `off`, widened to float32."""
        return f32(tirx.reinterpret("float16", self.u16(off)))
