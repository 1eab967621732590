"""KV cache types (llama.cpp's `-ctk/--cache-type-k`, `-ctv/--cache-type-v`), run-time half: names, storage and
bytes, and the numpy rounding that defines what a cache of each type holds (numpy only).

- f32, f16, bf16: one value per element, rounded to nearest even when stored (ggml GGML_FP32_TO_FP16 /
  GGML_FP32_TO_BF16);
- q8_0: ggml's `block_q8_0` (ggml-common.h) per 32 consecutive values of a head row: an f16 scale d then 32 int8
  qs, value d * qs; quantized as ggml's `quantize_row_q8_0_ref` (ggml-quants.c): amax = max |x|, d = amax / 127,
  id = d ? 1 / d : 0, qs = roundf(x * id); read back exactly as gguf-py's `Q8_0` dequantize. (llama.cpp also
  Hadamard-rotates K/V rows of quantized caches by default, `attn_rot_k/v`; nextn does not.)

A cache is logically float32 `[C, H, D]`; `KVType.round(x)` is the float32 value a cell holds after storing x,
which is what the IR interpreter keeps and what the compiled kernels must read back.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import NextnError

QK8_0 = 32
DEFAULT = "f16"   # llama.cpp's default for both caches


@dataclass(frozen=True)
class KVType:
    name: str
    storage_dtype: str      # numpy / TVM dtype of the buffer
    block: int              # values per block
    block_bytes: int        # bytes per block

    def storage_shape(self, shape) -> tuple:
        """Buffer shape of a cache of logical shape [..., D] (D a multiple of `block`)."""
        *lead, d = shape
        if self.block == 1:
            return (*lead, d)
        return (*lead, d // self.block * self.block_bytes)

    def row_bytes(self, d: int) -> int:
        return d // self.block * self.block_bytes

    def check_width(self, d: int, what: str) -> None:
        """NextnError unless rows of `d` values fit whole blocks."""
        if d % self.block:
            raise NextnError(f"KV cache type {self.name} stores blocks of {self.block} values, but {what} has rows of "
                             f"{d}; use f32, f16 or bf16 for this cache")

    def round(self, x: np.ndarray) -> np.ndarray:
        """float32 values of x [..., D] after a store into a cache of this type."""
        x = np.asarray(x, np.float32)
        if self.name == "f32":
            return x
        if self.name == "f16":
            return x.astype(np.float16).astype(np.float32)
        if self.name == "bf16":
            return (_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)
        d16, qs = _q8_0(x)
        return (d16.astype(np.float32)[..., None] * qs.astype(np.float32)).reshape(x.shape)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """The storage of x [..., D] (what a compiled cache's buffer holds), as a numpy array of storage_dtype
        (bf16 as its uint16 bits)."""
        x = np.asarray(x, np.float32)
        if self.name == "f32":
            return x.copy()
        if self.name == "f16":
            return x.astype(np.float16)
        if self.name == "bf16":
            return _bf16_bits(x)
        d16, qs = _q8_0(x)
        blocks = np.concatenate([d16[..., None].view(np.uint8), qs.view(np.uint8)], axis=-1)   # [..., nb, 34]
        return blocks.reshape(*x.shape[:-1], -1)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even bf16 bits of float32 x (NaN stays NaN), as GGML_FP32_TO_BF16."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), ((u >> 16) | 64).astype(np.uint16), r)


def _q8_0(x: np.ndarray):
    """ggml quantize_row_q8_0_ref on the last axis: (d as float16 [..., nb], qs int8 [..., nb, 32])."""
    b = x.reshape(*x.shape[:-1], x.shape[-1] // QK8_0, QK8_0)
    d = np.max(np.abs(b), axis=-1) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = b * inv[..., None]
    tr = np.trunc(v)
    qs = tr + np.where(np.abs(v - tr) >= np.float32(0.5), np.sign(v), np.float32(0))   # roundf: half away from 0
    return d.astype(np.float16), qs.astype(np.int8)


KV_TYPES = {t.name: t for t in (
    KVType("f32", "float32", 1, 4),
    KVType("f16", "float16", 1, 2),
    KVType("bf16", "bfloat16", 1, 2),
    KVType("q8_0", "uint8", QK8_0, 2 + QK8_0),
)}
NAMES = tuple(KV_TYPES)


def numpy_dtype(dtype: str):
    """The numpy dtype of a storage dtype name (bfloat16 through ml_dtypes, which TVM depends on)."""
    if str(dtype) == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(str(dtype))


def itemsize(dtype: str) -> int:
    """Bytes per element of a buffer dtype (bfloat16 without ml_dtypes: the runtime bundle may lack it)."""
    return 2 if str(dtype) == "bfloat16" else np.dtype(str(dtype)).itemsize


def state_bytes_per_cell(shape, dtype: str) -> int:
    """Bytes one cell of a position-indexed state buffer [C, ...] of `dtype` holds."""
    return int(np.prod([int(d) for d in shape[1:]], dtype=np.int64)) * itemsize(dtype)


def kv_type(name: str, flag: str = "--cache-type-k") -> KVType:
    """The type named `name` (case-insensitive), or NextnError naming the flag and the choices."""
    t = KV_TYPES.get(str(name).lower())
    if t is None:
        raise NextnError(f"{flag} {name}: expected one of {', '.join(NAMES)}")
    return t
