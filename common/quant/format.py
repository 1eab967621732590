"""The run-time description of a block-quantized format and the registry of them (by kind and GGUF type)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class QuantFormat:
    """How a weight of one GGUF block type sits in memory for the kernels.

    `buffers(shape)` → [(suffix, dtype, buffer shape)] for a weight of logical row-major `shape` [..., N, K];
    `pack(raw, shape)` → one numpy array per buffer, from gguf-py's raw blocks (uint8 [..., N, K/block*type_size]).
    The kernels' element expression of the same format (compile time) is `nextn.compiler.quant.ELEMENTS[kind]`."""

    kind: str                 # buffer-plan kind, lowercase ggml type name ("q8_0")
    ggml_type: str            # GGUF type name ("Q8_0")
    block: int                # weights per block along K
    buffers: Callable         # shape -> [(suffix, dtype, buffer shape)]
    pack: Callable            # (raw uint8 blocks, shape) -> tuple of arrays, one per buffer


FORMATS: dict[str, QuantFormat] = {}


def register(fmt: QuantFormat) -> QuantFormat:
    FORMATS[fmt.kind] = fmt
    return fmt


def by_ggml_type(type_name: str) -> QuantFormat | None:
    """The format of GGUF tensor type `type_name` ("Q4_K"), or None for float and unsupported types."""
    for f in FORMATS.values():
        if f.ggml_type == type_name:
            return f
    return None
