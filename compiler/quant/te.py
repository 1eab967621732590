"""TE building blocks of the element expressions, and the registry `ELEMENTS` (format kind → expression).

The element expressions reproduce gguf-py's float32 arithmetic operation by operation, in its order. LLVM
contracts `a*b + c` into a fused multiply-add (one rounding instead of two); that cannot change a result here,
because every product that feeds an add (float16 scale × ≤ 6-bit sub-block scale × ≤ 5-bit quant) has at most
11 + 6 + 5 = 22 significant bits and is exact in float32. Formats whose products can round (Q6_K: 11 + 8 + 6
bits) have no add.
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


def bits(byte, shift, mask: int):
    """(byte >> shift) & mask for an unsigned byte/word load; `shift` is an index expression."""
    dt = byte.dtype
    return (byte >> tirx.Cast(dt, shift)) & tirx.const(mask, dt)


def f32(e):
    return e.astype(F32)
