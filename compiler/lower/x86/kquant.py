"""The unsigned K-quants (Q4_K, Q5_K, Q6_K) on "q8" activation rows: a weight row's blocks against a group of
rows, one int->float conversion and one FMA per term, rows two at a time through VNNI where the quants allow."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from .kernel import prefetch
from .vec import (PAIR_LANES, const, dot_packed, dot_pair, dot_u8s8, fma, fold_packed, fold_pairs, hsum_pairwise, madd,
                  ramp)


def _pairs(k, fmt) -> bool:
    """Rows two at a time through vec.dot_pair (`kquant_rows`): VNNI at 64 bytes and quants of at most
    `fmt.q_max` (a sum of 4 products with int8 activations below 2^15)."""
    return k.vnni and k.width == 64 and 4 * fmt.q_max * 127 < 1 << 15


def kquant(k, fmt) -> bool:
    """The unsigned super-block formats on "q8" rows (Q4_K, Q5_K, Q6_K: `fmt.xs_term`) go through `kquant_rows`."""
    return k.acts == "q8" and hasattr(fmt, "xs_term")


def kquant_lanes(k, fmt) -> int:
    """Float accumulator lanes per row of `kquant_rows`: 8 (block sum and xs term in one integer, or at 32-byte
    width in one vector of their lanes added pairwise: `_hadd`), else 8 + 8."""
    return 8 if fmt.xs_merged or k.width == 32 else 16


def kquant_paired(k, fmt, n_rows: int) -> int:
    """How many of a group's rows `kquant_rows` takes in pairs (the first ones)."""
    return 2 * (n_rows // 2) if _pairs(k, fmt) else 0


def kquant_zero(k, fmt, acc, base, n_rows):
    """Zeroed accumulators for `kquant_rows`, stored as they are read (so they stay in registers)."""
    n_l, paired = kquant_lanes(k, fmt), kquant_paired(k, fmt, n_rows)
    units = [(r * n_l + 16 * j, 16) for r in range(0, paired, 2) for j in range(n_l // 8)]
    for off, m in units + [(r * n_l, n_l) for r in range(paired, n_rows)]:
        T.buffer_store(acc, const(0.0, "float32", m), [ramp(base + off, m)])


def kquant_rows(k, fmt, n, rows, acc, base, blocks=None, pair_terms=None, ahead=None):
    """Weight row n against "q8" activation rows `rows` for the unsigned K-quants. Per block (of `blocks`, a
    (first, end) range; all by default) and row: the block sum's 8 int32 lanes (`dot_u8s8` folded to 8, or
    `dot_pair` for two rows at once: the same lanes) and the xs term's 8 (`fmt.xs_term`: weights of the row's
    16-value sums, pmaddwd), then per lane one FMA of float(int) by (d x the row's scale): the xs term joins the
    block sum's integers when it has no factor of its own (Q6_K's -32), else it has 8 lanes of its own with its
    factor (Q4_K's -dmin). A pair keeps its two rows' lanes interleaved (vec.PAIR_LANES) in one 16-lane vector
    per term, so a block costs it one conversion and one FMA per term, no shuffles; a row alone has the same
    lanes in order, so its bits are the same. At 32-byte width (AVX2) a group's block sums go through
    `_steps32` and each row's end of block through `_rows32`. acc: float32 buffer, row r's `kquant_lanes` lanes at
    base + r * lanes (a pair's two rows side by side). `pair_terms`: the pairs' activation terms of every
    block, computed once for all the weight rows of a tile (`kquant_pair_terms`; None: computed here). `ahead`:
    the prefetch distance in bytes (kernel.prefetch)."""
    L = k.width // 4
    n_l = kquant_lanes(k, fmt)
    n_pairs = kquant_paired(k, fmt, len(rows)) // 2
    with T.serial(*(blocks or (0, k.n_blocks))) as s:
        prefetch(k, n, s * fmt.type_size, fmt.type_size, ahead)
        st = fmt.setup(k, n, s)
        if k.width == 32 and len(rows) > 1 and hasattr(fmt, "step_chunks"):
            sums = _steps32(k, fmt, st, n, s, rows)
        else:
            chunks = fmt.chunks(k, st, n, s)
            # a row alone (the one-row decode kernel, a group of 1) takes the block's chunks two at a time where
            # VNNI pairs rows (vec.dot_packed: 6 multiplies for 4 chunks, not 8, half the scale vectors), folded
            # to the same integer lanes; beside a pair it measured 0.85-0.97x (bench/x86_rows.py, 3 rows)
            packed = _pairs(k, fmt) and len(rows) == 1 and len(chunks) % 2 == 0
            sums = [None for _ in rows]
            if packed:
                x = lambda off: k.xq[rows[0], ramp(fmt.block * s + off, 64)]   # noqa: E731
                for (wa, oa, sa), (wb, ob, sb) in zip(chunks[0::2], chunks[1::2]):
                    sums[0] = dot_packed(sums[0], (wa, x(oa), sa), (wb, x(ob), sb))
            else:
                for w, off, scv in chunks:
                    xs = [k.xq[t, ramp(fmt.block * s + off, k.width)] for t in rows]
                    for p in range(n_pairs):
                        sums[2 * p] = dot_pair(sums[2 * p], w, xs[2 * p], xs[2 * p + 1], scv)
                    for i in range(2 * n_pairs, len(rows)):
                        sums[i] = dot_u8s8(sums[i], w, xs[i], k.width, scv, k.vnni)
        v16, f2 = fmt.xs_term(st)
        d = st["d"]
        xsum = [k.xs[t, ramp(16 * s, 16)] for t in rows]
        if n_pairs:
            v32 = T.Bind(tirx.Shuffle([v16, v16], [4 * c + i for c in range(4) for _ in range(2) for i in range(4)]))
        for p in range(n_pairs):
            if pair_terms is None:
                xsp, xdp = _pair_terms(k, rows[2 * p], rows[2 * p + 1], s)
            else:
                xsp, xdp = pair_terms.load(s, p)
            xt = madd(xsp, v32, 64)
            at = base + 2 * p * n_l
            main = sums[2 * p] if f2 is not None else sums[2 * p] + xt
            T.buffer_store(acc, fma(tirx.Broadcast(d, 16) * xdp, tirx.Cast("float32x16", main), acc[ramp(at, 16)]),
                           [ramp(at, 16)])
            if f2 is not None:
                T.buffer_store(acc, fma(tirx.Broadcast(f2, 16) * xdp, tirx.Cast("float32x16", xt),
                                        acc[ramp(at + 16, 16)]), [ramp(at + 16, 16)])
        if k.width == 32:       # (no pairs: they take VNNI at 64 bytes)
            _rows32(k, rows, sums, xsum, v16, d, f2, acc, base, s)
        else:
            for i in range(2 * n_pairs, len(rows)):
                xt = madd(v16, xsum[i], 32)
                at = base + i * n_l
                xd = tirx.Broadcast(k.xd[rows[i], s], n_l)
                if f2 is None:
                    main = fold_packed(sums[i]) if packed else fold_pairs(sums[i], L, 8)
                    fac, iv = tirx.Broadcast(d, 8) * xd, main + xt
                else:   # the block sum's lanes and the xs term's side by side as a pair keeps two rows (SPLIT)
                    fac = pair_lanes(tirx.Broadcast(d, 16), tirx.Broadcast(f2, 16)) * xd
                    if packed:      # dot_packed's lanes m, m + 2 added in place (vpshufd, vpaddd), one shuffle
                        p2 = sums[i] + tirx.Shuffle([sums[i]], [j - j % 4 + (j + 2) % 4 for j in range(16)])
                        iv = tirx.Shuffle([p2, xt], [j if j in PAIR_LANES[0] else 16 + SPLIT_INV[j] - 8
                                                     for j in range(16)])
                    else:
                        iv = tirx.Shuffle([fold_pairs(sums[i], L, 8), xt], SPLIT_INV)
                T.buffer_store(acc, fma(fac, tirx.Cast(f"float32x{n_l}", iv), acc[ramp(at, n_l)]),
                               [ramp(at, n_l)])


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


def _steps32(k, fmt, st, n, s, rows):
    """Block s's int32 x 8 sums of several `rows` at 32-byte width (AVX2: 16 vector registers), as a loop over
    the format's steps (`fmt.step_chunks`: two chunks each) with the rows' sums carried in registers: one step's
    vectors live at a time, each used by every row. Unrolled, LLVM computed one row's block sum after the other
    with the whole block's decoded vectors spilled and reloaded per row (1.1-1.3x slower at 3-8 rows,
    bench/x86_rows.py --against). Integer sums: the same lanes as `chunks` in any order."""
    buf = T.decl_buffer((len(rows) * 8,), "int32")
    for i in range(len(rows)):
        T.buffer_store(buf, const(0, "int32", 8), [ramp(8 * i, 8)])
    fmt.step_setup(k, st)
    # the trip count + 0 where LLVM cannot see it is 0 (a row's scale is never negative): a loop of known trip
    # count it unrolls, and then evaluates each row's sums whole, every step's vectors live at once (spilled)
    zero = tirx.Cast("int32", k.xd[rows[0], s] < const(0.0, "float32"))
    with T.serial(0, fmt.n_steps + zero) as j:
        for w, off, scv in fmt.step_chunks(k, st, n, s, j):
            for i, t in enumerate(rows):
                T.buffer_store(buf, dot_u8s8(buf[ramp(8 * i, 8)], w, k.xq[t, ramp(fmt.block * s + off, 32)], 32, scv,
                                             k.vnni), [ramp(8 * i, 8)])
    return [buf[ramp(8 * i, 8)] for i in range(len(rows))]


def _rows32(k, rows, sums, xsum, v16, d, f2, acc, base, s):
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
        T.buffer_store(acc, fma(fac * tirx.Broadcast(k.xd[t, s], 8), tirx.Cast("float32x8", iv), acc[ramp(at, 8)]),
                       [ramp(at, 8)])


def _hadd(a, b):
    """int32 x 8 a, b added pairwise within each 128-bit half: [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, ...] (vphaddd)."""
    return tirx.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.phadd.d", a, b)


def _pair_terms(k, a, b, s):
    """What rows a, b add to a pair's block s whatever the weight row: (i16 x 32: row a's 16-value sums 4c..4c+3,
    then row b's, per quadword c, so that pmaddwd with the block's xs weights puts row r's groups 2j, 2j+1 in
    lane PAIR_LANES[r][j], as `madd` of one row puts them in lane j; f32 x 16: each lane's row scale xd)."""
    inter = [4 * c + i + 16 * r for c in range(4) for r in range(2) for i in range(4)]
    xsp = tirx.Shuffle([k.xs[a, ramp(16 * s, 16)], k.xs[b, ramp(16 * s, 16)]], inter)
    return xsp, pair_lanes(tirx.Broadcast(k.xd[a, s], 16), tirx.Broadcast(k.xd[b, s], 16))


class PairTerms:
    """`_pair_terms` of a group's pairs for every block, in a local buffer (block-major): shuffled once per
    tile instead of once per weight row (the same values, loaded)."""

    def __init__(self, k, n_pairs):
        self.n_pairs = n_pairs
        self.xsp = T.decl_buffer((k.n_blocks * n_pairs * 32,), "int16")
        self.xdp = T.decl_buffer((k.n_blocks * n_pairs * 16,), "float32")

    def load(self, s, p):
        at = s * self.n_pairs + p
        return self.xsp[ramp(at * 32, 32)], self.xdp[ramp(at * 16, 16)]


def kquant_pair_terms(k, fmt, rows):
    """The PairTerms of activation rows `rows` (a group) for `kquant_rows`, or None where it takes no pairs."""
    n_pairs = kquant_paired(k, fmt, len(rows)) // 2
    if not n_pairs:
        return None
    pt = PairTerms(k, n_pairs)
    with T.serial(0, k.n_blocks) as s:
        for p in range(n_pairs):
            xsp, xdp = _pair_terms(k, rows[2 * p], rows[2 * p + 1], s)
            at = s * n_pairs + p
            T.buffer_store(pt.xsp, xsp, [ramp(at * 32, 32)])
            T.buffer_store(pt.xdp, xdp, [ramp(at * 16, 16)])
    return pt


def kquant_out(k, fmt, acc, base, r, paired):
    """Row r's result from `kquant_rows`' accumulators: its lanes summed pairwise (taken from the pair's
    interleaved vectors when `paired`)."""
    n_l = kquant_lanes(k, fmt)
    if not paired:
        v = acc[ramp(base + r * n_l, n_l)]
        return hsum_pairwise(v if n_l == 8 else tirx.Shuffle([v], SPLIT), n_l)
    at, lanes = base + (r - r % 2) * n_l, PAIR_LANES[r % 2]
    vs = [acc[ramp(at + 16 * j, 16)] for j in range(n_l // 8)]
    return hsum_pairwise(tirx.Shuffle(vs, [16 * j + l for j in range(n_l // 8) for l in lanes]), n_l)
