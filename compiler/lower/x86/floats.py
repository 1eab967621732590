"""The float path of the x86 matmul kernels: float32 activation rows against 16-bit weights and the 32-weight block
formats under --exact-matmul (formats.FloatFormat). The integer 32-block path is lanes.py's groups (tiles._rows)."""
from __future__ import annotations

from tvm.tirx.script import builder as T

from .kernel import prefetch
from .vec import fma, ramp


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
