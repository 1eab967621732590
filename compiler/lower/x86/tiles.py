"""The loop nest of an x86 matmul kernel inside one work item: a tile of weight rows against the activation rows in
groups (`tile`), a row group against weight rows with K whole (RowPath.rows), or for the integer formats K in
chunks so a group's activations stay in L1 (`_int_tile_chunked`). What a format does inside is its path's
(`fmt.path`, kernel.RowPath: kquant.py, lanes.py, block32.py, codebook.py, floats.py); nothing here asks which
format it is."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T


def w_rows(kern, fmt) -> int:
    """Weight rows per register block (Knobs.w_rows) for the row functions that take several, each activation
    vector load serving all of them (lanes.py: IQ4_XS, the grouped Q8_0 / IQ4_NL / MXFP4; kquant.py: the K-quants);
    1 for the others."""
    return kern.w_rows if fmt.path.multi_row else 1


def tile_rows(kern, fmt, nt, tile_n, N, body, W=None):
    """body(nns, ns) for weight tile nt's rows: nns their indices in the tile, ns = nt * tile_n + nns, in register
    blocks of W (default `w_rows`) where all of a block's rows are < N, else (the matrix's last rows, a tile_n
    that W does not divide) one at a time."""
    W = w_rows(kern, fmt) if W is None else W

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


def tile(kern, fmt, nt, tile_n, N, count, group, row_of, out_of, wrow=lambda n: n):
    """Weight tile nt against `count` activation rows: full groups of `group` rows, then the rest in smaller
    groups (`group_sizes`: one group up to 8 rows), the tile's weight rows in register blocks (`tile_rows`).
    row_of(i) / out_of(i, n): activation row / output index of the i-th row; wrow(n): the weight row."""
    def each_row(make):
        if fmt.path.unit_blocks and _units_in(kern, len(make()), kern.fit_bytes) < _chunk_units(kern, fmt):
            return _int_tile_chunked(kern, fmt, nt, tile_n, N, make, row_of, out_of, wrow)
        idx = make()
        pt = fmt.path.tile_terms(kern, fmt, [row_of(i) for i in idx])

        def body(_nns, ns):
            fmt.path.rows(kern, fmt, [T.Bind(wrow(n)) for n in ns], [row_of(i) for i in idx],
                  [[out_of(i, n) for i in idx] for n in ns], pt)
        tile_rows(kern, fmt, nt, tile_n, N, body)

    # full groups, then the rest (< group rows) by its value: one branch per value, each its greedy split
    # (`group_sizes`); a chain of greedy loops would nest each size's start in the next one's, an expression that
    # doubles per size once the simplifier substitutes the bound values (minutes of compile at 8 sizes)
    sizes = group_sizes(group)
    n_full = count // group if isinstance(count, int) else T.Bind(count // group)
    with T.serial(0, n_full) as g:
        each_row(lambda: [g * group + r for r in range(group)])
    base = n_full * group if isinstance(count, int) else T.Bind(n_full * group)
    rest = count - base if isinstance(count, int) else T.Bind(count - base)
    for v in range(1, group):
        def split(v=v):
            off = 0
            for size in _greedy(v, sizes[1:]):
                each_row(lambda off=off, size=size: [base + off + r for r in range(size)])
                off += size
        if isinstance(rest, int):
            if rest == v:
                split()
            continue
        with T.If(rest == v):
            with T.Then():
                split()


def _greedy(v: int, sizes: list[int]) -> list[int]:
    """v rows as groups of `sizes` (descending, ending in 1), largest first."""
    out = []
    for size in sizes:
        out += [size] * (v // size)
        v %= size
    return out


# A row group whose int8 activations fit kern.fit_bytes (Knobs.fit_kb: the L1 data cache, twice it on AVX2,
# x86.default_knobs) reads K whole; a larger one goes through K in chunks of X_CHUNK_BYTES: chunks that filled all
# of a 32 KB L1 left no room for the weight lines streaming past and the tile's accumulators (16 KB chunks beat
# 32 KB ones, bench/x86_rows.py), while rows that fit the L1 lose to chunking (bench/verify_rows.py on a 48 KB L1;
# both measured in docs/performance.md), and on AVX2 so do 2-3 verify rows that fit twice the L1.
X_CHUNK_BYTES = 16 << 10


def _chunk_units(kern, fmt) -> int:
    """What `_units_in` counts in K: units of the path's `unit_blocks` blocks (of 256, or groups of 8 of 32)."""
    return kern.n_blocks // fmt.path.unit_blocks


