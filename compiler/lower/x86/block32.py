"""32-weight blocks on "q8_0" activation rows (formats.Block32: Q8_0; IQ4_NL / MXFP4 go through lanes.py's groups,
tiles._rows), and the float path (float32 rows: 16-bit weights, --exact-matmul)."""
from __future__ import annotations

from tvm import tirx
from tvm.tirx.script import builder as T

from .kernel import prefetch
from .lanes import sign
from .vec import const, dot_u8s8, fma, ramp


def block32_rows(k, fmt, n, rows, accs):
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
                ws.append((lambda x, w=w: sign(x, w, k.width), signed(w, k.width)))
        dw = T.Bind(fmt.scales(k, n, b0, step))                  # float32 x step
        prefetch(k, n, b0 * fmt.type_size, step * fmt.type_size)
        for t, acc in zip(rows, accs):
            sc = T.Bind(dw * k.xd[t, ramp(b0, step)])
            prods = []
            for u, (signed_x, aw) in enumerate(ws):
                sx = signed_x(k.xq[t, ramp(32 * (b0 + u * per), k.width)])
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
            isum = dot_u8s8(None, aw, sign(k.xq[t, ramp(32 * b, 32)], w, 32), 32)
            scv = tirx.Broadcast(dw * k.xd[t, b], 8)
            T.buffer_store(acc[1], fma(tirx.Cast("float32x8", isum), scv, acc[1][ramp(0, 8)]), [ramp(0, 8)])

    with T.serial(0, k.n_blocks // step) as g:
        step_at(g * step)
    with T.serial(k.n_blocks // step * step, k.n_blocks) as b:
        single(b)


def float_rows(k, fmt, n, rows, accs):
    """Weight row n against float activation rows: `unroll` blocks per step, one accumulator per (block slot,
    vector) so the FMA chains overlap."""
    L = k.width // 4
    U = k.unroll

    def block(blk, slot):
        prefetch(k, n, blk * fmt.type_size, fmt.type_size)
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
