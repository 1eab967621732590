"""The loop nest of an x86 matmul kernel inside one work item: a tile of weight rows against the activation rows in
groups (`tile`), a row group's accumulators and their sums (`_rows`), or for the integer formats K in chunks so a
group's activations stay in L1 (`_int_tile_chunked`). The row loops themselves are per format (kquant.py,
lanes.py, floats.py)."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from .codebook import Codebook
from .codebook_rows import codebook_rows
from .floats import float_rows
from .formats import Block32
from .kquant import kquant, kquant_lanes, kquant_out, kquant_pair_terms, kquant_paired, kquant_rows, kquant_zero
from .lanes import LANE_ACC, group_rows, lane_rows, multi_row, scaled, single_rows
from .vec import const, hsum, hsum_pairwise, ramp


def acc_lanes(k, fmt):
    if isinstance(fmt, Codebook):
        return [8]
    if hasattr(fmt, "lane_quants"):
        return [8 if scaled(k, fmt) else LANE_ACC]
    if kquant(k, fmt):
        return [kquant_lanes(k, fmt)]
    if k.acts == "q8_0":
        return fmt.term_lanes(k.width)
    return [k.width // 4] * (k.unroll * 32 // (k.width // 4))


def _rows(k, fmt, ns, rows, outs, pair_terms=None):
    """Zeroed accumulators for each (weight row of `ns`, activation row), the block loop, then y = the sum of the
    accumulators' lanes (in lane order on the float path; pairwise on the integer path, whose one accumulator per
    row is 8 or 16 lanes). ns: one weight row, or a register block of them (`w_rows`); outs[j][r]: the output
    index of weight row ns[j] and activation row rows[r]; pair_terms: the K-quants' per-tile activation terms
    (`kquant_pair_terms`)."""
    if kquant(k, fmt):
        (n,), (outs,) = ns, outs
        acc = T.decl_buffer((len(rows) * kquant_lanes(k, fmt),), "float32")
        kquant_zero(k, fmt, acc, 0, len(rows))
        kquant_rows(k, fmt, n, rows, acc, 0, pair_terms=pair_terms)
        paired = kquant_paired(k, fmt, len(rows))
        for r, out in enumerate(outs):
            T.buffer_store(k.y, kquant_out(k, fmt, acc, 0, r, r < paired), out)
        return
    lanes = acc_lanes(k, fmt)
    accs = []
    for _n in ns:
        per = []
        for _ in rows:
            acc = [T.decl_buffer((n_l,), "float32") for n_l in lanes]
            for a, n_l in zip(acc, lanes):
                T.buffer_store(a, const(0.0, "float32", n_l), [ramp(0, n_l)])
            per.append(acc)
        accs.append(per)
    if isinstance(fmt, Block32):     # groups of 8 blocks in IQ4_XS's lane order ("q8_0_g8" rows), then single blocks
        group_rows(k, fmt, ns, rows, [[(acc[0], 0) for acc in per] for per in accs])
        single_rows(k, fmt, ns, rows, [[(acc[1], 0) for acc in per] for per in accs])
        for per, o in zip(accs, outs):
            for acc, out in zip(per, o):
                T.buffer_store(k.y, hsum_pairwise(acc[0][ramp(0, lanes[0])], lanes[0]) +
                               hsum_pairwise(acc[1][ramp(0, lanes[1])], lanes[1]), out)
        return
    if k.acts == "q8":      # IQ4_XS and the codebook formats (the K-quants are above)
        (codebook_rows if isinstance(fmt, Codebook) else lane_rows)(
            k, fmt, ns, rows, [[(acc[0], 0) for acc in per] for per in accs])
        for per, o in zip(accs, outs):
            for acc, out in zip(per, o):
                T.buffer_store(k.y, hsum_pairwise(acc[0][ramp(0, lanes[0])], lanes[0]), out)
        return
    (n,), (accs,), (outs,) = ns, accs, outs
    float_rows(k, fmt, n, rows, accs)
    for acc, out in zip(accs, outs):
        total = hsum(acc[0][ramp(0, lanes[0])])
        for a, n_l in zip(acc[1:], lanes[1:]):
            total = total + hsum(a[ramp(0, n_l)])
        T.buffer_store(k.y, total, out)


def w_rows(k, fmt) -> int:
    """Weight rows per register block (Knobs.w_rows) for the row functions that take several, each activation
    vector load serving all of them (lanes.py: IQ4_XS, the grouped Q8_0 / IQ4_NL / MXFP4); 1 for the others."""
    return k.w_rows if multi_row(fmt) else 1


def tile_rows(k, fmt, nt, tile_n, N, body, W=None):
    """body(nns, ns) for weight tile nt's rows: nns their indices in the tile, ns = nt * tile_n + nns, in register
    blocks of W (default `w_rows`) where all of a block's rows are < N, else (the matrix's last rows, a tile_n
    that W does not divide) one at a time."""
    W = w_rows(k, fmt) if W is None else W

    def single(nn):
        with T.If(nt * tile_n + nn < N):
            with T.Then():
                body([nn], [T.Bind(nt * tile_n + nn)])

    if W == 1:
        with T.serial(0, tile_n) as nn:
            single(nn)
        return
    with T.serial(0, tile_n // W) as j:
        with T.If(nt * tile_n + W * j + (W - 1) < N):
            with T.Then():
                n0 = T.Bind(nt * tile_n + W * j)
                body([W * j + i for i in range(W)], [n0 + i for i in range(W)])
            with T.Else():
                with T.serial(0, W) as i:
                    single(W * j + i)
    if tile_n % W:
        with T.serial(tile_n // W * W, tile_n) as nn:
            single(nn)


def tile(k, fmt, nt, tile_n, N, count, group, row_of, out_of, wrow=lambda n: n):
    """Weight tile nt against `count` activation rows: full groups of `group` rows, then the rest in smaller
    groups (`group_sizes`), the tile's weight rows in register blocks (`tile_rows`). row_of(i) / out_of(i, n):
    activation row / output index of the i-th row; wrow(n): the weight row."""
    def each_row(make):
        if _chunked(k, fmt) and _units_in(k, len(make()), X_FIT_BYTES) < _chunk_units(k, fmt):
            return _int_tile_chunked(k, fmt, nt, tile_n, N, make, row_of, out_of, wrow)
        idx = make()
        pt = kquant_pair_terms(k, fmt, [row_of(i) for i in idx]) if kquant(k, fmt) else None

        def body(_nns, ns):
            _rows(k, fmt, [T.Bind(wrow(n)) for n in ns], [row_of(i) for i in idx],
                  [[out_of(i, n) for i in idx] for n in ns], pt)
        tile_rows(k, fmt, nt, tile_n, N, body)

    start = 0
    for size in group_sizes(group):
        n = (count - start) // size
        if not isinstance(n, int):
            n = T.Bind(n)
        with T.serial(0, n) as g:
            each_row(lambda: [start + g * size + r for r in range(size)])
        start = start + n * size


# A row group whose int8 activations fit X_FIT_BYTES (the 32 KB L1) reads K whole; a larger one goes through K in
# chunks of X_CHUNK_BYTES, half of L1: chunks that filled all of it left no room for the weight lines streaming past
# and the tile's accumulators (bench/x86_rows.py on Zen 4, 2 threads, K = 10944 / 12288: 3-8 rows 1.1-1.2x faster in
# 16 KB chunks than in 32 KB ones; unchunked at 36-49 KB was slower still)
X_CHUNK_BYTES = 16 << 10
X_FIT_BYTES = 32 << 10


def _chunked(k, fmt) -> bool:
    """Formats whose row groups go through K in chunks (`_int_tile_chunked`): the "q8" ones, the grouped "q8_0"."""
    return k.acts == "q8" or hasattr(fmt, "group_quants")


def _chunk_units(k, fmt) -> int:
    """What `_units_in` counts in K: blocks of 256, or groups of 8 blocks of 32."""
    return k.n_blocks // 8 if hasattr(fmt, "group_quants") else k.n_blocks


def _units_in(k, size: int, nbytes: int) -> int:
    """Units of K (`_chunk_units`) whose int8 activations of `size` rows fit `nbytes` (at least one): against
    X_FIT_BYTES whether a group reads K whole, against X_CHUNK_BYTES the units per pass (`_int_tile_chunked`)."""
    return max(1, nbytes // (size * k.unit_bytes))


def _int_tile_chunked(k, fmt, nt, tile_n, N, make, row_of, out_of, wrow):
    """A group of rows against the tile's weight rows, K in chunks of `_units_in(.., X_CHUNK_BYTES)` units (outer)
    so the group's activations stay in L1 while every weight row of the tile reads them: accumulators for the
    whole tile, zeroed, then the chunks, then the lane sums. Each output still adds its blocks in order: the same
    bits."""
    idx = make()
    grouped = hasattr(fmt, "group_quants")
    n_acc = acc_lanes(k, fmt)[0]
    cb, units = _units_in(k, len(idx), X_CHUNK_BYTES), _chunk_units(k, fmt)
    acc = T.decl_buffer((tile_n * len(idx) * n_acc,), "float32")
    acc1 = T.decl_buffer((tile_n * len(idx) * 8,), "float32") if grouped else None

    def per_row(body):
        tile_rows(k, fmt, nt, tile_n, N, lambda nns, ns: body(nns[0], ns[0]), 1)

    def per_block(body):     # body(nns, weight rows): a register block of the tile's rows (`tile_rows`)
        tile_rows(k, fmt, nt, tile_n, N, lambda nns, ns: body(nns, [T.Bind(wrow(n)) for n in ns]))

    def zero(nn, n):
        for r in range(len(idx)):
            T.buffer_store(acc, const(0.0, "float32", n_acc), [ramp((nn * len(idx) + r) * n_acc, n_acc)])
            if grouped:
                T.buffer_store(acc1, const(0.0, "float32", 8), [ramp((nn * len(idx) + r) * 8, 8)])

    kq = kquant(k, fmt)
    per_row((lambda nn, n: kquant_zero(k, fmt, acc, nn * len(idx) * n_acc, len(idx))) if kq else zero)
    pt = kquant_pair_terms(k, fmt, [row_of(i) for i in idx]) if kq else None
    rows_fn = group_rows if grouped else codebook_rows if isinstance(fmt, Codebook) else lane_rows
    # a pass reads one chunk of each row: the K-quants prefetch the same chunk of a row as far ahead (whole rows),
    # not the bytes right after (the rest of this row and the start of the next, which this pass does not read)
    ahead = -(-k.prefetch // k.row_bytes) * k.row_bytes
    with T.serial(0, -(-units // cb)) as c:
        chunk = (c * cb, tirx.min((c + 1) * cb, units))
        if kq:
            per_row(lambda nn, n: kquant_rows(k, fmt, T.Bind(wrow(n)), [row_of(i) for i in idx], acc,
                                              nn * len(idx) * n_acc, chunk, pt, ahead))
        else:
            per_block(lambda nns, ns: rows_fn(k, fmt, ns, [row_of(i) for i in idx], [
                [(acc, (nn * len(idx) + r) * n_acc) for r in range(len(idx))] for nn in nns], chunk))
    paired = kquant_paired(k, fmt, len(idx)) if kq else 0
    if grouped:
        per_block(lambda nns, ns: single_rows(k, fmt, ns, [row_of(i) for i in idx], [
            [(acc1, (nn * len(idx) + r) * 8) for r in range(len(idx))] for nn in nns]))

    def store(nn, n):
        for r, i in enumerate(idx):
            if kq:
                y = kquant_out(k, fmt, acc, nn * len(idx) * n_acc, r, r < paired)
            else:
                y = hsum_pairwise(acc[ramp((nn * len(idx) + r) * n_acc, n_acc)], n_acc)
            if grouped:      # the same sum as _rows: groups, then the blocks after them
                y = y + hsum_pairwise(acc1[ramp((nn * len(idx) + r) * 8, 8)], 8)
            T.buffer_store(k.y, y, out_of(i, n))

    per_row(store)


def group_sizes(group: int) -> list[int]:
    """The group sizes a tile's rows go through: `group`, then the powers of two below it and 3, down to 1 (the
    rows left over from the larger groups, greedily), so a verify of a few rows still shares each tile pass: 3
    rows (2 drafts) as one group, not 2 + 1 (which decodes each weight block twice)."""
    below = {1 << i for i in range(group.bit_length()) if 1 << i < group} | ({3} if group > 3 else set())
    return [group] + sorted(below, reverse=True)
