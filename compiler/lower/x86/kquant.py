"""The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) on "q8" activation rows, their quants taken unsigned: the formats
(how a (weight row, block) is decoded straight from ggml's block_q2_K .. block_q6_K bytes, ggml/src/ggml-common.h)
and their row loop: a weight row's blocks against a group of rows, u8 x s8 -> i16 pairs (pmaddubsw) then i16 x sub-block scale
-> i32 (pmaddwd), one int->float conversion and one FMA per term and block, rows two at a time through VNNI where
the quants allow (an odd row two weight rows at a time, in a register block of two). The same idea as ggml-cpu's
ggml_vec_dot_q4_K_q8_K and its siblings (ggml-cpu/arch/x86/quants.c)."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from .kernel import Format, RowPath, prefetch
from .vec import (PAIR_LANES, const, dot_packed, dot_pair, dot_u8s8, f16, fma, fold_packed, fold_pairs, hsum_pairwise,
                  madd, ramp, u8)


def _shr(v, by):
    """uint8 x 32 v >> by, `by` a Python int or an expression (a loop variable's: as a 16-bit shift by a
    register, vpsrlw, where AVX2 has no byte shift; each byte also takes bits of its neighbour, which the
    callers mask off)."""
    if isinstance(by, int):
        return v >> u8(by)
    w = tirx.reinterpret("uint16x16", v) >> tirx.Broadcast(tirx.Cast("uint16", by), 16)
    return tirx.reinterpret("uint8x32", w)



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
    return tirx.reinterpret(f"int16x{width // 2}", tirx.Shuffle([b16] + [u8(0, 16)] * (width // 16 - 1), idx))


def _shift_halves(v, a, b, left=False):
    """uint8 x 64 v with the bytes of its low 32 shifted by a and of its high 32 by b, as 16-bit shifts (one
    vpsrlvw / vpsllvw; AVX-512BW has no byte shifts): each byte also takes bits of its neighbour, which the
    callers mask off."""
    amounts = tirx.Shuffle([const(a, "uint16")] * 16 + [const(b, "uint16")] * 16, list(range(32)))
    w = tirx.reinterpret("uint16x32", v)
    return tirx.reinterpret("uint8x64", (w << amounts) if left else (w >> amounts))



class KQuantPath(RowPath):
    """`kquant_rows`: a register block of weight rows (Knobs.w_rows, 2 by default for the row-count kernels at 64
    bytes: x86.default_knobs) against a row group (a tile's rows share the activation pairs' terms,
    `tile_terms`), its float lanes per (weight row, activation row) `kquant_lanes`, K whole or in chunks of
    blocks. With two weight rows the row left over from the pairs goes beside itself across them (`kquant_rows`)."""
    multi_row = True
    w_rows_dense = 2

    def acc_lanes(self, kern, fmt):
        return [kquant_lanes(kern, fmt)]

    def tile_terms(self, kern, fmt, rows):
        return kquant_pair_terms(kern, fmt, rows)

    def rows(self, kern, fmt, ns, rows, outs, terms):
        n_l, R = kquant_lanes(kern, fmt), len(rows)
        acc = T.decl_buffer((len(ns) * R * n_l,), "float32")
        bases = [j * R * n_l for j in range(len(ns))]
        for b in bases:
            kquant_zero(kern, fmt, acc, b, R)
        kquant_rows(kern, fmt, ns, rows, acc, bases, pair_terms=terms)
        paired = kquant_paired(kern, fmt, R)
        for b, o in zip(bases, outs):
            for r, out in enumerate(o):
                T.buffer_store(kern.y, kquant_out(kern, fmt, acc, b, r, r < paired), out)

    def chunk_zero(self, kern, fmt, accs, nn, n_rows):
        kquant_zero(kern, fmt, accs[0], nn * n_rows * kquant_lanes(kern, fmt), n_rows)

    def chunk_pass(self, kern, fmt, nns, ns, rows, accs, chunk, terms, ahead):
        n_l = kquant_lanes(kern, fmt)
        kquant_rows(kern, fmt, ns, rows, accs[0], [nn * len(rows) * n_l for nn in nns], chunk, terms, ahead)

    def chunk_out(self, kern, fmt, accs, nn, r, n_rows):
        paired = kquant_paired(kern, fmt, n_rows)
        return kquant_out(kern, fmt, accs[0], nn * n_rows * kquant_lanes(kern, fmt), r, r < paired)


class KQuant(Format):
    """An unsigned K-quant on "q8" activation rows (`kquant_rows`): `setup` binds what a (row, block) shares across
    activation rows, `chunks` gives [(u8 quants x width, offset of their first activation in the block, i16
    scales, each constant over 16 bytes)], whose products weighted by their scales make the block sum (factor d),
    and `xs_term` the block's term on the row's 16-value sums. The factors must not depend on the row (they are
    taken once per block). `n_steps` > 0: the format also gives its chunks as a loop (`step_setup`,
    `step_chunks`: `_steps32`). `q_max`: the largest quant (`_pairs`); `xs_merged`: xs_term has no factor of its
    own."""
    path = KQuantPath()
    block = 256
    acts = "q8"
    n_steps = 0
    q_max: int
    xs_merged: bool


def _at(j):
    """The position in a "q8_q4k" block of sub-block 2j (j a Python int or a loop variable); 2j + 1's is 64 on
    (activation.Q4K_ORDER: per 128 values the sub-blocks 0, 2, 1, 3)."""
    return 128 * (j // 2) + 32 * (j % 2)


class Q4K(KQuant):
    """Q4_K (144 B): d f16 | dmin f16 | 12 B of 8 (6-bit scale, 6-bit min) | qs[128]: w = d*sc*q - dmin*m per
    32 weights; lo nibbles of qs[32j..32j+32) are sub-block 2j, hi nibbles 2j+1 (get_scale_min_k4). Its
    activation rows are "q8" rows in the order 64 bytes of qs unpack to ("q8_q4k", activation.Q4K_ORDER)."""
    type_size, qs_at, qh_at = 144, 16, None
    layout = "q8_q4k"
    q_max = 15          # the largest quant (kquant._pairs)
    xs_merged = False   # xs_term has a factor of its own

    def setup(self, kern, n, s):
        b = T.Bind(n * kern.row_bytes + s * self.type_size)
        # the 12 scale bytes as words u0 u1 u2 (after d, dmin) in one vector, the 4 words of
        # get_scale_min_k4's bytes by lanes: [u0 & m6, (u2 & m4) | ((u0 >> 6) & m2) << 4, u1 & m6, ...]
        hdr = T.Bind(kern.w32[ramp(b // 4, 4)])          # d | dmin, u0, u1, u2
        u32 = lambda *v: tirx.Shuffle([const(x, "uint32") for x in v], list(range(4)))   # noqa: E731
        lo = (tirx.Shuffle([hdr], [1, 3, 2, 3]) >> u32(0, 0, 0, 4)) & u32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F)
        hi = ((tirx.Shuffle([hdr], [0, 1, 0, 2]) >> u32(6, 6, 6, 6)) & u32(0, 0x03030303, 0, 0x03030303)) << u32(4, 4, 4, 4)
        sb = T.Bind(tirx.reinterpret("uint8x16", lo | hi))
        sm = T.Bind(tirx.Cast("int16x16", sb))
        dd = T.Bind(tirx.Cast("float32x8", tirx.reinterpret("float16x8", hdr)))     # d, dmin: one conversion
        d, dmin = T.Bind(tirx.Shuffle([dd], [0])), T.Bind(tirx.Shuffle([dd], [1]))
        return {"sm": sm, "sb": sb, "d": d, "dmin": dmin,
                "mins": T.Bind(tirx.Shuffle([sm], [8 + i // 2 for i in range(16)]))}   # min j over 2 x 16 sums

    def _quants(self, kern, n, s, j):
        v = T.Bind(kern.w[n, ramp(s * self.type_size + self.qs_at + 32 * j, 32)])
        lo, hi = v & u8(15), (v >> u8(4)) & u8(15)
        if self.qh_at is not None:     # Q5_K: bits 2j, 2j+1 of qh[l] are bit 4 of elements 64j + l, 64j + 32 + l
            qh = T.Bind(kern.w[n, ramp(s * self.type_size + self.qh_at, 32)])
            lo = lo | ((_shr(qh, 2 * j) & u8(1)) << u8(4))
            hi = hi | ((_shr(qh, 2 * j + 1) & u8(1)) << u8(4))
        return lo, hi

    def _quants64(self, kern, n, s, h):
        """(lo, hi): the quants of qs[64h .. 64h + 64) as two uint8 x 64, lo its low nibbles (sub-blocks 4h, 4h + 2)
        and hi its high ones (4h + 1, 4h + 3): the activation positions 128h and 128h + 64 of a "q8_q4k" row. One
        64-byte load, a mask, a 16-bit shift and a mask; Q5_K's bit 4 from qh's 32 bytes in both halves
        (`_shift_halves`)."""
        raw = T.Bind(kern.w[n, ramp(s * self.type_size + self.qs_at + 64 * h, 64)])
        hi16 = tirx.reinterpret("uint16x32", raw) >> const(4, "uint16", 32)
        lo, hi = raw & u8(15, 64), tirx.reinterpret("uint8x64", hi16) & u8(15, 64)
        if self.qh_at is not None:     # bit b of qh[l]: bit 4 of element l of sub-block b
            qh = T.Bind(kern.w[n, ramp(s * self.type_size + self.qh_at, 32)])
            qh2 = T.Bind(tirx.vectorcombine("uint8x64", qh, qh))
            lo = lo | ((_shift_halves(qh2, 4 * h, 4 * h + 2) & u8(1, 64)) << u8(4, 64))
            hi = hi | ((_shift_halves(qh2, 4 * h + 1, 4 * h + 3) & u8(1, 64)) << u8(4, 64))
        return lo, hi

    def chunks(self, kern, st, n, s):
        out = []
        if kern.width == 64:
            for h in range(2):
                lo, hi = self._quants64(kern, n, s, h)
                out.append((T.Bind(lo), 128 * h, T.Bind(_scales_u8(st["sb"], [4 * h, 4 * h + 2], 64))))
                out.append((T.Bind(hi), 128 * h + 64, T.Bind(_scales_u8(st["sb"], [4 * h + 1, 4 * h + 3], 64))))
            return out
        for j in range(4):
            lo, hi = self._quants(kern, n, s, j)
            out.append((T.Bind(lo), _at(j), T.Bind(_scales(st["sm"], [2 * j], 32))))
            out.append((T.Bind(hi), _at(j) + 64, T.Bind(_scales(st["sm"], [2 * j + 1], 32))))
        return out

    n_steps = 4         # kquant._steps32: sub-blocks 2j, 2j + 1 per step

    def step_setup(self, kern, st):
        """The block's scales in a local buffer, which `step_chunks` indexes by the loop variable."""
        st["sbuf"] = T.decl_buffer((16,), "int16")
        T.buffer_store(st["sbuf"], st["sm"], [ramp(0, 16)])

    def step_chunks(self, kern, st, n, s, j):
        """The two chunks of `chunks` (32 bytes) that step j, a loop variable, takes: sub-blocks 2j, 2j + 1."""
        lo, hi = self._quants(kern, n, s, j)
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


