"""The codebook formats on the integer path: super-blocks of 256 weights whose groups of 8 (IQ2) or 4 (IQ3) are
indices into a fixed grid (ggml/src/ggml-common.h block_iq2_xxs …, iq2xxs_grid …, ksigns_iq2xs; gguf-py
gguf/quants.py), against "q8" activation rows in element order (`nextn.common.quant.activation`, ggml's
block_q8_K).

As ggml-cpu's ggml_vec_dot_iq2_xxs_q8_K and its siblings (ggml-cpu/arch/x86/quants.c, AVX2): per group of 8 (4)
weights one grid entry of unsigned bytes (at most 62) and per 8 weights one 8-byte sign pattern (0x01 / 0xFF per
weight, by a 7-bit ksigns index or a sign byte) are read from constant tables by the block's indices, the sign
moved onto the activation bytes (vpsignb; a masked negate at 64 bytes), the unsigned grid bytes times those by
pmaddubsw (|pair| <= 2 x 62 x 127), the scale 2s + 1 of each 16 weights as pmaddwd's weights, all of a block's 8
sub-blocks of 32 in one exact int32 x 8 per row (lane i: bytes 4i..4i+3 of every 32; at 64 bytes two sub-blocks
per vector, the halves added at the end: the same integers), then one conversion and one FMA per block and row by
d_w x d_x x `factor` (IQ2: w = d (0.5 + s) / 4 x grid x sign = d (2s + 1) x grid x sign / 8). The float operations
are the same at either width and with or without VNNI (where LLVM fuses pmaddwd + add into vpdpwssd), so a row's
bits are too. A weight row's block is decoded once for all the activation rows of a group (verify, prefill, the
rows an expert was routed), each row then costs the sign, two multiplies and an add per 32 bytes.

The tables are the kernel's own constants (`constants`: written to a stack buffer once per call from constant
vectors), not the weight's `.grid` / `.signs` buffers, which stay the element path's.
"""
from __future__ import annotations

import functools

import numpy as np
from tvm import tirx
from tvm.tirx.script import builder as T

from .kernel import Format, SumPath, concat, prefetch
from .vec import const, dot_u8s8, fma, madd, ramp, sign


def _patterns(bytes_):
    """uint64 per sign byte: byte j is 0xFF (-1) where bit j of the byte is set, else 0x01."""
    bits = (np.asarray(bytes_, np.uint8)[:, None] >> np.arange(8, dtype=np.uint8)) & 1
    return [int(v) for v in np.where(bits == 1, 0xFF, 0x01).astype(np.uint8).view("<u8").reshape(-1)]


SIGN_BYTES = tuple(_patterns(range(256)))     # the patterns of a sign byte (IQ2_S, IQ3_S)


@functools.cache   # gguf-py builds the tables; every kernel of the format declares them again
def _grid(name: str, dtype: str):
    """The codebook of IQ format `name` (gguf-py's, as nextn.common.quant.formats gives the weight's `.grid`), one
    `dtype` word per entry (its 8 or 4 bytes)."""
    from nextn.common.quant import FORMATS

    g = np.ascontiguousarray(dict(FORMATS[name].tables())[".grid"])
    return tuple(int(v) for v in g.view("<u8" if dtype == "uint64" else "<u4"))


@functools.cache
def _ksigns(name: str):
    """The sign patterns of the 7-bit indices (ksigns_iq2xs: the 8th bit makes the count of minus signs even)."""
    from nextn.common.quant import FORMATS

    return tuple(_patterns(dict(FORMATS[name].tables())[".signs"]))


class CodebookPath(SumPath):
    """`codebook_rows`: one weight row against a row group, one int32 x 8 per block and row at either width (the
    same bits), 8 float lanes per row, K whole or in chunks of blocks. Default width 32 bytes on AVX-512 too
    (`max_width`): a 64-byte vector of a block's grid entries costs more cross-lane inserts than it saves in
    multiply-adds (re-timed against 64: docs/performance.md, "Codebook formats", 2026-12-05 21:30)."""
    bit_knobs = ()
    max_width = 32

    def acc_lanes(self, kern, fmt):
        return [8]

    def row_loop(self, kern, fmt, ns, rows, accs, blocks=None):
        codebook_rows(kern, fmt, ns, rows, accs, blocks)


