"""The loop nest of the x86 matmul kernels: weight rows in tiles spread over the threads, activation rows in groups.

    matmul     y[t, n] = sum_k w[n, k] x[t, k]                        (ggml mul_mat)
    matmul_id  y[t, j, n] = sum_k w[ids[t, j], n, k] x[t or (t, j), k]   (ggml mul_mat_id, routed experts)

The weight is the GGUF's block bytes (a view of the mapped file: 32-byte aligned, so every buffer is declared
align=32). A thread takes tiles of `tile_n` weight rows; in a tile each group of `row_group` activation rows
reads the tile from cache, so a tile comes from memory once per call whatever the row count (verify, prefill).
For routed experts the (t, j) pairs are first grouped by expert, so each selected expert is read once for all
the rows that chose it, and the work items (expert, tile) go to the threads.

Every activation row runs the same instruction sequence whether it is computed alone or in a group (full groups,
then the remaining rows in smaller groups), so a row's result does not depend on how many rows the call has: verify
and prefill rows equal decode rows bit for bit. Integer-path sums are exact, so how the instructions get them
(VNNI or not, see vec.dot_u8s8) does not change a bit either.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from .formats import Block32, format_of
from .vec import PAIR_LANES, const, dot_pair, dot_u8s8, fma, fold_pairs, hsum, hsum_pairwise, madd, ramp


@dataclass(frozen=True)
class Knobs:
    """What `nextn tune` searches. width: vector bytes (32 AVX2, 64 AVX-512BW); tile_n: weight rows per work
    item; row_group: activation rows sharing one decode of a weight row's blocks (the rows left over go in smaller
    groups, `_group_sizes`); unroll: blocks per step (float path); prefetch_kb: KB ahead of the weight bytes
    being read that each block prefetches (0: none; `_prefetch`). The defaults are the best measured
    on GLM widths (row_group 8: 8 rows' accumulators and the decoded block fit the 32 zmm registers)."""
    width: int = 32
    tile_n: int = 16
    row_group: int = 8
    unroll: int = 2
    prefetch_kb: int = 16


class _Kern:
    """The kernel being built: its buffers, byte views of the weight, and knobs (what format code reads)."""


def _format(kind, exact: bool = False):
    return format_of(kind, exact)


def _new(kind: str, K: int, knobs: Knobs, vnni: bool = False, exact: bool = False):
    fmt = _format(kind, exact)
    if K % fmt.block:
        raise ValueError(f"{kind}: K={K} is not a multiple of the block ({fmt.block})")
    k = _Kern()
    k.kind, k.width, k.unroll, k.vnni = kind, knobs.width, knobs.unroll, vnni
    k.acts, k.prefetch = fmt.acts, knobs.prefetch_kb * 1024
    k.unit_bytes = getattr(fmt, "unit_bytes", 256)     # activation bytes per 256 values of a row (_k_chunk)
    k.n_blocks = K // fmt.block
    k.row_bytes = k.n_blocks * fmt.type_size
    return fmt, k


def weight_arg(kind: str, lead: tuple, K: int) -> tuple[tuple, str]:
    """(shape, dtype) of the weight argument: block bytes per row, or a plain float tensor's elements."""
    fmt = _format(kind)
    if hasattr(fmt, "arg_dtype"):
        return (*lead, K), fmt.arg_dtype
    return (*lead, K // fmt.block * fmt.type_size), "uint8"


def act_layout(kind: str, exact: bool = False) -> str:
    """How a `kind` kernel takes its activation rows: the row format (`acts`: "q8", "q8_0", "f32"), or a layout
    of it ("q8_iq4xs": the "q8" values in IQ4_XS's order, formats.IQ4XS; "q8_0_g8": the "q8_0" values in groups
    of 8 blocks in that order, formats.IQ4NLInt)."""
    fmt = _format(kind, exact)
    return getattr(fmt, "layout", fmt.acts)


def act_args(kind: str, rows, K: int, exact: bool = False) -> list[tuple[str, tuple, str]]:
    """[(name, shape, dtype)] of a kernel's activation arguments: the "q8" row (int8 values, f32 scale per 256,
    i16 sums per 16) for the super-block integer formats, in IQ4_XS's order with i32 lane offsets per 16 for
    IQ4_XS, the "q8_0" row (int8 values, f32 scale per 32) for the 32-block ones (for IQ4_NL / MXFP4 in groups
    of 8 blocks, with each lane's scale and offset per group), the float32 row otherwise (`exact`: the float path
    where a kind has both)."""
    acts = act_layout(kind, exact)
    if acts == "q8_iq4xs":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 256), "float32"), ("xc", (rows, K // 16), "int32")]
    if acts == "q8_0_g8":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 32), "float32"), ("xl", (rows, K // 256 * 16), "float32"),
                ("xc", (rows, K // 256 * 16), "int32")]
    if acts == "q8":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 256), "float32"), ("xs", (rows, K // 16), "int16")]
    if acts == "q8_0":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 32), "float32")]
    return [("x", (rows, K), "float32")]


def _bind_acts(k, kind, rows, K):
    for name, shape, dtype in act_args(kind, rows, K, k.acts == "f32"):
        setattr(k, name, T.arg(name, T.buffer(shape, dtype, align=32)))


def _views(k, data, nbytes):
    """Typed views of the weight bytes (f16 scales, u32 words, ...) over the same pointer."""
    k.w8 = T.decl_buffer((nbytes,), "int8", data=data)
    k.w16 = T.decl_buffer((nbytes // 2,), "float16", data=data)
    k.w16u = T.decl_buffer((nbytes // 2,), "uint16", data=data)
    k.w32 = T.decl_buffer((nbytes // 4,), "uint32", data=data)
    k.w32f = T.decl_buffer((nbytes // 4,), "float32", data=data)


def _concat(vs):
    return vs[0] if len(vs) == 1 else tirx.Shuffle(vs, list(range(sum(v.ty.dtype.lanes for v in vs))))
def _prefetch(k, n, off, nbytes):
    """Software prefetch (prefetcht0) of the weight bytes `k.prefetch` ahead of row n's bytes [off, off + nbytes),
    one per 64-byte line. The rows of a thread's tiles are one contiguous stream; with the hardware prefetcher
    alone a one-row kernel read it at ~0.7 of the machine's read bandwidth (Zen 4, bench/quant_gemv.py), with
    16 KB ahead at about the read bandwidth. Prefetches past the end of the weight do not fault."""
    if not k.prefetch:
        return
    base = n * k.row_bytes + off + k.prefetch
    for o in range(0, nbytes, 64):
        T.evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch.p0", tirx.address_of(k.w8[base + o]),
                                         const(0, "int32"), const(3, "int32"), const(1, "int32")))


def _pairs(k, fmt) -> bool:
    """Rows two at a time through vec.dot_pair (`_kquant_rows`): VNNI at 64 bytes and quants of at most
    `fmt.q_max` (a sum of 4 products with int8 activations below 2^15)."""
    return k.vnni and k.width == 64 and 4 * fmt.q_max * 127 < 1 << 15


def _kquant(k, fmt) -> bool:
    """The unsigned super-block formats on "q8" rows (Q4_K, Q5_K, Q6_K: `fmt.xs_term`) go through `_kquant_rows`."""
    return k.acts == "q8" and hasattr(fmt, "xs_term")


def _kquant_lanes(fmt) -> int:
    """Float accumulator lanes per row of `_kquant_rows`: 8 (block sum and xs term in one integer) or 8 + 8."""
    return 8 if fmt.xs_merged else 16


def _kquant_paired(k, fmt, n_rows: int) -> int:
    """How many of a group's rows `_kquant_rows` takes in pairs (the first ones)."""
    return 2 * (n_rows // 2) if _pairs(k, fmt) else 0


def _kquant_zero(k, fmt, acc, base, n_rows):
    """Zeroed accumulators for `_kquant_rows`, stored as they are read (so they stay in registers)."""
    n_l, paired = _kquant_lanes(fmt), _kquant_paired(k, fmt, n_rows)
    units = [(r * n_l + 16 * j, 16) for r in range(0, paired, 2) for j in range(n_l // 8)]
    for off, m in units + [(r * n_l, n_l) for r in range(paired, n_rows)]:
        T.buffer_store(acc, const(0.0, "float32", m), [ramp(base + off, m)])


def _kquant_rows(k, fmt, n, rows, acc, base, blocks=None):
    """Weight row n against "q8" activation rows `rows` for the unsigned K-quants. Per block (of `blocks`, a
    (first, end) range; all by default) and row: the block sum's 8 int32 lanes (`dot_u8s8` folded to 8, or
    `dot_pair` for two rows at once: the same lanes) and the xs term's 8 (`fmt.xs_term`: weights of the row's
    16-value sums, pmaddwd), then per lane one FMA of float(int) by (d x the row's scale): the xs term joins the
    block sum's integers when it has no factor of its own (Q6_K's -32), else it has 8 lanes of its own with its
    factor (Q4_K's -dmin). A pair keeps its two rows' lanes interleaved (vec.PAIR_LANES) in one 16-lane vector
    per term, so a block costs it one conversion and one FMA per term, no shuffles; a row alone has the same
    lanes in order, so its bits are the same. acc: float32 buffer, row r's `_kquant_lanes` lanes at
    base + r * lanes (a pair's two rows side by side)."""
    L = k.width // 4
    n_l = _kquant_lanes(fmt)
    n_pairs = _kquant_paired(k, fmt, len(rows)) // 2
    with T.serial(*(blocks or (0, k.n_blocks))) as s:
        _prefetch(k, n, s * fmt.type_size, fmt.type_size)
        st = fmt.setup(k, n, s)
        sums = [None for _ in rows]
        for w, off, scv in fmt.chunks(k, st, n, s):
            xs = [k.xq[t, ramp(fmt.block * s + off, k.width)] for t in rows]
            for p in range(n_pairs):
                sums[2 * p] = dot_pair(sums[2 * p], w, xs[2 * p], xs[2 * p + 1], scv)
            for i in range(2 * n_pairs, len(rows)):
                sums[i] = dot_u8s8(sums[i], w, xs[i], k.width, scv, k.vnni)
        v16, f2 = fmt.xs_term(st)
        d = st["d"]
        xsum = [k.xs[t, ramp(16 * s, 16)] for t in rows]
        if n_pairs:
            # row a's 16-value sums 4c..4c+3, then row b's, per quadword c: pmaddwd puts row r's groups 2j, 2j+1
            # in lane PAIR_LANES[r][j], as `madd` of one row puts them in lane j
            inter = [4 * c + i + 16 * r for c in range(4) for r in range(2) for i in range(4)]
            v32 = T.Bind(tirx.Shuffle([v16, v16], [4 * c + i for c in range(4) for _ in range(2) for i in range(4)]))
        for p in range(n_pairs):
            a, b = rows[2 * p], rows[2 * p + 1]
            xt = madd(tirx.Shuffle([xsum[2 * p], xsum[2 * p + 1]], inter), v32, 64)
            xdp = tirx.Shuffle([tirx.Broadcast(k.xd[a, s], 16), tirx.Broadcast(k.xd[b, s], 16)],
                               [i if i % 4 < 2 else 16 + i for i in range(16)])
            at = base + 2 * p * n_l
            main = sums[2 * p] if f2 is not None else sums[2 * p] + xt
            T.buffer_store(acc, fma(tirx.Broadcast(d, 16) * xdp, tirx.Cast("float32x16", main), acc[ramp(at, 16)]),
                           [ramp(at, 16)])
            if f2 is not None:
                T.buffer_store(acc, fma(tirx.Broadcast(f2, 16) * xdp, tirx.Cast("float32x16", xt),
                                        acc[ramp(at + 16, 16)]), [ramp(at + 16, 16)])
        for i in range(2 * n_pairs, len(rows)):
            main = fold_pairs(sums[i], L, 8)
            xt = madd(v16, xsum[i], 32)
            at = base + i * n_l
            xd = tirx.Broadcast(k.xd[rows[i], s], n_l)
            if f2 is None:
                fac, iv = tirx.Broadcast(d, 8) * xd, main + xt
            else:
                fac, iv = _concat([tirx.Broadcast(d, 8), tirx.Broadcast(f2, 8)]) * xd, _concat([main, xt])
            T.buffer_store(acc, fma(fac, tirx.Cast(f"float32x{n_l}", iv), acc[ramp(at, n_l)]), [ramp(at, n_l)])


def _kquant_out(k, fmt, acc, base, r, paired):
    """Row r's result from `_kquant_rows`' accumulators: its lanes summed pairwise (taken from the pair's
    interleaved vectors when `paired`)."""
    n_l = _kquant_lanes(fmt)
    if not paired:
        return hsum_pairwise(acc[ramp(base + r * n_l, n_l)], n_l)
    at, lanes = base + (r - r % 2) * n_l, PAIR_LANES[r % 2]
    vs = [acc[ramp(at + 16 * j, 16)] for j in range(n_l // 8)]
    return hsum_pairwise(tirx.Shuffle(vs, [16 * j + l for j in range(n_l // 8) for l in lanes]), n_l)


LANE_ACC = 16   # int32 lanes of a block's sum in _lane_rows (at either width: the same bits from AVX2 and AVX-512)


def _lane_rows(k, fmt, n, rows, accs, blocks=None):
    """Weight row n against "q8" rows for a format whose int32 lanes keep one sub-block across a block's vectors
    (formats.IQ4XS; accs: per row [(float32 buffer, lane offset)]): per
    block and row, 16 exact int32 lane sums over the four 64-byte vectors of quants (VNNI: one vpdpbusd each of
    the unsigned quants, from the row's xc lane offsets; else |q| x (x with q's sign) by pmaddubsw + pmaddwd,
    the same integers), converted once, then one FMA: acc += (weight factors per lane x the row's scale) * sums.
    64 // width vectors per 64 bytes at 32-byte width."""
    with T.serial(*(blocks or (0, k.n_blocks))) as s:
        _prefetch(k, n, s * fmt.type_size, fmt.type_size)
        wfac = T.Bind(fmt.lane_factors(k, n, s))
        qs = fmt.lane_quants(k, n, s, k.vnni)
        for t, acc in zip(rows, accs):
            fac = wfac * tirx.Broadcast(k.xd[t, s], LANE_ACC)
            a, off = acc[0]
            T.buffer_store(a, fma(fac, _lane_sums(k, qs, t, 256 * s, LANE_ACC * s), a[ramp(off, LANE_ACC)]),
                           [ramp(off, LANE_ACC)])


def _lane_sums(k, qs, t, x_at, c_at):
    """float32 x 16: the exact int32 lane sums of row t's 256 values from xq[t, x_at] with the four vectors of
    quants `qs` (formats.lane_vectors): VNNI: from the row's lane offsets xc[t, c_at], one vpdpbusd per vector of
    the unsigned quants; else |q| x (x with q's sign), pmaddubsw + pmaddwd; converted to float32 (exact: below
    2^24)."""
    parts = 64 // k.width
    L = k.width // 4
    zero = const(0, "int8", k.width)
    sums = [k.xc[t, ramp(c_at + h * L, L)] if k.vnni else None for h in range(parts)]
    for c, q in enumerate(qs):
        for h in range(parts):
            def part(v):
                return v if parts == 1 else tirx.Shuffle([v], list(range(h * k.width, (h + 1) * k.width)))
            x = k.xq[t, ramp(x_at + 64 * c + h * k.width, k.width)]
            if k.vnni:
                sums[h] = dot_u8s8(sums[h], part(q), x, k.width, None, True)
            else:
                aq, neg = q
                sums[h] = dot_u8s8(sums[h], part(aq), tirx.Select(part(neg), zero - x, x), k.width)
    return tirx.Cast(f"float32x{LANE_ACC}", _concat(sums))


def _float_rows(k, fmt, n, rows, accs):
    """Weight row n against float activation rows: `unroll` blocks per step, one accumulator per (block slot,
    vector) so the FMA chains overlap."""
    L = k.width // 4
    U = k.unroll

    def block(blk, slot):
        _prefetch(k, n, blk * fmt.type_size, fmt.type_size)
        vals = fmt.values(k, n, blk)
        for t, acc in zip(rows, accs):
            for i, v in enumerate(vals):
                a = acc[slot * len(vals) + i]
                T.buffer_store(a, fma(v, k.x[t, ramp(32 * blk + i * L, L)], a[ramp(0, L)]), [ramp(0, L)])

    with T.serial(0, k.n_blocks // U) as bu:
        for u in range(U):
            block(bu * U + u, u)
    with T.serial(k.n_blocks // U * U, k.n_blocks) as blk:
        block(blk, 0)


# -- 32-weight blocks on "q8_0" activation rows (formats.Block32) ----------------------------------------------------
def _block32_rows(k, fmt, n, rows, accs):
    """Weight row n against "q8_0" activation rows: per block an exact int32 sum (`dot_u8s8` of |w| with x carrying
    w's sign), then float(sum) * (d_w * d_x). width / 32 blocks per vector, `fmt.UNROLL` vectors per step, their
    products summed pairwise (mul, fma) and added to the row's accumulator accs[0] once per step; the blocks after
    the last full step go one at a time in 32-byte vectors into accs[1]. One accumulator per row keeps a group of
    8 rows in registers."""
    U, per = fmt.UNROLL, k.width // 32
    step, L = U * per, k.width // 4

    def signed(w, width):
        zero = const(0, "int8", width)
        return T.Bind(tirx.Select(w < zero, zero - w, w))      # |w| as u8 (-128 -> 128)

    def step_at(b0):
        """Blocks b0 .. b0 + step - 1: the scales of the step as one vector (d_w * d_x per row: one multiply),
        spread over each vector's blocks by a permute."""
        ws = []
        for u in range(U):
            if k.width == 64 and hasattr(fmt, "abs_quants"):     # |q| and its sign straight from a table index
                aw, idx = fmt.abs_quants(k, n, b0 + u * per, per)
                zero = const(0, "int8", 64)
                ws.append((lambda x, idx=idx: tirx.Select(fmt.negative(idx, 64), zero - x, x), aw))
            else:
                w = T.Bind(fmt.quants(k, n, b0 + u * per, per))
                ws.append((lambda x, w=w: _sign(x, w, k.width), signed(w, k.width)))
        dw = T.Bind(fmt.scales(k, n, b0, step))                  # float32 x step
        _prefetch(k, n, b0 * fmt.type_size, step * fmt.type_size)
        for t, acc in zip(rows, accs):
            sc = T.Bind(dw * k.xd[t, ramp(b0, step)])
            prods = []
            for u, (sign, aw) in enumerate(ws):
                sx = sign(k.xq[t, ramp(32 * (b0 + u * per), k.width)])
                isum = dot_u8s8(None, aw, sx, k.width, None, k.vnni)      # int32 x L, 8 lanes per block
                scv = tirx.Shuffle([sc] * (2 * L // step), [u * per + i // 8 for i in range(L)])
                f = tirx.Cast(f"float32x{L}", isum)
                prods.append(f * scv if u % 2 == 0 else fma(f, scv, prods.pop()))
            while len(prods) > 1:
                prods = [prods[i] + prods[i + 1] if i + 1 < len(prods) else prods[i] for i in range(0, len(prods), 2)]
            T.buffer_store(acc[0], acc[0][ramp(0, L)] + prods[0], [ramp(0, L)])

    def single(b):
        w = T.Bind(fmt.quants(k, n, b, 1))
        aw = signed(w, 32)
        dw = T.Bind(fmt.scales(k, n, b, 1))
        for t, acc in zip(rows, accs):
            isum = dot_u8s8(None, aw, _sign(k.xq[t, ramp(32 * b, 32)], w, 32), 32)
            scv = tirx.Broadcast(dw * k.xd[t, b], 8)
            T.buffer_store(acc[1], fma(tirx.Cast("float32x8", isum), scv, acc[1][ramp(0, 8)]), [ramp(0, 8)])

    if hasattr(fmt, "group_quants"):     # groups of 8 blocks in IQ4_XS's lane order ("q8_0_g8" rows)
        _group_rows(k, fmt, n, rows, [[(acc[0], 0)] for acc in accs])
        _single_rows(k, fmt, n, rows, [[(acc[1], 0)] for acc in accs])
        return
    with T.serial(0, k.n_blocks // step) as g:
        step_at(g * step)
    with T.serial(k.n_blocks // step * step, k.n_blocks) as b:
        single(b)


def _group_rows(k, fmt, n, rows, accs, groups=None):
    """Weight row n's full groups of 8 blocks (of `groups`, a (first, end) range; all by default) against "q8_0_g8"
    rows: per group and row the 16 exact lane sums (`_lane_sums`), then one FMA with the weight's d per lane x the
    row's (xl). accs: per row [(float32 buffer, lane offset)]."""
    with T.serial(*(groups or (0, k.n_blocks // 8))) as g:
        _prefetch(k, n, 8 * g * fmt.type_size, 8 * fmt.type_size)
        wfac = T.Bind(fmt.group_factors(k, n, 8 * g))
        qs = fmt.group_quants(k, n, 8 * g, k.vnni)
        for t, acc in zip(rows, accs):
            a, off = acc[0]
            fac = wfac * k.xl[t, ramp(LANE_ACC * g, LANE_ACC)]
            T.buffer_store(a, fma(fac, _lane_sums(k, qs, t, 256 * g, LANE_ACC * g), a[ramp(off, LANE_ACC)]),
                           [ramp(off, LANE_ACC)])


def _single_rows(k, fmt, n, rows, accs):
    """The blocks of weight row n after its last full group of 8, one at a time (32-byte vectors, |w| x (x with
    w's sign)), each adding float(sum) * (d_w * d_x) to the row's 8-lane accumulator accs[row][0]."""
    with T.serial(k.n_blocks // 8 * 8, k.n_blocks) as b:
        w = T.Bind(fmt.quants(k, n, b, 1))
        zero = const(0, "int8", 32)
        aw = T.Bind(tirx.Select(w < zero, zero - w, w))
        dw = T.Bind(fmt.scales(k, n, b, 1))
        for t, acc in zip(rows, accs):
            a, off = acc[0]
            isum = dot_u8s8(None, aw, _sign(k.xq[t, ramp(32 * b, 32)], w, 32), 32)
            scv = tirx.Broadcast(dw * k.xd[t, b], 8)
            T.buffer_store(a, fma(tirx.Cast("float32x8", isum), scv, a[ramp(off, 8)]), [ramp(off, 8)])


def _sign(x, w, width):
    """x where w > 0, -x where w < 0, 0 where w = 0 (vpsignb on AVX2; AVX-512 has none for zmm: a masked negate,
    which LLVM makes of the select)."""
    if width == 32:
        return tirx.call_llvm_pure_intrin("int8x32", "llvm.x86.avx2.psign.b", x, w)
    zero = const(0, "int8", width)
    return tirx.Select(w < zero, zero - x, x)


def _lanes(k, fmt):
    if hasattr(fmt, "lane_quants"):
        return [LANE_ACC]
    if _kquant(k, fmt):
        return [_kquant_lanes(fmt)]
    if k.acts == "q8_0":
        return fmt.term_lanes(k.width)
    return [k.width // 4] * (k.unroll * 32 // (k.width // 4))


def _rows(k, fmt, n, rows, outs):
    """Zeroed accumulators for each row, the block loop, then y = the sum of the accumulators' lanes (in lane
    order on the float path; pairwise on the integer path, whose one accumulator per row is 8 or 16 lanes)."""
    if _kquant(k, fmt):
        acc = T.decl_buffer((len(rows) * _kquant_lanes(fmt),), "float32")
        _kquant_zero(k, fmt, acc, 0, len(rows))
        _kquant_rows(k, fmt, n, rows, acc, 0)
        paired = _kquant_paired(k, fmt, len(rows))
        for r, out in enumerate(outs):
            T.buffer_store(k.y, _kquant_out(k, fmt, acc, 0, r, r < paired), out)
        return
    lanes = _lanes(k, fmt)
    accs = []
    for _ in rows:
        acc = [T.decl_buffer((n_l,), "float32") for n_l in lanes]
        for a, n_l in zip(acc, lanes):
            T.buffer_store(a, const(0.0, "float32", n_l), [ramp(0, n_l)])
        accs.append(acc)
    if isinstance(fmt, Block32):
        _block32_rows(k, fmt, n, rows, accs)
        for acc, out in zip(accs, outs):
            T.buffer_store(k.y, hsum_pairwise(acc[0][ramp(0, lanes[0])], lanes[0]) +
                           hsum_pairwise(acc[1][ramp(0, lanes[1])], lanes[1]), out)
        return
    if k.acts == "q8":      # IQ4_XS (the K-quants are above)
        _lane_rows(k, fmt, n, rows, [[(acc[0], 0)] for acc in accs])
        for acc, out in zip(accs, outs):
            T.buffer_store(k.y, hsum_pairwise(acc[0][ramp(0, lanes[0])], lanes[0]), out)
        return
    _float_rows(k, fmt, n, rows, accs)
    for acc, out in zip(accs, outs):
        total = hsum(acc[0][ramp(0, lanes[0])])
        for a, n_l in zip(acc[1:], lanes[1:]):
            total = total + hsum(a[ramp(0, n_l)])
        T.buffer_store(k.y, total, out)


def _tile(k, fmt, nt, tile_n, N, count, group, row_of, out_of, wrow=lambda n: n):
    """Weight tile nt against `count` activation rows: full groups of `group` rows, then the rest in smaller
    groups (`_group_sizes`). row_of(i) / out_of(i, n): activation row / output index of the i-th
    row; wrow(n): the weight row."""
    def each_row(make):
        if _chunked(k, fmt) and _k_chunk(k, len(make())) < _chunk_units(k, fmt):
            return _int_tile_chunked(k, fmt, nt, tile_n, N, make, row_of, out_of, wrow)
        with T.serial(0, tile_n) as nn:
            with T.If(nt * tile_n + nn < N):
                with T.Then():
                    n = T.Bind(nt * tile_n + nn)
                    idx = make()
                    _rows(k, fmt, T.Bind(wrow(n)), [row_of(i) for i in idx], [out_of(i, n) for i in idx])

    start = 0
    for size in _group_sizes(group):
        n = (count - start) // size
        if not isinstance(n, int):
            n = T.Bind(n)
        with T.serial(0, n) as g:
            each_row(lambda: [start + g * size + r for r in range(size)])
        start = start + n * size


X_CHUNK_BYTES = 32 << 10    # int8 activation bytes of a row group that one pass over a tile's rows keeps in L1


def _chunked(k, fmt) -> bool:
    """Formats whose row groups go through K in chunks (`_int_tile_chunked`): the "q8" ones, the grouped "q8_0"."""
    return k.acts == "q8" or hasattr(fmt, "group_quants")


def _chunk_units(k, fmt) -> int:
    """What `_k_chunk` counts in K: blocks of 256, or groups of 8 blocks of 32."""
    return k.n_blocks // 8 if hasattr(fmt, "group_quants") else k.n_blocks


def _k_chunk(k, size: int) -> int:
    """Blocks per pass of `size` activation rows over a tile's weight rows (`_int_tile_chunked`)."""
    return max(1, X_CHUNK_BYTES // (size * k.unit_bytes))


def _int_tile_chunked(k, fmt, nt, tile_n, N, make, row_of, out_of, wrow):
    """A group of rows against the tile's weight rows, K in chunks of `_k_chunk` blocks (outer) so the group's
    activations stay in L1 while every weight row of the tile reads them: accumulators for the whole tile,
    zeroed, then the chunks, then the lane sums. Each output still adds its blocks in order: the same bits."""
    idx = make()
    grouped = hasattr(fmt, "group_quants")
    n_acc = _lanes(k, fmt)[0]
    cb, units = _k_chunk(k, len(idx)), _chunk_units(k, fmt)
    acc = T.decl_buffer((tile_n * len(idx) * n_acc,), "float32")
    acc1 = T.decl_buffer((tile_n * len(idx) * 8,), "float32") if grouped else None

    def per_row(body):
        with T.serial(0, tile_n) as nn:
            with T.If(nt * tile_n + nn < N):
                with T.Then():
                    body(nn, T.Bind(nt * tile_n + nn))

    def zero(nn, n):
        for r in range(len(idx)):
            T.buffer_store(acc, const(0.0, "float32", n_acc), [ramp((nn * len(idx) + r) * n_acc, n_acc)])
            if grouped:
                T.buffer_store(acc1, const(0.0, "float32", 8), [ramp((nn * len(idx) + r) * 8, 8)])

    kq = _kquant(k, fmt)
    per_row((lambda nn, n: _kquant_zero(k, fmt, acc, nn * len(idx) * n_acc, len(idx))) if kq else zero)
    rows_fn = _group_rows if grouped else _lane_rows
    with T.serial(0, -(-units // cb)) as c:
        chunk = (c * cb, tirx.min((c + 1) * cb, units))
        if kq:
            per_row(lambda nn, n: _kquant_rows(k, fmt, T.Bind(wrow(n)), [row_of(i) for i in idx], acc,
                                               nn * len(idx) * n_acc, chunk))
        else:
            per_row(lambda nn, n: rows_fn(k, fmt, T.Bind(wrow(n)), [row_of(i) for i in idx],
                                          [[(acc, (nn * len(idx) + r) * n_acc)] for r in range(len(idx))], chunk))
    paired = _kquant_paired(k, fmt, len(idx)) if kq else 0
    if grouped:
        per_row(lambda nn, n: _single_rows(k, fmt, T.Bind(wrow(n)), [row_of(i) for i in idx],
                                           [[(acc1, (nn * len(idx) + r) * 8)] for r in range(len(idx))]))

    def store(nn, n):
        for r, i in enumerate(idx):
            if kq:
                y = _kquant_out(k, fmt, acc, nn * len(idx) * n_acc, r, r < paired)
            else:
                y = hsum_pairwise(acc[ramp((nn * len(idx) + r) * n_acc, n_acc)], n_acc)
            if grouped:      # the same sum as _rows: groups, then the blocks after them
                y = y + hsum_pairwise(acc1[ramp((nn * len(idx) + r) * 8, 8)], 8)
            T.buffer_store(k.y, y, out_of(i, n))

    per_row(store)


def _group_sizes(group: int) -> list[int]:
    """The group sizes a tile's rows go through: `group`, then the powers of two below it and 3, down to 1 (the
    rows left over from the larger groups, greedily), so a verify of a few rows still shares each tile pass: 3
    rows (2 drafts) as one group, not 2 + 1 (which decodes each weight block twice)."""
    below = {1 << i for i in range(group.bit_length()) if 1 << i < group} | ({3} if group > 3 else set())
    return [group] + sorted(below, reverse=True)


@contextmanager
def _kernel(name: str, kind: str, lead: tuple, K: int, rows, knobs: Knobs, vnni: bool, exact: bool,
            weights=("w",)):
    """The prologue of every x86 matmul kernel: the format and `_Kern`, the PrimFunc named `name`, the row count
    Tr (`rows`, or a symbolic T), and the weight arguments `weights` of shape `lead` + the row's bytes (or
    elements). Yields (fmt, k, Tr, [weight args]); the caller binds the other arguments and writes the body
    inside, and finds the PrimFunc in k.func after the block. k.n_tiles: tiles of `tile_n` rows of the last
    `lead` dimension."""
    fmt, k = _new(kind, K, knobs, vnni, exact)
    k.n_tiles = -(-lead[-1] // knobs.tile_n)
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name(name)
            T.func_attr({"global_symbol": name, "tirx.noalias": True, "tirx.is_scheduled": True})
            Tr = tirx.Var("T", "int64") if rows is None else rows
            shape, dtype = weight_arg(kind, lead, K)
            yield fmt, k, Tr, [T.arg(w, T.buffer(shape, dtype, align=32)) for w in weights]
    k.func = ib.get()


def matmul(kind: str, N: int, K: int, rows: int | None = None, knobs: Knobs = Knobs(), name: str = "matmul",
           vnni: bool = False, exact: bool = False):
    """y float32 [T, N] = x [T, K] · w [N, K]ᵀ for a weight of format `kind` (arguments: w, act_args..., y).
    `rows`: a static row count (the one-row entry points), or None for a symbolic T. `vnni`: the target has
    VNNI at this vector width (`has_vnni`; the same bits either way, see vec.dot_u8s8). `exact`: float32
    activation rows for a kind that also has an integer path (Q8_0, IQ4_NL, MXFP4)."""
    with _kernel(name, kind, (N,), K, rows, knobs, vnni, exact) as (fmt, k, Tr, (w,)):
        _bind_acts(k, kind, Tr, K)
        k.y = T.arg("y", T.buffer((Tr, N), "float32", align=32))
        with T.sblock("root"):   # the form Relax passes expect of a PrimFunc body
            k.w = T.decl_buffer((N, k.row_bytes), "uint8", data=w.data, align=32)
            _views(k, w.data, N * k.row_bytes)
            with T.parallel(0, k.n_tiles) as nt:
                _tile(k, fmt, nt, knobs.tile_n, N, Tr, knobs.row_group, lambda i: i, lambda i, n: [i, n])
    return k.func


def _counter():
    b = T.decl_buffer((1,), "int32")
    T.buffer_store(b, const(0, "int32"), [0])
    return b


def matmul_id(kind: str, X: int, N: int, K: int, n_used: int, shared_x: bool, n_weights: int = 1,
              rows: int | None = None, knobs: Knobs = Knobs(), name: str = "matmul_id", vnni: bool = False,
              exact: bool = False):
    """Routed experts: for each of `n_weights` weights w_i [X, N, K] of format `kind` (e.g. an expert FFN's gate
    and up: one pass, x read once for both), y_i float32 [T, n_used, N] with
    y_i[t, j] = w_i[ids[t, j]] · x[t] (`shared_x`) or · x[t * n_used + j]. Arguments: w_0.., act_args...,
    ids int32 [T, n_used], y_0... Expert ids outside [0, X) select nothing (their outputs are left as they are).
    `exact`: as in `matmul`."""
    weights = [f"w{i}" for i in range(n_weights)]
    with _kernel(name, kind, (X, N), K, rows, knobs, vnni, exact, weights) as (fmt, k, Tr, ws):
        _bind_acts(k, kind, Tr if shared_x else Tr * n_used, K)
        ids = T.arg("ids", T.buffer((Tr, n_used), "int32", align=32))
        ys = [T.arg(f"y{i}", T.buffer((Tr, n_used, N), "float32", align=32)) for i in range(n_weights)]
        with T.sblock("root"):
            P = Tr * n_used
            pairs_e = T.decl_buffer((P,), "int32", data=ids.data)
            w2 = [T.decl_buffer((X * N, k.row_bytes), "uint8", data=w.data, align=32) for w in ws]
            y2 = [T.decl_buffer((P, N), "float32", data=y.data, align=32) for y in ys]
            # group the pairs p = t * n_used + j by expert: counts, start offsets, the experts used, the pairs in
            # expert order (stable)
            cnt, start, used = (T.decl_buffer((X,), "int32") for _ in range(3))
            order = T.decl_buffer((P,), "int32")
            n_used_experts, total = _counter(), _counter()
            with T.serial(0, X) as e:
                T.buffer_store(cnt, const(0, "int32"), [e])
            with T.serial(0, P) as p:
                e = T.Bind(pairs_e[p])
                with T.If(tirx.all(e >= 0, e < X)):
                    with T.Then():
                        T.buffer_store(cnt, cnt[e] + 1, [e])
            with T.serial(0, X) as e:
                T.buffer_store(start, total[0], [e])
                T.buffer_store(total, total[0] + cnt[e], [0])
                with T.If(cnt[e] > 0):
                    with T.Then():
                        T.buffer_store(used, tirx.Cast("int32", e), [n_used_experts[0]])
                        T.buffer_store(n_used_experts, n_used_experts[0] + 1, [0])
                T.buffer_store(cnt, const(0, "int32"), [e])     # counted again below, as the fill position
            with T.serial(0, P) as p:
                e = T.Bind(pairs_e[p])
                with T.If(tirx.all(e >= 0, e < X)):
                    with T.Then():
                        T.buffer_store(order, tirx.Cast("int32", p), [start[e] + cnt[e]])
                        T.buffer_store(cnt, cnt[e] + 1, [e])
            views = []
            for w in w2:
                _views(k, w.data, X * N * k.row_bytes)
                views.append((k.w8, k.w16, k.w16u, k.w32, k.w32f))
            with T.parallel(0, T.Bind(n_used_experts[0] * k.n_tiles)) as it:
                e = T.Bind(used[it // k.n_tiles])
                nt = T.Bind(it % k.n_tiles)
                base, count = T.Bind(start[e]), T.Bind(cnt[e])
                pair = lambda i: order[base + i]   # noqa: E731
                row_of = (lambda i: pair(i) // n_used) if shared_x else pair
                for w, v, y in zip(w2, views, y2):
                    k.w, (k.w8, k.w16, k.w16u, k.w32, k.w32f), k.y = w, v, y
                    _tile(k, fmt, nt, knobs.tile_n, N, count, knobs.row_group, row_of, lambda i, n: [pair(i), n],
                          wrow=lambda n: e * N + n)
    return k.func
