"""The row loop of the codebook formats (`codebook.Codebook`: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)
on "q8" activation rows, as kquant.py / lanes.py / floats.py are for theirs; the formats and their tables are in
codebook.py (which formats.py imports, so the loop that needs kernel.py lives here)."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from .kernel import prefetch
from .lanes import sign
from .vec import const, dot_u8s8, fma, madd, ramp


def _vector(words, dtype):
    return tirx.reinterpret(dtype, tirx.Shuffle(words, list(range(len(words)))))



def codebook_rows(k, fmt, ns, rows, accs, blocks=None):
    """Weight rows `ns` against "q8" rows `rows` for a `Codebook` format (module docstring): per block (of
    `blocks`, a (first, end) range; all by default) and weight row, each `width` bytes of its quants (grid
    entries, sign patterns, scales) decoded once, then per activation row the exact int32 x 8 block sum and
    one FMA into the row's 8 float lanes accs[j][r] = (float32 buffer, lane offset)."""
    W = k.width
    per = W // 32        # sub-blocks per vector
    with T.serial(*(blocks or (0, k.n_blocks))) as s:
        for n, acc in zip(ns, accs):
            prefetch(k, n, s * fmt.type_size, fmt.type_size)
            d = T.Bind(fmt.d(k, n, s) * const(fmt.factor, "float32"))
            sums = [None for _ in rows]
            scale16 = []        # the block's scale of each 16 weights, for the xs term
            for c in range(256 // W):
                grid, signs, scales = [], [], []
                for ib in range(per * c, per * c + per):
                    g, sg, sc = fmt.groups(k, n, s, ib)
                    grid, signs = grid + g, signs + (sg or [None])
                    scales += [tirx.Broadcast(tirx.Cast("int16", v), 8) for v in sc]
                    scale16 += sc
                q = T.Bind(_vector(grid, f"uint8x{W}"))
                sgn = T.Bind(_vector(signs, f"int8x{W}")) if signs[0] is not None else None
                scv = T.Bind(tirx.Shuffle(scales, list(range(16 * per))))
                for r, t in enumerate(rows):
                    x = k.xq[t, ramp(256 * s + W * c, W)]
                    v = dot_u8s8(None, q, x if sgn is None else sign(x, sgn, W), W, scv)
                    sums[r] = T.Bind(v if sums[r] is None else sums[r] + v)
            xs_w = T.Bind(tirx.Shuffle([tirx.Cast("int16", v * fmt.xs_factor) for v in scale16], list(range(16)))) \
                if hasattr(fmt, "xs_factor") else None
            for r, t in enumerate(rows):
                tot = sums[r] if W == 32 else \
                    tirx.Shuffle([sums[r]], list(range(8))) + tirx.Shuffle([sums[r]], list(range(8, 16)))
                if xs_w is not None:    # the row's sums per 16 weighted per 16 weights (IQ1S)
                    tot = tot + madd(k.xs[t, ramp(16 * s, 16)], xs_w, 32)
                a, off = acc[r]
                T.buffer_store(a, fma(tirx.Cast("float32x8", tot), tirx.Broadcast(d * k.xd[t, s], 8),
                                      a[ramp(off, 8)]), [ramp(off, 8)])
