"""GGUF block-quantized weight formats, run-time half: the buffers a weight occupies and how gguf-py's raw
blocks are packed into them (numpy only, so the runtime loads weights without the TVM compiler).

Each format says (1) which buffers a weight of logical row-major shape `[..., N, K]` occupies in memory and
(2) how to pack gguf-py's raw blocks (`uint8 [..., N, K / block * type_size]`) into those buffers. The
compile-time half, (3) the TE expression of one dequantized float32 element evaluated inside the matmul kernels,
is `nextn.compiler.quant`, keyed by the same `kind`. Dequantization must equal `gguf.quants.dequantize` bit for
bit. Layouts follow gguf-py's `gguf.quants` and ggml's type table (ggml/src/ggml-common.h).
"""
from __future__ import annotations

from . import iq4, iq_grid, k_quants, legacy, q8_0  # noqa: F401  (each registers its formats)
from .format import FORMATS, QuantFormat, by_ggml_type, register

__all__ = ["FORMATS", "QuantFormat", "by_ggml_type", "register"]
