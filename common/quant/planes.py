"""Splitting gguf-py's raw blocks into planes, shared by the block formats.

Formats keep the GGUF's bytes, split into one buffer per block field ("structure of arrays"); a few repack a
field at load time where that makes the kernel much cheaper (K-quants' 6-bit scales unpacked to bytes, IQ
codebooks as per-tensor tables; each format's docstring gives the cost).
"""
from __future__ import annotations

import numpy as np


def blocks(raw: np.ndarray, shape, block: int, type_size: int) -> np.ndarray:
    """raw uint8 GGUF bytes of a `[..., N, K]` tensor → uint8 `[..., N, K/block, type_size]`."""
    *lead, k = shape
    return np.ascontiguousarray(raw).view(np.uint8).reshape(*lead, k // block, type_size)


def field(b: np.ndarray, start: int, stop: int, dtype, shape) -> np.ndarray:
    """Bytes [start, stop) of every block, reinterpreted as little-endian `dtype`, reshaped to `shape`."""
    return np.ascontiguousarray(b[..., start:stop]).view(dtype).reshape(shape)
