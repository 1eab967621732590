"""The run-time description of a weight format and the registry of them (by kind and GGUF type).

A weight is kept in the GGUF's own layout: the kernels read the file's bytes through a view of the mapped tensor
data, so loading copies nothing (nextn.common.gguf). A tensor of logical row-major shape [..., N, K] is one buffer
`uint8 [..., N, K / block * type_size]` (its blocks, row after row, exactly as in the file), or for the 16-bit
float types the values themselves (`float16` / `uint16` for BF16's bits, [..., N, K]); the codebook formats add
small constant tables that their element expression reads (`tables`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

# Bytes of alignment every kernel may assume of a weight buffer: GGUF's default `general.alignment`. A tensor view
# that is less aligned (a file written with a smaller alignment) is copied at load (nextn.runtime.weights).
ALIGNMENT = 32


def _no_tables():
    return ()


@dataclass(frozen=True)
class QuantFormat:
    """One GGUF tensor type as the kernels see it. The compile-time half of the same format, the element
    expression of one dequantized float32 value, is `nextn.compiler.quant.ELEMENTS[kind]`."""

    kind: str                 # buffer-plan kind, lowercase ggml type name ("q4_k")
    ggml_type: str            # GGUF type name ("Q4_K")
    block: int                # weights per block along K
    type_size: int            # bytes per block (ggml's type_size)
    dtype: str = "uint8"      # element type of the main buffer: block bytes, or float16 / uint16 (bf16 bits)
    activation: str | None = None   # "q8" / "q8_0": the CPU's integer kernels' activation rows (activation.py)
    tables: Callable = _no_tables   # () -> ((suffix, np.ndarray), ...): constant codebooks, the same for every tensor

    def row_items(self, k: int) -> int:
        """Elements of the main buffer per row of K weights."""
        return k if self.dtype != "uint8" else k // self.block * self.type_size

    def buffers(self, shape) -> list[tuple[str, str, tuple]]:
        """[(suffix, dtype, buffer shape)] for a weight of logical `shape` [..., N, K]."""
        *lead, k = shape
        out = [("", self.dtype, (*lead, self.row_items(k)))]
        return out + [(sfx, str(a.dtype), tuple(a.shape)) for sfx, a in self.tables()]

    def pack(self, raw: np.ndarray, shape) -> tuple[np.ndarray, ...]:
        """The buffers of a tensor from its data as gguf-py maps it (any shape, contiguous): the main buffer is a
        view of `raw` (no copy), then the tables."""
        *lead, k = shape
        main = np.asarray(raw).reshape(-1).view(self.dtype).reshape(*lead, self.row_items(k))
        return (main, *(a for _sfx, a in self.tables()))


FORMATS: dict[str, QuantFormat] = {}


def register(fmt: QuantFormat) -> QuantFormat:
    FORMATS[fmt.kind] = fmt
    return fmt


def by_ggml_type(type_name: str) -> QuantFormat | None:
    """The format of GGUF tensor type `type_name` ("Q4_K", "BF16"), or None for F32 and unsupported types."""
    for f in FORMATS.values():
        if f.ggml_type == type_name:
            return f
    return None
