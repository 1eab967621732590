"""Head-batched x86 matmul: one weight matrix per head, as absorbed MLA's `attn_k_b` / `attn_v_b`.

    matmul_heads  y[t, h, n] = sum_k w[h, n, k] x[t, h, k]     (ggml mul_mat with a 3-D weight [H, N, K] and
                                                              x [T, H, K]: llama.cpp src/models/glm-dsa.cpp)

The loop nest is tiles.py's `tile`: a thread takes a work item (head h, tile of `tile_n` weight rows) and runs
it against that head's T activation rows (row t * H + h of x flattened to [T * H, K]) in row groups, so each
head's weight comes from memory once per call whatever T is (the TE element expression read it once per row), and
a row gives the same bits alone (the decode step) or in a batch, as every x86 kernel.
"""
from __future__ import annotations

from tvm.tirx.script import builder as T

from .formats import format_of
from .kernel import Knobs, bind_acts, declare_tables, kernel, views
from .tiles import tile


def matmul_heads(kind: str, H: int, N: int, K: int, rows: int | None = None, knobs: Knobs = Knobs(),
                 name: str = "matmul_heads", vnni: bool = False, exact: bool = False):
    """y float32 [T, H, N] with y[t, h] = w[h] · x[t * H + h] for a weight w [H, N, K] of format `kind`.
    Arguments: w, act_args for T*H rows (x [T, H, K] flattened), y. `rows`: a static T, or None (symbolic);
    `vnni`, `exact`: as `matmul.matmul`."""
    fmt = format_of(kind, exact)
    with kernel(name, fmt, kind, (H, N), K, rows, knobs, vnni) as (kern, Tr, (w,)):
        bind_acts(kern, fmt, Tr * H, K)
        y = T.arg("y", T.buffer((Tr, H, N), "float32", align=32))
        with T.sblock("root"):
            kern.w = T.decl_buffer((H * N, kern.row_bytes), "uint8", data=w.data, align=32)
            views(kern, w.data, H * N * kern.row_bytes)
            kern.y = T.decl_buffer((Tr * H, N), "float32", data=y.data, align=32)
            declare_tables(kern, fmt)
            with T.parallel(0, H * kern.n_tiles) as it:
                h = T.Bind(it // kern.n_tiles)
                nt = T.Bind(it % kern.n_tiles)
                tile(kern, fmt, nt, knobs.tile_n, N, Tr, knobs.row_group, lambda i: i * H + h,
                     lambda i, n: [i * H + h, n], wrow=lambda n: h * N + n)
    return kern.func
