"""Q8_0: blocks of 32 weights = float16 scale d + 32 × int8 q; w = float32(d) * q (34 bytes).

Buffers (weight `[..., N, K]`): `.qs` int8 [..., N, K], `.d` float16 [..., N, K/32].
"""
from __future__ import annotations

import numpy as np

from .format import QuantFormat, register


def _buffers(shape):
    return [(".qs", "int8", tuple(shape)), (".d", "float16", (*shape[:-1], shape[-1] // 32))]


def _pack(raw, shape):
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).reshape(*shape[:-1], shape[-1] // 32)
    qs = blocks[:, 2:].copy().view(np.int8).reshape(shape)
    return qs, d


Q8_0 = register(QuantFormat("q8_0", "Q8_0", 32, _buffers, _pack))