def _units_in(kern, size: int, nbytes: int) -> int:
    """Units of K (`_chunk_units`) whose int8 activations of `size` rows fit `nbytes` (at least one): against
    kern.fit_bytes whether a group reads K whole, against X_CHUNK_BYTES the units per pass (`_int_tile_chunked`)."""
    return max(1, nbytes // (size * kern.unit_bytes))


def _int_tile_chunked(kern, fmt, nt, tile_n, N, make, row_of, out_of, wrow):
    """A group of rows against the tile's weight rows, K in chunks of `_units_in(.., X_CHUNK_BYTES)` units (outer)
    so the group's activations stay in L1 while every weight row of the tile reads them: accumulators for the
    whole tile (RowPath.chunk_accs), zeroed, then the chunks (chunk_pass), what follows them (chunk_finish), then
    the results (chunk_out). Each output still adds its blocks in order: the same bits."""
    idx = make()
    path = fmt.path
    cb, units = _units_in(kern, len(idx), X_CHUNK_BYTES), _chunk_units(kern, fmt)
    accs = path.chunk_accs(kern, fmt, tile_n, len(idx))

    def per_row(body):
        tile_rows(kern, fmt, nt, tile_n, N, lambda nns, ns: body(nns[0], ns[0]), 1)

    def per_block(body):     # body(nns, weight rows): a register block of the tile's rows (`tile_rows`)
        tile_rows(kern, fmt, nt, tile_n, N, lambda nns, ns: body(nns, [T.Bind(wrow(n)) for n in ns]))

    per_row(lambda nn, n: path.chunk_zero(kern, fmt, accs, nn, len(idx)))
    rows = [row_of(i) for i in idx]
    terms = path.tile_terms(kern, fmt, rows)
    # a pass reads one chunk of each row: the K-quants prefetch the same chunk of a row as far ahead (whole rows),
    # not the bytes right after (the rest of this row and the start of the next, which this pass does not read)
    ahead = -(-kern.prefetch // kern.row_bytes) * kern.row_bytes
    with T.serial(0, -(-units // cb)) as c:
        chunk = (c * cb, tirx.min((c + 1) * cb, units))
        per_block(lambda nns, ns: path.chunk_pass(kern, fmt, nns, ns, rows, accs, chunk, terms, ahead))
    path.chunk_finish(kern, fmt, per_block, rows, accs)

    def store(nn, n):
        for r, i in enumerate(idx):
            T.buffer_store(kern.y, path.chunk_out(kern, fmt, accs, nn, r, len(idx)), out_of(i, n))

    per_row(store)


# A verify of up to this many rows (n_max 7) goes through the weight as one row group (`group_sizes`)
ONE_PASS_ROWS = 8


def group_sizes(group: int) -> list[int]:
    """The group sizes a tile's rows go through: `group`, then every size below it up to ONE_PASS_ROWS, down to 1
    (the rows left over from the larger groups, greedily), so a verify of up to ONE_PASS_ROWS rows (n_max 7) that
    `group` covers decodes each weight block once: 5 rows as one group, not 4 + 1 (a second pass over the weight,
    bench/verify_rows.py). Each size is one more body in a row-count kernel (`tile`: one branch per rest)."""
    return [group] + list(range(min(group - 1, ONE_PASS_ROWS), 0, -1))
