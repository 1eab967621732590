"""NVFP4 (36 B per 64 weights): NVIDIA's 4-bit e2m1 values with an unsigned e4m3 scale per 16 (ggml/src/ggml-common.h
block_nvfp4, ggml-impl.h ggml_ue4m3_to_fp32, ggml-quants.c dequantize_row_nvfp4; gguf-py gguf/quants.py NVFP4).

    NVFP4 (36 B)  d[4] (one ue4m3 byte per sub-block of 16) | qs[32] (8 bytes per sub-block s: byte 4 + 8s + j
                  holds element 16s + j (low nibble) and 16s + 8 + j (high nibble), j < 8)
                  w = ue4m3_half(d[s]) * E2M1X2[q]

ue4m3_half(x) = 0.5 * the unsigned e4m3 value of byte x (bias 7; bit 7 is ignored but for the two zero codes):
0 for x = 0 and x = 0x7F (e4m3's NaN), man * 2^-10 for exponent field 0, (1 + man/8) * 2^(exp - 8) otherwise:
built from its float32 bits, exact, as the e2m1 values doubled (MXFP4's table): every product is exact in
float32. The per-tensor (per-expert) second scale, GGUF tensor `X.scale` next to `X.weight`, multiplies the
matmul's output, not the weight (nextn.compiler.graphs.apply_weight_scales).
"""
from __future__ import annotations

from tvm import tirx

from .mxfp4 import E2M1X2
from .te import F32, Block, bits, const, element, lut16


def ue4m3_half(x, lanes: int = 1):
    """ggml_ue4m3_to_fp32 of a uint8 expression: the scale, halved (E2M1X2 holds the e2m1 values doubled); of
    each lane of a uint8 x `lanes` vector for lanes > 1 (float32 x lanes)."""
    vec = (lambda dt: dt) if lanes == 1 else (lambda dt: f"{dt}x{lanes}")   # noqa: E731
    c = (lambda v, dt: const(v, dt)) if lanes == 1 else (lambda v, dt: tirx.Broadcast(const(v, dt), lanes))  # noqa
    u32 = lambda v: c(v, "uint32")  # noqa: E731
    e = tirx.Cast(vec("uint32"), x)
    exp, man = (e >> u32(3)) & u32(0xF), e & u32(7)
    normal = tirx.reinterpret(vec(F32), ((exp + u32(119)) << u32(23)) | (man << u32(20)))   # (1 + man/8) 2^(exp-8)
    val = tirx.Select(exp == u32(0), tirx.Cast(vec(F32), man) * c(2.0 ** -10, F32), normal)
    return tirx.Select(tirx.Or(e == u32(0), e == u32(0x7F)), c(0.0, F32), val)


@element("nvfp4")
def _nvfp4(t, idx):
    b = Block(t[0], idx, 64, 36)
    s, j = b.e // 16, b.e % 16
    return ue4m3_half(b.u8(s)) * lut16(E2M1X2, bits(b.u8(4 + s * 8 + j % 8), j // 8 * 4, 0x0F))
