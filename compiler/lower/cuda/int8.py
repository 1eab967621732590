"""The integer route of the GPU matmuls: activation rows quantized to int8 once per matmul, exactly as the CPU's
integer kernels quantize them, and integer dot products over the weight's quants (`__dp4a` on CUDA sm_61+).

    quantize_rows  x f32 [..., K] -> xq int32 [..., K/4] (4 int8 quants per word, little-endian), xd f32 [..., K/B]
                   per block of B (`row_block`: 32 for the 32-value block formats and NVFP4, 256 for the K-quants and
                   IQ4_XS, the CPU's row format for the kind): amax = max |x|, d = amax / 127,
                   q = round_half_even(x * (127 / amax)), q = 0 where amax = 0 or below AMAX_MIN
                   (nextn.common.quant.activation `quantize_q8_0` / `quantize`: the CPU's "q8_0" / "q8" rows, bit
                   for bit on equal inputs)
    mul_mat        y[..., n] = sum over word groups g < K/(4G) (G = `group_words`: 8 words, 32 quants, or the
                   sub-block's 4 (16 quants), IQ1_M's 2) of
                       xd[.., blk(g)] · (s[n, sub(g)] · f32(sum_{j in g} dot4(w4[n, j], xq[.., j]))
                                         - m[n, sub(g)] · f32(sum_{j in g} dot4(1111, xq[.., j])))

w4 (the DEQUANT stage, int32 [..., N, K/4]) packs 4 consecutive signed quants of the weight (`FORMATS`: Q8_0 qs;
Q4_0 / Q5_0 q - 8 / q - 16; Q4_1 / Q5_1 q; IQ4_NL / IQ4_XS kvalues[q]; MXFP4 / NVFP4 the doubled e2m1 values
E2M1X2[q]; Q2_K q, 0..3; Q3_K q, -4..3; Q4_K the nibbles, 0..15; Q5_K 5 bits, 0..31; Q6_K q - 32, -32..31); s / m
(the SCALE / MIN stages, float32 per sub-block: the block's d (Q8_0, Q4_0 ... Q5_1, IQ4_NL), with m = -min (Q4_1,
Q5_1); the e8m0 / ue4m3 scale halved (MXFP4, NVFP4); d·(ls - 32) (IQ4_XS), d·(sc - 32) (Q3_K); Q2_K / Q4_K / Q5_K
d·sc and dmin·m; Q6_K d·sc) are the weight's float factors, so that the weight element is s · q - m exactly as the
format's element expression (nextn.compiler.quant) computes it. Each word
product is exact in int32, so a kernel computes sum_k w_k x'_k (x' = d · q, what the CPU multiplies) and differs
from the CPU's integer kernels (compiler/lower/x86, ggml_vec_dot_q8_0_q8_0 / ggml_vec_dot_q4_K_q8_K ...) only by
float32 rounding: the CPU sums whole blocks in int32 and scales once per block; here each group of G words of one
sub-block (the scheduled kernel gives each lane one group per step) is summed in int32 and scaled once.
IQ2_XXS ... IQ3_S: 4 signed bytes of one grid entry, the scale per sub-block; IQ1_S / IQ1_M: the int8 grid values,
scale dl and min -(dl · delta).

`dot4(a, b)` = the sum of the 4 signed byte products of int32 words a and b: `__dp4a(a, b, 0)` (a pure extern
call) where the target has it (`has_dot4`: CUDA sm_61+), else the same int32 result from shifts and multiplies
(`dp4a=False`: llvm, where the tests run the definitions; ROCm; older CUDA). Every function below takes that
choice as `dp4a`; with it, the 16-entry tables of IQ4_NL / IQ4_XS / MXFP4 / NVFP4 are looked up with CUDA's
`__byte_perm` (`byte_perm`; without it, the same bytes from shifts and selects).
Reference for the scheme: llama.cpp ggml-cuda vecdotq.cuh (q8_1 activations, dp4a).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
from tvm import te, tirx

from nextn.compiler.quant import k_quants
from nextn.compiler.quant.te import Block

F32, I32 = "float32", "int32"
AMAX, ACT_D, ACT_Q, ACT_S = "act_amax", "act_d", "act_q", "act_s"
# Quants per activation sum (`quantize_rows(sums=True)`): a group of 4 words, the smallest group_words that sums
# them (a sub-block of 16)
SUM_QUANTS = 16
DOT4 = "__dp4a"


def _c(v, dtype=I32):
    return tirx.const(v, dtype)


def dot4(a, b, dp4a: bool = True, acc=None):
    """The dot product of the 4 signed bytes of int32 words a and b, plus int32 `acc` (None: 0): CUDA
    `__dp4a(a, b, acc)`, or (not `dp4a`) the same int32 sum of sign-extended byte products."""
    if dp4a:
        return tirx.call_pure_extern(I32, DOT4, a, b, _c(0) if acc is None else acc)
    total = sbyte(a, 0) * sbyte(b, 0)
    for e in range(1, 4):
        total = total + sbyte(a, e) * sbyte(b, e)
    return total if acc is None else acc + total


def sbyte(v, e):
    """Byte e (an int, or an int32 expression) of int32 word v, sign-extended."""
    shift = _c(8 * e) if isinstance(e, int) else tirx.Cast(I32, e) * 8
    return (((v >> shift) & _c(255)) ^ _c(128)) - _c(128)


def sm_number(arch) -> int | None:
    """The number of a CUDA arch name ("sm_90a" -> 90), None where it has none."""
    try:
        return int(str(arch).split("_")[1].rstrip("af"))
    except (IndexError, ValueError):
        return None


def has_dot4(target) -> bool:
    """Whether `target` compiles `dot4` as `__dp4a`: CUDA sm_61 or newer (an arch without a number: assumed)."""
    if target is None or target.kind.name != "cuda":
        return False
    sm = sm_number(target.attrs.get("arch", "sm_61"))
    return sm is None or sm >= 61


def row_block(kind: str) -> int:
    """The activation block B of `kind`'s integer matmul: the CPU's row format for it (nextn.common.quant.FORMATS
    `activation`: "q8_0" rows, blocks of 32, for the 32-value block formats and NVFP4; "q8" rows, blocks of 256, for the
    K-quants and IQ4_XS), so that both compute the same products."""
    from nextn.common.quant import FORMATS as LAYOUTS

    return 32 if LAYOUTS[kind].activation == "q8_0" else 256


def route(kind: str | None, K: int, quantize: bool) -> int | None:
    """The activation block B of the integer route for a `kind` weight of row length K (None: the float route):
    the kinds of `FORMATS` whose K is whole activation and weight blocks, when the artifact quantizes activations."""
    if not quantize or kind not in FORMATS:
        return None
    from nextn.common.quant import FORMATS as LAYOUTS

    B = row_block(kind)
    return B if K % B == 0 and K % LAYOUTS[kind].block == 0 else None


def _div(a, b, cuda: bool):
    """a / b in float32, correctly rounded: on CUDA `__fdiv_rn` (nvcc compiles TVM's kernels with
    --use_fast_math, whose `/` is an approximation that would move q across rounding boundaries); elsewhere plain
    `/`, which llvm and ROCm (TVM's LLVM AMDGPU codegen: no fast-math flags, so LLVM's correctly rounded
    v_div_scale / v_div_fmas / v_div_fixup sequence; tests/test_cuda_int8.py) compile correctly rounded."""
    return tirx.call_pure_extern(F32, "__fdiv_rn", a, b) if cuda else a / b


def quantize_rows(x, B: int, cuda: bool = False, sums: bool = False):
    """(xq int32 [..., K/4], xd float32 [..., K/B]) of float32 rows x [..., K] (module docstring), and with `sums`
    xs int32 [..., K/16]: each 16 quants' sum (what sum dot4(0x01010101, xq) over their 4 words gives; the GEMV's
    min term reads it once per row instead, as llama.cpp's q8_1 blocks carry theirs). `cuda`: the divisions as
    `__fdiv_rn` (else plain; llvm's is correctly rounded)."""
    from nextn.common.quant.activation import AMAX_MIN

    *lead, K = x.shape
    i = te.reduce_axis((0, B), name="i")
    amax = te.compute((*lead, K // B), lambda *l: te.max(tirx.abs(x[(*l[:-1], l[-1] * B + i)]), axis=i), name=AMAX)

    def kept(a):   # an amax below AMAX_MIN as 0: a zero block, as the CPU's (under -ftz too: activation.AMAX_MIN)
        return tirx.Select(a < _c(float(AMAX_MIN), F32), _c(0.0, F32), a)

    xd = te.compute((*lead, K // B), lambda *l: _div(kept(amax[l]), _c(127.0, F32), cuda), name=ACT_D)

    def inv(l, k):   # 127 / amax of the block of element k of row l
        a = kept(amax[(*l, k // B)])
        return tirx.Select(a > _c(0.0, F32), _div(_c(127.0, F32), a, cuda), _c(0.0, F32))

    def quant(l, k, scale):   # the int32 quant of element k of row l (-127 .. 127)
        return tirx.nearbyint(x[(*l, k)] * scale).astype(I32)

    def word(*l):
        scale, w = inv(l[:-1], l[-1] * 4), _c(0)
        for e in range(4):
            w = w | ((quant(l[:-1], l[-1] * 4 + e, scale) & _c(255)) << _c(8 * e))
        return w

    xq = te.compute((*lead, K // 4), word, name=ACT_Q)
    if not sums:
        return xq, xd

    def total(*l):
        scale, v = inv(l[:-1], l[-1] * SUM_QUANTS), _c(0)
        for e in range(SUM_QUANTS):
            v = v + quant(l[:-1], l[-1] * SUM_QUANTS + e, scale)
        return v

    return xq, xd, te.compute((*lead, K // SUM_QUANTS), total, name=ACT_S)


def _u32(b, off):
    return tirx.reinterpret(I32, b.u32(off))


def _uc(v):
    return tirx.const(v, "uint32")


def _nibbles(b, off, shift):
    """uint32: the 4-bit fields at bit `shift` of the 4 bytes at `off` (4 consecutive elements of a nibble format),
    one per byte, 0..15."""
    return (b.u32(off) >> tirx.Cast("uint32", shift)) & _uc(0x0F0F0F0F)


def _minus(v, c: int):
    """Each byte of uint32 v (0..127) minus c (<= 128) as a signed byte, without borrows between bytes: 128 is
    added to every byte first, so no byte goes below 0, and taken back by the XOR."""
    return ((v | _uc(0x80808080)) - _uc(c * 0x01010101)) ^ _uc(0x80808080)


def _spread(h):
    """Bits 0..3 of uint32 h as bit 0 of bytes 0..3."""
    return (h & _uc(1)) | ((h & _uc(2)) << _uc(7)) | ((h & _uc(4)) << _uc(14)) | ((h & _uc(8)) << _uc(21))


PERM = "__byte_perm"


def byte_perm(x, y, sel, cuda: bool = True):
    """uint32: byte i is byte (sel >> 4i) & 7 of the 8 bytes of y:x (x bytes 0..3, y bytes 4..7), for selectors
    whose nibbles are all 0..7 and upper 16 bits 0: CUDA `__byte_perm(x, y, sel)` (PTX `prmt.b32`, one instruction;
    the nibbles' bit 3, prmt's sign-replicate flag, is never set here), or (not `cuda`) the same from shifts and
    selects."""
    if cuda:
        return tirx.call_pure_extern("uint32", PERM, x, y, sel)
    out = _uc(0)
    for i in range(4):
        k = (sel >> _uc(4 * i)) & _uc(7)
        at = (k & _uc(3)) * _uc(8)
        out = out | (((tirx.Select(k < _uc(4), x >> at, y >> at)) & _uc(255)) << _uc(8 * i))
    return out


def _lut16(u, table, shift, cuda: bool):
    """uint32: the 4 nibbles at bit `shift` (0 or 4) of the 4 bytes of uint32 u, each replaced by table[nibble]
    (16 small signed integers) as a signed byte. The table is 4 words of constants; each 16 bits of u (4 nibbles)
    take two `byte_perm`s of entries 0..7 and 8..15 by their low 3 bits and one choosing by bit 3; a last one keeps
    the low or the high nibbles' bytes (llama.cpp ggml-cuda vecdotq.cuh get_int_from_table_16: 8 prmt per 8
    values, against ~10 integer operations per value for a select-and-shift lookup). Two words that share u (the
    low and high nibbles of the same bytes: elements j and j + 16) share all but the last `byte_perm`."""
    t = [_uc(int(np.array(table[4 * i:4 * i + 4], np.int8).view("<u4")[0])) for i in range(4)]

    def look(s):   # the 4 nibbles of bits 0..15 of s: bytes table[n0], table[n1], table[n2], table[n3]
        low3 = s & _uc(0x7777)
        lo, hi = byte_perm(t[0], t[1], low3, cuda), byte_perm(t[2], t[3], low3, cuda)
        return byte_perm(lo, hi, ((s & _uc(0x8888)) >> _uc(1)) | _uc(0x3210), cuda)

    # look(u): bytes 0, 1 of u, low and high nibbles interleaved; look(u >> 16): bytes 2, 3. 0x6420 gathers the
    # low nibbles' bytes, 0x7531 the high ones'
    pick = _uc(0x6420) + (tirx.Cast("uint32", shift) >> _uc(2)) * _uc(0x1111)
    return byte_perm(look(u), look(u >> _uc(16)), pick, cuda)


class Fmt(NamedTuple):
    """A weight format on the integer route (its GGUF block and size: nextn.common.quant.FORMATS): one float factor
    per `sub` weights (`scale`, and `low` where the element has a min term), `word(b)` the int32 of the 4 signed
    quants at elements b.e .. b.e + 3 (b.e a multiple of 4; 4 consecutive quants always share their bytes' bit
    position): the weight element is scale · q - low, the same value as the format's element expression
    (nextn.compiler.quant)."""
    sub: int
    word: Callable
    scale: Callable   # (b, i: sub-block index in the block) -> float32
    low: Callable | None = None
    # the word's fields are 4 bytes at 4-byte-aligned offsets of a block whose size is a multiple of 4 (so of
    # every row and expert: device allocations are 256-byte aligned): the GEMV loads each as one 32-bit word
    # (word_loads.py, which proves it; blocks of an even size get two 16-bit loads, odd ones bytes)
    # (`WORD_LOAD`, gemv.py) instead of 4 bytes
    aligned: bool = False
    # `word(b, tensors)`: the word reads the format's table buffers too (the codebook formats' `.grid` / `.signs`)
    tables: bool = False
    # `word(b, cuda)`: the word looks its quants up with `byte_perm` (16-entry tables), CUDA's where `cuda`
    perm: bool = False
    # the factors read only the first HEAD_BYTES of blocks whose size is a multiple of them (Q4_K's, Q5_K's d, dmin
    # and 12 scale bytes): they read them from a stage of their own (te.HEAD, 4 words per block), which the GEMV
    # loads as one 128-bit vector, not 2 16-bit and 3 byte loads per sub-block
    head: bool = False

    def word_of(self, b, tables, cuda: bool):
        """`word(b)` with what this format's word takes: its `tables` (the weight's buffers, the main one first),
        or `cuda` (byte_perm), or nothing."""
        return self.word(b, tables) if self.tables else self.word(b, cuda) if self.perm else self.word(b)


HEAD_BYTES = 16


class _Head(Block):
    """A Block whose reads at byte offsets below HEAD_BYTES come from the block's head words (te.HEAD: uint32
    [..., blocks, 4], little-endian) instead of the weight's bytes; i8 / u32 / f16 as Block builds them."""

    def __init__(self, head, pre, kb):   # (no Block.__init__: no raw bytes, no element)
        self.head, self.pre, self.kb = head, tuple(pre), kb

    def _bits(self, off, dtype):   # the value at byte `off` and up, in a `dtype`
        word = self.head[(*self.pre, self.kb, off // 4)]
        return (word >> tirx.Cast("uint32", off % 4 * 8)).astype(dtype)

    def u8(self, off):
        return self._bits(off, "uint8")

    def u16(self, off):   # at an even offset: within one word
        return self._bits(off, "uint16")


def _q45k_word(kind):
    def word(b):
        _ts, at_qs, at_qh = k_quants.Q45K[kind]
        e = b.e
        q = (_u32(b, at_qs + e // 64 * 32 + e % 32) >> (e % 64 // 32 * 4).astype(I32)) & _c(0x0F0F0F0F)
        if at_qh is not None:
            q = q | (((_u32(b, at_qh + e % 32) >> (e // 32).astype(I32)) & _c(0x01010101)) << _c(4))
        return q
    return word


def _q6k_word(b):   # 6-bit offset-binary quants, turned into signed bytes q - 32
    e = b.e
    h, r = e // 128, e % 128
    lo = (b.u32(h * 64 + r % 64) >> tirx.Cast("uint32", r // 64 * 4)) & _uc(0x0F0F0F0F)
    hi = (b.u32(128 + h * 32 + r % 32) >> tirx.Cast("uint32", r // 32 * 2)) & _uc(0x03030303)
    return tirx.reinterpret(I32, _minus(lo | (hi << _uc(4)), 32))


def _legacy(has_min, has_high):
    """Q4_0 / Q4_1 / Q5_0 / Q5_1 (compiler/quant/legacy.py): q - 8 (q - 16) signed where there is no min;
    with a min, w = d · q + m, i.e. low = -m."""
    at_qh = 4 if has_min else 2
    at_qs = at_qh + (4 if has_high else 0)

    def word(b):
        q = _nibbles(b, at_qs + b.e % 16, b.e // 16 * 4)
        if has_high:
            q = q | (_spread(b.u32(at_qh) >> tirx.Cast("uint32", b.e)) << _uc(4))
        if not has_min:
            q = _minus(q, 16 if has_high else 8)
        return tirx.reinterpret(I32, q)

    # Q4_1 / Q5_1: 20 / 24-byte blocks, qh at 4, qs at 4 / 8: aligned words
    return Fmt(32, word, lambda b, i: b.f16(0), (lambda b, i: -b.f16(2)) if has_min else None,
               aligned=has_min)


def _table_word(table, at, shift):
    """`Fmt.word` (with `cuda`: Fmt.perm) of a 16-entry table format: the nibbles at bit shift(b) of the 4 bytes at
    at(b), looked up in `table`."""
    return lambda b, cuda: tirx.reinterpret(I32, _lut16(b.u32(at(b)), table, shift(b), cuda))


def _grid_word(grid, start):
    """uint32: grid bytes start .. start + 3 (4 weights of one codebook entry), little-endian, written as the OR of
    4 byte loads that `word_loads` turns into one 32-bit load of the table where it proves `start` a multiple of 4
    (entries of 4 or 8 bytes, words at entry byte 0 or 4: always). An int8 table (IQ1's -1 / 0 / 1) is read as
    its bytes."""
    out = None
    for i in range(4):
        v = grid(start + i)
        if str(v.ty) != "uint8":
            v = tirx.reinterpret("uint8", v)
        v = v.astype("uint32")
        out = v if out is None else out | (v << _uc(8 * i))
    return out


def _signed(g, sign_byte, bit0):
    """int32 word of 4 signed bytes: the bytes of uint32 g (each 1..127: every entry of the signed codebooks, see
    `SIGNED_GRID`), negated where bit bit0 + i of sign_byte is set. m = 0xFF in the negated bytes, and
    (g ^ m) + (m & 1) = 256 - g there, which fits its byte because g >= 1 (no carry into the next byte): ~10
    integer operations per word instead of a select per byte (llama.cpp vecdotq.cuh: __vcmpne4 / __vsub4)."""
    m = _spread(sign_byte.astype("uint32") >> tirx.Cast("uint32", bit0)) * _uc(0xFF)
    return tirx.reinterpret(I32, (g ^ m) + (m & _uc(0x01010101)))


# the codebooks whose entries `_signed` negates: every grid byte in 1 .. 127 (gguf-py's tables: IQ2 8 .. 43, IQ3_XXS
# 4 .. 62, IQ3_S 1 .. 15; tests/test_cuda_int8.py checks it)
SIGNED_GRID = ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s")


def _codebook():
    """IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (compiler/quant/iq_grid.py): the word is 4 bytes of one grid entry
    (unsigned, <= 62) with their signs; the grid and sign patterns are the weight's table buffers (`.grid`,
    `.signs`: gguf-py's, in device memory, read through the cache), the scale d (0.5 + s) / 4 (IQ2), d (0.5 + s) / 2
    (IQ3_XXS), d (1 + 2s) (IQ3_S) per sub-block, as the element expressions compute it."""
    from nextn.compiler.quant.iq_grid import _delta, _iq2_scale, iq1m_parts, iq1s_parts
    from nextn.compiler.quant.te import bits, f32

    u32 = lambda v: v.astype("int32")   # noqa: E731

    def entry(grid, gi, width, j0):   # the 4 grid bytes j0 .. j0 + 3 of entry gi (width bytes per entry)
        return _grid_word(grid, u32(gi) * width + j0)

    def iq2_xxs(b, t):
        _raw, grid, signs = t
        ib, l, j0 = b.e // 32, b.e % 32 // 8, b.e % 8
        aux0, aux1 = b.u32(2 + ib * 8), b.u32(6 + ib * 8)
        return _signed(entry(grid, bits(aux0, l * 8, 0xFF), 8, j0), signs(u32(bits(aux1, l * 7, 0x7F))), j0)

    def iq2_xs(b, t):
        _raw, grid, signs = t
        q = b.u16(2 + b.e // 8 * 2)
        return _signed(entry(grid, bits(q, 0, 0x1FF), 8, b.e % 8), signs(u32(q >> tirx.const(9, "uint16"))),
                       b.e % 8)

    def iq2_s(b, t):
        _raw, grid = t
        g8 = b.e // 8
        gi = u32(b.u8(2 + g8)) | (u32(bits(b.u8(66 + g8 // 4), g8 % 4 * 2, 3)) << _c(8))
        return _signed(entry(grid, gi, 8, b.e % 8), b.u8(34 + g8), b.e % 8)

    def iq3_xxs(b, t):
        _raw, grid, signs = t
        aux = b.u32(66 + b.e // 32 * 4)
        sign = signs(u32(bits(aux, b.e % 32 // 8 * 7, 0x7F)))
        return _signed(entry(grid, b.u8(2 + b.e // 4), 4, 0), sign, b.e % 8)

    def iq3_s(b, t):
        _raw, grid = t
        g4 = b.e // 4
        gi = u32(b.u8(2 + g4)) | (u32(bits(b.u8(66 + g4 // 8), g4 % 8, 1)) << _c(8))
        return _signed(entry(grid, gi, 4, 0), b.u8(74 + b.e // 8), b.e % 8)

    def iq3xxs_scale(b, i):
        aux = b.u32(66 + i * 4)
        return b.f16(0) * (_c(0.5, F32) + f32(aux >> _uc(28))) * _c(0.5, F32)

    def iq3s_scale(b, i):   # i: sub-block of 32
        sc = bits(b.u8(106 + i // 2), i % 2 * 4, 0x0F).astype(I32)
        return b.f16(0) * f32(sc * _c(2) + _c(1))

    def iq1(parts):   # IQ1_S / IQ1_M: int8 grid values -1, 0, 1; w = dl · q + dl · delta, so low = -(dl · delta)
        def word(b, t):
            return tirx.reinterpret(I32, _grid_word(t[1], parts(b)[0] * 8 + b.e % 8))

        def low(b, i):
            _gi, dl, negative = parts(b)
            return -(dl * _delta(negative))

        return word, (lambda b, i: parts(b)[1]), low

    w1s, s1s, l1s = iq1(iq1s_parts)
    w1m, s1m, l1m = iq1(iq1m_parts)
    return {
        # the factors of a sub-block from its first element (the SCALE / MIN stages' b.e); IQ1_M's delta sign is
        # per 8 weights, so its factors are too
        "iq1_s": Fmt(32, w1s, s1s, l1s, tables=True),
        "iq1_m": Fmt(8, w1m, s1m, l1m, tables=True),
        "iq2_xxs": Fmt(32, iq2_xxs, lambda b, i: _iq2_scale(b.f16(0), b.u32(6 + i * 8) >> _uc(28)), tables=True),
        "iq2_xs": Fmt(16, iq2_xs, lambda b, i: _iq2_scale(b.f16(0), bits(b.u8(66 + i // 2), i % 2 * 4, 0x0F)),
                      tables=True),
        "iq2_s": Fmt(16, iq2_s, lambda b, i: _iq2_scale(b.f16(0), bits(b.u8(74 + i // 2), i % 2 * 4, 0x0F)),
                     tables=True),
        "iq3_xxs": Fmt(32, iq3_xxs, iq3xxs_scale, tables=True),
        "iq3_s": Fmt(32, iq3_s, iq3s_scale, tables=True),
    }


def _formats():
    from nextn.compiler.quant import iq4, mxfp4, nvfp4

    def q3k_word(b):   # 2 low bits | the hmask bit << 2, minus 4 (compiler/quant/k_quants.py _q3k)
        e = b.e
        lo = (b.u32(32 + e // 128 * 32 + e % 32) >> tirx.Cast("uint32", e % 128 // 32 * 2)) & _uc(0x03030303)
        hb = (b.u32(e % 32) >> tirx.Cast("uint32", e // 32)) & _uc(0x01010101)
        return tirx.reinterpret(I32, _minus(lo | (hb << _uc(2)), 4))

    def q2k_word(b):
        e = b.e
        return _u32(b, 16 + e // 128 * 32 + e % 32) >> (e % 128 // 32 * 2).astype(I32) & _c(0x03030303)

    nl16 = (lambda b: b.e % 16, lambda b: b.e // 16 * 4)   # IQ4_NL / MXFP4 nibbles as Q4_0's
    return {
        "q8_0": Fmt(32, lambda b: _u32(b, 2 + b.e), lambda b, i: b.f16(0)),
        "q4_0": _legacy(False, False), "q4_1": _legacy(True, False),
        "q5_0": _legacy(False, True), "q5_1": _legacy(True, True),
        "iq4_nl": Fmt(32, _table_word(iq4.KVALUES, lambda b: 2 + nl16[0](b), nl16[1]), lambda b, i: b.f16(0),
                      perm=True),
        "mxfp4": Fmt(32, _table_word(mxfp4.E2M1X2, lambda b: 1 + nl16[0](b), nl16[1]),
                     lambda b, i: mxfp4.e8m0_half(b.u8(0)), perm=True),
        # NVFP4: sub-block s = e / 16, element 16s + j in byte 4 + 8s + j % 8 (nibble j / 8)
        "nvfp4": Fmt(16, _table_word(mxfp4.E2M1X2, lambda b: 4 + b.e // 16 * 8 + b.e % 8,
                                             lambda b: b.e % 16 // 8 * 4), lambda b, i: nvfp4.ue4m3_half(b.u8(i)),
                     aligned=True, perm=True),
        "iq4_xs": Fmt(32, _table_word(iq4.KVALUES, lambda b: 8 + b.e // 32 * 16 + b.e % 16,
                                                lambda b: b.e % 32 // 16 * 4), iq4.iq4xs_factor, aligned=True,
                      perm=True),
        "q2_k": Fmt(16, q2k_word, lambda b, i: k_quants.q2k_factors(b, i)[0],
                    lambda b, i: k_quants.q2k_factors(b, i)[1], aligned=True),
        "q3_k": Fmt(16, q3k_word, k_quants.q3k_factor),
        "q4_k": Fmt(32, _q45k_word("q4_k"), lambda b, i: k_quants.q45k_factors(b, i)[0],
                    lambda b, i: k_quants.q45k_factors(b, i)[1], aligned=True, head=True),
        "q5_k": Fmt(32, _q45k_word("q5_k"), lambda b, i: k_quants.q45k_factors(b, i)[0],
                    lambda b, i: k_quants.q45k_factors(b, i)[1], aligned=True, head=True),
        "q6_k": Fmt(16, _q6k_word, k_quants.q6k_factor),
        **_codebook(),
    }


FORMATS = _formats()


def _stages(w, lead, weight_lead, cuda: bool = True):
    """(DEQUANT words int32 [*lead, N, K/4], SCALE f32 [*lead, N, K/sub], MIN or None) of quantized weight w;
    `cuda`: CUDA's intrinsics in the words (`byte_perm`)."""
    from nextn.common.quant import FORMATS as LAYOUTS

    from .te import DEQUANT, HEAD, MIN, SCALE, WORD_LOAD

    *_, N, K = w.shape
    f, layout = FORMATS[w.kind], LAYOUTS[w.kind]

    def blk(i, k):   # i = (*lead, n)
        return Block(w.tensors[0], (*weight_lead(*i[:-1]), i[-1], k), layout.block, layout.type_size)

    # the weight's words (and the codebook formats' grid words) as 32-bit loads where aligned, else 16-bit pairs
    # where even (word_loads.py)
    words = te.compute((*lead, N, K // 4), lambda *i: f.word_of(blk(i[:-1], i[-1] * 4), w.tensors, cuda), name=DEQUANT,
                       attrs={WORD_LOAD: 1})
    shape = (*lead, N, K // f.sub)
    per_block = layout.block // f.sub
    if f.head:
        assert layout.type_size % HEAD_BYTES == 0, w.kind
        head = te.compute((*lead, N, K // layout.block, HEAD_BYTES // 4),
                          lambda *i: blk(i[:-2], i[-2] * layout.block).u32(i[-1] * 4), name=HEAD,
                          attrs={WORD_LOAD: 1})

    def at(i):   # the reads of the block of sub-block i[-1] of row i[:-1]
        if f.head:
            return _Head(head, i[:-1], i[-1] // per_block)
        return blk(i[:-1], i[-1] * f.sub)

    def factor(fn, name):   # its float16 fields (a block's d, dmin) as 16-bit loads where even (word_loads.py)
        return te.compute(shape, lambda *i: fn(at(i), i[-1] % per_block), name=name,
                          attrs={WORD_LOAD: 1})

    return words, factor(f.scale, SCALE), factor(f.low, MIN) if f.low is not None else None


_ONES = 0x01010101
# Words per reduction step: a sub-block of up to 32 quants (8 words; 4 for the sub-blocks of 16 of Q2_K, Q3_K,
# Q6_K, NVFP4; 2 for IQ1_M's of 8), in one activation block (B >= 32). Their products are summed in int32 (each dp4a
# adds the last one's sum, as llama.cpp's vec_dot_*_q8_1 do) and scaled once, and a GPU lane's step reads the
# sub-block's factors once (Q4_K: the block head, 6-bit scale and min) and its activation words as 128-bit loads:
# per 32 quants 0.65x the instructions of steps of 16 quants (Q4_K, sm_90 PTX; 0.65-0.9x for the other formats).
GROUP = 8


def group_words(kind: str, K: int) -> int:
    """Words per reduction step of `kind`'s integer matmuls over rows of K quants: GROUP, or the sub-block's words
    where fewer; GROUP / 2 where K is whole GEMV warp steps of GROUP / 2 words per lane but not of GROUP (GLM-4.6's
    1536), whose activation loads are then vectors and unpredicated (gemv.py)."""
    from .gemv import LANES

    g = min(GROUP, FORMATS[kind].sub // 4)
    if g == GROUP and K % (LANES * 4 * g) and K % (LANES * 2 * g) == 0:
        g //= 2
    return g


# The formats whose word groups share weight bytes (`group_order`): Q4_K's and Q5_K's sub-blocks 2i and 2i + 1 are the
# low and high nibbles of the same qs bytes and one block head serves all 8 (Q5_K: its qh bytes hold a bit plane per
# sub-block); Q6_K's quants q and q + 32 share qh bytes (their 2-bit fields), as Q2_K's q and q + 32 their qs bytes and
# Q3_K's their qs and hmask bytes.
SHARED = frozenset({"q4_k", "q5_k", "q6_k", "q2_k", "q3_k"})


def group_order(kind: str, K: int):
    """The word group that the GEMV's reduction index j stands for (j -> group) in the integer definitions of
    `kind` over rows of K quants, or None for row order. For the formats of `SHARED` where K is whole unrolled GEMV
    bodies of U > 1 warp steps (gemv.py: j = body · 32U + u · 32 + lane, U = `gemv.unroll`): group body · 32U +
    lane · U + u, so that a lane's U groups of a body are U consecutive groups of one block, which read shared bytes
    (Q4_K: 2 sub-blocks of qs nibbles and one head per 2 groups) in one basic block, where nvcc loads them once. Only
    the order of the lane's float32 terms changes (the int32 sums and the scales are the same); every kernel of the
    format and K takes it (decode, verify, routed experts, prefill), so their rows still agree bit for bit. Reference:
    llama.cpp ggml-cuda vecdotq.cuh vec_dot_q6_K_q8_1, which uses both nibbles of each ql word it loads."""
    from nextn.common.quant import FORMATS as LAYOUTS

    from .gemv import LANES, unroll

    G = group_words(kind, K)
    n = K // (4 * G)
    if kind not in SHARED or n % LANES:
        return None
    U = unroll(n // LANES, True)
    if U == 1 or (LAYOUTS[kind].block // (4 * G)) % U:
        return None

    def order(j):
        return j // (LANES * U) * (LANES * U) + j % LANES * U + j // LANES % U

    return order


def _reduction(kind: str, Kw):
    """(j, g): the GEMV reduction axis over the word groups of rows of Kw words of `kind`, and the group j stands
    for (`group_order`, or j itself)."""
    j = te.reduce_axis((0, Kw // group_words(kind, int(Kw) * 4)), name="k")
    order = group_order(kind, int(Kw) * 4)
    return j, j if order is None else order(j)


def _group_term(kind, words, scale, low, wi, xw, xdw, g, dp4a, xsw=None):
    """The float32 term of word group g (words Gg .. Gg + G - 1, G = `group_words`):
    xd · (s · f32(Σ dot4(w, xq)) - m · f32(Σ dot4(1111, xq))), the sums in int32 over the group's words; `wi`
    indexes the weight stages without the word, `xw(j)` / `xdw(j)` are the activation's word j and its block scale;
    `xsw(i)`, where given, the activation's sum i of 16 quants (`quantize_rows(sums=True)`): Σ dot4(1111, xq) as
    the sum of the group's G / 4 of them (the same int32), for G a multiple of 4."""
    sub, G = FORMATS[kind].sub // 4, group_words(kind, int(words.shape[-1]) * 4)
    j0 = g * G
    per = SUM_QUANTS // 4
    sums = low is not None and xsw is not None and G % per == 0
    iw = ix = None
    for v in range(G):
        x = xw(j0 + v)
        iw = dot4(words[(*wi, j0 + v)], x, dp4a, iw)
        if low is not None and not sums:
            ix = dot4(_c(_ONES), x, dp4a, ix)
    if sums:
        for h in range(G // per):
            ix = xsw(g * (G // per) + h) if ix is None else ix + xsw(g * (G // per) + h)
    s = scale[(*wi, j0 // sub)] * iw.astype(F32)
    if low is not None:
        s = s - low[(*wi, j0 // sub)] * ix.astype(F32)
    return xdw(j0) * s


def mul_mat(w, xq, xd, dp4a: bool = True, xs=None):
    """ggml_mul_mat of quantized weight w [N, K] (or [H, N, K] per head with rows [T, H, K]) with quantized
    activation rows (`quantize_rows`: xq [T, ..., K/4], xd [T, ..., K/B], and xs [T, ..., K/16] or None: the
    min term from the quants' sums, else from dot4(1111, xq)): float32 [T, ..., N]. A symbolic T is padded to whole
    GEMV row tiles in the definition (`te.padded_rows`: a padded row reads row T - 1 and is not stored), which the
    schedule's `pad_einsum` cannot do here (it takes einsums only)."""
    from .te import MATMUL

    words, scale, low = _stages(w, tuple(w.shape[:-2]), lambda *b: b, cuda=dp4a)
    Kw = words.shape[-1]
    B4 = Kw // xd.shape[-1]   # words per activation block
    heads = len(w.shape) == 3
    T = xq.shape[0]
    padded = not isinstance(T, tirx.IntImm)
    if padded:
        from .te import XQ_PAD, XS_PAD, padded_rows

        xq, xd = padded_rows(xq, T, XQ_PAD), padded_rows(xd, T, "xd_pad")
        if xs is not None:   # a register tile of the GEMV too (gemv.py)
            xs = padded_rows(xs, T, XS_PAD)
    j, g = _reduction(w.kind, Kw)

    def f(*i):
        wi = (i[-2], i[-1]) if heads else (i[-1],)
        xi = i[:-1]
        return te.sum(_group_term(w.kind, words, scale, low, wi, lambda jj: xq[(*xi, jj)],
                                  lambda jj: xd[(*xi, jj // B4)], g, dp4a,
                                  None if xs is None else lambda h: xs[(*xi, h)]), axis=j)

    y = te.compute((*xq.shape[:-1], w.shape[-2]), f, name=MATMUL)
    if padded:
        from .te import unpadded

        y = unpadded(y, T)
    return y


def mul_mat_id(w, xq, xd, ids, dp4a: bool = True, xs=None):
    """ggml_mul_mat_id of quantized experts w [X, N, K] with quantized rows xq / xd (/ xs) ([T, ...] or
    [T, n_used, ...], `quantize_rows`; xs as in `mul_mat`): float32 [T, n_used, N]."""
    from .te import MATMUL

    T, kk = ids.shape
    words, scale, low = _stages(w, (T, kk), lambda t, s: (ids[t, s].astype("int64"),), cuda=dp4a)
    Kw = words.shape[-1]
    B4 = Kw // xd.shape[-1]
    j, g = _reduction(w.kind, Kw)

    def f(t, s, n):
        xi = (t,) if len(xq.shape) == 2 else (t, s)
        return te.sum(_group_term(w.kind, words, scale, low, (t, s, n), lambda jj: xq[(*xi, jj)],
                                  lambda jj: xd[(*xi, jj // B4)], g, dp4a,
                                  None if xs is None else lambda h: xs[(*xi, h)]), axis=j)

    return te.compute((T, kk, w.shape[-2]), f, name=MATMUL)


def mul_mat_id_grouped(w, xq, xd, ids, groups, dp4a: bool = True, xs=None):
    """`te.mul_mat_id_grouped` on quantized rows (xs as in `mul_mat`): float32 [T, n_used, GROUP_ROWS, N], a
    leader's products for its member rows, 0 elsewhere (on the GPU a pair that leads no group runs nothing and
    leaves its entries unwritten: gemv._leaders_only)."""
    from .te import GROUP_ROWS, GROUPED, XQ_GROUP, XS_GROUP

    T, kk = ids.shape
    W = GROUP_ROWS
    # (no test around the weight loads: the GPU schedule runs only the leaders' thread blocks, gemv._leaders_only;
    # a pair that leads none has no members, so its entries are 0 here)
    words, scale, low = _stages(w, (T, kk), lambda t, s: (ids[t, s].astype("int64"),), cuda=dp4a)
    Kw = words.shape[-1]
    B4 = Kw // xd.shape[-1]
    j, g = _reduction(w.kind, Kw)

    def member(t, s, q):   # the activation row of member q of leader (t, s): (row,) or (row, slot), and m >= 0
        m = groups[t, s, q].astype("int64")
        row = te.max(m, _c(0, "int64"))
        return ((row // kk,) if len(xq.shape) == 2 else (row // kk, row % kk)), m >= 0

    def words_of(t, s, q, jj):
        xi, is_member = member(t, s, q)
        return tirx.if_then_else(is_member, xq[(*xi, jj)], _c(0))

    # the members' activation words as a stage of their own (0 past the members): the GEMV keeps it as a register
    # tile, a lane's words of a step as 128-bit loads under the member's test (gemv.py, as XQ_PAD); the sums
    # read the same words in the same order, whether it is kept or inlined. Their sums of 16 quants alike (XS_GROUP).
    xg = te.compute((T, kk, W, Kw), words_of, name=XQ_GROUP)
    if xs is not None:
        def sums_of(t, s, q, h):
            xi, is_member = member(t, s, q)
            return tirx.if_then_else(is_member, xs[(*xi, h)], _c(0))

        xsg = te.compute((T, kk, W, xs.shape[-1]), sums_of, name=XS_GROUP)

    def f(t, s, q, n):
        xi, is_member = member(t, s, q)
        v = _group_term(w.kind, words, scale, low, (t, s, n), lambda jj: xg[t, s, q, jj],
                        lambda jj: xd[(*xi, jj // B4)], g, dp4a,
                        None if xs is None else lambda h: xsg[t, s, q, h])
        return te.sum(tirx.if_then_else(is_member, v, _c(0.0, F32)), axis=j)

    return te.compute((T, kk, W, w.shape[-2]), f, name=GROUPED)


QUANT_WARPS = 4   # activation blocks per thread block of the quantizer (one warp each)


def schedule_quantize(func: tirx.PrimFunc, target):
    """The GPU schedule of a (fused) `quantize_rows` PrimFunc, or None when `func` is not one: a warp per activation
    block, its lanes' |x| maxima reduced by warp shuffles (max is exact in any order, so amax is the CPU's), then
    lane 0 stores d and the lanes the block's B / 4 words (and B / 16 sums); element-wise producers of x (SwiGLU, a
    division) are computed in place of its reads."""
    import re

    from tvm import s_tir

    sch = s_tir.Schedule(func)
    try:
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:
        return None
    names = [sch.get(b).name_hint for b in blocks]

    def one(name):
        hits = [b for b, n in zip(blocks, names) if re.fullmatch(rf"{name}(_\d+)?", n)]
        return hits[0] if len(hits) == 1 else None

    amax, xd, xq, xs = one(AMAX), one(ACT_D), one(ACT_Q), one(ACT_S)
    if amax is None or xd is None or xq is None:
        return None
    i_amax = next(i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(amax)))
    # element-wise producers, then the three stages (four with the sums) and nothing after them
    if len(blocks) != i_amax + (3 if xs is None else 4):
        return None
    for b in blocks[:i_amax]:
        sch.compute_inline(b)
    *outer, i = sch.get_loops(amax)
    lb = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    bx, ty = sch.split(lb, [None, QUANT_WARPS])
    _io, tx = sch.split(i, [None, 32])
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")   # a cross-lane reduction: TVM lowers it to warp shuffles, the result in every lane
    sch.set_scope(amax, 0, "local")
    outs = (xd, xq) if xs is None else (xd, xq, xs)
    for b in outs:
        sch.reverse_compute_at(b, ty, preserve_unit_loops=True)
    for b in outs[1:]:   # the block's words, and its sums of 16 quants: over the lanes
        *_, wj = sch.get_loops(b)
        _wo, wx = sch.split(wj, [None, 32])
        sch.bind(wx, "threadIdx.x")
    return sch
