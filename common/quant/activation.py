"""Activation rows as the CPU's integer matmul kernels read them (the semantics of `mul_mat` / `mul_mat_id` with a
weight whose format has `activation = "q8"` or `"q8_0"`, when an artifact quantizes activations:
`x86_kernels.activation_quant`). Two row formats, the same rule with different block lengths:

    "q8"    blocks of 256 (ggml's block_q8_K; for the K-quants and IQ4_XS), plus the sums of q over each 16
    "q8_0"  blocks of 32 (ggml's block_q8_0; for the 32-weight block formats Q8_0, IQ4_NL, MXFP4: ggml-cpu's
            vec_dot_type for them, ggml_vec_dot_q8_0_q8_0 / ggml_vec_dot_iq4_nl_q8_0 / ggml_vec_dot_mxfp4_q8_0)

Each row of x (float32, length K, a multiple of the block) is cut into blocks of 256 (32) values; per block
    amax = max |x_i|,  d = amax / 127,  q_i = round_half_even(x_i * (127 / amax))   (q = 0 where amax = 0)
in float32 arithmetic, q_i in [-127, 127]; the row then stands for x'_i = d * q_i. The product with a weight w is
sum_i w_i x'_i, where w_i is the weight's exact dequantized value: the kernels get it exactly from integer
products (u8 x s8 -> i16 pairs -> i32) and one float32 multiply-add per block, so compiled and numpy results differ
only by float32 rounding of the per-block sums. This is ggml-cpu's scheme (quantize_row_q8_K, block_q8_K;
ggml_vec_dot_q4_K_q8_K …) with a float32 d; the sums of q over each 16 (`xs`) are the kernels' shortcut for the
mins and offsets of Q4_K / Q5_K / Q6_K. A "q8_0" row has no sums: its formats have one scale per 32 weights
and no offset, so a block's product is d_w * d_x * (exact int32 sum), one float32 multiply-add.
"""
from __future__ import annotations

import numpy as np

BLOCK = 256
SUM_GROUP = 16
BLOCKS = {"q8": BLOCK, "q8_0": 32}   # values per scale of each row format


def quantize(x: np.ndarray):
    """x f32 [..., K] -> (q int8 [..., K], d f32 [..., K/256], xs int16 [..., K/16])."""
    x = np.ascontiguousarray(x, np.float32)
    *lead, k = x.shape
    if k % BLOCK:
        raise ValueError(f"activation rows of length {k}: the q8 row format needs a multiple of {BLOCK}")
    xb = x.reshape(*lead, k // BLOCK, BLOCK)
    amax = np.abs(xb).max(-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int8).reshape(*lead, k)
    xs = q.reshape(*lead, k // SUM_GROUP, SUM_GROUP).astype(np.int16).sum(-1, dtype=np.int16)
    return q, d, xs


def dequantize(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The values a quantized row stands for, exactly (float64: d * q needs 24 + 7 bits)."""
    *lead, k = q.shape
    return (q.astype(np.float64).reshape(*lead, k // BLOCK, BLOCK) * d[..., None].astype(np.float64)).reshape(*lead, k)


def quantize_q8_0(x: np.ndarray):
    """The "q8_0" row format: x f32 [..., K] -> (q int8 [..., K], d f32 [..., K/32]); per block of 32 values the
    rule of `quantize` (d = amax / 127, q = round_half_even(x * (127 / amax)), q = 0 where amax = 0). As ggml's
    quantize_row_q8_0 (ggml-cpu/arch/x86/quants.c: 127 / amax, round to nearest even) with a float32 d where ggml
    stores a float16 one."""
    x = np.ascontiguousarray(x, np.float32)
    *lead, k = x.shape
    if k % 32:
        raise ValueError(f"activation rows of length {k}: the q8_0 row format needs a multiple of 32")
    xb = x.reshape(*lead, k // 32, 32)
    amax = np.abs(xb).max(-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    return np.rint(xb * inv[..., None]).astype(np.int8).reshape(*lead, k), d


def dequantize_blocks(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The values a quantized row of either format stands for, exactly (float64), the block length from the
    shapes (K / d.shape[-1])."""
    *lead, k = q.shape
    b = k // d.shape[-1]
    return (q.astype(np.float64).reshape(*lead, k // b, b) * d[..., None].astype(np.float64)).reshape(*lead, k)


def round_trip(x: np.ndarray, row_format: str = "q8") -> np.ndarray:
    """x' (float64) for x: what a quantizing matmul with activation rows `row_format` ("q8", "q8_0")
    multiplies the weight with."""
    if row_format == "q8_0":
        return dequantize_blocks(*quantize_q8_0(x))
    q, d, _ = quantize(x)
    return dequantize(q, d)
