"""Formats whose int32 lanes keep one sub-block across a block's vectors: IQ4_XS on "q8_iq4xs" rows, and the
grouped 32-block formats (Q8_0, IQ4_NL, MXFP4) on "q8_0_g8" rows in groups of 8 blocks, the blocks after the last group
one at a time. Per block (group) and row: 16 exact lane sums, converted once, one FMA."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from .kernel import concat, prefetch
from .vec import abs_i8, const, dot_u8s8, fma, ramp


LANE_ACC = 16   # int32 lanes of a block's sum in lane_rows (at either width: the same bits from AVX2 and AVX-512)


def multi_row(fmt) -> bool:
    """Whether `fmt`'s row functions here take several weight rows at once (Knobs.w_rows, tiles.tile_rows)."""
    return hasattr(fmt, "lane_quants") or hasattr(fmt, "group_quants")


def scaled(k, fmt) -> bool:
    """Whether `lane_rows` takes `fmt` through `scaled_rows` (IQ4_XS at 32-byte width, VNNI or not: the same bits
    from every AVX2 machine), with 8 float lanes per row (tiles.acc_lanes)."""
    return k.width == 32 and hasattr(fmt, "lane_scales")


def scaled_rows(k, fmt, ns, rows, accs, blocks=None):
    """`lane_rows` at 32-byte width, as ggml's AVX2 ggml_vec_dot_iq4_xs_q8_K: per (weight row, activation row)
    and 32 bytes, the weight's sign moved onto x (vpsignb), |q| x that (pmaddubsw: |pair| <= 2 x 127 x 127), the
    sub-block scales ls - 32 as pmaddwd's weights (`fmt.lane_scales`; every lane of a 32-byte half keeps its
    sub-block, LANE_BLOCK), all in one int32 x 8 (exact: below 2^23), then per block one conversion and one FMA
    by d x the row's scale. About half the instructions per row of `_lane_sums`' select and float lanes
    (16 registers: two float vectors per row spilled at 8 rows)."""
    with T.serial(*(blocks or (0, k.n_blocks))) as s:
        ws = []
        for n in ns:
            prefetch(k, n, s * fmt.type_size, fmt.type_size)
            d, scs = fmt.lane_scales(k, n, s)
            ws.append((d, scs, fmt.signed_quants(k, n, s)))
        for r, t in enumerate(rows):
            for (d, scs, qs), acc in zip(ws, accs):
                total = None
                for c, (aq, q) in enumerate(qs):
                    for h in range(2):
                        half = list(range(32 * h, 32 * h + 32))
                        x = k.xq[t, ramp(256 * s + 64 * c + 32 * h, 32)]
                        xs = sign(x, tirx.reinterpret("int8x32", tirx.Shuffle([q], half)), 32)
                        v = dot_u8s8(None, tirx.Shuffle([aq], half), xs, 32, scs[h])
                        total = v if total is None else total + v
                a, off = acc[r]
                T.buffer_store(a, fma(tirx.Broadcast(d * k.xd[t, s], 8), tirx.Cast("float32x8", total),
                                      a[ramp(off, 8)]), [ramp(off, 8)])


def lane_rows(k, fmt, ns, rows, accs, blocks=None):
    """Weight rows `ns` (one, or a register block of Knobs.w_rows: tiles.py) against "q8" rows for a format whose
    int32 lanes keep one sub-block across a block's vectors (formats.IQ4XS; accs[j][r]: the (float32 buffer, lane
    offset) of weight row ns[j] and activation row rows[r]): per block, each weight row's quants and factors, then
    per activation row its four 64-byte vectors loaded once for all the weight rows, and per (weight row,
    activation row) 16 exact int32 lane sums (VNNI: one vpdpbusd per vector of the unsigned quants, from the
    row's xc lane offsets; else |q| x (x with q's sign) by pmaddubsw + pmaddwd, the same integers), converted
    once, then one FMA: acc += (weight factors per lane x the row's scale) * sums. Every (weight row, activation
    row) runs that sequence whatever the block: the same bits for any w_rows and row count. 64 // width vectors
    per 64 bytes at 32-byte width; IQ4_XS there goes through `scaled_rows`."""
    if scaled(k, fmt):
        return scaled_rows(k, fmt, ns, rows, accs, blocks)
    with T.serial(*(blocks or (0, k.n_blocks))) as s:
        ws = []
        for n in ns:
            prefetch(k, n, s * fmt.type_size, fmt.type_size)
            ws.append((T.Bind(fmt.lane_factors(k, n, s)), fmt.lane_quants(k, n, s, k.vnni)))
        _lane_fmas(k, ws, rows, accs, 256 * s, LANE_ACC * s, lambda t: tirx.Broadcast(k.xd[t, s], LANE_ACC))