class Q6K(KQuant):
    """Q6_K (210 B): ql[128] | qh[64] | 16 int8 scales | d f16: w = d*sc*(q - 32) per 16 weights. The -32 is one
    correction per block: -32 d sum_g sc_g (sum of the 16 activations of g)."""
    type_size = 210
    q_max = 63
    xs_merged = True

    def setup(self, kern, n, s):
        b = T.Bind(n * kern.row_bytes + s * 210)
        return {"sc": T.Bind(tirx.Cast("int16x16", kern.w8[ramp(b + 192, 16)])),
                "d": T.Bind(f16(kern.w16, b // 2 + 104))}

    def chunks(self, kern, st, n, s):
        if kern.width == 64:
            return self._chunks64(kern, st, n, s)
        out = []
        for h in range(2):      # halves of 128 weights: ql[64h, 64h + 64), qh[32h, 32h + 32)
            q = self._half32(kern, n, s, h)
            g = 8 * h
            for i in range(4):
                out.append((T.Bind(q[i]), 128 * h + 32 * i, T.Bind(_scales(st["sc"], [g + 2 * i, g + 2 * i + 1], 32))))
        return out

    def _half32(self, kern, n, s, h):
        """The quants of weights 128h + [32i, 32i + 32), i = 0..3, as uint8 x 32 (h a Python int or a loop
        variable): ql[64h, 64h + 64) lo then hi nibbles | qh[32h, 32h + 32) bits (0, 1) .. (6, 7) as bits 4, 5."""
        ql0 = T.Bind(kern.w[n, ramp(s * 210 + 64 * h, 32)])
        ql1 = T.Bind(kern.w[n, ramp(s * 210 + 64 * h + 32, 32)])
        qh = T.Bind(kern.w[n, ramp(s * 210 + 128 + 32 * h, 32)])
        return [(ql0 & u8(15)) | ((qh & u8(3)) << u8(4)),                   # weights 128h + [0, 32)
                (ql1 & u8(15)) | (((qh >> u8(2)) & u8(3)) << u8(4)),       # [32, 64)
                (ql0 >> u8(4)) | (((qh >> u8(4)) & u8(3)) << u8(4)),       # [64, 96)
                (ql1 >> u8(4)) | ((qh >> u8(6)) << u8(4))]                  # [96, 128)

    def _chunks64(self, kern, st, n, s):
        """`chunks` at 64 bytes: per half h, weights 128h + [0, 64) are ql's lo nibbles | qh bits (0, 1) and (2, 3)
        as bits 4, 5, weights 128h + [64, 128) ql's hi nibbles | qh bits (4, 5) and (6, 7), each as one vector:
        ql's 64 bytes and qh's 32 in both halves (`_shift_halves`), no insert of two halves."""
        out = []
        for h in range(2):
            ql = T.Bind(kern.w[n, ramp(s * 210 + 64 * h, 64)])
            qh = T.Bind(kern.w[n, ramp(s * 210 + 128 + 32 * h, 32)])
            qh2 = tirx.vectorcombine("uint8x64", qh, qh)
            q01 = (ql & u8(15, 64)) | (_shift_halves(qh2, 4, 2, left=True) & u8(0x30, 64))
            q23 = (_shift_halves(ql, 4, 4) & u8(15, 64)) | (_shift_halves(qh2, 0, 2) & u8(0x30, 64))
            g = 8 * h
            for i, q in enumerate((q01, q23)):
                out.append((T.Bind(q), 128 * h + 64 * i, T.Bind(_scales(st["sc"], [g + 4 * i + m for m in range(4)], 64))))
        return out

    # kquant._steps32 (AVX2, several rows): a half of 128 weights per step (4 chunks; 2 chunks per step ran
    # slower, 0.85-0.92x of unrolled). Unrolled, LLVM spilled the block's 8 decoded and 8 scale vectors and
    # reloaded them per row (per block 24 stack accesses at 2 rows, 60 at 4); as steps, 2-8 rows ran 1.10-1.24x
    # faster on a Zen AVX2 VM (bench/x86_rows.py --against, q6k_l3 and lm_head)
    n_steps = 2

    def step_setup(self, kern, st):
        """The block's 16 scales in a local buffer, which `step_chunks` indexes by the loop variable."""
        st["sbuf"] = T.decl_buffer((16,), "int16")
        T.buffer_store(st["sbuf"], st["sc"], [ramp(0, 16)])

    def step_chunks(self, kern, st, n, s, h):
        """The four chunks of `chunks` (32 bytes) that step h, a loop variable, takes: half h's (`_half32`)."""
        q = self._half32(kern, n, s, h)
        sc8 = T.Bind(st["sbuf"][ramp(8 * h, 8)])
        return [(T.Bind(q[i]), 128 * h + 32 * i, T.Bind(_scales(sc8, [2 * i, 2 * i + 1], 32))) for i in range(4)]

    def xs_term(self, st):
        """The -32 of every quant, -32 sum_g sc_g (sum of the 16 activations of g): an integer with the block sum's
        factor d, so it joins the block sum before the conversion (None: no factor of its own). |32 sc| <= 4096."""
        return T.Bind(st["sc"] * const(-32, "int16", 16)), None



class Q2K(KQuant):
    """Q2_K (84 B): scales[16] (per 16 weights: the scale in the low nibble, the min in the high) | qs[64] | d f16 |
    dmin f16: w = d sc q - dmin m, q = bits 2j, 2j + 1 of qs[32h + l] for weight 128h + 32j + l (ggml
    dequantize_row_q2_K), so the quants of 32 weights are one shift and mask of 32 bytes, in element order ("q8"
    rows as they are). The mins are a term with a factor of its own, -dmin sum_g m_g (sum of the 16 activations
    of g), as ggml_vec_dot_q2_K_q8_K takes them from the row's bsums."""
    type_size = 84
    q_max = 3
    xs_merged = False

    def setup(self, kern, n, s):
        b = T.Bind(n * kern.row_bytes + s * 84)
        sb = T.Bind(kern.w[n, ramp(s * 84, 16)])
        return {"sm": T.Bind(tirx.Cast("int16x16", sb & u8(15, 16))),
                "mins": T.Bind(tirx.Cast("int16x16", sb >> u8(4, 16))),
                "d": T.Bind(f16(kern.w16, b // 2 + 40)), "dmin": T.Bind(f16(kern.w16, b // 2 + 41))}

    def low_bits(self, kern, n, s, at, h):
        """[(uint8 quants of `width` bytes: the 2 bits at `at` + 32h of weights 128h + 32j .., j)] per vector."""
        qs = T.Bind(kern.w[n, ramp(s * self.type_size + at + 32 * h, 32)])
        if kern.width == 32:
            return [((qs >> u8(2 * j)) & u8(3), j) for j in range(4)]
        qs2 = T.Bind(tirx.vectorcombine("uint8x64", qs, qs))
        return [(_shift_halves(qs2, 2 * j, 2 * j + 2) & u8(3, 64), j) for j in (0, 2)]

    def chunks(self, kern, st, n, s):
        out = []
        per = kern.width // 16      # groups of 16 weights per vector
        for h in range(2):
            for q, j in self.low_bits(kern, n, s, 16, h):
                g = 8 * h + 2 * j
                out.append((T.Bind(q), 128 * h + 32 * j, T.Bind(_scales(st["sm"], list(range(g, g + per)),
                                                                        kern.width))))
        return out

    def xs_term(self, st):
        return st["mins"], -st["dmin"]


class Q3K(Q2K):
    """Q3_K (110 B): hmask[32] | qs[64] | scales[12] (16 6-bit scales, ggml's kmask1 / kmask2 packing) | d f16:
    w = d (sc - 32) q, q = (Q2_K's 2 bits of qs) - 4 where bit 4h + j of hmask[l] is clear, weight 128h + 32j + l
    (dequantize_row_q3_K). The quants go as u = q + 4 in 0..7 (the hmask bit as bit 2); the -4 is one correction
    per block, -4 d sum_g (sc_g - 32) (sum of the 16 activations of g), an integer with the block sum's factor d
    (as Q6_K's -32; ggml_vec_dot_q3_K_q8_K subtracts it per weight instead)."""
    type_size = 110
    q_max = 7
    xs_merged = True

    def setup(self, kern, n, s):
        b = T.Bind(n * kern.row_bytes + s * 110)
        # the 12 scale bytes as words u0 u1 u2 (blocks are 2-byte aligned: three pairs of u16), then as in ggml:
        # byte i of [(u0 & m4) | (u2 & m2) << 4, (u1 & m4) | (u2 >> 2 & m2) << 4, (u0 >> 4 & m4) | (u2 >> 4 & m2)
        # << 4, (u1 >> 4 & m4) | (u2 >> 6 & m2) << 4] is 6-bit scale 4w + i
        w16 = kern.w16u[ramp((b + 96) // 2, 6)]
        u = T.Bind(tirx.reinterpret("uint32x4", tirx.Shuffle([w16, const(0, "uint16", 2)], list(range(8)))))
        u32 = lambda *v: tirx.Shuffle([const(x, "uint32") for x in v], list(range(4)))   # noqa: E731
        lo = (tirx.Shuffle([u], [0, 1, 0, 1]) >> u32(0, 0, 4, 4)) & u32(*[0x0F0F0F0F] * 4)
        hi = ((tirx.Shuffle([u], [2, 2, 2, 2]) >> u32(0, 2, 4, 6)) & u32(*[0x03030303] * 4)) << u32(4, 4, 4, 4)
        sc = tirx.Cast("int16x16", tirx.reinterpret("uint8x16", lo | hi)) - const(32, "int16", 16)
        return {"sm": T.Bind(sc), "d": T.Bind(f16(kern.w16, b // 2 + 54))}

    def chunks(self, kern, st, n, s):
        out = []
        per = kern.width // 16
        hm = T.Bind(kern.w[n, ramp(s * 110, 32)])
        hm2 = T.Bind(tirx.vectorcombine("uint8x64", hm, hm)) if kern.width == 64 else None
        for h in range(2):
            for q, j in self.low_bits(kern, n, s, 32, h):
                if kern.width == 32:
                    hb = (hm >> u8(4 * h + j)) & u8(1)
                else:
                    hb = _shift_halves(hm2, 4 * h + j, 4 * h + j + 1) & u8(1, 64)
                g = 8 * h + 2 * j
                out.append((T.Bind(q | (hb << u8(2, kern.width))), 128 * h + 32 * j,
                            T.Bind(_scales(st["sm"], list(range(g, g + per)), kern.width))))
        return out

    def xs_term(self, st):
        """-4 (sc - 32) per 16 activations, joining the block sum (None: no factor of its own); |4 (sc - 32)| <= 128."""
        return T.Bind(st["sm"] * const(-4, "int16", 16)), None


def _pairs(kern, fmt) -> bool:
    """Rows two at a time through vec.dot_pair (`kquant_rows`): VNNI at 64 bytes and quants of at most
    `fmt.q_max` (a sum of 4 products with int8 activations below 2^15)."""
    return kern.vnni and kern.width == 64 and 4 * fmt.q_max * 127 < 1 << 15


def kquant_lanes(kern, fmt) -> int:
    """Float accumulator lanes per row of `kquant_rows`: 8 (block sum and xs term in one integer, or at 32-byte
    width in one vector of their lanes added pairwise: `_hadd`), else 8 + 8."""
    return 8 if fmt.xs_merged or kern.width == 32 else 16


def kquant_paired(kern, fmt, n_rows: int) -> int:
    """How many of a group's rows `kquant_rows` takes in pairs (the first ones)."""
    return 2 * (n_rows // 2) if _pairs(kern, fmt) else 0


def kquant_zero(kern, fmt, acc, base, n_rows):
    """Zeroed accumulators for `kquant_rows`, stored as they are read (so they stay in registers)."""
    n_l, paired = kquant_lanes(kern, fmt), kquant_paired(kern, fmt, n_rows)
    units = [(r * n_l + 16 * j, 16) for r in range(0, paired, 2) for j in range(n_l // 8)]
    for off, m in units + [(r * n_l, n_l) for r in range(paired, n_rows)]:
        T.buffer_store(acc, const(0.0, "float32", m), [ramp(base + off, m)])


def kquant_rows(kern, fmt, ns, rows, acc, bases, blocks=None, pair_terms=None, ahead=None):
    """Weight rows `ns` (one, or a register block of Knobs.w_rows: tiles.py) against "q8" activation rows `rows`
    for the unsigned K-quants. Per block (of `blocks`, a (first, end) range; all by default), weight row and
    activation row: the block sum's 8 int32 lanes (`dot_u8s8` folded to 8, or `dot_pair` for two rows at once:
    the same lanes) and the xs term's 8 (`fmt.xs_term`: weights of the row's 16-value sums, pmaddwd), then per
    lane one FMA of float(int) by (d x the row's scale): the xs term joins the block sum's integers when it has
    no factor of its own (Q6_K's -32), else it has 8 lanes of its own with its factor (Q4_K's -dmin). A pair
    keeps its two rows' lanes interleaved (vec.PAIR_LANES) in one 16-lane vector per term, so a block costs it
    one conversion and one FMA per term, no shuffles; a row alone has the same lanes in order, so its bits are
    the same. Where the rows are odd and two weight rows share the block, the last row goes as a cross pair:
    one row against both weight rows' vectors (`dot_packed`, weight row i in lanes PAIR_LANES[i]), the same
    integers, then each weight row's lanes moved into a row alone's order before its FMA: a third row costs
    what a pair's row costs, not a `dot_u8s8` of its own per weight row. At 32-byte width (AVX2) a group's block
    sums go through `_steps32` and each row's end of block through `_rows32`. acc: float32 buffer, the lanes of
    weight row ns[j] and activation row r (`kquant_lanes`) at bases[j] + r * lanes (a pair's two rows side by
    side; a cross pair's as a row alone's). `pair_terms`: the pairs' activation terms of every block, computed
    once for all the weight rows of a tile (`kquant_pair_terms`; None: computed here). `ahead`: the prefetch
    distance in bytes (kernel.prefetch)."""
    L = kern.width // 4
    n_l = kquant_lanes(kern, fmt)
    n_pairs = kquant_paired(kern, fmt, len(rows)) // 2
    # cross pairs: weight rows (2c, 2c + 1) against the last row where pairs leave one
    n_cross = len(ns) // 2 if _pairs(kern, fmt) and len(rows) % 2 else 0
    if len(ns) > 1 and not n_cross:
        # without a row left over, each weight row on its own, as with one weight row per block: a prefill group's
        # 8 rows of sums for two weight rows at once would not fit the 32 vector registers
        for n, base in zip(ns, bases):
            kquant_rows(kern, fmt, [n], rows, acc, [base], blocks, pair_terms, ahead)
        return
    shared = len(ns) > 1
    with T.serial(*(blocks or (0, kern.n_blocks))) as s:
        sts = []
        for n in ns:
            prefetch(kern, n, s * fmt.type_size, fmt.type_size, ahead)
            sts.append(fmt.setup(kern, n, s))
        # the activation rows each weight row takes alone (after its pairs; none for a cross pair's)
        alone = [[] if j < 2 * n_cross else list(range(2 * n_pairs, len(rows))) for j in range(len(ns))]
        packed = [False] * len(ns)
        if kern.width == 32 and len(rows) > 1 and fmt.n_steps:
            sums = [_steps32(kern, fmt, st, n, s, rows) for st, n in zip(sts, ns)]
        else:
            chunks = [fmt.chunks(kern, st, n, s) for st, n in zip(sts, ns)]
            sums = [[None for _ in rows] for _ in ns]
            cross = [None] * n_cross
            # a row alone (the one-row decode kernel, a group of 1) takes the block's chunks two at a time where
            # VNNI pairs rows (vec.dot_packed: 6 multiplies for 4 chunks, not 8, half the scale vectors), folded
            # to the same integer lanes; beside a pair it was slower (bench/x86_rows.py, 3 rows)
            for j, n in enumerate(ns):
                packed[j] = _pairs(kern, fmt) and len(rows) == 1 and bool(alone[j]) and len(chunks[j]) % 2 == 0
                if packed[j]:
                    x = lambda off: kern.xq[rows[0], ramp(fmt.block * s + off, 64)]   # noqa: E731
                    for (wa, oa, sa), (wb, ob, sb) in zip(chunks[j][0::2], chunks[j][1::2]):
                        sums[j][0] = dot_packed(sums[j][0], (wa, x(oa), sa), (wb, x(ob), sb))
            for k in range(len(chunks[0])):
                off = chunks[0][k][1]
                xs = [kern.xq[t, ramp(fmt.block * s + off, kern.width)] for t in rows]
                if shared:      # loaded once for the register block's weight rows
                    xs = [T.Bind(x) for x in xs]
                for j in range(len(ns)):
                    if packed[j]:
                        continue
                    w, _, scv = chunks[j][k]
                    for p in range(n_pairs):
                        sums[j][2 * p] = dot_pair(sums[j][2 * p], w, xs[2 * p], xs[2 * p + 1], scv)
                    for i in alone[j]:
                        sums[j][i] = dot_u8s8(sums[j][i], w, xs[i], kern.width, scv, kern.vnni)
                for c in range(n_cross):
                    (wa, _, sa), (wb, _, sb) = chunks[2 * c][k], chunks[2 * c + 1][k]
                    cross[c] = dot_packed(cross[c], (wa, xs[-1], sa), (wb, xs[-1], sb))
        terms = [fmt.xs_term(st) for st in sts]
        xsum = [kern.xs[t, ramp(16 * s, 16)] for t in rows]
        for j, ((v16, f2), st, base) in enumerate(zip(terms, sts, bases)):
            d = st["d"]
            if n_pairs:
                v32 = T.Bind(tirx.Shuffle([v16, v16], [4 * c + i for c in range(4) for _ in range(2)
                                                       for i in range(4)]))
            for p in range(n_pairs):
                if pair_terms is None:
                    xsp, xdp = _pair_terms(kern, rows[2 * p], rows[2 * p + 1], s)
                else:
                    xsp, xdp = pair_terms.load(s, p)
                xt = madd(xsp, v32, 64)
                at = base + 2 * p * n_l
                main = sums[j][2 * p] if f2 is not None else sums[j][2 * p] + xt
                T.buffer_store(acc, fma(tirx.Broadcast(d, 16) * xdp, tirx.Cast("float32x16", main),
                                        acc[ramp(at, 16)]), [ramp(at, 16)])
                if f2 is not None:
                    T.buffer_store(acc, fma(tirx.Broadcast(f2, 16) * xdp, tirx.Cast("float32x16", xt),
                                            acc[ramp(at + 16, 16)]), [ramp(at + 16, 16)])
            if kern.width == 32:       # (no pairs: they take VNNI at 64 bytes)
                _rows32(kern, rows, sums[j], xsum, v16, d, f2, acc, base, s)
                continue
            for i in alone[j]:
                _alone_end(kern, fmt, sums[j][i], packed[j], madd(v16, xsum[i], 32), d, f2,
                           tirx.Broadcast(kern.xd[rows[i], s], n_l), acc, base + i * n_l, L)
        for c in range(n_cross):
            _cross_end(kern, fmt, cross[c], terms[2 * c:2 * c + 2], sts[2 * c:2 * c + 2], bases[2 * c:2 * c + 2],
                       rows[-1], len(rows) - 1, acc, s)


def _alone_end(kern, fmt, isum, packed, xt, d, f2, xd, acc, at, L):
    """The end of block s for a row alone: its block sum `isum` (dot_u8s8 lanes, or dot_packed's where `packed`)
    and xs term `xt` (int32 x 8) into its `kquant_lanes` accumulator at acc[at]."""
    n_l = kquant_lanes(kern, fmt)
    if f2 is None:
        main = fold_packed(isum) if packed else fold_pairs(isum, L, 8)
        fac, iv = tirx.Broadcast(d, 8) * xd, main + xt
    else:   # the block sum's lanes and the xs term's side by side as a pair keeps two rows (SPLIT)
        fac = pair_lanes(tirx.Broadcast(d, 16), tirx.Broadcast(f2, 16)) * xd
        if packed:      # dot_packed's lanes m, m + 2 added in place (vpshufd, vpaddd), one shuffle
            p2 = isum + tirx.Shuffle([isum], [j - j % 4 + (j + 2) % 4 for j in range(16)])
            iv = tirx.Shuffle([p2, xt], [j if j in PAIR_LANES[0] else 16 + SPLIT_INV[j] - 8 for j in range(16)])
        else:
            iv = tirx.Shuffle([fold_pairs(isum, L, 8), xt], SPLIT_INV)
    T.buffer_store(acc, fma(fac, tirx.Cast(f"float32x{n_l}", iv), acc[ramp(at, n_l)]), [ramp(at, n_l)])


def _cross_end(kern, fmt, isum, terms, sts, bases, t, r, acc, s):
    """The end of block s for activation row t (the group's row r) against two weight rows as a cross pair:
    `isum`, dot_packed's lanes (weight row i's block sum in PAIR_LANES[i]); the xs terms of both weight rows by
    one pmaddwd of the row's 16-value sums (twice) against both rows' weights, the same lanes; then per weight
    row its lanes in a row alone's order (`_alone_end`'s: the same integers, the same factors, one FMA), into
    acc at bases[i] + r * lanes."""
    n_l = kquant_lanes(kern, fmt)
    (va, f2a), (vb, f2b) = terms
    inter = [4 * c + i + 16 * h for c in range(4) for h in range(2) for i in range(4)]
    xs = kern.xs[t, ramp(16 * s, 16)]
    xt = madd(tirx.Shuffle([xs, xs], inter), tirx.Shuffle([va, vb], inter), 64)
    xd = kern.xd[t, s]
    for i, (st, f2, base) in enumerate(zip(sts, (f2a, f2b), bases)):
        lanes = PAIR_LANES[i]
        if f2 is None:
            iv = tirx.Shuffle([isum + xt], lanes)
            fac = tirx.Broadcast(st["d"], 8) * tirx.Broadcast(xd, 8)
        else:
            idx = [0] * 16
            for m in range(8):
                idx[PAIR_LANES[0][m]], idx[PAIR_LANES[1][m]] = lanes[m], 16 + lanes[m]
            iv = tirx.Shuffle([isum, xt], idx)
            fac = pair_lanes(tirx.Broadcast(st["d"], 16), tirx.Broadcast(f2, 16)) * tirx.Broadcast(xd, 16)
        at = base + r * n_l
        T.buffer_store(acc, fma(fac, tirx.Cast(f"float32x{n_l}", iv), acc[ramp(at, n_l)]), [ramp(at, n_l)])


# A row alone with kquant_lanes 16 (the block sum's 8 lanes and the xs term's 8 with a factor of its own, at 64
# bytes) keeps them as a pair keeps its two rows: lane j of the block sum in PAIR_LANES[0][j], of the xs term in
# PAIR_LANES[1][j] (then dot_packed's sums need no fold across 128-bit lanes); SPLIT_INV[p]: the lane of
# concat([block sum, xs term]) at position p, SPLIT: the position of each such lane (kquant_out)
SPLIT = PAIR_LANES[0] + PAIR_LANES[1]
SPLIT_INV = [SPLIT.index(p) for p in range(16)]


def pair_lanes(a, b):
    """The 16-lane vector with a's lanes PAIR_LANES[0] and b's lanes PAIR_LANES[1] (a pair's two rows, or a row
    alone's block sum and xs term: SPLIT)."""
    return tirx.Shuffle([a, b], [p if p in PAIR_LANES[0] else 16 + p for p in range(16)])


def _steps32(kern, fmt, st, n, s, rows):
    """Block s's int32 x 8 sums of several `rows` at 32-byte width (AVX2: 16 vector registers), as a loop over
    the format's steps (`fmt.step_chunks`: two or four chunks each) with the rows' sums carried in registers: one step's
    vectors live at a time, each used by every row. Unrolled, LLVM computed one row's block sum after the other
    with the whole block's decoded vectors spilled and reloaded per row (slower at 3-8 rows,
    bench/x86_rows.py --against). Integer sums: the same lanes as `chunks` in any order."""
    buf = T.decl_buffer((len(rows) * 8,), "int32")
    for i in range(len(rows)):
        T.buffer_store(buf, const(0, "int32", 8), [ramp(8 * i, 8)])
    fmt.step_setup(kern, st)
    # the trip count + 0 where LLVM cannot see it is 0 (a row's scale is never negative): a loop of known trip
    # count it unrolls, and then evaluates each row's sums whole, every step's vectors live at once (spilled)
    zero = tirx.Cast("int32", kern.xd[rows[0], s] < const(0.0, "float32"))
    with T.serial(0, fmt.n_steps + zero) as j:
        for w, off, scv in fmt.step_chunks(kern, st, n, s, j):
            for i, t in enumerate(rows):
                T.buffer_store(buf, dot_u8s8(buf[ramp(8 * i, 8)], w, kern.xq[t, ramp(fmt.block * s + off, 32)], 32, scv,
                                             kern.vnni), [ramp(8 * i, 8)])
    return [buf[ramp(8 * i, 8)] for i in range(len(rows))]


def _rows32(kern, rows, sums, xsum, v16, d, f2, acc, base, s):
    """The end of a block for each row at 32-byte width (AVX2 has 16 vector registers: one 8-lane float
    accumulator per row, and the fewest instructions per row): the xs term (pmaddwd), then with no factor of
    its own added to the block sum, else both horizontally added pairwise into one vector (vphaddd: lanes 0, 1,
    4, 5 the block sum's, 2, 3, 6, 7 the xs term's), one conversion, one FMA by the lanes' factors x the row's
    scale."""
    fac = tirx.Broadcast(d, 8) if f2 is None else T.Bind(tirx.Shuffle(
        [tirx.Broadcast(d, 4), tirx.Broadcast(f2, 4)], [0, 1, 4, 5, 2, 3, 6, 7]))
    for i, t in enumerate(rows):
        xt = madd(v16, xsum[i], 32)
        iv = sums[i] + xt if f2 is None else _hadd(sums[i], xt)
        at = base + i * 8
        T.buffer_store(acc, fma(fac * tirx.Broadcast(kern.xd[t, s], 8), tirx.Cast("float32x8", iv), acc[ramp(at, 8)]),
                       [ramp(at, 8)])


def _hadd(a, b):
    """int32 x 8 a, b added pairwise within each 128-bit half: [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, ...] (vphaddd)."""
    return tirx.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.phadd.d", a, b)


def _pair_terms(kern, a, b, s):
    """What rows a, b add to a pair's block s whatever the weight row: (i16 x 32: row a's 16-value sums 4c..4c+3,
    then row b's, per quadword c, so that pmaddwd with the block's xs weights puts row r's groups 2j, 2j+1 in
    lane PAIR_LANES[r][j], as `madd` of one row puts them in lane j; f32 x 16: each lane's row scale xd)."""
    inter = [4 * c + i + 16 * r for c in range(4) for r in range(2) for i in range(4)]
    xsp = tirx.Shuffle([kern.xs[a, ramp(16 * s, 16)], kern.xs[b, ramp(16 * s, 16)]], inter)
    return xsp, pair_lanes(tirx.Broadcast(kern.xd[a, s], 16), tirx.Broadcast(kern.xd[b, s], 16))


class PairTerms:
    """`_pair_terms` of a group's pairs for every block, in a local buffer (block-major): shuffled once per
    tile instead of once per weight row (the same values, loaded)."""

    def __init__(self, kern, n_pairs):
        self.n_pairs = n_pairs
        self.xsp = T.decl_buffer((kern.n_blocks * n_pairs * 32,), "int16")
        self.xdp = T.decl_buffer((kern.n_blocks * n_pairs * 16,), "float32")

    def load(self, s, p):
        at = s * self.n_pairs + p
        return self.xsp[ramp(at * 32, 32)], self.xdp[ramp(at * 16, 16)]


def kquant_pair_terms(kern, fmt, rows):
    """The PairTerms of activation rows `rows` (a group) for `kquant_rows`, or None where it takes no pairs."""
    n_pairs = kquant_paired(kern, fmt, len(rows)) // 2
    if not n_pairs:
        return None
    pt = PairTerms(kern, n_pairs)
    with T.serial(0, kern.n_blocks) as s:
        for p in range(n_pairs):
            xsp, xdp = _pair_terms(kern, rows[2 * p], rows[2 * p + 1], s)
            at = s * n_pairs + p
            T.buffer_store(pt.xsp, xsp, [ramp(at * 32, 32)])
            T.buffer_store(pt.xdp, xdp, [ramp(at * 16, 16)])
    return pt


def kquant_out(kern, fmt, acc, base, r, paired):
    """Row r's result from `kquant_rows`' accumulators: its lanes summed pairwise (taken from the pair's
    interleaved vectors when `paired`)."""
    n_l = kquant_lanes(kern, fmt)
    if not paired:
        v = acc[ramp(base + r * n_l, n_l)]
        return hsum_pairwise(v if n_l == 8 else tirx.Shuffle([v], SPLIT), n_l)
    at, lanes = base + (r - r % 2) * n_l, PAIR_LANES[r % 2]
    vs = [acc[ramp(at + 16 * j, 16)] for j in range(n_l // 8)]
    return hsum_pairwise(tirx.Shuffle(vs, [16 * j + l for j in range(n_l // 8) for l in lanes]), n_l)
