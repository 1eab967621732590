"""The 32-weight block formats on the integer path (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) against "q8_0_g8"
activation rows: each full group of 8 blocks as IQ4_XS takes a block (lanes.py: one vpdpbusd per 64 bytes and
row, one FMA per group), the blocks after the last group one at a time (ggml-cpu's ggml_vec_dot_q8_0_q8_0 /
ggml_vec_dot_q4_0_q8_0 / ggml_vec_dot_q5_0_q8_0 / ggml_vec_dot_iq4_nl_q8_0 / ggml_vec_dot_mxfp4_q8_0 on x86: an
exact int32 sum per block, one FMA by d_w x d_x). Q4_1 and Q5_1 (w = d q + m) add m x d_x x (the activation
block's exact int sum: the group's lane sums from the row's xc, per single block one more dot product), one more
FMA per group or block, as ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q5_1_q8_1 add m x s (block_q8_1's s = d Σ q)."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from nextn.compiler.quant.mxfp4 import E2M1X2, e8m0_half

from .kernel import Format, RowPath, prefetch, zeroed_accs
from .lanes import KVALUES, LANE_ACC, LANE_BLOCK, _lane_fmas, lane_vectors
from .vec import abs_i8, byte_vector, const, dot_u8s8, f16, fma, hsum_pairwise, pshufb, ramp, sign, u8

LANE_MIN = -1.0 / 128    # xc = -128 x a lane's sum of q: m x this x xc = m x the sum (exact: a power of two)


def _nibbles(v, per):
    """uint8 x 16*per bytes of `per` 4-bit blocks (byte l: element l low, 16 + l high) -> uint8 x 32*per indices in
    element order: one mask and one shift over all of v, then 16-byte lanes [lo_0, hi_0, lo_1, hi_1] (one
    shuffle of 128-bit lanes)."""
    lo, hi = v & u8(15, 16 * per), (v >> u8(4, 16 * per)) & u8(15, 16 * per)
    if per == 1:
        return tirx.vectorcombine("uint8x32", lo, hi)
    idx = [j for p in range(per) for j in list(range(16 * p, 16 * p + 16)) + list(range(16 * per + 16 * p, 16 * per + 16 * p + 16))]
    return tirx.Shuffle([lo, hi], idx)


def _high_bits(qh, per):
    """uint8 x 4*per, the qh words of `per` Q5 blocks (bit j: element j's bit 4, ggml block_q5_0) -> uint8 x 32*per
    in element order: 16 where the bit is set, else 0 (ggml's bytes_from_bits_32: each qh byte spread over 8
    bytes, one bit tested in each)."""
    lanes, period = 32 * per, 4 * per
    # the words broadcast (one qword or dword load), then a byte shuffle within each 16-byte lane (vpshufb)
    rep = tirx.reinterpret(f"uint8x{lanes}", tirx.Broadcast(tirx.reinterpret(f"uint{8 * period}", qh),
                                                             lanes // period))
    spread = tirx.Shuffle([rep], [i // period * period + 4 * (i // 32) + i % 32 // 8 for i in range(lanes)])
    bit = byte_vector([1 << (j % 8) for j in range(32)] * per)
    return tirx.Select((spread & bit) != u8(0, lanes), u8(16, lanes), u8(0, lanes))


def _qword_groups(pairs, vnni, width):
    """The four vectors of 64 quants of a group of 8 blocks in activation.IQ4XS_ORDER from `pairs`, four int8 x 64
    (or uint8) in element order, pair i holding block i in bytes 0..31 and block 4 + i in 32..63: vector c holds
    qword c of every block, qword 2i + h of it from block 4h + i. Two permutes of two pairs give the low halves
    of two outputs, one more joins halves. VNNI: q + 128 (u8; the row's xc takes the 128 back off), else (|q| as
    u8, q < 0), at 32-byte width (|q| as u8, q): each row's x takes q's sign by one vpsignb (lanes._lane_sums),
    not a compare here and a conditional negate per row (Q8_0 verify rows 1.0-1.1x faster, docs/performance.md)."""
    u64 = lambda v: tirx.reinterpret("uint64x8", v)   # noqa: E731
    pairs = [T.Bind(u64(p)) for p in pairs]
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
            out.append(T.Bind(tirx.reinterpret("uint8x64", q) ^ u8(128, 64)))
        else:
            qb = T.Bind(q)
            out.append((T.Bind(tirx.reinterpret("uint8x64", abs_i8(qb, 64))),
                        qb if width == 32 else qb < const(0, "int8", 64)))
    return out


class Block32Path(RowPath):
    """`group_rows` over the full groups of 8 blocks (K whole or in chunks of groups) into 16 float lanes per
    (weight row, activation row), then `single_rows` over the blocks after them into 8 more; y = the two sums.
    Register blocks of Knobs.w_rows weight rows; exact int32 lane sums per group at either width (the same bits)."""
    multi_row = True
    bit_knobs = ()
    unit_blocks = 8

    def acc_lanes(self, kern, fmt):
        return [LANE_ACC, 8]     # the groups' lane sums (at either width), the blocks after them

    def rows(self, kern, fmt, ns, rows, outs, terms):
        lanes = self.acc_lanes(kern, fmt)
        accs = zeroed_accs(ns, rows, lanes)
        group_rows(kern, fmt, ns, rows, [[(acc[0], 0) for acc in per] for per in accs])
        single_rows(kern, fmt, ns, rows, [[(acc[1], 0) for acc in per] for per in accs])
        for per, o in zip(accs, outs):
            for acc, out in zip(per, o):
                T.buffer_store(kern.y, hsum_pairwise(acc[0][ramp(0, lanes[0])], lanes[0]) +
                               hsum_pairwise(acc[1][ramp(0, lanes[1])], lanes[1]), out)

    def chunk_accs(self, kern, fmt, tile_n, n_rows):
        return [T.decl_buffer((tile_n * n_rows * LANE_ACC,), "float32"),
                T.decl_buffer((tile_n * n_rows * 8,), "float32")]

    def chunk_zero(self, kern, fmt, accs, nn, n_rows):
        for r in range(n_rows):
            T.buffer_store(accs[0], const(0.0, "float32", LANE_ACC), [ramp((nn * n_rows + r) * LANE_ACC, LANE_ACC)])
            T.buffer_store(accs[1], const(0.0, "float32", 8), [ramp((nn * n_rows + r) * 8, 8)])

    def chunk_pass(self, kern, fmt, nns, ns, rows, accs, chunk, terms, ahead):
        group_rows(kern, fmt, ns, rows, [[(accs[0], (nn * len(rows) + r) * LANE_ACC) for r in range(len(rows))]
                                         for nn in nns], chunk)

    def chunk_finish(self, kern, fmt, per_block, rows, accs):
        per_block(lambda nns, ns: single_rows(kern, fmt, ns, rows, [
            [(accs[1], (nn * len(rows) + r) * 8) for r in range(len(rows))] for nn in nns]))

    def chunk_out(self, kern, fmt, accs, nn, r, n_rows):
        # the same sum as `rows`: groups, then the blocks after them
        return hsum_pairwise(accs[0][ramp((nn * n_rows + r) * LANE_ACC, LANE_ACC)], LANE_ACC) + \
            hsum_pairwise(accs[1][ramp((nn * n_rows + r) * 8, 8)], 8)


class Block32(Format):
    """A 32-weight block format on the integer path: each full group of 8 blocks against "q8_0_g8" activation
    rows (`group_rows`: `group_quants`, the group's four vectors of 64 quants in activation.IQ4XS_ORDER, and
    `group_factors`, d_w per int32 lane), the blocks after the last group one at a time (`single_rows`:
    `quants`, the 32 * p signed quants (int8, element order) of blocks b0 .. b0 + p - 1, and `scales`, their
    float32 factors d_w, w = d_w * q; a scalar for p = 1). `m_at`: the byte offset of a float16 m in each block
    where w = d_w * q + m (Q4_1, Q5_1; `mins`, `group_mins`), None where there is none."""
    path = Block32Path()
    block = 32
    acts = "q8_0"
    layout = "q8_0_g8"
    unit_bytes = 416    # a row's bytes per group (tiles._units_in): 256 quants, 8 d, 16 lane d and 16 lane offsets
    m_at = None

    def group_factors(self, kern, n, b0):
        """float32 x 16: d_w of each int32 lane's block."""
        d = T.Bind(self.scales(kern, n, b0, 8))
        return tirx.Shuffle([d, d], LANE_BLOCK)

    def group_mins(self, kern, n, b0):
        """float32 x 16: m x LANE_MIN of each int32 lane's block (the factor of the row's xc, `group_rows`)."""
        m = T.Bind(self.mins(kern, n, b0, 8))
        return tirx.Shuffle([m, m], LANE_BLOCK) * const(LANE_MIN, "float32", 16)

    def scales(self, kern, n, b0, p):
        return self._f16s(kern, n, b0, p, 0)

    def mins(self, kern, n, b0, p):
        return self._f16s(kern, n, b0, p, self.m_at)

    def _f16s(self, kern, n, b0, p, at):   # a float16 at byte `at` (even) of each block (type_size even)
        base = (n * kern.row_bytes + b0 * self.type_size + at) // 2
        if p == 1:
            return f16(kern.w16, base)
        offs = [i * self.type_size // 2 for i in range(p)]
        if kern.width == 32:    # AVX2 has no word permute: p scalar inserts
            return tirx.Cast(f"float32x{p}", tirx.Shuffle([kern.w16[base + o] for o in offs], list(range(p))))
        # AVX-512BW: the words of p blocks by whole-vector loads and one shuffle (vpermt2w), not p scalar inserts
        vecs = [kern.w16[ramp(base + 32 * j, 32)] for j in range(offs[-1] // 32 + 1)]
        return tirx.Cast(f"float32x{p}", tirx.Shuffle(vecs, offs))


class Q80Int(Block32):
    """Q8_0 (34 B): d f16 | qs int8[32].

    Each full group of 8 blocks goes as IQ4_NL's does ("q8_0_g8" rows: one vpdpbusd per 64 bytes and row, one FMA
    per group), the quants moved into activation.IQ4XS_ORDER by qword permutes (`group_quants`): per block a
    row's sum cost a sign, a product, a conversion and an FMA on the block-at-a-time path it took before, which
    at 512 rows ran Q8_0 at half IQ4_NL's rate (bench/x86_rows.py)."""
    type_size = 34

    def quants(self, kern, n, b0, p):
        qs = [kern.w8[ramp(n * kern.row_bytes + (b0 + i) * 34 + 2, 32)] for i in range(p)]
        return qs[0] if p == 1 else tirx.vectorcombine(f"int8x{32 * p}", *qs)

    def group_quants(self, kern, n, b0, vnni):
        """The four vectors of 64 quants of blocks b0 .. b0 + 7 in activation.IQ4XS_ORDER (`_qword_groups`): blocks
        i and 4 + i share one 64-byte vector (two 32-byte loads)."""
        return _qword_groups([tirx.vectorcombine("uint8x64", *[kern.w[n, ramp((b0 + i + 4 * h) * 34 + 2, 32)]
                                                                for h in (0, 1)]) for i in range(4)], vnni, kern.width)


class Q5Int(Block32):
    """Q5_0 (22 B): d f16 | qh u32 | qs[16]: w = d (q - 16); Q5_1 (24 B): d f16 | m f16 | qh u32 | qs[16]:
    w = d q + m. q = the nibble (lo nibbles weights 0..15, hi nibbles 16..31) | bit e of qh << 4 (ggml
    dequantize_row_q5_0 / q5_1). The 5-bit quants are decoded in element order (`_nibbles` | `_high_bits`),
    Q5_0's as q - 16 (signed, exact int sums as Q8_0's), Q5_1's as q (0..31, its m a term on the row's sums),
    and a group's go into activation.IQ4XS_ORDER as Q8_0's (`_qword_groups`), as ggml_vec_dot_q5_0_q8_0 /
    ggml_vec_dot_q5_1_q8_1 against "q8_0" rows."""
    qh_at: int
    q_at: int
    offset: int     # subtracted from q: 16 (Q5_0), 0 (Q5_1)

    def _quants(self, kern, n, blocks):
        """int8 x 32 * len(blocks): the quants (q - offset) of `blocks` of row n, in element order."""
        per, ts = len(blocks), self.type_size
        cat = lambda vs, lanes: vs[0] if per == 1 else tirx.vectorcombine(f"uint8x{lanes * per}", *vs)  # noqa: E731
        qs = cat([kern.w[n, ramp(b * ts + self.q_at, 16)] for b in blocks], 16)
        qh = cat([kern.w[n, ramp(b * ts + self.qh_at, 4)] for b in blocks], 4)
        q = tirx.reinterpret(f"int8x{32 * per}", _nibbles(qs, per) | _high_bits(qh, per))
        return q - const(self.offset, "int8", 32 * per) if self.offset else q

    def quants(self, kern, n, b0, p):
        return self._quants(kern, n, [b0 + i for i in range(p)])

    def group_quants(self, kern, n, b0, vnni):
        return _qword_groups([self._quants(kern, n, [b0 + i, b0 + 4 + i]) for i in range(4)], vnni, kern.width)


class Q50Int(Q5Int):
    type_size, qh_at, q_at, offset = 22, 2, 6, 16


class Q51Int(Q5Int):
    type_size, m_at, qh_at, q_at, offset = 24, 2, 4, 8, 0


class IQ4NLInt(Block32):
    """IQ4_NL (18 B): d f16 | qs[16]: q = kvalues[nibble], lo nibbles weights 0..15, hi nibbles 16..31.

    Its activation rows are "q8_0" rows with each full group of 8 blocks in IQ4_XS's order ("q8_0_g8"): the
    group's 8 qs gathered as IQ4_XS's 8 sub-blocks (`group_quants`), so a row's sums take one vpdpbusd per
    64 bytes and one FMA per group (`group_rows`); the blocks after the last full group go one at a time."""
    type_size, table, q_at = 18, KVALUES, 2

    def group_quants(self, kern, n, b0, vnni):
        """The four vectors of 64 quants of blocks b0 .. b0 + 7 in activation.IQ4XS_ORDER (lanes.lane_vectors)."""
        raw = [T.Bind(tirx.vectorcombine("uint8x64", tirx.vectorcombine("uint8x32", *[
                   kern.w[n, ramp((b0 + 4 * h + i) * self.type_size + self.q_at, 16)] for i in (0, 1)]),
                   tirx.vectorcombine("uint8x32", *[kern.w[n, ramp((b0 + 4 * h + i) * self.type_size + self.q_at, 16)]
                                                    for i in (2, 3)])))
               for h in range(2)]
        return lane_vectors(raw, self.table, lambda idx: self.negative(idx, 64), vnni, kern.width)

    def _idx(self, kern, n, b0, p):
        qs = [kern.w[n, ramp((b0 + i) * self.type_size + self.q_at, 16)] for i in range(p)]
        return _nibbles(qs[0] if p == 1 else tirx.vectorcombine(f"uint8x{16 * p}", *qs), p)

    def quants(self, kern, n, b0, p):
        return pshufb(tirx.reinterpret(f"int8x{32 * p}", byte_vector(list(self.table) * (2 * p))),
                      self._idx(kern, n, b0, p), 32 * p)

    def negative(self, idx, lanes):
        """Lanes whose quant is negative: kvalues_iq4nl is ascending, negative for the indices 0..7."""
        return idx < u8(8, lanes)


class Q40Int(IQ4NLInt):
    """Q4_0 (18 B): d f16 | qs[16]: w = d (q - 8), q the nibble (lo nibbles weights 0..15, hi nibbles 16..31,
    ggml dequantize_row_q4_0): IQ4_NL's layout with the table q - 8, ascending as kvalues_iq4nl (negative for the
    indices 0..7), against "q8_0" rows as ggml_vec_dot_q4_0_q8_0."""
    table = tuple(range(-8, 8))


class Q41Int(IQ4NLInt):
    """Q4_1 (20 B): d f16 | m f16 | qs[16]: w = d q + m, q the nibble (ggml dequantize_row_q4_1): IQ4_NL's layout
    with the table q (0..15, none negative), m a term on the row's sums, against "q8_0" rows as
    ggml_vec_dot_q4_1_q8_1."""
    type_size, table, q_at, m_at = 20, tuple(range(16)), 4, 2

    def negative(self, idx, lanes):
        return tirx.Broadcast(tirx.const(False, "bool"), lanes)


class MXFP4Int(IQ4NLInt):
    """MXFP4 (17 B): e u8 | qs[16]: q = E2M1X2[nibble] (doubled e2m1 values), d_w = 2^(e - 128) (e8m0_half)."""
    type_size, table, q_at = 17, E2M1X2, 1

    def negative(self, idx, lanes):   # bit 3 is the e2m1 sign (index 8 is -0: |q| = 0 either way)
        return idx > u8(8, lanes)

    def scales(self, kern, n, b0, p):
        d = [e8m0_half(kern.w[n, (b0 + i) * 17]) for i in range(p)]
        return d[0] if p == 1 else tirx.Shuffle(d, list(range(p)))


def group_rows(kern, fmt, ns, rows, accs, groups=None):
    """Weight rows `ns`' full groups of 8 blocks (of `groups`, a (first, end) range; all by default) against
    "q8_0_g8" rows: per group and (weight row, activation row) the 16 exact lane sums (`_lane_sums`, the
    activation vectors loaded once for all of `ns`), then one FMA with the weight's d per lane x the row's (xl);
    where the format has an m (Q4_1, Q5_1) one more with m per lane x the row's d x its exact lane sums (from xc).
    accs[j][r]: (float32 buffer, lane offset) of weight row ns[j] and activation row rows[r]."""
    with T.serial(*(groups or (0, kern.n_blocks // 8))) as g:
        ws, ms = [], []
        for n in ns:
            prefetch(kern, n, 8 * g * fmt.type_size, 8 * fmt.type_size)
            ws.append((T.Bind(fmt.group_factors(kern, n, 8 * g)), fmt.group_quants(kern, n, 8 * g, kern.vnni)))
            if fmt.m_at is not None:
                ms.append(T.Bind(fmt.group_mins(kern, n, 8 * g)))
        _lane_fmas(kern, ws, rows, accs, 256 * g, LANE_ACC * g, lambda t: kern.xl[t, ramp(LANE_ACC * g, LANE_ACC)])
        for r, t in enumerate(rows if ms else []):
            # the row's lane sums: xc / -128 (exact in float32: |xc| <= 128 x 16 x 127 < 2^24)
            xs = T.Bind(tirx.Cast(f"float32x{LANE_ACC}", kern.xc[t, ramp(LANE_ACC * g, LANE_ACC)]))
            xl = T.Bind(kern.xl[t, ramp(LANE_ACC * g, LANE_ACC)])
            for m, acc in zip(ms, accs):
                a, off = acc[r]
                T.buffer_store(a, fma(m * xl, xs, a[ramp(off, LANE_ACC)]), [ramp(off, LANE_ACC)])


def single_rows(kern, fmt, ns, rows, accs):
    """The blocks of weight rows `ns` after their last full group of 8, one at a time (32-byte vectors, |w| x (x
    with w's sign)), each adding float(sum) * (d_w * d_x) to the 8-lane accumulator accs[j][r] of weight row
    ns[j] and activation row rows[r]; where the format has an m (Q4_1, Q5_1), then float(the row's sums) *
    (m * d_x), the sums of its block (int32 x 8, exact) by one more dot product with ones."""
    with T.serial(kern.n_blocks // 8 * 8, kern.n_blocks) as b:
        ws = []
        for n in ns:
            # the groups' prefetches leave these bytes of every row out of the stream ahead (from memory, 4096 x
            # 1408 Q8_0 rows (4 blocks here) read at 10-12 GB/s a thread without this)
            prefetch(kern, n, b * fmt.type_size, fmt.type_size)
            w = T.Bind(fmt.quants(kern, n, b, 1))
            m = None if fmt.m_at is None else T.Bind(fmt.mins(kern, n, b, 1))
            ws.append((w, T.Bind(abs_i8(w, 32)), T.Bind(fmt.scales(kern, n, b, 1)), m))
        for r, t in enumerate(rows):
            x = kern.xq[t, ramp(32 * b, 32)] if len(ns) == 1 else T.Bind(kern.xq[t, ramp(32 * b, 32)])
            xs = None if fmt.m_at is None else T.Bind(tirx.Cast("float32x8", dot_u8s8(None, u8(1, 32), x, 32)))
            for (w, aw, dw, m), acc in zip(ws, accs):
                a, off = acc[r]
                isum = dot_u8s8(None, aw, sign(x, w, 32), 32)
                scv = tirx.Broadcast(dw * kern.xd[t, b], 8)
                T.buffer_store(a, fma(tirx.Cast("float32x8", isum), scv, a[ramp(off, 8)]), [ramp(off, 8)])
                if m is not None:
                    T.buffer_store(a, fma(xs, tirx.Broadcast(m * kern.xd[t, b], 8), a[ramp(off, 8)]), [ramp(off, 8)])
