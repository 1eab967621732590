"""K-quants Q2_K … Q6_K: super-blocks of 256 weights (block_q2_K …); e = k % 256, sub-blocks of 16 or 32.

    Q2_K (84 B)   scales[16] (lo nibble sc, hi m) | qs[64] | d f16 | dmin f16
                  q = 2 bits (e%128)/32 of qs[32(e/128) + e%32];  w = (d*sc) q - dmin*m        (sub-block e/16)
    Q3_K (110 B)  hmask[32] | qs[64] | 12 B of 16 x 6-bit sc | d f16
                  q = (2 bits as Q2_K) - 4 (1 - bit e/32 of hmask[e%32]);  w = (d*(sc-32)) q      (sub-block e/16;
                  sc: nibble i/8 of byte i%8 | 2 bits 2(i/4) of byte 8 + i%4, i = e/16)
    Q4_K (144 B)  d f16 | dmin f16 | 12 B of 8 x (6-bit sc, 6-bit m) | qs[128]
                  q = nibble (e%64)/32 of qs[32(e/64) + e%32];  w = d*sc*q - dmin*m  (sub-block j = e/32; sc, m as
                  ggml get_scale_min_k4: j < 4: q[j] & 63, q[j+4] & 63; else nibbles of q[j+4] | 2 high bits of q[j-4], q[j])
    Q5_K (176 B)  d | dmin | 12 B scales | qh[32] | qs[128];  q |= (bit e/32 of qh[e%32]) << 4
    Q6_K (210 B)  ql[128] | qh[64] | scales int8[16] | d f16
                  q = (nibble (e%128)/64 of ql[64(e/128) + e%64] | 2 bits (e%128)/32 of qh[32(e/128) + e%32] << 4) - 32
                  w = (d*sc) q                                                                  (sub-block e/16)
"""
from __future__ import annotations

from tvm import tirx

from .te import Block, bits, const, element, f32


def _two_bits(b, off, e):
    return bits(b.u8(off + e // 128 * 32 + e % 32), e % 128 // 32 * 2, 3).astype("int32")


def q2k_factors(b, i):
    """(d · sc, dmin · m) of sub-block i (16 weights) of a Q2_K block, float32: the element is d·sc · q - dmin·m."""
    sc = b.u8(i)
    return b.f16(80) * f32(bits(sc, 0, 0x0F)), b.f16(82) * f32(bits(sc, 4, 0x0F))


@element("q2_k")
def _q2k(t, idx):
    b = Block(t[0], idx, 256, 84)
    scale, low = q2k_factors(b, b.e // 16)
    return scale * f32(_two_bits(b, 16, b.e)) - low


def q3k_factor(b, i):
    """d · (sc - 32) of sub-block i (16 weights) of a Q3_K block, float32: the element is that · q."""
    lo = bits(b.u8(96 + i % 8), i // 8 * 4, 0x0F).astype("int32")
    hi = bits(b.u8(104 + i % 4), i // 4 * 2, 0x03).astype("int32")
    return b.f16(108) * f32((lo | (hi << const(4, "int32"))) - const(32, "int32"))


@element("q3_k")
def _q3k(t, idx):
    b = Block(t[0], idx, 256, 110)
    e = b.e
    hb = bits(b.u8(e % 32), e // 32, 1).astype("int32")
    q = _two_bits(b, 32, e) - ((hb ^ const(1, "int32")) << const(2, "int32"))
    return q3k_factor(b, e // 16) * f32(q)


def scale_min(b, j):
    """6-bit (scale, min) of sub-block j from the 12 bytes at offset 4 (ggml get_scale_min_k4), as float32."""
    a, m, c = b.u8(4 + j % 4), b.u8(8 + j % 4), b.u8(12 + j % 4)   # q[j%4], q[4 + j%4], q[8 + j%4]
    u = lambda v: const(v, "uint8")   # noqa: E731
    # the two layouts chosen by a byte mask, not a Select: with a j that varies across GPU lanes, TVM's CUDA code
    # for a Select of loads is a branch per lane group (divergent) that loads a and c again in each arm
    low = u(255) * (j < 4).astype("uint8")   # 0xFF for j < 4, else 0
    sc = ((a & u(63)) & low) | (((c & u(15)) | ((a >> u(6)) << u(4))) & ~low)
    mn = ((m & u(63)) & low) | (((c >> u(4)) | ((m >> u(6)) << u(4))) & ~low)
    return f32(sc), f32(mn)


# Q4_K / Q5_K: kind -> (type_size, offset of qs, offset of qh or None)
Q45K = {"q4_k": (144, 16, None), "q5_k": (176, 48, 16)}
Q6K_SIZE = 210
# Weights per sub-block (one scale factor) of the K-quants whose element is factor · q (- min): Q4_K / Q5_K / Q6_K
SUBBLOCK = {"q4_k": 32, "q5_k": 32, "q6_k": 16}


def q45k_factors(b, j):
    """(d · sc, dmin · m) of sub-block j of a Q4_K / Q5_K block, float32: the element is d·sc · q - dmin·m."""
    sc, mn = scale_min(b, j)
    return b.f16(0) * sc, b.f16(2) * mn


def q45k_quant(b, kind):
    """The int32 quant of element b.e of a Q4_K / Q5_K block."""
    _ts, at_qs, at_qh = Q45K[kind]
    e = b.e
    q = bits(b.u8(at_qs + e // 64 * 32 + e % 32), e % 64 // 32 * 4, 0x0F).astype("int32")
    if at_qh is not None:
        q = q | (bits(b.u8(at_qh + e % 32), e // 32, 1).astype("int32") << const(4, "int32"))
    return q


def _q45k(kind):
    @element(kind)
    def expr(t, idx):
        b = Block(t[0], idx, 256, Q45K[kind][0])
        scale, low = q45k_factors(b, b.e // 32)
        return scale * f32(q45k_quant(b, kind)) - low

    return expr


_q45k("q4_k")
_q45k("q5_k")


def q6k_quant(b):
    """The int32 quant of element b.e of a Q6_K block, -32 … 31."""
    h, r = b.e // 128, b.e % 128
    lo = bits(b.u8(h * 64 + r % 64), r // 64 * 4, 0x0F).astype("int32")
    hi = bits(b.u8(128 + h * 32 + r % 32), r // 32 * 2, 0x3).astype("int32")
    return (lo | (hi << const(4, "int32"))) - const(32, "int32")


def q6k_factor(b, i):
    """d · sc of sub-block i (16 weights) of a Q6_K block, float32: the element is d·sc · q."""
    return b.f16(208) * f32(b.i8(192 + i))


@element("q6_k")
def _q6k(t, idx):
    b = Block(t[0], idx, 256, Q6K_SIZE)
    return q6k_factor(b, b.e // 16) * f32(q6k_quant(b))
