"""Vector building blocks of the x86 kernels: lane-typed constants and the few intrinsics LLVM is given directly.

Every float accumulation is an explicit `llvm.fma` and every horizontal sum an ordered `llvm.vector.reduce.fadd`,
so a row's arithmetic is one fixed instruction sequence whatever loop it sits in (rows of a verify pass give the
same bits as the one-row decode step).
"""
from __future__ import annotations

from tvm import tirx

# (u8 x s8 -> adjacent pairs summed to i16, i16 x i16 -> adjacent pairs summed to i32) per vector width in bytes
_MADD = {32: ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
         64: ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512")}
_PSHUFB = {32: "llvm.x86.avx2.pshuf.b", 64: "llvm.x86.avx512.pshuf.b.512"}
# u8 x s8, groups of 4 adjacent products summed into i32 and accumulated, no saturation (AVX512-VNNI / AVX-VNNI)
_DPBUSD = {32: "llvm.x86.avx512.vpdpbusd.256", 64: "llvm.x86.avx512.vpdpbusd.512"}
# PAIR_LANES[r]: the i32 lanes of dot_pair's result that hold row r (0: a, 1: b), in the order of fold_pairs
PAIR_LANES = ([4 * k + m for k in range(4) for m in (0, 1)], [4 * k + m for k in range(4) for m in (2, 3)])


def const(v, dtype: str, lanes: int = 1):
    c = tirx.const(v, dtype)
    return c if lanes == 1 else tirx.Broadcast(c, lanes)


def ramp(base, n: int):
    return tirx.Ramp(base, 1, n)


def maddubs(a, b, width: int):
    """u8 a[i] * s8 b[i], adjacent pairs summed to i16 (pmaddubsw saturates: callers keep |pair| < 2^15)."""
    return tirx.call_llvm_pure_intrin(f"int16x{width // 2}", _MADD[width][0], a, b)


def madd(a, b, width: int):
    """i16 a[i] * i16 b[i], adjacent pairs summed to i32 (pmaddwd, exact)."""
    return tirx.call_llvm_pure_intrin(f"int32x{width // 4}", _MADD[width][1], a, b)


def dot_u8s8(acc, w, x, width: int, scales=None, vnni: bool = False):
    """The integer multiply-accumulate of the x86 kernels: acc (int32 x width/4, or None for zeros) plus, per i32
    lane i, the u8 w x s8 x products of bytes 4i..4i+3, adjacent pairs weighted by the i16 `scales` lanes 2i,
    2i+1 when given. Callers keep every adjacent pair |w_j x_j + w_j+1 x_j+1| < 2^15 (pmaddubsw saturates), so
    each lane is the exact integer whatever the instructions: pmaddubsw + pmaddwd (+ add, which LLVM fuses into
    vpdpwssd on VNNI targets), or with `vnni` and no scales one vpdpbusd."""
    if scales is None and vnni:
        zero = const(0, "int32", width // 4)
        return tirx.call_llvm_pure_intrin(f"int32x{width // 4}", _DPBUSD[width], zero if acc is None else acc, w, x)
    if scales is None:
        scales = const(1, "int16", width // 2)
    v = madd(maddubs(w, x, width), scales, width)
    return v if acc is None else acc + v


def dot_pair(acc, w, xa, xb, scales):
    """Two activation rows a, b against one 64-byte weight vector w (u8; VNNI): the i32 lanes of
    fold_pairs(dot_u8s8(None, w, x, 64, scales)) for both rows in one vector, row r in lanes PAIR_LANES[r], plus acc.
    vpdpbusd per row (sums of 4 products, unscaled), vpackssdw of the two (exact while |sum of 4| < 2^15), then
    one pmaddwd (+ add: vpdpwssd) with `scales`, which must be constant over each 16 bytes (one 128-bit lane)."""
    return dot_packed(acc, (w, xa, scales), (w, xb, scales))


def dot_packed(acc, a, b):
    """Two 64-byte products (w u8, x s8, i16 scales constant over each 16 bytes) in one vector (VNNI), plus acc:
    vpdpbusd each (sums of 4 products, unscaled), vpackssdw of the two (exact while |sum of 4| < 2^15), one
    pmaddwd (+ add: vpdpwssd) with a's scales on a's lanes and b's on b's. i32 lanes 4L + m of 128-bit lane L:
    m = 0, 1: a's bytes 16L..16L+8, 16L+8..16L+16 (weighted), m = 2, 3: b's (PAIR_LANES[0], [1]). Two rows
    against one weight vector (`dot_pair`), or one row against two weight vectors (`fold_packed`)."""
    (wa, xa, sa), (wb, xb, sb) = a, b
    da, db = dot_u8s8(None, wa, xa, 64, None, True), dot_u8s8(None, wb, xb, 64, None, True)
    packed = tirx.call_llvm_pure_intrin("int16x32", "llvm.x86.avx512.packssdw.512", da, db)
    scales = sa if sa is sb else tirx.Shuffle([sa, sb], [i if i % 8 < 4 else 32 + i for i in range(32)])
    v = madd(packed, scales, 64)
    return v if acc is None else acc + v


def fold_packed(v):
    """int32 x 8 from `dot_packed` sums of one row against chunk pairs (a, b): lane i = the bytes 8i..8i+8 of
    every chunk, a's and b's added, the same integers as fold_pairs(dot_u8s8(...), 16, 8) over the chunks."""
    return tirx.Shuffle([v], PAIR_LANES[0]) + tirx.Shuffle([v], PAIR_LANES[1])


def fold_pairs(v, n_in: int, n_out: int):
    """Adjacent i32 lanes added (2i, 2i+1 -> i) until n_out lanes are left (exact)."""
    while n_in > n_out:
        n_in //= 2
        v = tirx.Shuffle([v], list(range(0, 2 * n_in, 2))) + tirx.Shuffle([v], list(range(1, 2 * n_in, 2)))
    return v


def abs_i8(w, lanes: int):
    """|w| of an int8 x lanes vector, whose bits read as uint8 are the magnitude (-128 -> 128)."""
    zero = const(0, "int8", lanes)
    return tirx.Select(w < zero, zero - w, w)


def pshufb(table, idx, width: int):
    """table[idx[i]] within each 16-byte lane (idx < 16): a 16-entry byte lookup."""
    return tirx.call_llvm_pure_intrin(f"int8x{width}", _PSHUFB[width], table, idx)


def fma(a, b, c):
    """a * b + c, one rounding."""
    return tirx.call_llvm_pure_intrin(str(c.ty), "llvm.fma", a, b, c)


def hsum(v):
    """The lanes of a float32 vector summed in lane order."""
    return tirx.call_llvm_pure_intrin("float32", "llvm.vector.reduce.fadd", const(0.0, "float32"), v)


def byte_vector(values):
    """A constant uint8 vector."""
    return tirx.Shuffle([const(v & 0xFF, "uint8") for v in values], list(range(len(values))))


def hsum_pairwise(v, lanes: int):
    """The lanes of a float32 vector summed pairwise (halves added until one lane is left): log2(lanes) adds."""
    while lanes > 1:
        h = lanes // 2
        v = tirx.Shuffle([v], list(range(h))) + tirx.Shuffle([v], list(range(h, lanes)))
        lanes = h
    return v


def u8(v, lanes: int = 32):
    """A constant uint8 vector of `lanes` copies of v."""
    return const(v, "uint8", lanes)


def f16(buf16, index):
    """The float16 at `index` of a float16 view, as float32."""
    return tirx.Cast("float32", buf16[index])


def sign(x, w, width):
    """x where w > 0, -x where w < 0, 0 where w = 0 (vpsignb on AVX2; AVX-512 has none for zmm: a masked negate,
    which LLVM makes of the select)."""
    if width == 32:
        return tirx.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.psign.b", x, w)
    zero = const(0, "int8", width)
    return tirx.Select(w < zero, zero - x, x)
