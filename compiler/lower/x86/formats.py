"""Per-format inner loops of the x86 matmul kernels (kquant.py, lanes.py and floats.py run them): how one (weight
row, block) is decoded straight from the GGUF block bytes (ggml/src/ggml-common.h block_*), and what each
activation row adds.

Integer path (K-quants, IQ4_XS; blocks of 256): the activation row is int8 per 256 values
(`nextn.common.quant.activation`); a block's quants are multiplied with it exactly, u8 x s8 -> i16 pairs
(pmaddubsw) then i16 x sub-block scale -> i32 (pmaddwd), and its float factors (d, dmin) enter once per block
through one FMA per term. The same idea as ggml-cpu's ggml_vec_dot_q4_K_q8_K (ggml-cpu/arch/x86/quants.c).
IQ4_XS (signed quants) instead takes its rows in the order its nibbles unpack to and sums unsigned quants
(kvalues + 128) with one vpdpbusd per 64 bytes, the sub-block scales per lane once per block (`IQ4XS`).

Integer path for the 32-weight block formats (Q8_0, IQ4_NL, MXFP4: `BLOCK32_FORMATS`): the activation row is int8
per 32 values ("q8_0" rows); a block's signed quants (int8, a byte shuffle of IQ4_NL's / MXFP4's table) give an
exact int32 sum per block, |w| x (x with w's sign) by pmaddubsw then pmaddwd by 1, and each block adds
float(sum) * (d_w * d_x) by one FMA (ggml-cpu's ggml_vec_dot_q8_0_q8_0 / ggml_vec_dot_iq4_nl_q8_0 /
ggml_vec_dot_mxfp4_q8_0 on x86). Each full group of 8 blocks goes as IQ4_XS takes a block ("q8_0_g8" rows,
`Block32`: one vpdpbusd per 64 bytes, one FMA per group); the blocks after the last group go one at a time.

Float path (Q8_0, IQ4_NL, MXFP4 under --exact-matmul, NVFP4 always, and unquantized F16 / BF16 / F32; blocks of
32): each weight is dequantized exactly (d * q: at most 11 + 8 significant bits) and multiplied with the float32
activation by FMA.
"""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from nextn.compiler.quant.mxfp4 import E2M1X2, e8m0_half
from nextn.compiler.quant.nvfp4 import ue4m3_half

from .codebook import CODEBOOK_FORMATS
from .vec import abs_i8, byte_vector, const, pshufb, ramp


def _u8(v, lanes=32):
    return const(v, "uint8", lanes)


def _shr(v, by):
    """uint8 x 32 v >> by, `by` a Python int or an expression (a loop variable's: as a 16-bit shift by a
    register, vpsrlw, where AVX2 has no byte shift; each byte also takes bits of its neighbour, which the
    callers mask off)."""
    if isinstance(by, int):
        return v >> _u8(by)
    w = tirx.reinterpret("uint16x16", v) >> tirx.Broadcast(tirx.Cast("uint16", by), 16)
    return tirx.reinterpret("uint8x32", w)


def _f16(buf16, index):
    return tirx.Cast("float32", buf16[index])


def _scales(sc16, groups, width):
    """The i16 scale vector for pmaddwd: scale `g` of int16x16 `sc16` repeated over the i16 lanes of its weights,
    for the sub-blocks `groups` that one vector of `width` bytes covers."""
    per = width // 2 // len(groups)
    return tirx.Shuffle([sc16, sc16], [g for g in groups for _ in range(per)])


