"""K-quants Q2_K … Q6_K: super-blocks of 256 weights (ggml/src/ggml-common.h block_q2_K …, gguf-py gguf/quants.py).

Each super-block's fields become one buffer each (same bytes, "structure of arrays"); for a weight
`[..., N, K]` with S = K / 256 super-blocks per row, e = k % 256 the position inside one:

    Q2_K (84 B)   .scales u8[16S] (lo nibble sc, hi nibble m) | .qs u8[64S] | .d f16[S] | .dmin f16[S]
                  q = 2 bits of qs[64s + 32(e/128) + e%32] at 2((e%128)/32);  w = (d*sc) q - dmin*m  (sub-block 16)
    Q3_K (110 B)  .hmask u8[32S] | .qs u8[64S] | 12 bytes of 16 × 6-bit sc | .d f16[S]
                  q = (2 bits as Q2_K) - 4 * (1 - bit e/32 of hmask[32s + e%32]);  w = (d*(sc-32)) q  (sub-block 16)
                  the packed scales are unpacked at load time to .scales i8[16S] = sc - 32 (+4 bytes per
                  super-block: +3.6 %; 1.6x faster GEMV on this CPU)
    Q4_K (144 B)  .d f16[S] | .dmin f16[S] | 12 bytes of 8 × 6-bit sc and m | .qs u8[128S]
                  q = nibble (e%64)/32 of qs[128s + 32(e/64) + e%32];  w = (d*sc) q - dmin*m  (sub-block 32)
                  the packed scales are unpacked at load time to .sc u8[8S] and .m u8[8S] (+4 bytes per
                  super-block: +2.8 %; the kernel then reads two bytes instead of decoding the 6-bit fields,
                  1.7x faster GEMV on this CPU)
    Q5_K (176 B)  as Q4_K plus .qh u8[32S]: q |= (bit e/32 of qh[32s + e%32]) << 4   (+2.3 %)
    Q6_K (210 B)  .ql u8[128S] | .qh u8[64S] | .scales i8[16S] | .d f16[S]
                  q = (nibble (e%128)/64 of ql[128s + 64(e/128) + e%64]
                       | 2 bits (e%128)/32 of qh[64s + 32(e/128) + e%32] << 4) - 32;  w = (d*sc) q  (sub-block 16)

Q2_K and Q6_K keep exactly the GGUF's bytes.
"""
from __future__ import annotations

import numpy as np

from .format import QuantFormat, register
from .planes import blocks, field

QK = 256


def _planes(spec, type_size):
    """spec: [(suffix, start, stop, dtype, elems per super-block)] → (buffers, pack)."""

    def buffers(shape):
        *lead, k = shape
        return [(sfx, np.dtype(dt).name, (*lead, k // QK * per)) for sfx, _a, _b, dt, per in spec]

    def pack(raw, shape):
        *lead, k = shape
        b = blocks(raw, shape, QK, type_size)
        return tuple(field(b, a, z, dt, (*lead, k // QK * per)) for _s, a, z, dt, per in spec)

    return buffers, pack


def _register(name, type_size, spec):
    buffers, pack = _planes(spec, type_size)
    return register(QuantFormat(name.lower(), name, QK, buffers, pack))


def _unpack_q3k_scales(raw12: np.ndarray) -> np.ndarray:
    """[..., 12] packed bytes → [..., 16] signed scales (6 bits - 32): low nibbles from bytes 0..7, high 2 bits from
    bytes 8..11 (sub-block i: nibble i/8 of byte i%8, bits 2(i/4) of byte 8 + i%4)."""
    i = np.arange(16)
    lo = (raw12[..., i % 8] >> (i // 8 * 4)) & 0x0F
    hi = (raw12[..., 8 + i % 4] >> (i // 4 * 2)) & 0x03
    return ((lo | (hi << 4)).astype(np.int16) - 32).astype(np.int8)


def _register_q3k():
    """Q3_K: the planes plus the 16 6-bit scales per super-block unpacked to int8 ([..., K/16]): 4 bytes more per
    256 weights (+3.6 %), so the kernel reads one byte instead of decoding two bit fields."""
    spec = [(".qs", 32, 96, np.uint8, 64), (".hmask", 0, 32, np.uint8, 32), (".d", 108, 110, np.float16, 1)]
    buffers0, pack0 = _planes(spec, 110)

    def buffers(shape):
        *lead, k = shape
        return buffers0(shape) + [(".scales", "int8", (*lead, k // 16))]

    def pack(raw, shape):
        *lead, k = shape
        sc = _unpack_q3k_scales(blocks(raw, shape, QK, 110)[..., 96:108])
        return pack0(raw, shape) + (sc.reshape(*lead, k // 16),)

    return register(QuantFormat("q3_k", "Q3_K", QK, buffers, pack))


def _unpack_scale_min(raw12: np.ndarray):
    """[..., 12] packed bytes → ([..., 8] scales, [..., 8] mins), 6 bits each (ggml get_scale_min_k4)."""
    a, b, c = raw12[..., 0:4], raw12[..., 4:8], raw12[..., 8:12]
    sc = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, mn


def _register_q45k(name, type_size, spec):
    """Q4_K / Q5_K: the planes of `spec` plus the 6-bit scales and mins unpacked to one byte each ([..., K/32]):
    4 bytes more per 256 weights (+2.8 % / +2.3 %), so the kernel reads them instead of decoding 12 packed bytes."""
    buffers0, pack0 = _planes(spec, type_size)

    def buffers(shape):
        *lead, k = shape
        return buffers0(shape) + [(".sc", "uint8", (*lead, k // 32)), (".m", "uint8", (*lead, k // 32))]

    def pack(raw, shape):
        *lead, k = shape
        sc, mn = _unpack_scale_min(blocks(raw, shape, QK, type_size)[..., 4:16])
        return pack0(raw, shape) + (sc.reshape(*lead, k // 32), mn.reshape(*lead, k // 32))

    return register(QuantFormat(name.lower(), name, QK, buffers, pack))


Q2_K = _register("Q2_K", 84, [(".qs", 16, 80, np.uint8, 64), (".scales", 0, 16, np.uint8, 16),
                              (".d", 80, 82, np.float16, 1), (".dmin", 82, 84, np.float16, 1)])
Q3_K = _register_q3k()
Q4_K = _register_q45k("Q4_K", 144, [(".qs", 16, 144, np.uint8, 128), (".d", 0, 2, np.float16, 1),
                                    (".dmin", 2, 4, np.float16, 1)])
Q5_K = _register_q45k("Q5_K", 176, [(".qs", 48, 176, np.uint8, 128), (".qh", 16, 48, np.uint8, 32),
                                    (".d", 0, 2, np.float16, 1), (".dmin", 2, 4, np.float16, 1)])
Q6_K = _register("Q6_K", 210, [(".ql", 0, 128, np.uint8, 128), (".qh", 128, 192, np.uint8, 64),
                               (".scales", 192, 208, np.int8, 16), (".d", 208, 210, np.float16, 1)])
