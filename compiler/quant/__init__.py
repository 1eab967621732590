"""GGUF block-quantized weight formats, compile-time half: the TE expression of one dequantized float32 element,
evaluated inside the matmul / expert / embedding kernels, so that the weights stay quantized in memory.

`ELEMENTS[kind](tensors, idx)`: `tensors` are the TE tensors of the format's buffers in the order of
`nextn.common.quant.FORMATS[kind].buffers` (the run-time half: layout and packing), `idx` the logical index
[..., n, k]. Dequantization must equal `gguf.quants.dequantize` bit for bit (tests/test_quant.py).
"""
from __future__ import annotations

from nextn.common.quant import FORMATS

from . import floats, iq4, iq_grid, k_quants, legacy, mxfp4, nvfp4, q8_0  # noqa: F401  (each registers its element expressions)
from .te import ELEMENTS

_missing = set(FORMATS) ^ set(ELEMENTS)
assert not _missing, f"formats without both halves (common.quant layout, compiler.quant element): {sorted(_missing)}"

__all__ = ["ELEMENTS"]
