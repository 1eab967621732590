"""GGUF weight formats, run-time half: which buffers a weight occupies (the file's own bytes: views, no repacking)
and the activation rows of the CPU's integer kernels (numpy only, so the runtime loads weights without the TVM
compiler). The compile-time half, the TE expression of one dequantized float32 element evaluated inside the
kernels, is `nextn.compiler.quant`, keyed by the same `kind`; dequantization equals `gguf.quants.dequantize`
bit for bit (tests/test_quant.py).
"""
from __future__ import annotations

from . import formats  # noqa: F401  (registers the formats)
from .format import FORMATS, QuantFormat, by_ggml_type, register

__all__ = ["FORMATS", "QuantFormat", "by_ggml_type", "register"]
