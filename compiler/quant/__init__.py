"""GGUF block-quantized weight formats as the kernels read them.

Each format says (1) which buffers a weight of logical row-major shape `[..., N, K]` occupies in memory,
(2) how to pack gguf-py's raw blocks (`uint8 [..., N, K / block * type_size]`) into those buffers, and
(3) the TE expression of one dequantized float32 element, evaluated inside the matmul kernels, so that the
weights stay quantized in memory. Dequantization must equal `gguf.quants.dequantize` bit for bit.
Layouts follow gguf-py's `gguf.quants` and ggml's type table (ggml/src/ggml-common.h).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class QuantFormat:
    kind: str                 # buffer-plan kind, lowercase ggml type name ("q8_0")
    ggml_type: str            # GGUF type name ("Q8_0")
    block: int                # weights per block along K
    buffers: Callable         # shape -> [(suffix, dtype, buffer shape)]
    pack: Callable            # (raw uint8 blocks, shape) -> tuple of arrays, one per buffer
    element: Callable         # (TE tensors per buffer, index tuple) -> float32 PrimExpr


FORMATS: dict[str, QuantFormat] = {}


def register(fmt: QuantFormat) -> QuantFormat:
    FORMATS[fmt.kind] = fmt
    return fmt


def by_ggml_type(type_name: str) -> QuantFormat | None:
    for f in FORMATS.values():
        if f.ggml_type == type_name:
            return f
    return None


def pack(type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    fmt = by_ggml_type(type_name)
    return fmt.pack(np.ascontiguousarray(raw).view(np.uint8), tuple(shape))


from . import q8_0, legacy, k_quants, iq4, iq_grid  # noqa: E402,F401  (registers the formats)
