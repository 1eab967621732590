"""The 32-weight block formats on the integer path (Q8_0, Q4_0, IQ4_NL, MXFP4) against "q8_0_g8" activation rows:
each full group of 8 blocks as IQ4_XS takes a block (lanes.py: one vpdpbusd per 64 bytes and row, one FMA per
group), the blocks after the last group one at a time (ggml-cpu's ggml_vec_dot_q8_0_q8_0 / ggml_vec_dot_q4_0_q8_0 /
ggml_vec_dot_iq4_nl_q8_0 / ggml_vec_dot_mxfp4_q8_0 on x86: an exact int32 sum per block, one FMA by d_w x d_x)."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from nextn.compiler.quant.mxfp4 import E2M1X2, e8m0_half

from .kernel import Format, RowPath, prefetch, zeroed_accs
from .lanes import KVALUES, LANE_ACC, LANE_BLOCK, _lane_fmas, lane_vectors
from .vec import abs_i8, byte_vector, const, dot_u8s8, f16, fma, hsum_pairwise, pshufb, ramp, sign, u8


def _nibbles(v, per):
    """uint8 x 16*per bytes of `per` 4-bit blocks (byte l: element l low, 16 + l high) -> uint8 x 32*per indices in
    element order: one mask and one shift over all of v, then 16-byte lanes [lo_0, hi_0, lo_1, hi_1] (one
    shuffle of 128-bit lanes)."""
    lo, hi = v & u8(15, 16 * per), (v >> u8(4, 16 * per)) & u8(15, 16 * per)
    if per == 1:
        return tirx.vectorcombine("uint8x32", lo, hi)
    idx = [j for p in range(per) for j in list(range(16 * p, 16 * p + 16)) + list(range(16 * per + 16 * p, 16 * per + 16 * p + 16))]
    return tirx.Shuffle([lo, hi], idx)



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
    float32 factors d_w, w = d_w * q; a scalar for p = 1)."""
    path = Block32Path()
    block = 32
    acts = "q8_0"
    layout = "q8_0_g8"
    unit_bytes = 416    # a row's bytes per group (tiles._units_in): 256 quants, 8 d, 16 lane d and 16 lane offsets

    def group_factors(self, kern, n, b0):
        """float32 x 16: d_w of each int32 lane's block."""
        d = T.Bind(self.scales(kern, n, b0, 8))
        return tirx.Shuffle([d, d], LANE_BLOCK)

    def scales(self, kern, n, b0, p):   # a float16 d_w at the start of each block (type_size even)
        base = (n * kern.row_bytes + b0 * self.type_size) // 2
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
        """The four vectors of 64 quants of blocks b0 .. b0 + 7 in activation.IQ4XS_ORDER: vector c holds qword c
        of every block, qword 2i + h of it from block 4h + i. Blocks i and 4 + i share one 64-byte vector (two
        32-byte loads), two permutes of two such vectors give the low halves of two outputs, one more joins
        halves. VNNI: q + 128 (u8; the row's xc takes the 128 back off), else (|q| as u8, q < 0)."""
        u64 = lambda v: tirx.reinterpret("uint64x8", v)   # noqa: E731
        pairs = [T.Bind(u64(tirx.vectorcombine("uint8x64", *[
                     kern.w[n, ramp((b0 + i + 4 * h) * 34 + 2, 32)] for h in (0, 1)]))) for i in range(4)]
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
                out.append((T.Bind(tirx.reinterpret("uint8x64", abs_i8(qb, 64))), qb < const(0, "int8", 64)))
        return out


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
    activation vectors loaded once for all of `ns`), then one FMA with the weight's d per lane x the row's (xl).
    accs[j][r]: (float32 buffer, lane offset) of weight row ns[j] and activation row rows[r]."""
    with T.serial(*(groups or (0, kern.n_blocks // 8))) as g:
        ws = []
        for n in ns:
            prefetch(kern, n, 8 * g * fmt.type_size, 8 * fmt.type_size)
            ws.append((T.Bind(fmt.group_factors(kern, n, 8 * g)), fmt.group_quants(kern, n, 8 * g, kern.vnni)))
        _lane_fmas(kern, ws, rows, accs, 256 * g, LANE_ACC * g, lambda t: kern.xl[t, ramp(LANE_ACC * g, LANE_ACC)])


def single_rows(kern, fmt, ns, rows, accs):
    """The blocks of weight rows `ns` after their last full group of 8, one at a time (32-byte vectors, |w| x (x
    with w's sign)), each adding float(sum) * (d_w * d_x) to the 8-lane accumulator accs[j][r] of weight row
    ns[j] and activation row rows[r]."""
    with T.serial(kern.n_blocks // 8 * 8, kern.n_blocks) as b:
        ws = []
        for n in ns:
            # the groups' prefetches leave these bytes of every row out of the stream ahead (from memory, 4096 x
            # 1408 Q8_0 rows (4 blocks here) read at 10-12 GB/s a thread without this)
            prefetch(kern, n, b * fmt.type_size, fmt.type_size)
            w = T.Bind(fmt.quants(kern, n, b, 1))
            ws.append((w, T.Bind(abs_i8(w, 32)), T.Bind(fmt.scales(kern, n, b, 1))))
        for r, t in enumerate(rows):
            x = kern.xq[t, ramp(32 * b, 32)] if len(ns) == 1 else T.Bind(kern.xq[t, ramp(32 * b, 32)])
            for (w, aw, dw), acc in zip(ws, accs):
                a, off = acc[r]
                isum = dot_u8s8(None, aw, sign(x, w, 32), 32)
                scv = tirx.Broadcast(dw * kern.xd[t, b], 8)
                T.buffer_store(a, fma(tirx.Cast("float32x8", isum), scv, a[ramp(off, 8)]), [ramp(off, 8)])


