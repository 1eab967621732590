"""Helpers shared by the block formats: splitting gguf-py's raw blocks into planes, and TE building blocks.

Formats keep the GGUF's bytes, split into one buffer per block field ("structure of arrays"); a few repack a
field at load time where that makes the kernel much cheaper (K-quants' 6-bit scales unpacked to bytes, IQ
codebooks as per-tensor tables; each format's docstring gives the cost). The element expressions reproduce
gguf-py's float32 arithmetic operation by operation, in its order. LLVM contracts `a*b + c` into a fused
multiply-add (one rounding instead of two); that cannot change a result here, because every product that
feeds an add (float16 scale × ≤ 6-bit sub-block scale × ≤ 5-bit quant) has at most 11 + 6 + 5 = 22
significant bits and is exact in float32. Formats whose products can round (Q6_K: 11 + 8 + 6 bits) have no add.
"""
from __future__ import annotations

import numpy as np
from tvm import tirx

F32 = "float32"


def blocks(raw: np.ndarray, shape, block: int, type_size: int) -> np.ndarray:
    """raw uint8 GGUF bytes of a `[..., N, K]` tensor → uint8 `[..., N, K/block, type_size]`."""
    *lead, k = shape
    return np.ascontiguousarray(raw).view(np.uint8).reshape(*lead, k // block, type_size)


def field(b: np.ndarray, start: int, stop: int, dtype, shape) -> np.ndarray:
    """Bytes [start, stop) of every block, reinterpreted as little-endian `dtype`, reshaped to `shape`."""
    return np.ascontiguousarray(b[..., start:stop]).view(dtype).reshape(shape)


def bits(byte, shift, mask: int):
    """(byte >> shift) & mask for an unsigned byte/word load; `shift` is an index expression."""
    dt = byte.dtype
    return (byte >> tirx.Cast(dt, shift)) & tirx.const(mask, dt)


def f32(e):
    return e.astype(F32)
