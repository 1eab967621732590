"""MXFP4 (17 B per 32 weights): OCP microscaling FP4, a shared power-of-two scale over 4-bit e2m1 values
(ggml/src/ggml-common.h block_mxfp4, kvalues_mxfp4; ggml-impl.h ggml_e8m0_to_fp32_half; gguf-py gguf/quants.py).

    MXFP4 (17 B)  e u8 | qs[16] (nibbles as Q4_0: byte l holds elements l (low) and 16 + l (high))
                  w = d * E2M1X2[q],  d = 2^(e - 128) built from its float32 bits as ggml_e8m0_to_fp32_half (e8m0_half)

The e8m0 scale is halved and the e2m1 values doubled (as ggml and gguf-py do), so both stay exact in float32;
the 16-value lookup is te.lut16 (a Select tree: no table buffer).
"""
from __future__ import annotations

from tvm import tirx

from .te import Block, bits, const, element, lut16

# e2m1 values doubled (index bit 3 the sign; 0, 0.5, 1, 1.5, 2, 3, 4, 6 in the OCP Microscaling Formats v1.0 spec)
E2M1X2 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def e8m0_half(e_byte):
    """2^(e - 128) as float32 for a uint8 exponent expression (ggml_e8m0_to_fp32_half): e < 2 give the float32
    subnormals 2^-128, 2^-127 (0x00200000 << e), else the bits (e - 1) << 23. Both Select arms are evaluated: the
    subnormal arm shifts by e & 1 (= e where it is taken) to stay below 32 bits."""
    e = e_byte.astype("uint32")
    u32 = lambda v: const(v, "uint32")  # noqa: E731
    return tirx.reinterpret("float32", tirx.Select(e < u32(2), u32(0x00200000) << (e & u32(1)), (e - u32(1)) << u32(23)))


@element("mxfp4")
def _mxfp4(t, idx):
    b = Block(t[0], idx, 32, 17)
    return e8m0_half(b.u8(0)) * lut16(E2M1X2, bits(b.u8(1 + b.e % 16), b.e // 16 * 4, 0x0F))
