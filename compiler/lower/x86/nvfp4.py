"""NVFP4 on the integer path against "q8_0" activation rows (per 32 values, element order), as ggml-cpu's
ggml_vec_dot_nvfp4_q8_0 (NVFP4's vec_dot_type is q8_0): per block of 64 weights and (weight row, activation row)
the exact int32 sums of its four 16-weight sub-blocks (four int32 lanes each: |q| x (x with q's sign), pmaddubsw +
pmaddwd, or one vpdpbusd with VNNI), converted once, then one FMA of 16 float lanes by each sub-block's ue4m3 scale
x the row's scale of its block of 32. The same int32 x 16 and float operations at 32 and 64 bytes and with or
without VNNI, so neither changes a row's bits. The per-tensor `.scale` stays a multiply of the matmul's output
(nextn.compiler.graphs.apply_weight_scales). --exact-matmul keeps the float kernel (floats.NVFP4)."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from nextn.compiler.quant.mxfp4 import E2M1X2
from nextn.compiler.quant.nvfp4 import ue4m3_half

from .kernel import Format, SumPath, concat, prefetch
from .lanes import _lookup
from .vec import abs_i8, dot_u8s8, fma, ramp, sign, u8

SUB_LANES = 16    # float lanes of a block's sum: int32 lane i holds products 4i .. 4i + 3, sub-block i // 4


class NVFP4Path(SumPath):
    """`nvfp4_rows`: a register block of weight rows against a row group, 16 float lanes per (weight row,
    activation row) at either width, K whole or in chunks of blocks."""
    multi_row = True
    bit_knobs = ()

    def acc_lanes(self, kern, fmt):
        return [SUB_LANES]

    def row_loop(self, kern, fmt, ns, rows, accs, blocks=None):
        nvfp4_rows(kern, fmt, ns, rows, accs, blocks)


class NVFP4Int(Format):
    """NVFP4 (36 B per 64 weights): d u8[4] (ue4m3, one per 16 weights) | qs[32]; quant byte j of sub-block s holds
    weights 16s + j (low nibble) and 16s + 8 + j (high); w = ue4m3_half(d[s]) x E2M1X2[q] (gguf-py's NVFP4:
    kvalues doubled, the scale halved)."""
    path = NVFP4Path()
    block, type_size, acts = 64, 36, "q8_0"
    unit_bytes = 72     # a row's activation bytes per block (tiles._units_in): 64 quants, 2 scales

    def quants(self, kern, n, s):
        """int8 x 64: the block's signed quants E2M1X2[q] (-12 .. 12) in element order (the table by pshufb)."""
        v = kern.w[n, ramp(s * 36 + 4, 32)]
        lo, hi = v & u8(15, 32), (v >> u8(4, 32)) & u8(15, 32)
        idx = tirx.Shuffle([lo, hi], [j for b in range(4) for j in [*range(8 * b, 8 * b + 8),
                                                                    *range(32 + 8 * b, 32 + 8 * b + 8)]])
        return tirx.reinterpret("int8x64", _lookup(E2M1X2, idx, kern.width))

    def factors(self, kern, n, s):
        """float32 x 16: the ue4m3 scale (halved) of each int32 lane's sub-block (the four decoded as one vector)."""
        d = T.Bind(ue4m3_half(kern.w[n, ramp(s * 36, 4)], 4))
        return tirx.Shuffle([d, d, d, d], [i // 4 for i in range(16)])


def nvfp4_rows(kern, fmt, ns, rows, accs, blocks=None):
    """Weight rows `ns` against "q8_0" rows `rows` over the blocks `blocks` ((first, end); all by default): per
    block, each weight row's quants (|q| and q) and sub-block factors, then per activation row its 64 bytes and
    two scales loaded once for all the weight rows, and per (weight row, activation row) the int32 x 16 of exact
    sub-block sums (`dot_u8s8`, 64 // width parts), converted, and one FMA: acc += (factors x the row's scales) *
    sums. accs[j][r]: the (float32 buffer, lane offset) of weight row ns[j] and activation row rows[r]."""
    W = kern.width
    parts = 64 // W
    with T.serial(*(blocks or (0, kern.n_blocks))) as s:
        ws = []
        for n in ns:
            prefetch(kern, n, s * 36, 36)
            q = T.Bind(fmt.quants(kern, n, s))
            ws.append((q, T.Bind(abs_i8(q, 64)), T.Bind(fmt.factors(kern, n, s))))
        for r, t in enumerate(rows):
            x = kern.xq[t, ramp(64 * s, 64)]
            x = T.Bind(x) if len(ns) > 1 else x
            xd = T.Bind(concat([tirx.Broadcast(kern.xd[t, 2 * s + h], 8) for h in range(2)]))
            for (q, aq, f), acc in zip(ws, accs):
                def part(v, h):
                    return v if parts == 1 else tirx.Shuffle([v], list(range(h * W, (h + 1) * W)))
                sums = [dot_u8s8(None, part(aq, h), sign(part(x, h), part(q, h), W), W, None, kern.vnni)
                        for h in range(parts)]
                a, off = acc[r]
                T.buffer_store(a, fma(f * xd, tirx.Cast(f"float32x{SUB_LANES}", concat(sums)),
                                      a[ramp(off, SUB_LANES)]), [ramp(off, SUB_LANES)])
