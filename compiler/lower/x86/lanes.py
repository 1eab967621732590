"""IQ4_XS on "q8_iq4xs" activation rows: int32 lanes that keep one sub-block across a block's vectors. Per block
and row: 16 exact lane sums, converted once, one FMA (`lane_rows`); at 32-byte width ggml's AVX2 sequence
(`scaled_rows`). The lane machinery (`lane_vectors`, `_lane_fmas`) also serves block32.py's groups of 8 blocks."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from .kernel import Format, SumPath, concat, prefetch
from .vec import abs_i8, byte_vector, const, dot_u8s8, f16, fma, pshufb, ramp, sign, u8


KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)   # kvalues_iq4nl


class LanesPath(SumPath):
    """`lane_rows`: a register block of weight rows (Knobs.w_rows, 2 by default for the dense row-count kernels
    at 64 bytes: x86.default_knobs) against a row group, 16 float lanes per row (8 at 32 bytes, `scaled_rows`)."""
    multi_row = True
    w_rows_dense = 2

    def acc_lanes(self, kern, fmt):
        return [8 if kern.width == 32 else LANE_ACC]

    def row_loop(self, kern, fmt, ns, rows, accs, blocks=None):
        lane_rows(kern, fmt, ns, rows, accs, blocks)


class IQ4XS(Format):
    """IQ4_XS (136 B): d f16 | scales_h u16 | scales_l[4] | qs[128]: w = d*(ls - 32)*kvalues[q] per 32 weights,
    ls = 4 bits of scales_l | 2 bits of scales_h << 4; the table lookup is a byte shuffle (pshufb).

    Its activation rows are "q8" rows in the order the nibbles unpack to ("q8_iq4xs", activation.IQ4XS_ORDER):
    a block is four vectors of 64 quants in which int32 lane L always holds sub-block L // 4 + 4 * (L % 4 // 2),
    so a row's four products (`lane_quants`) accumulate in one int32 vector and the sub-block scales enter once
    per block, as float factors per lane (`lane_factors`). With VNNI the quants are unsigned, kvalues + 128, for
    one vpdpbusd per vector and row (no sign moved onto x); the row's xc starts the sum at -128 x its lane sums,
    so the lanes are the exact signed sums either way (lanes.lane_rows)."""
    path = LanesPath()
    block, type_size, acts = 256, 136, "q8"
    layout = "q8_iq4xs"

    def _ls(self, kern, n, s):
        """(byte offset of block s of row n, int32 x 8: ls - 32 of its sub-blocks)."""
        b = T.Bind(n * kern.row_bytes + s * 136)
        sl = tirx.Broadcast(kern.w32[b // 4 + 1], 8)
        sh = tirx.Broadcast(tirx.Cast("uint32", kern.w16u[b // 2 + 1]), 8)
        lo = (sl >> tirx.Ramp(const(0, "uint32"), const(4, "uint32"), 8)) & const(15, "uint32", 8)
        hi = (sh >> tirx.Ramp(const(0, "uint32"), const(2, "uint32"), 8)) & const(3, "uint32", 8)
        return b, tirx.Cast("int32x8", lo | (hi << const(4, "uint32", 8))) - const(32, "int32", 8)

    def lane_factors(self, kern, n, s):
        """float32 x 16: d * (ls - 32) of each int32 lane's sub-block (exact: 11 x 6 significant bits)."""
        b, ls = self._ls(kern, n, s)
        dls = tirx.Cast("float32x8", ls) * tirx.Broadcast(f16(kern.w16, b // 2), 8)
        return tirx.Shuffle([dls, dls], LANE_BLOCK)

    def _raw(self, kern, n, s):
        """Block s's qs[128] of row n as two uint8 x 64 (the `raw` of `lane_vectors`)."""
        return [T.Bind(kern.w[n, ramp(s * 136 + 8 + 64 * h, 64)]) for h in range(2)]

    def lane_quants(self, kern, n, s, vnni):
        """The block's four vectors of 64 quants in activation.IQ4XS_ORDER (`lane_vectors`)."""
        return lane_vectors(self._raw(kern, n, s), KVALUES, lambda idx: idx < u8(8, 64), vnni, kern.width)

    def signed_quants(self, kern, n, s):
        """The four vectors of `lane_quants` as (u8 |q|, q's bytes), for lanes.scaled_rows (vpsignb by q)."""
        return lane_vectors(self._raw(kern, n, s), KVALUES, None, False, kern.width, signed=True)

    def lane_scales(self, kern, n, s):
        """(float32 d, [int16 x 16] x 2): for lanes.scaled_rows, the block's d and for each 32-byte half of its
        64-byte vectors the pmaddwd weights: ls - 32 of the sub-block of each int16 lane's int32 lane."""
        b, ls = self._ls(kern, n, s)
        ls16 = T.Bind(tirx.Cast("int16x8", ls))
        halves = [T.Bind(tirx.Shuffle([ls16, ls16], [LANE_BLOCK[8 * h + m // 2] for m in range(16)]))
                  for h in range(2)]
        return T.Bind(f16(kern.w16, b // 2)), halves


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
    nib = [[r & u8(15, 64) for r in raw], [h & u8(15, 64) for h in hi]]
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



LANE_ACC = 16   # int32 lanes of a block's sum in lane_rows (at either width: the same bits from AVX2 and AVX-512)


def scaled_rows(kern, fmt, ns, rows, accs, blocks=None):
    """`lane_rows` at 32-byte width, as ggml's AVX2 ggml_vec_dot_iq4_xs_q8_K: per (weight row, activation row)
    and 32 bytes, the weight's sign moved onto x (vpsignb), |q| x that (pmaddubsw: |pair| <= 2 x 127 x 127), the
    sub-block scales ls - 32 as pmaddwd's weights (`fmt.lane_scales`; every lane of a 32-byte half keeps its
    sub-block, LANE_BLOCK), all in one int32 x 8 (exact: below 2^23), then per block one conversion and one FMA
    by d x the row's scale. About half the instructions per row of `_lane_sums`' select and float lanes
    (16 registers: two float vectors per row spilled at 8 rows)."""
    with T.serial(*(blocks or (0, kern.n_blocks))) as s:
        ws = []
        for n in ns:
            prefetch(kern, n, s * fmt.type_size, fmt.type_size)
            d, scs = fmt.lane_scales(kern, n, s)
            ws.append((d, scs, fmt.signed_quants(kern, n, s)))
        for r, t in enumerate(rows):
            for (d, scs, qs), acc in zip(ws, accs):
                total = None
                for c, (aq, q) in enumerate(qs):
                    for h in range(2):
                        half = list(range(32 * h, 32 * h + 32))
                        x = kern.xq[t, ramp(256 * s + 64 * c + 32 * h, 32)]
                        xs = sign(x, tirx.reinterpret("int8x32", tirx.Shuffle([q], half)), 32)
                        v = dot_u8s8(None, tirx.Shuffle([aq], half), xs, 32, scs[h])
                        total = v if total is None else total + v
                a, off = acc[r]
                T.buffer_store(a, fma(tirx.Broadcast(d * kern.xd[t, s], 8), tirx.Cast("float32x8", total),
                                      a[ramp(off, 8)]), [ramp(off, 8)])


def lane_rows(kern, fmt, ns, rows, accs, blocks=None):
    """Weight rows `ns` (one, or a register block of Knobs.w_rows: tiles.py) against "q8" rows for a format whose
    int32 lanes keep one sub-block across a block's vectors (`IQ4XS`; accs[j][r]: the (float32 buffer, lane
    offset) of weight row ns[j] and activation row rows[r]): per block, each weight row's quants and factors, then
    per activation row its four 64-byte vectors loaded once for all the weight rows, and per (weight row,
    activation row) 16 exact int32 lane sums (VNNI: one vpdpbusd per vector of the unsigned quants, from the
    row's xc lane offsets; else |q| x (x with q's sign) by pmaddubsw + pmaddwd, the same integers), converted
    once, then one FMA: acc += (weight factors per lane x the row's scale) * sums. Every (weight row, activation
    row) runs that sequence whatever the block: the same bits for any w_rows and row count. 64 // width vectors
    per 64 bytes at 32-byte width; IQ4_XS there goes through `scaled_rows`."""
    if kern.width == 32:     # the same bits from every AVX2 machine, VNNI or not
        return scaled_rows(kern, fmt, ns, rows, accs, blocks)
    with T.serial(*(blocks or (0, kern.n_blocks))) as s:
        ws = []
        for n in ns:
            prefetch(kern, n, s * fmt.type_size, fmt.type_size)
            ws.append((T.Bind(fmt.lane_factors(kern, n, s)), fmt.lane_quants(kern, n, s, kern.vnni)))
        _lane_fmas(kern, ws, rows, accs, 256 * s, LANE_ACC * s, lambda t: tirx.Broadcast(kern.xd[t, s], LANE_ACC))


def _lane_fmas(kern, ws, rows, accs, x_at, c_at, row_scale):
    """acc[j][r] += (ws[j]'s factors x row_scale(t)) * the lane sums of ws[j]'s quants with row t = rows[r], the
    row's vectors loaded once for every weight row (lane_rows, group_rows)."""
    for r, t in enumerate(rows):
        xs = _row_vectors(kern, t, x_at, len(ws) > 1)
        xsc = row_scale(t) if len(ws) == 1 else T.Bind(row_scale(t))
        for (wfac, qs), acc in zip(ws, accs):
            a, off = acc[r]
            T.buffer_store(a, fma(wfac * xsc, _lane_sums(kern, qs, xs, t, c_at), a[ramp(off, LANE_ACC)]),
                           [ramp(off, LANE_ACC)])


def _row_vectors(kern, t, x_at, shared):
    """Row t's 256 activation values from xq[t, x_at], as the `width`-byte vectors `_lane_sums` takes (bound
    once when `shared`, so a register block of weight rows reads them once)."""
    W = kern.width
    xs = [kern.xq[t, ramp(x_at + 64 * c + h * W, W)] for c in range(4) for h in range(64 // W)]
    return [T.Bind(x) for x in xs] if shared else xs


def _lane_sums(kern, qs, xs, t, c_at):
    """float32 x 16: the exact int32 lane sums of row t's 256 values `xs` (`_row_vectors`) with the four vectors
    of quants `qs` (`lane_vectors`): VNNI: from the row's lane offsets xc[t, c_at], one vpdpbusd per vector
    of the unsigned quants; else |q| x (x with q's sign), pmaddubsw + pmaddwd; converted to float32 (exact: below
    2^24)."""
    parts = 64 // kern.width
    L = kern.width // 4
    zero = const(0, "int8", kern.width)
    sums = [kern.xc[t, ramp(c_at + h * L, L)] if kern.vnni else None for h in range(parts)]
    for c, q in enumerate(qs):
        for h in range(parts):
            def part(v):
                return v if parts == 1 else tirx.Shuffle([v], list(range(h * kern.width, (h + 1) * kern.width)))
            x = xs[c * parts + h]
            if kern.vnni:
                sums[h] = dot_u8s8(sums[h], part(q), x, kern.width, None, True)
            else:
                aq, sq = q     # sq: the quants' signs, as a mask (q < 0) or as the signed quants themselves
                sx = tirx.Select(part(sq), zero - x, x) if str(sq.ty).startswith("bool") else \
                    sign(x, tirx.reinterpret(f"int8x{kern.width}", part(sq)), kern.width)
                sums[h] = dot_u8s8(sums[h], part(aq), sx, kern.width)
    return tirx.Cast(f"float32x{LANE_ACC}", concat(sums))


