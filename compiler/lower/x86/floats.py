"""The float path of the x86 matmul kernels: float32 activation rows against 16-bit weights and the 32-weight block
formats under --exact-matmul. Each weight is dequantized exactly (d * q: at most 11 + 8 significant bits) and
multiplied with the float32 activation by FMA. The integer 32-block path is block32.py."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from nextn.compiler.quant.mxfp4 import E2M1X2, e8m0_half
from nextn.compiler.quant.nvfp4 import ue4m3_half

from .kernel import Format, RowPath, prefetch, zeroed_accs
from .lanes import KVALUES
from .vec import byte_vector, const, f16, fma, hsum, pshufb, ramp, u8


class FloatPath(RowPath):
    """`float_rows`: one weight row against a row group, `unroll` blocks per step with one accumulator of width/4
    lanes per (block slot, vector), K whole; y = the accumulators' lanes summed in order (so `width` and `unroll`
    change the bits)."""
    bit_knobs = ("width", "unroll")
    unit_blocks = 0

    def acc_lanes(self, kern, fmt):
        return [kern.width // 4] * (kern.unroll * 32 // (kern.width // 4))

    def rows(self, kern, fmt, ns, rows, outs, terms):
        lanes = self.acc_lanes(kern, fmt)
        (n,), (accs,), (outs,) = ns, zeroed_accs(ns, rows, lanes), outs
        float_rows(kern, fmt, n, rows, accs)
        for acc, out in zip(accs, outs):
            total = hsum(acc[0][ramp(0, lanes[0])])
            for a, n_l in zip(acc[1:], lanes[1:]):
                total = total + hsum(a[ramp(0, n_l)])
            T.buffer_store(kern.y, total, out)


class FloatFormat(Format):
    """A 32-weight block format on the float path: `values` gives the block's dequantized weights (exact) as
    float32 vectors of width/4 lanes, in element order."""
    path = FloatPath()
    block = 32
    acts = "f32"


class Q80(FloatFormat):
    """Q8_0 (34 B): d f16 | qs int8[32]: w = d * q."""
    type_size = 34

    def values(self, kern, n, blk):
        b = T.Bind(n * kern.row_bytes + blk * 34)
        q = T.Bind(kern.w8[ramp(b + 2, 32)])
        L = kern.width // 4
        d = T.Bind(tirx.Broadcast(f16(kern.w16, b // 2), L))
        return [T.Bind(d * tirx.Cast(f"float32x{L}", tirx.Shuffle([q], list(range(i, i + L))))) for i in range(0, 32, L)]


class IQ4NL(FloatFormat):
    """IQ4_NL (18 B): d f16 | qs[16]: w = d * kvalues[q], lo nibbles weights 0..15, hi nibbles 16..31."""
    type_size = 18

    def values(self, kern, n, blk):
        b = T.Bind(n * kern.row_bytes + blk * 18)
        v = kern.w[n, ramp(blk * 18 + 2, 16)]
        idx = tirx.vectorcombine("uint8x32", v & u8(15, 16), (v >> u8(4, 16)) & u8(15, 16))
        q = T.Bind(pshufb(tirx.reinterpret("int8x32", byte_vector(list(KVALUES) * 2)), idx, 32))
        L = kern.width // 4
        d = T.Bind(tirx.Broadcast(f16(kern.w16, b // 2), L))
        return [T.Bind(d * tirx.Cast(f"float32x{L}", tirx.Shuffle([q], list(range(i, i + L))))) for i in range(0, 32, L)]


class MXFP4(FloatFormat):
    """MXFP4 (17 B): e u8 | qs[16]: w = 2^(e - 128) * E2M1X2[q] (ggml_e8m0_to_fp32_half: e < 2 are the float32
    subnormals 2^-128, 2^-127), lo nibbles weights 0..15, hi nibbles 16..31. A power of two times a small integer:
    exact."""
    type_size = 17

    def values(self, kern, n, blk):
        d = T.Bind(tirx.Broadcast(e8m0_half(kern.w[n, blk * 17]), kern.width // 4))
        v = kern.w[n, ramp(blk * 17 + 1, 16)]
        idx = tirx.vectorcombine("uint8x32", v & u8(15, 16), (v >> u8(4, 16)) & u8(15, 16))
        q = T.Bind(pshufb(tirx.reinterpret("int8x32", byte_vector(list(E2M1X2) * 2)), idx, 32))
        L = kern.width // 4
        return [T.Bind(d * tirx.Cast(f"float32x{L}", tirx.Shuffle([q], list(range(i, i + L))))) for i in range(0, 32, L)]


class NVFP4(FloatFormat):
    """NVFP4 (36 B per 64): d u8[4] (ue4m3 per 16) | qs[32]; a float-path block is half of one (32 weights: two
    scale bytes, 16 quant bytes at 4 + 16h, h = blk % 2). Quant byte j of sub-block s holds weights 16s + j (low
    nibble) and 16s + 8 + j (high); w = ue4m3_half(d[s]) * E2M1X2[q]: exact (at most 4 + 4 significant bits)."""
    type_size = 18     # 36 B per 64 weights: the row bytes are the format's (kernel.py: K / 32 * 18)

    def values(self, kern, n, blk):
        base, h = T.Bind(blk // 2 * 36), blk % 2
        v = kern.w[n, ramp(base + 4 + h * 16, 16)]
        lo, hi = v & u8(15, 16), (v >> u8(4, 16)) & u8(15, 16)
        idx = tirx.Shuffle([lo, hi], [*range(0, 8), *range(16, 24), *range(8, 16), *range(24, 32)])
        q = T.Bind(pshufb(tirx.reinterpret("int8x32", byte_vector(list(E2M1X2) * 2)), idx, 32))
        L = kern.width // 4
        d = [T.Bind(tirx.Broadcast(ue4m3_half(kern.w[n, base + h * 2 + s]), L)) for s in (0, 1)]
        return [T.Bind(d[i // 16] * tirx.Cast(f"float32x{L}", tirx.Shuffle([q], list(range(i, i + L)))))
                for i in range(0, 32, L)]


class Plain(FloatFormat):
    """Unquantized weights, widened as they are read: F16 (vcvtph2ps), BF16 (the float32's upper 16 bits), F32.
    The weight argument is the tensor itself ([N, K] of `arg_dtype`); a "block" is 32 elements."""

    def __init__(self, arg_dtype: str):
        self.arg_dtype = arg_dtype
        self.type_size = 32 * (4 if arg_dtype == "float32" else 2)

    def values(self, kern, n, blk):
        L = kern.width // 4
        base = n * (kern.n_blocks * 32) + 32 * blk
        out = []
        for i in range(0, 32, L):
            if self.arg_dtype == "float16":
                v = tirx.Cast(f"float32x{L}", kern.w16[ramp(base + i, L)])
            elif self.arg_dtype == "uint16":   # bfloat16 bits
                v = tirx.reinterpret(f"float32x{L}", tirx.Cast(f"uint32x{L}", kern.w16u[ramp(base + i, L)])
                                     << const(16, "uint32", L))
            else:
                v = kern.w32f[ramp(base + i, L)]
            out.append(T.Bind(v))
        return out




def float_rows(kern, fmt, n, rows, accs):
    """Weight row n against float activation rows: `unroll` blocks per step, one accumulator per (block slot,
    vector) so the FMA chains overlap."""
    L = kern.width // 4
    U = kern.unroll

    def block(blk, slot):
        prefetch(kern, n, blk * fmt.type_size, fmt.type_size)
        vals = fmt.values(kern, n, blk)
        for t, acc in zip(rows, accs):
            for i, v in enumerate(vals):
                a = acc[slot * len(vals) + i]
                T.buffer_store(a, fma(v, kern.x[t, ramp(32 * blk + i * L, L)], a[ramp(0, L)]), [ramp(0, L)])

    with T.serial(0, kern.n_blocks // U) as bu:
        for u in range(U):
            block(bu * U + u, u)
    with T.serial(kern.n_blocks // U * U, kern.n_blocks) as blk:
        block(blk, 0)