def _scales_u8(b16, groups, width):
    """`_scales` of the zero-extended bytes of uint8 x 16 `b16`, as one byte shuffle with zeros (no widening
    of each vector after it)."""
    per = width // 2 // len(groups)
    idx = [i for g in groups for _ in range(per) for i in (g, 16)]
    return tirx.reinterpret(f"int16x{width // 2}", tirx.Shuffle([b16] + [_u8(0, 16)] * (width // 16 - 1), idx))


def _shift_halves(v, a, b, left=False):
    """uint8 x 64 v with the bytes of its low 32 shifted by a and of its high 32 by b, as 16-bit shifts (one
    vpsrlvw / vpsllvw; AVX-512BW has no byte shifts): each byte also takes bits of its neighbour, which the
    callers mask off."""
    amounts = tirx.Shuffle([const(a, "uint16")] * 16 + [const(b, "uint16")] * 16, list(range(32)))
    w = tirx.reinterpret("uint16x32", v)
    return tirx.reinterpret("uint8x64", (w << amounts) if left else (w >> amounts))


def _nibbles(v, per):
    """uint8 x 16*per bytes of `per` 4-bit blocks (byte l: element l low, 16 + l high) -> uint8 x 32*per indices in
    element order: one mask and one shift over all of v, then 16-byte lanes [lo_0, hi_0, lo_1, hi_1] (one
    shuffle of 128-bit lanes)."""
    lo, hi = v & _u8(15, 16 * per), (v >> _u8(4, 16 * per)) & _u8(15, 16 * per)
    if per == 1:
        return tirx.vectorcombine("uint8x32", lo, hi)
    idx = [j for p in range(per) for j in list(range(16 * p, 16 * p + 16)) + list(range(16 * per + 16 * p, 16 * per + 16 * p + 16))]
    return tirx.Shuffle([lo, hi], idx)


class IntFormat:
    """A super-block format on the integer path ("q8" activation rows). The unsigned K-quants (kquant.kquant_rows):
    `setup` binds what a (row, block) shares across activation rows, `chunks` gives [(u8 quants x width, offset of
    their first activation in the block, i16 scales, each constant over 16 bytes)], whose products weighted by
    their scales make the block sum (factor d), and `xs_term` the block's term on the row's 16-value sums. The
    factors must not depend on the row (they are taken once per block). IQ4_XS: its own lanes (lanes.lane_rows)."""
    block = 256
    acts = "q8"         # the activation row format (nextn.common.quant.activation)


def _at(j):
    """The position in a "q8_q4k" block of sub-block 2j (j a Python int or a loop variable); 2j + 1's is 64 on
    (activation.Q4K_ORDER: per 128 values the sub-blocks 0, 2, 1, 3)."""
    return 128 * (j // 2) + 32 * (j % 2)


class Q4K(IntFormat):
    """Q4_K (144 B): d f16 | dmin f16 | 12 B of 8 (6-bit scale, 6-bit min) | qs[128]: w = d*sc*q - dmin*m per
    32 weights; lo nibbles of qs[32j..32j+32) are sub-block 2j, hi nibbles 2j+1 (get_scale_min_k4). Its
    activation rows are "q8" rows in the order 64 bytes of qs unpack to ("q8_q4k", activation.Q4K_ORDER)."""
    type_size, qs_at, qh_at = 144, 16, None
    layout = "q8_q4k"
    q_max = 15          # the largest quant (kquant._pairs)
    xs_merged = False   # xs_term has a factor of its own

    def setup(self, k, n, s):
        b = T.Bind(n * k.row_bytes + s * self.type_size)
        # the 12 scale bytes as words u0 u1 u2 (after d, dmin) in one vector, the 4 words of
        # get_scale_min_k4's bytes by lanes: [u0 & m6, (u2 & m4) | ((u0 >> 6) & m2) << 4, u1 & m6, ...]
        hdr = T.Bind(k.w32[ramp(b // 4, 4)])          # d | dmin, u0, u1, u2
        u32 = lambda *v: tirx.Shuffle([const(x, "uint32") for x in v], list(range(4)))   # noqa: E731
        lo = (tirx.Shuffle([hdr], [1, 3, 2, 3]) >> u32(0, 0, 0, 4)) & u32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F)
        hi = ((tirx.Shuffle([hdr], [0, 1, 0, 2]) >> u32(6, 6, 6, 6)) & u32(0, 0x03030303, 0, 0x03030303)) << u32(4, 4, 4, 4)
        sb = T.Bind(tirx.reinterpret("uint8x16", lo | hi))
        sm = T.Bind(tirx.Cast("int16x16", sb))
        dd = T.Bind(tirx.Cast("float32x8", tirx.reinterpret("float16x8", hdr)))     # d, dmin: one conversion
        d, dmin = T.Bind(tirx.Shuffle([dd], [0])), T.Bind(tirx.Shuffle([dd], [1]))
        return {"sm": sm, "sb": sb, "d": d, "dmin": dmin,
                "mins": T.Bind(tirx.Shuffle([sm], [8 + i // 2 for i in range(16)]))}   # min j over 2 x 16 sums

    def _quants(self, k, n, s, j):
        v = T.Bind(k.w[n, ramp(s * self.type_size + self.qs_at + 32 * j, 32)])
        lo, hi = v & _u8(15), (v >> _u8(4)) & _u8(15)
        if self.qh_at is not None:     # Q5_K: bits 2j, 2j+1 of qh[l] are bit 4 of elements 64j + l, 64j + 32 + l
            qh = T.Bind(k.w[n, ramp(s * self.type_size + self.qh_at, 32)])
            lo = lo | ((_shr(qh, 2 * j) & _u8(1)) << _u8(4))
            hi = hi | ((_shr(qh, 2 * j + 1) & _u8(1)) << _u8(4))
        return lo, hi

    def _quants64(self, k, n, s, h):
        """(lo, hi): the quants of qs[64h .. 64h + 64) as two uint8 x 64, lo its low nibbles (sub-blocks 4h, 4h + 2)
        and hi its high ones (4h + 1, 4h + 3): the activation positions 128h and 128h + 64 of a "q8_q4k" row. One
        64-byte load, a mask, a 16-bit shift and a mask; Q5_K's bit 4 from qh's 32 bytes in both halves
        (`_shift_halves`)."""
        raw = T.Bind(k.w[n, ramp(s * self.type_size + self.qs_at + 64 * h, 64)])
        hi16 = tirx.reinterpret("uint16x32", raw) >> const(4, "uint16", 32)
        lo, hi = raw & _u8(15, 64), tirx.reinterpret("uint8x64", hi16) & _u8(15, 64)
        if self.qh_at is not None:     # bit b of qh[l]: bit 4 of element l of sub-block b
            qh = T.Bind(k.w[n, ramp(s * self.type_size + self.qh_at, 32)])
            qh2 = T.Bind(tirx.vectorcombine("uint8x64", qh, qh))
            lo = lo | ((_shift_halves(qh2, 4 * h, 4 * h + 2) & _u8(1, 64)) << _u8(4, 64))
            hi = hi | ((_shift_halves(qh2, 4 * h + 1, 4 * h + 3) & _u8(1, 64)) << _u8(4, 64))
        return lo, hi

    def chunks(self, k, st, n, s):
        out = []
        if k.width == 64:
            for h in range(2):
                lo, hi = self._quants64(k, n, s, h)
                out.append((T.Bind(lo), 128 * h, T.Bind(_scales_u8(st["sb"], [4 * h, 4 * h + 2], 64))))
                out.append((T.Bind(hi), 128 * h + 64, T.Bind(_scales_u8(st["sb"], [4 * h + 1, 4 * h + 3], 64))))
            return out
        for j in range(4):
            lo, hi = self._quants(k, n, s, j)
            out.append((T.Bind(lo), _at(j), T.Bind(_scales(st["sm"], [2 * j], 32))))
            out.append((T.Bind(hi), _at(j) + 64, T.Bind(_scales(st["sm"], [2 * j + 1], 32))))
        return out

    n_steps = 4         # kquant._steps32: sub-blocks 2j, 2j + 1 per step

    def step_setup(self, k, st):
        """The block's scales in a local buffer, which `step_chunks` indexes by the loop variable."""
        st["sbuf"] = T.decl_buffer((16,), "int16")
        T.buffer_store(st["sbuf"], st["sm"], [ramp(0, 16)])

    def step_chunks(self, k, st, n, s, j):
        """The two chunks of `chunks` (32 bytes) that step j, a loop variable, takes: sub-blocks 2j, 2j + 1."""
        lo, hi = self._quants(k, n, s, j)
        return [(T.Bind(lo), _at(j), T.Bind(tirx.Broadcast(st["sbuf"][2 * j], 16))),
                (T.Bind(hi), _at(j) + 64, T.Bind(tirx.Broadcast(st["sbuf"][2 * j + 1], 16)))]

    def xs_term(self, st):
        """(int16 x 16 weights of the row's 16-value sums `xs`, float factor or None): the block's
        -dmin * sum_j m_j * (sum of sub-block j), a term with its own factor (kquant.kquant_rows)."""
        return st["mins"], -st["dmin"]


class Q5K(Q4K):
    """Q5_K (176 B): as Q4_K, with qh[32] (bit 4 of every quant) between the scales and qs."""
    type_size, qs_at, qh_at = 176, 48, 16
    q_max = 31


class Q6K(IntFormat):
    """Q6_K (210 B): ql[128] | qh[64] | 16 int8 scales | d f16: w = d*sc*(q - 32) per 16 weights. The -32 is one
    correction per block: -32 d sum_g sc_g (sum of the 16 activations of g)."""
    type_size = 210
    q_max = 63
    xs_merged = True

    def setup(self, k, n, s):
        b = T.Bind(n * k.row_bytes + s * 210)
        return {"sc": T.Bind(tirx.Cast("int16x16", k.w8[ramp(b + 192, 16)])), "d": T.Bind(_f16(k.w16, b // 2 + 104))}

    def chunks(self, k, st, n, s):
        if k.width == 64:
            return self._chunks64(k, st, n, s)
        out = []
        for h in range(2):      # halves of 128 weights: ql[64h, 64h + 64), qh[32h, 32h + 32)
            ql0 = T.Bind(k.w[n, ramp(s * 210 + 64 * h, 32)])
            ql1 = T.Bind(k.w[n, ramp(s * 210 + 64 * h + 32, 32)])
            qh = T.Bind(k.w[n, ramp(s * 210 + 128 + 32 * h, 32)])
            q = [(ql0 & _u8(15)) | ((qh & _u8(3)) << _u8(4)),                   # weights 128h + [0, 32)
                 (ql1 & _u8(15)) | (((qh >> _u8(2)) & _u8(3)) << _u8(4)),       # [32, 64)
                 (ql0 >> _u8(4)) | (((qh >> _u8(4)) & _u8(3)) << _u8(4)),       # [64, 96)
                 (ql1 >> _u8(4)) | ((qh >> _u8(6)) << _u8(4))]                  # [96, 128)
            g = 8 * h
            for i in range(4):
                out.append((T.Bind(q[i]), 128 * h + 32 * i, T.Bind(_scales(st["sc"], [g + 2 * i, g + 2 * i + 1], 32))))
        return out

    def _chunks64(self, k, st, n, s):
        """`chunks` at 64 bytes: per half h, weights 128h + [0, 64) are ql's lo nibbles | qh bits (0, 1) and (2, 3)
        as bits 4, 5, weights 128h + [64, 128) ql's hi nibbles | qh bits (4, 5) and (6, 7), each as one vector:
        ql's 64 bytes and qh's 32 in both halves (`_shift_halves`), no insert of two halves."""
        out = []
        for h in range(2):
            ql = T.Bind(k.w[n, ramp(s * 210 + 64 * h, 64)])
            qh = T.Bind(k.w[n, ramp(s * 210 + 128 + 32 * h, 32)])
            qh2 = tirx.vectorcombine("uint8x64", qh, qh)
            q01 = (ql & _u8(15, 64)) | (_shift_halves(qh2, 4, 2, left=True) & _u8(0x30, 64))
            q23 = (_shift_halves(ql, 4, 4) & _u8(15, 64)) | (_shift_halves(qh2, 0, 2) & _u8(0x30, 64))
            g = 8 * h
            for i, q in enumerate((q01, q23)):
                out.append((T.Bind(q), 128 * h + 64 * i, T.Bind(_scales(st["sc"], [g + 4 * i + m for m in range(4)], 64))))
        return out

    def xs_term(self, st):
        """The -32 of every quant, -32 sum_g sc_g (sum of the 16 activations of g): an integer with the block sum's
        factor d, so it joins the block sum before the conversion (None: no factor of its own). |32 sc| <= 4096."""
        return T.Bind(st["sc"] * const(-32, "int16", 16)), None


KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)   # kvalues_iq4nl


class IQ4XS(IntFormat):
    """IQ4_XS (136 B): d f16 | scales_h u16 | scales_l[4] | qs[128]: w = d*(ls - 32)*kvalues[q] per 32 weights,
    ls = 4 bits of scales_l | 2 bits of scales_h << 4; the table lookup is a byte shuffle (pshufb).

    Its activation rows are "q8" rows in the order the nibbles unpack to ("q8_iq4xs", activation.IQ4XS_ORDER):
    a block is four vectors of 64 quants in which int32 lane L always holds sub-block L // 4 + 4 * (L % 4 // 2),
    so a row's four products (`lane_quants`) accumulate in one int32 vector and the sub-block scales enter once
    per block, as float factors per lane (`lane_factors`). With VNNI the quants are unsigned, kvalues + 128, for
    one vpdpbusd per vector and row (no sign moved onto x); the row's xc starts the sum at -128 x its lane sums,
    so the lanes are the exact signed sums either way (lanes.lane_rows)."""
    type_size = 136
    layout = "q8_iq4xs"

    def _ls(self, k, n, s):
        """(byte offset of block s of row n, int32 x 8: ls - 32 of its sub-blocks)."""
        b = T.Bind(n * k.row_bytes + s * 136)
        sl = tirx.Broadcast(k.w32[b // 4 + 1], 8)
        sh = tirx.Broadcast(tirx.Cast("uint32", k.w16u[b // 2 + 1]), 8)
        lo = (sl >> tirx.Ramp(const(0, "uint32"), const(4, "uint32"), 8)) & const(15, "uint32", 8)
        hi = (sh >> tirx.Ramp(const(0, "uint32"), const(2, "uint32"), 8)) & const(3, "uint32", 8)
        return b, tirx.Cast("int32x8", lo | (hi << const(4, "uint32", 8))) - const(32, "int32", 8)

    def lane_factors(self, k, n, s):
        """float32 x 16: d * (ls - 32) of each int32 lane's sub-block (exact: 11 x 6 significant bits)."""
        b, ls = self._ls(k, n, s)
        dls = tirx.Cast("float32x8", ls) * tirx.Broadcast(_f16(k.w16, b // 2), 8)
        return tirx.Shuffle([dls, dls], LANE_BLOCK)

    def _raw(self, k, n, s):
        """Block s's qs[128] of row n as two uint8 x 64 (the `raw` of `lane_vectors`)."""
        return [T.Bind(k.w[n, ramp(s * 136 + 8 + 64 * h, 64)]) for h in range(2)]

    def lane_quants(self, k, n, s, vnni):
        """The block's four vectors of 64 quants in activation.IQ4XS_ORDER (`lane_vectors`)."""
        return lane_vectors(self._raw(k, n, s), KVALUES, lambda idx: idx < _u8(8, 64), vnni, k.width)

    def signed_quants(self, k, n, s):
        """The four vectors of `lane_quants` as (u8 |q|, q's bytes), for lanes.scaled_rows (vpsignb by q)."""
        return lane_vectors(self._raw(k, n, s), KVALUES, None, False, k.width, signed=True)

    def lane_scales(self, k, n, s):
        """(float32 d, [int16 x 16] x 2): for lanes.scaled_rows, the block's d and for each 32-byte half of its
        64-byte vectors the pmaddwd weights: ls - 32 of the sub-block of each int16 lane's int32 lane."""
        b, ls = self._ls(k, n, s)
        ls16 = T.Bind(tirx.Cast("int16x8", ls))
        halves = [T.Bind(tirx.Shuffle([ls16, ls16], [LANE_BLOCK[8 * h + m // 2] for m in range(16)]))
                  for h in range(2)]
        return T.Bind(_f16(k.w16, b // 2)), halves


LANE_BLOCK = [lane // 4 + 4 * (lane % 4 // 2) for lane in range(16)]   # the sub-block (block) of each int32 lane


def lane_vectors(raw, table, negative, vnni, width, signed=False):
    """Four vectors of 64 quants in activation.IQ4XS_ORDER from two uint8 x 64 `raw` whose 128-bit lane i holds
    the 16 nibble bytes of sub-block (block) 4h + i (byte j: value j low, 16 + j high): vector c takes 8 bytes of
    lane i of each half (unpck{l,h}qdq), low nibbles for c < 2, then the table lookup (pshufb): u8 table + 128
    (`vnni`), else (u8 |table|, `negative`(index): the lanes whose quant is negative), or with `signed`
    (u8 |table|, the signed quants' bytes)."""
    # the high nibbles by a 16-bit shift (vpsrlw; the mask drops what the neighbour byte brings): a byte shift
    # would be GFNI's vgf2p8affineqb, on the multiply pipes the vpdpbusd need
    hi = [tirx.reinterpret("uint8x64", tirx.reinterpret("uint16x32", r) >> const(4, "uint16", 32)) for r in raw]
    nib = [[r & _u8(15, 64) for r in raw], [h & _u8(15, 64) for h in hi]]
    out = []
    for c in range(4):
        idx = T.Bind(tirx.Shuffle(nib[c // 2], [64 * (p % 16 // 8) + 16 * (p // 16) + 8 * (c % 2) + p % 8
                                                 for p in range(64)]))
        if vnni:
            out.append(T.Bind(_lookup([v + 128 for v in table], idx, width)))
        elif signed:    # |q| by vpabsb, not a second table in a register
            q = T.Bind(_lookup(table, idx, width))
            out.append((tirx.reinterpret("uint8x64", abs_i8(tirx.reinterpret("int8x64", q), 64)), q))
        else:
            out.append((T.Bind(_lookup([abs(v) for v in table], idx, width)), negative(idx)))
    return out


def _lookup(table, idx, width):
    """uint8 x 64: table[idx] (16 entries, idx < 16) by pshufb, one per `width` bytes."""
    parts = []
    for h in range(0, 64, width):
        part = idx if width == 64 else tirx.Shuffle([idx], list(range(h, h + width)))
        parts.append(tirx.reinterpret(f"uint8x{width}", pshufb(
            tirx.reinterpret(f"int8x{width}", byte_vector(list(table) * (width // 16))), part, width)))
    return parts[0] if len(parts) == 1 else tirx.vectorcombine("uint8x64", *parts)


class Block32:
    """A 32-weight block format on the integer path: each full group of 8 blocks against "q8_0_g8" activation
    rows (lanes.group_rows: `group_quants`, the group's four vectors of 64 quants in activation.IQ4XS_ORDER, and
    `group_factors`, d_w per int32 lane), the blocks after the last group one at a time (lanes.single_rows:
    `quants`, the 32 * p signed quants (int8, element order) of blocks b0 .. b0 + p - 1, and `scales`, their
    float32 factors d_w, w = d_w * q; a scalar for p = 1)."""
    block = 32
    acts = "q8_0"
    layout = "q8_0_g8"
    unit_bytes = 416    # a row's bytes per group (tiles._units_in): 256 quants, 8 d, 16 lane d and 16 lane offsets

    def term_lanes(self, width):
        return [16, 8]     # the groups' lane sums (at either width), the blocks after them

    def group_factors(self, k, n, b0):
        """float32 x 16: d_w of each int32 lane's block."""
        d = T.Bind(self.scales(k, n, b0, 8))
        return tirx.Shuffle([d, d], LANE_BLOCK)

    def scales(self, k, n, b0, p):   # a float16 d_w at the start of each block (type_size even)
        base = (n * k.row_bytes + b0 * self.type_size) // 2
        if p == 1:
            return _f16(k.w16, base)
        offs = [i * self.type_size // 2 for i in range(p)]
        if k.width == 32:    # AVX2 has no word permute: p scalar inserts
            return tirx.Cast(f"float32x{p}", tirx.Shuffle([k.w16[base + o] for o in offs], list(range(p))))
        # AVX-512BW: the words of p blocks by whole-vector loads and one shuffle (vpermt2w), not p scalar inserts
        vecs = [k.w16[ramp(base + 32 * j, 32)] for j in range(offs[-1] // 32 + 1)]
        return tirx.Cast(f"float32x{p}", tirx.Shuffle(vecs, offs))


class Q80Int(Block32):
    """Q8_0 (34 B): d f16 | qs int8[32].

    Each full group of 8 blocks goes as IQ4_NL's does ("q8_0_g8" rows: one vpdpbusd per 64 bytes and row, one FMA
    per group), the quants moved into activation.IQ4XS_ORDER by qword permutes (`group_quants`): per block a
    row's sum cost a sign, a product, a conversion and an FMA on the block-at-a-time path it took before, which
    at 512 rows ran Q8_0 at half IQ4_NL's rate (bench/x86_rows.py)."""
    type_size = 34

    def quants(self, k, n, b0, p):
        qs = [k.w8[ramp(n * k.row_bytes + (b0 + i) * 34 + 2, 32)] for i in range(p)]
        return qs[0] if p == 1 else tirx.vectorcombine(f"int8x{32 * p}", *qs)

    def group_quants(self, k, n, b0, vnni):
        """The four vectors of 64 quants of blocks b0 .. b0 + 7 in activation.IQ4XS_ORDER: vector c holds qword c
        of every block, qword 2i + h of it from block 4h + i. Blocks i and 4 + i share one 64-byte vector (two
        32-byte loads), two permutes of two such vectors give the low halves of two outputs, one more joins
        halves. VNNI: q + 128 (u8; the row's xc takes the 128 back off), else (|q| as u8, q < 0)."""
        u64 = lambda v: tirx.reinterpret("uint64x8", v)   # noqa: E731
        pairs = [T.Bind(u64(tirx.vectorcombine("uint8x64", *[
                     k.w[n, ramp((b0 + i + 4 * h) * 34 + 2, 32)] for h in (0, 1)]))) for i in range(4)]
        # halves[j][c]: qwords (block i, qword c), (block 4 + i, qword c) for i = 2j, 2j + 1: output c's half j
        halves = [[T.Bind(tirx.Shuffle(pairs[2 * j:2 * j + 2], [8 * i + 4 * h + c for c in (c2, c2 + 1)
                                                                for i in (0, 1) for h in (0, 1)]))
                   for c2 in (0, 2)] for j in (0, 1)]
        out = []
        for c in range(4):
            lo, hi = halves[0][c // 2], halves[1][c // 2]
            sel = [4 * (c % 2) + q for q in range(4)]
            q = tirx.reinterpret("int8x64", tirx.Shuffle([lo, hi], sel + [8 + v for v in sel]))
            if vnni:
                out.append(T.Bind(tirx.reinterpret("uint8x64", q) ^ _u8(128, 64)))
            else:
                qb = T.Bind(q)
                out.append((T.Bind(tirx.reinterpret("uint8x64", abs_i8(qb, 64))), qb < const(0, "int8", 64)))
        return out


class IQ4NLInt(Block32):
    """IQ4_NL (18 B): d f16 | qs[16]: q = kvalues[nibble], lo nibbles weights 0..15, hi nibbles 16..31.

    Its activation rows are "q8_0" rows with each full group of 8 blocks in IQ4_XS's order ("q8_0_g8"): the
    group's 8 qs gathered as IQ4_XS's 8 sub-blocks (`group_quants`), so a row's sums take one vpdpbusd per
    64 bytes and one FMA per group (lanes.group_rows); the blocks after the last full group go one at a time."""
    type_size, table, q_at = 18, KVALUES, 2

    def group_quants(self, k, n, b0, vnni):
        """The four vectors of 64 quants of blocks b0 .. b0 + 7 in activation.IQ4XS_ORDER (formats.lane_vectors)."""
        raw = [T.Bind(tirx.vectorcombine("uint8x64", tirx.vectorcombine("uint8x32", *[
                   k.w[n, ramp((b0 + 4 * h + i) * self.type_size + self.q_at, 16)] for i in (0, 1)]),
                   tirx.vectorcombine("uint8x32", *[k.w[n, ramp((b0 + 4 * h + i) * self.type_size + self.q_at, 16)]
                                                    for i in (2, 3)])))
               for h in range(2)]
        return lane_vectors(raw, self.table, lambda idx: self.negative(idx, 64), vnni, k.width)

    def _idx(self, k, n, b0, p):
        qs = [k.w[n, ramp((b0 + i) * self.type_size + self.q_at, 16)] for i in range(p)]
        return _nibbles(qs[0] if p == 1 else tirx.vectorcombine(f"uint8x{16 * p}", *qs), p)

    def quants(self, k, n, b0, p):
        return pshufb(tirx.reinterpret(f"int8x{32 * p}", byte_vector(list(self.table) * (2 * p))),
                      self._idx(k, n, b0, p), 32 * p)

    def negative(self, idx, lanes):
        """Lanes whose quant is negative: kvalues_iq4nl is ascending, negative for the indices 0..7."""
        return idx < _u8(8, lanes)


class MXFP4Int(IQ4NLInt):
    """MXFP4 (17 B): e u8 | qs[16]: q = E2M1X2[nibble] (doubled e2m1 values), d_w = 2^(e - 128) (e8m0_half)."""
    type_size, table, q_at = 17, E2M1X2, 1

    def negative(self, idx, lanes):   # bit 3 is the e2m1 sign (index 8 is -0: |q| = 0 either way)
        return idx > _u8(8, lanes)

    def scales(self, k, n, b0, p):
        d = [e8m0_half(k.w[n, (b0 + i) * 17]) for i in range(p)]
        return d[0] if p == 1 else tirx.Shuffle(d, list(range(p)))


class FloatFormat:
    """A 32-weight block format on the float path: `values` gives the block's dequantized weights (exact) as
    float32 vectors of width/4 lanes, in element order."""
    block = 32
    acts = "f32"


class Q80(FloatFormat):
    """Q8_0 (34 B): d f16 | qs int8[32]: w = d * q."""
    type_size = 34

    def values(self, k, n, blk):
        b = T.Bind(n * k.row_bytes + blk * 34)
        q = T.Bind(k.w8[ramp(b + 2, 32)])
        L = k.width // 4
        d = T.Bind(tirx.Broadcast(_f16(k.w16, b // 2), L))
        return [T.Bind(d * tirx.Cast(f"float32x{L}", tirx.Shuffle([q], list(range(i, i + L))))) for i in range(0, 32, L)]


class IQ4NL(FloatFormat):
    """IQ4_NL (18 B): d f16 | qs[16]: w = d * kvalues[q], lo nibbles weights 0..15, hi nibbles 16..31."""
    type_size = 18

    def values(self, k, n, blk):
        b = T.Bind(n * k.row_bytes + blk * 18)
        v = k.w[n, ramp(blk * 18 + 2, 16)]
        idx = tirx.vectorcombine("uint8x32", v & _u8(15, 16), (v >> _u8(4, 16)) & _u8(15, 16))
        q = T.Bind(pshufb(tirx.reinterpret("int8x32", byte_vector(list(KVALUES) * 2)), idx, 32))
        L = k.width // 4
        d = T.Bind(tirx.Broadcast(_f16(k.w16, b // 2), L))
        return [T.Bind(d * tirx.Cast(f"float32x{L}", tirx.Shuffle([q], list(range(i, i + L))))) for i in range(0, 32, L)]


class MXFP4(FloatFormat):
    """MXFP4 (17 B): e u8 | qs[16]: w = 2^(e - 128) * E2M1X2[q] (ggml_e8m0_to_fp32_half: e < 2 are the float32
    subnormals 2^-128, 2^-127), lo nibbles weights 0..15, hi nibbles 16..31. A power of two times a small integer:
    exact."""
    type_size = 17

    def values(self, k, n, blk):
        d = T.Bind(tirx.Broadcast(e8m0_half(k.w[n, blk * 17]), k.width // 4))
        v = k.w[n, ramp(blk * 17 + 1, 16)]
        idx = tirx.vectorcombine("uint8x32", v & _u8(15, 16), (v >> _u8(4, 16)) & _u8(15, 16))
        q = T.Bind(pshufb(tirx.reinterpret("int8x32", byte_vector(list(E2M1X2) * 2)), idx, 32))
        L = k.width // 4
        return [T.Bind(d * tirx.Cast(f"float32x{L}", tirx.Shuffle([q], list(range(i, i + L))))) for i in range(0, 32, L)]


class NVFP4(FloatFormat):
    """NVFP4 (36 B per 64): d u8[4] (ue4m3 per 16) | qs[32]; a float-path block is half of one (32 weights: two
    scale bytes, 16 quant bytes at 4 + 16h, h = blk % 2). Quant byte j of sub-block s holds weights 16s + j (low
    nibble) and 16s + 8 + j (high); w = ue4m3_half(d[s]) * E2M1X2[q]: exact (at most 4 + 4 significant bits)."""
    type_size = 18     # 36 B per 64 weights: the row bytes are the format's (kernel.py: K / 32 * 18)

    def values(self, k, n, blk):
        base, h = T.Bind(blk // 2 * 36), blk % 2
        v = k.w[n, ramp(base + 4 + h * 16, 16)]
        lo, hi = v & _u8(15, 16), (v >> _u8(4, 16)) & _u8(15, 16)
        idx = tirx.Shuffle([lo, hi], [*range(0, 8), *range(16, 24), *range(8, 16), *range(24, 32)])
        q = T.Bind(pshufb(tirx.reinterpret("int8x32", byte_vector(list(E2M1X2) * 2)), idx, 32))
        L = k.width // 4
        d = [T.Bind(tirx.Broadcast(ue4m3_half(k.w[n, base + h * 2 + s]), L)) for s in (0, 1)]
        return [T.Bind(d[i // 16] * tirx.Cast(f"float32x{L}", tirx.Shuffle([q], list(range(i, i + L)))))
                for i in range(0, 32, L)]


class Plain(FloatFormat):
    """Unquantized weights, widened as they are read: F16 (vcvtph2ps), BF16 (the float32's upper 16 bits), F32.
    The weight argument is the tensor itself ([N, K] of `arg_dtype`); a "block" is 32 elements."""

    def __init__(self, arg_dtype: str):
        self.arg_dtype = arg_dtype
        self.type_size = 32 * (4 if arg_dtype == "float32" else 2)

    def values(self, k, n, blk):
        L = k.width // 4
        base = n * (k.n_blocks * 32) + 32 * blk
        out = []
        for i in range(0, 32, L):
            if self.arg_dtype == "float16":
                v = tirx.Cast(f"float32x{L}", k.w16[ramp(base + i, L)])
            elif self.arg_dtype == "uint16":   # bfloat16 bits
                v = tirx.reinterpret(f"float32x{L}", tirx.Cast(f"uint32x{L}", k.w16u[ramp(base + i, L)]) << const(16, "uint32", L))
            else:
                v = k.w32f[ramp(base + i, L)]
            out.append(T.Bind(v))
        return out


BLOCK32_FORMATS = {"q8_0": Q80Int(), "iq4_nl": IQ4NLInt(), "mxfp4": MXFP4Int()}
INT_FORMATS = {"q4_k": Q4K(), "q5_k": Q5K(), "q6_k": Q6K(), "iq4_xs": IQ4XS(), **BLOCK32_FORMATS, **CODEBOOK_FORMATS}
# kinds in both: the float formats are the --exact-matmul path (float32 activation rows)
FLOAT_FORMATS = {"q8_0": Q80(), "iq4_nl": IQ4NL(), "mxfp4": MXFP4(), "f16": Plain("float16"), "bf16": Plain("uint16"),
                 "f32": Plain("float32"), "nvfp4": NVFP4()}


def format_of(kind: str, exact: bool = False):
    """The implementation of `kind`: integer (quantized activation rows) unless `exact` or it has none."""
    return INT_FORMATS[kind] if kind in INT_FORMATS and not (exact and kind in FLOAT_FORMATS) else FLOAT_FORMATS[kind]