class Codebook(Format):
    """A codebook format on "q8" rows (`codebook_rows`). `groups(kern, n, s, ib)` gives sub-block ib (32 weights)
    of block s of row n: (grid words, sign patterns as uint64 words (8 weights each) or None (IQ1: no signs),
    [scale of its first 16 weights, of its last 16] as int32): w = `factor` x d x scale x grid x sign (IQ1:
    `xs_factor`, `IQ1S`). The tables (`constants`): "grid", gguf-py's codebook of `kind` as `grid_word` words
    (IQ1, `signs` None: 8 (g + 1), `_grid1`), and by `signs` "signs" (the patterns of a 7-bit index,
    ksigns_iq2xs), "bits" (of a sign byte) or none. `d`: the block's float32 scale."""
    path = CodebookPath()
    block = 256
    acts = "q8"
    kind: str
    factor: float
    grid_word = "uint64"
    signs: str | None = "signs"
    xs_factor = 0

    def d(self, kern, n, s):
        return tirx.Cast("float32", kern.w16[(n * kern.row_bytes + s * self.type_size) // 2])

    def constants(self):
        grid = _grid1(self.kind) if self.signs is None else _grid(self.kind, self.grid_word)
        if self.signs is None:
            return [("grid", self.grid_word, grid)]
        return [("grid", self.grid_word, grid), (self.signs, "uint64", _ksigns(self.kind) if self.signs == "signs"
                                                  else SIGN_BYTES)]


def _u8(kern, n, at):
    return kern.w[n, at]


def _u16(kern, n, at):
    """The u16 at byte `at` (even: every block is 2-byte aligned) of row n."""
    return kern.w16u[(n * kern.row_bytes + at) // 2]


def _u32(kern, n, at):
    """The u32 at byte `at` (even) of row n, as two u16 (blocks of 66 or 98 bytes are not 4-byte aligned)."""
    return T.Bind(tirx.Cast("uint32", _u16(kern, n, at)) | (tirx.Cast("uint32", _u16(kern, n, at + 2)) << _c(16)))


def _c(v):
    return const(v, "uint32")


def _idx(v):
    return tirx.Cast("int32", v)


def _nibble(kern, n, at, h):
    """2 x (4-bit field h of byte `at`) + 1: a scale of the IQ2 formats (per 16 weights) or IQ3_S (per 32)."""
    return _idx((_u8(kern, n, at) >> const(4 * h, "uint8")) & const(15, "uint8")) * 2 + 1


class IQ2XXS(Codebook):
    """IQ2_XXS (66 B): d f16 | per sub-block of 32: aux0 u32 (4 grid indices, one byte per group of 8), aux1 u32
    (4 x 7-bit sign-pattern indices, scale s in bits 28..31): w = d (0.5 + s) / 4 x grid x sign."""
    type_size = 66
    kind, grid_word, signs = "iq2_xxs", "uint64", "signs"
    factor = 0.125     # (0.5 + s) / 4 = (2s + 1) / 8


    def groups(self, kern, n, s, ib):
        at = s * 66 + 2 + 8 * ib
        aux1 = _u32(kern, n, at + 4)
        grid = [kern.tables["grid"][_idx(_u8(kern, n, at + g))] for g in range(4)]
        signs = [kern.tables["signs"][_idx((aux1 >> _c(7 * g)) & _c(127))] for g in range(4)]
        sc = T.Bind(_idx(aux1 >> _c(28)) * 2 + 1)
        return grid, signs, [sc, sc]


class IQ3XXS(Codebook):
    """IQ3_XXS (98 B): d f16 | qs[64] (grid index per 4 weights) | per sub-block of 32 a u32 (4 x 7-bit
    sign-pattern indices, scale s in bits 28..31): w = d (0.5 + s) / 2 x grid x sign."""
    type_size = 98
    kind, grid_word, signs = "iq3_xxs", "uint32", "signs"
    factor = 0.25      # (0.5 + s) / 2 = (2s + 1) / 4


    def groups(self, kern, n, s, ib):
        aux = _u32(kern, n, s * 98 + 66 + 4 * ib)
        grid = [kern.tables["grid"][_idx(_u8(kern, n, s * 98 + 2 + 8 * ib + g))] for g in range(8)]
        signs = [kern.tables["signs"][_idx((aux >> _c(7 * g)) & _c(127))] for g in range(4)]
        sc = T.Bind(_idx(aux >> _c(28)) * 2 + 1)
        return grid, signs, [sc, sc]


class IQ2XS(Codebook):
    """IQ2_XS (74 B): d f16 | qs u16[32] (per 8 weights: 9-bit grid index | 7-bit sign-pattern index << 9) |
    scales[8] (per 32: 4-bit s of its first 16 weights, high nibble of its last 16): w = d (0.5 + s) / 4 x grid
    x sign."""
    type_size = 74
    kind, grid_word, signs = "iq2_xs", "uint64", "signs"
    factor = 0.125


    def groups(self, kern, n, s, ib):
        qs = [T.Bind(tirx.Cast("int32", _u16(kern, n, s * 74 + 2 + 8 * ib + 2 * g))) for g in range(4)]
        grid = [kern.tables["grid"][q & 511] for q in qs]
        signs = [kern.tables["signs"][q >> 9] for q in qs]
        return grid, signs, [T.Bind(_nibble(kern, n, s * 74 + 66 + ib, h)) for h in range(2)]


class IQ2S(Codebook):
    """IQ2_S (82 B): d f16 | qs[32] (low 8 bits of the grid index per 8 weights) | signs[32] (a sign bit per
    weight) | qh[8] (per 32: 2 high index bits per 8) | scales[8] (as IQ2_XS): w = d (0.5 + s) / 4 x grid x
    sign."""
    type_size = 82
    kind, grid_word, signs = "iq2_s", "uint64", "bits"
    factor = 0.125


    def groups(self, kern, n, s, ib):
        b = s * 82
        qh = T.Bind(_idx(_u8(kern, n, b + 66 + ib)))
        grid = [kern.tables["grid"][_idx(_u8(kern, n, b + 2 + 4 * ib + g)) | (((qh >> 2 * g) & 3) << 8)]
                for g in range(4)]
        signs = [kern.tables["bits"][_idx(_u8(kern, n, b + 34 + 4 * ib + g))] for g in range(4)]
        return grid, signs, [T.Bind(_nibble(kern, n, b + 74 + ib, h)) for h in range(2)]


class IQ3S(Codebook):
    """IQ3_S (110 B): d f16 | qs[64] (low 8 bits of the grid index per 4 weights) | qh[8] (per 32: the 9th bit
    of each of its 8 indices) | signs[32] (a sign bit per weight) | scales[4] (4-bit s per 32, two per byte):
    w = d (1 + 2s) x grid x sign."""
    type_size = 110
    kind, grid_word, signs = "iq3_s", "uint32", "bits"
    factor = 1.0


    def groups(self, kern, n, s, ib):
        b = s * 110
        qh = T.Bind(_idx(_u8(kern, n, b + 66 + ib)))
        grid = [kern.tables["grid"][_idx(_u8(kern, n, b + 2 + 8 * ib + g)) | (((qh >> g) & 1) << 8)] for g in range(8)]
        signs = [kern.tables["bits"][_idx(_u8(kern, n, b + 74 + 4 * ib + g))] for g in range(4)]
        sc = T.Bind(_nibble(kern, n, b + 106 + ib // 2, ib % 2))
        return grid, signs, [sc, sc]


@functools.cache
def _grid1(name: str):
    """IQ1's codebook (-1 / 0 / 1 per weight) as uint64 words of the unsigned bytes 8 (g + 1) (`IQ1S`)."""
    from nextn.common.quant import FORMATS

    g = dict(FORMATS[name].tables())[".grid"].astype(np.int16)
    return tuple(int(v) for v in np.ascontiguousarray((8 * (g + 1)).astype(np.uint8)).view("<u8"))


TWOS = 0x0202020202020202


class IQ1S(Codebook):
    """IQ1_S (50 B): d f16 | qs[32] (low 8 bits of the grid index per 8 weights) | qh u16[8] (per 32: 4 x 3 high
    index bits, scale s in bits 12..14, bit 15 the sign of delta): w = d (2s + 1) (grid + delta), grid in
    {-1, 0, 1}, delta = +-1/8. Per 8 weights the unsigned bytes u = 8 (grid + delta) + 9 (8 (g + 1) from the
    table, + 2 where delta > 0: at most 18), so that sum u x = 8 sum (grid + delta) x + 9 sum x: the block sum
    takes u as the grid, and the row's sums per 16 (xs) with the weights -9 (2s + 1) (`xs_factor`) take the 9
    back off; factor 1/8. (ggml-cpu's ggml_vec_dot_iq1_s_q8_K adds the delta term in float from the q8 row's
    bsums.)"""
    type_size = 50
    kind, grid_word, signs = "iq1_s", "uint64", None
    factor = 0.125
    xs_factor = -9


    def groups(self, kern, n, s, ib):
        b = s * 50
        h = T.Bind(_idx(_u16(kern, n, b + 34 + 2 * ib)))
        plus = T.Bind(tirx.Cast("uint64", 1 - (h >> 15)) * const(TWOS, "uint64"))
        grid = [kern.tables["grid"][_idx(_u8(kern, n, b + 2 + 4 * ib + g)) | (((h >> 3 * g) & 7) << 8)] + plus
                for g in range(4)]
        sc = T.Bind(((h >> 12) & 7) * 2 + 1)
        return grid, None, [sc, sc]


class IQ1M(Codebook):
    """IQ1_M (56 B): qs[32] (low 8 bits of the grid index per 8 weights) | qh[16] (a nibble per 8: 3 high index
    bits, bit 3 the sign of delta) | scales u16[4] (3-bit s per 16 weights; d f16 = the top nibbles of the four
    words): w = d (2s + 1) (grid + delta), taken as IQ1_S's (`IQ1S`), delta per 8 and s per 16 weights."""
    type_size = 56
    kind, grid_word, signs = "iq1_m", "uint64", None
    factor = 0.125
    xs_factor = -9


    def d(self, kern, n, s):
        w = [_u16(kern, n, s * 56 + 48 + 2 * i) for i in range(4)]
        u = lambda v: const(v, "uint16")   # noqa: E731
        d16 = (w[0] >> u(12)) | ((w[1] >> u(8)) & u(0x00F0)) | ((w[2] >> u(4)) & u(0x0F00)) | (w[3] & u(0xF000))
        return tirx.Cast("float32", tirx.reinterpret("float16", d16))

    def groups(self, kern, n, s, ib):
        b = s * 56
        sw = T.Bind(_idx(_u16(kern, n, b + 48 + 2 * (ib // 2))))
        scs = [T.Bind(((sw >> 3 * (2 * (ib % 2) + h)) & 7) * 2 + 1) for h in range(2)]
        grid = []
        for g in range(4):
            hn = T.Bind((_idx(_u8(kern, n, b + 32 + 2 * ib + g // 2)) >> 4 * (g % 2)) & 15)
            plus = tirx.Cast("uint64", 1 - (hn >> 3)) * const(TWOS, "uint64")
            grid.append(kern.tables["grid"][_idx(_u8(kern, n, b + 4 * ib + g)) | ((hn & 7) << 8)] + plus)
        return grid, None, scs


CODEBOOK_FORMATS = {"iq2_xxs": IQ2XXS(), "iq3_xxs": IQ3XXS(), "iq2_xs": IQ2XS(), "iq2_s": IQ2S(), "iq3_s": IQ3S(),
                    "iq1_s": IQ1S(), "iq1_m": IQ1M()}


def codebook_rows(kern, fmt, ns, rows, accs, blocks=None):
    """Weight rows `ns` against "q8" rows `rows` for a `Codebook` format (module docstring): per block (of
    `blocks`, a (first, end) range; all by default) and weight row, each `width` bytes of its quants (grid
    entries, sign patterns, scales) decoded once, then per activation row the exact int32 x 8 block sum and
    one FMA into the row's 8 float lanes accs[j][r] = (float32 buffer, lane offset)."""
    W = kern.width
    per = W // 32        # sub-blocks per vector
    with T.serial(*(blocks or (0, kern.n_blocks))) as s:
        for n, acc in zip(ns, accs):
            prefetch(kern, n, s * fmt.type_size, fmt.type_size)
            d = T.Bind(fmt.d(kern, n, s) * const(fmt.factor, "float32"))
            sums = [None for _ in rows]
            scale16 = []        # the block's scale of each 16 weights, for the xs term
            for c in range(256 // W):
                grid, signs, scales = [], [], []
                for ib in range(per * c, per * c + per):
                    g, sg, sc = fmt.groups(kern, n, s, ib)
                    grid, signs = grid + g, signs + (sg or [None])
                    scales += [tirx.Broadcast(tirx.Cast("int16", v), 8) for v in sc]
                    scale16 += sc
                q = T.Bind(tirx.reinterpret(f"uint8x{W}", concat(grid)))
                sgn = T.Bind(tirx.reinterpret(f"int8x{W}", concat(signs))) if signs[0] is not None else None
                scv = T.Bind(tirx.Shuffle(scales, list(range(16 * per))))
                for r, t in enumerate(rows):
                    x = kern.xq[t, ramp(256 * s + W * c, W)]
                    v = dot_u8s8(None, q, x if sgn is None else sign(x, sgn, W), W, scv)
                    sums[r] = T.Bind(v if sums[r] is None else sums[r] + v)
            xs_w = T.Bind(tirx.Shuffle([tirx.Cast("int16", v * fmt.xs_factor) for v in scale16], list(range(16)))) \
                if fmt.xs_factor else None
            for r, t in enumerate(rows):
                tot = sums[r] if W == 32 else \
                    tirx.Shuffle([sums[r]], list(range(8))) + tirx.Shuffle([sums[r]], list(range(8, 16)))
                if xs_w is not None:    # the row's sums per 16 weighted per 16 weights (IQ1S)
                    tot = tot + madd(kern.xs[t, ramp(16 * s, 16)], xs_w, 32)
                a, off = acc[r]
                T.buffer_store(a, fma(tirx.Cast("float32x8", tot), tirx.Broadcast(d * kern.xd[t, s], 8),
                                      a[ramp(off, 8)]), [ramp(off, 8)])
