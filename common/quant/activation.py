"""Activation rows as the CPU's integer matmul kernels read them (the semantics of `mul_mat` / `mul_mat_id` with a
weight whose format has `activation = "q8"` or `"q8_0"`, when an artifact quantizes activations:
`x86_kernels.activation_quant`). Two row formats, the same rule with different block lengths:

    "q8"    blocks of 256 (ggml's block_q8_K; for the K-quants and IQ4_XS), plus the sums of q over each 16
    "q8_0"  blocks of 32 (ggml's block_q8_0; for the 32-weight block formats Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 and
            for NVFP4: ggml-cpu's vec_dot_type for them, ggml_vec_dot_q8_0_q8_0 / ggml_vec_dot_iq4_nl_q8_0 /
            ggml_vec_dot_mxfp4_q8_0 / ggml_vec_dot_nvfp4_q8_0; and for Q4_1, Q5_1, whose vec_dot_type
            block_q8_1 adds s = d Σ q: the kernels take Σ q exactly from these values instead)

Each row of x (float32, length K, a multiple of the block) is cut into blocks of 256 (32) values; per block
    amax = max |x_i|,  d = amax / 127,  q_i = round_half_even(x_i * (127 / amax))   (q = 0 where amax = 0)
in float32 arithmetic, q_i in [-127, 127], amax taken as 0 where it is below AMAX_MIN (a zero block: d = 0, q = 0);
the row then stands for x'_i = d * q_i. The product with a weight w is
sum_i w_i x'_i, where w_i is the weight's exact dequantized value: the kernels get it exactly from integer
products (u8 x s8 -> i16 pairs -> i32) and one float32 multiply-add per block, so compiled and numpy results differ
only by float32 rounding of the per-block sums. This is ggml-cpu's scheme (quantize_row_q8_K, block_q8_K;
ggml_vec_dot_q4_K_q8_K …) with a float32 d; the sums of q over each 16 (`xs`) are the kernels' shortcut for the
mins and offsets of Q4_K / Q5_K / Q6_K. A "q8_0" row has no sums: most of its formats have one scale per 32
weights and no offset, so a block's product is d_w * d_x * (exact int32 sum), one float32 multiply-add; Q4_1 and
Q5_1 (w = d_w q + m) add m * d_x * (the block's exact sum of q), one more (the lane offsets of "q8_0_g8" hold it
per group of 8 blocks).
"""
from __future__ import annotations

import numpy as np

BLOCK = 256
SUM_GROUP = 16
BLOCKS = {"q8": BLOCK, "q8_0": 32}   # values per scale of each row format
# Blocks whose amax is below 2^-118 (~3e-36) quantize as zero blocks, on every path (this statement, the x86 kernels
# compiler/lower/x86/quantize.py, the GPU one compiler/lower/cuda/int8.py). CUDA kernels are compiled with nvcc's
# --use_fast_math, whose -ftz flushes float32 subnormal inputs and results to zero: from 2^-118 up, amax, d = amax /
# 127 and 127 / amax are normal and every product x * (127 / amax) that rounds to a nonzero q is too, so flushing
# changes no q or d (docs/gpu.md "Rounding of the quantizer"); below it, d may be subnormal (flushed to 0 there) and
# 127 / amax infinite (x * inf: no quant at all). The threshold makes both paths give the zero block instead.
AMAX_MIN = np.float32(2.0 ** -118)


def _amax(xb: np.ndarray) -> np.ndarray:
    """max |x| over the last axis, 0 where it is below AMAX_MIN (NaN stays NaN)."""
    a = np.abs(xb).max(-1)
    return np.where(a < AMAX_MIN, np.float32(0), a).astype(np.float32)