def _lane_fmas(k, ws, rows, accs, x_at, c_at, row_scale):
    """acc[j][r] += (ws[j]'s factors x row_scale(t)) * the lane sums of ws[j]'s quants with row t = rows[r], the
    row's vectors loaded once for every weight row (lane_rows, group_rows)."""
    for r, t in enumerate(rows):
        xs = _row_vectors(k, t, x_at, len(ws) > 1)
        xsc = row_scale(t) if len(ws) == 1 else T.Bind(row_scale(t))
        for (wfac, qs), acc in zip(ws, accs):
            a, off = acc[r]
            T.buffer_store(a, fma(wfac * xsc, _lane_sums(k, qs, xs, t, c_at), a[ramp(off, LANE_ACC)]),
                           [ramp(off, LANE_ACC)])


def _row_vectors(k, t, x_at, shared):
    """Row t's 256 activation values from xq[t, x_at], as the `width`-byte vectors `_lane_sums` takes (bound
    once when `shared`, so a register block of weight rows reads them once)."""
    xs = [k.xq[t, ramp(x_at + 64 * c + h * k.width, k.width)] for c in range(4) for h in range(64 // k.width)]
    return [T.Bind(x) for x in xs] if shared else xs


def _lane_sums(k, qs, xs, t, c_at):
    """float32 x 16: the exact int32 lane sums of row t's 256 values `xs` (`_row_vectors`) with the four vectors
    of quants `qs` (formats.lane_vectors): VNNI: from the row's lane offsets xc[t, c_at], one vpdpbusd per vector
    of the unsigned quants; else |q| x (x with q's sign), pmaddubsw + pmaddwd; converted to float32 (exact: below
    2^24)."""
    parts = 64 // k.width
    L = k.width // 4
    zero = const(0, "int8", k.width)
    sums = [k.xc[t, ramp(c_at + h * L, L)] if k.vnni else None for h in range(parts)]
    for c, q in enumerate(qs):
        for h in range(parts):
            def part(v):
                return v if parts == 1 else tirx.Shuffle([v], list(range(h * k.width, (h + 1) * k.width)))
            x = xs[c * parts + h]
            if k.vnni:
                sums[h] = dot_u8s8(sums[h], part(q), x, k.width, None, True)
            else:
                aq, neg = q
                sums[h] = dot_u8s8(sums[h], part(aq), tirx.Select(part(neg), zero - x, x), k.width)
    return tirx.Cast(f"float32x{LANE_ACC}", concat(sums))


def group_rows(k, fmt, ns, rows, accs, groups=None):
    """Weight rows `ns`' full groups of 8 blocks (of `groups`, a (first, end) range; all by default) against
    "q8_0_g8" rows: per group and (weight row, activation row) the 16 exact lane sums (`_lane_sums`, the
    activation vectors loaded once for all of `ns`), then one FMA with the weight's d per lane x the row's (xl).
    accs[j][r]: (float32 buffer, lane offset) of weight row ns[j] and activation row rows[r]."""
    with T.serial(*(groups or (0, k.n_blocks // 8))) as g:
        ws = []
        for n in ns:
            prefetch(k, n, 8 * g * fmt.type_size, 8 * fmt.type_size)
            ws.append((T.Bind(fmt.group_factors(k, n, 8 * g)), fmt.group_quants(k, n, 8 * g, k.vnni)))
        _lane_fmas(k, ws, rows, accs, 256 * g, LANE_ACC * g, lambda t: k.xl[t, ramp(LANE_ACC * g, LANE_ACC)])


def single_rows(k, fmt, ns, rows, accs):
    """The blocks of weight rows `ns` after their last full group of 8, one at a time (32-byte vectors, |w| x (x
    with w's sign)), each adding float(sum) * (d_w * d_x) to the 8-lane accumulator accs[j][r] of weight row
    ns[j] and activation row rows[r]."""
    with T.serial(k.n_blocks // 8 * 8, k.n_blocks) as b:
        ws = []
        for n in ns:
            # the groups' prefetches leave these bytes of every row out of the stream ahead (from memory, 4096 x
            # 1408 Q8_0 rows (4 blocks here) read at 10-12 GB/s a thread without this)
            prefetch(k, n, b * fmt.type_size, fmt.type_size)
            w = T.Bind(fmt.quants(k, n, b, 1))
            ws.append((w, T.Bind(abs_i8(w, 32)), T.Bind(fmt.scales(k, n, b, 1))))
        for r, t in enumerate(rows):
            x = k.xq[t, ramp(32 * b, 32)] if len(ns) == 1 else T.Bind(k.xq[t, ramp(32 * b, 32)])
            for (w, aw, dw), acc in zip(ws, accs):
                a, off = acc[r]
                isum = dot_u8s8(None, aw, sign(x, w, 32), 32)
                scv = tirx.Broadcast(dw * k.xd[t, b], 8)
                T.buffer_store(a, fma(tirx.Cast("float32x8", isum), scv, a[ramp(off, 8)]), [ramp(off, 8)])


def sign(x, w, width):
    """x where w > 0, -x where w < 0, 0 where w = 0 (vpsignb on AVX2; AVX-512 has none for zmm: a masked negate,
    which LLVM makes of the select)."""
    if width == 32:
        return tirx.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.psign.b", x, w)
    zero = const(0, "int8", width)
    return tirx.Select(w < zero, zero - x, x)