def quantize(x: np.ndarray):
    """x f32 [..., K] -> (q int8 [..., K], d f32 [..., K/256], xs int16 [..., K/16])."""
    x = np.ascontiguousarray(x, np.float32)
    *lead, k = x.shape
    if k % BLOCK:
        raise ValueError(f"activation rows of length {k}: the q8 row format needs a multiple of {BLOCK}")
    xb = x.reshape(*lead, k // BLOCK, BLOCK)
    amax = _amax(xb)
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
    rule of `quantize` (d = amax / 127, q = round_half_even(x * (127 / amax)), q = 0 where amax = 0, amax below
    AMAX_MIN taken as 0). As ggml's
    quantize_row_q8_0 (ggml-cpu/arch/x86/quants.c: 127 / amax, round to nearest even) with a float32 d where ggml
    stores a float16 one."""
    x = np.ascontiguousarray(x, np.float32)
    *lead, k = x.shape
    if k % 32:
        raise ValueError(f"activation rows of length {k}: the q8_0 row format needs a multiple of 32")
    xb = x.reshape(*lead, k // 32, 32)
    amax = _amax(xb)
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


def _iq4xs_order() -> np.ndarray:
    """IQ4XS_ORDER[p] = the index in its block of 256 of the value at position p of a "q8_iq4xs" block. Position
    p = 64c + 16i + 4m + e (four vectors c of 64 bytes, 128-bit lanes i, int32 lanes m, bytes e) holds value v of
    sub-block s (element 32s + v) with s = i + 4 * (m // 2) and v = 16 * (c // 2) + 8 * (c % 2) + 4 * (m % 2) + e:
    the order in which the CPU kernel's nibble unpacking leaves IQ4_XS's quants (qs[16s + j] holds values j and
    16 + j), so each int32 lane of every vector of a block sees one sub-block (lane 4i + m: sub-block
    i + 4 * (m // 2))."""
    p = np.arange(256)
    c, i, m, e = p // 64, p % 64 // 16, p % 16 // 4, p % 4
    return (32 * (i + 4 * (m // 2)) + 16 * (c // 2) + 8 * (c % 2) + 4 * (m % 2) + e).astype(np.int64)


IQ4XS_ORDER = _iq4xs_order()


def quantize_iq4xs(x: np.ndarray):
    """The "q8" row in the layout of the IQ4_XS kernels ("q8_iq4xs"): x f32 [..., K] -> (q int8 [..., K], d f32
    [..., K/256], xc int32 [..., K/16]). q and d are `quantize`'s (the same values x' = d * q), q reordered in
    each block of 256 by IQ4XS_ORDER; xc[16b + L] = -128 * (the sum of the 16 permuted q at positions
    64c + 4L + e of block b): the offset that turns the kernel's unsigned quants (kvalues + 128) back into
    signed ones, one int32 lane at a time."""
    q, d, _xs = quantize(x)
    *lead, k = q.shape
    qp = q.reshape(*lead, k // BLOCK, BLOCK)[..., IQ4XS_ORDER]
    lanes = qp.reshape(*lead, k // BLOCK, 4, 16, 4).astype(np.int32).sum((-3, -1))
    return qp.reshape(*lead, k), d, np.ascontiguousarray((-128 * lanes).reshape(*lead, k // 16).astype(np.int32))


def _q4k_order() -> np.ndarray:
    """Q4K_ORDER[p] = the index in its block of 256 of the value at position p of a "q8_q4k" block: per 128 values
    the sub-blocks of 32 in the order 0, 2, 1, 3 (p = 128h + 32r + v holds element 128h + 32 * [0, 2, 1, 3][r] + v).
    The order in which the CPU kernels unpack Q4_K / Q5_K quants 64 bytes at a time: qs[64h .. 64h + 64)'s low
    nibbles are sub-blocks 4h and 4h + 2, its high nibbles 4h + 1 and 4h + 3 (ggml-common.h block_q4_K), so each
    nibble vector meets 64 contiguous activation bytes."""
    p = np.arange(256)
    return (128 * (p // 128) + 32 * np.array([0, 2, 1, 3])[p % 128 // 32] + p % 32).astype(np.int64)


Q4K_ORDER = _q4k_order()


def quantize_q4k(x: np.ndarray):
    """The "q8" row in the layout of the Q4_K / Q5_K kernels ("q8_q4k"): x f32 [..., K] -> (q int8 [..., K], d f32
    [..., K/256], xs int16 [..., K/16]): `quantize`'s values, q reordered in each block of 256 by Q4K_ORDER, d and
    the sums xs (over each 16 values in element order) as they are."""
    q, d, xs = quantize(x)
    *lead, k = q.shape
    return q.reshape(*lead, k // BLOCK, BLOCK)[..., Q4K_ORDER].reshape(*lead, k), d, xs


def quantize_q8_0_g8(x: np.ndarray):
    """The "q8_0" row in the layout of the IQ4_NL / MXFP4 kernels ("q8_0_g8"): x f32 [..., K] -> (q int8 [..., K],
    d f32 [..., K/32], dl f32 [..., K/256*16], xc int32 [..., K/256*16]). q and d are `quantize_q8_0`'s; each full
    group of 8 blocks (256 values) is reordered by IQ4XS_ORDER (block b of the group taking sub-block b's place),
    the blocks after the last full group stay as they are. Per group, int32 lane L (of 16) sees block
    L // 4 + 4 * (L % 4 // 2) only: dl is that block's d, xc = -128 x the sum of the lane's 16 q (as in
    `quantize_iq4xs`)."""
    q, d = quantize_q8_0(x)
    *lead, k = q.shape
    g = k // BLOCK
    qg = q[..., :g * BLOCK].reshape(*lead, g, BLOCK)[..., IQ4XS_ORDER]
    lanes = qg.reshape(*lead, g, 4, 16, 4).astype(np.int32).sum((-3, -1))
    lane_block = np.array([lane // 4 + 4 * (lane % 4 // 2) for lane in range(16)])
    dl = d[..., :8 * g].reshape(*lead, g, 8)[..., lane_block]
    q = np.concatenate([qg.reshape(*lead, g * BLOCK), q[..., g * BLOCK:]], -1)
    xc = (-128 * lanes).reshape(*lead, g * 16).astype(np.int32)
    return q, d, np.ascontiguousarray(dl.reshape(*lead, g * 16)), np.ascontiguousarray(xc)
