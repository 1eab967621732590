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

from tvm import tirx
from tvm.tirx.script import builder as T

from .formats import format_of
from .kernel import Knobs, bind_acts, declare_tables, kernel, views
from .tiles import tile
from .vec import const


def matmul(kind: str, N: int, K: int, rows: int | None = None, knobs: Knobs = Knobs(), name: str = "matmul",
           vnni: bool = False, exact: bool = False):
    """y float32 [T, N] = x [T, K] · w [N, K]ᵀ for a weight of format `kind` (arguments: w, act_args..., y).
    `rows`: a static row count (the one-row entry points), or None for a symbolic T. `vnni`: the target has
    VNNI at this vector width (`has_vnni`; the same bits either way, see vec.dot_u8s8). `exact`: float32
    activation rows for a kind that also has an integer path (Q8_0, IQ4_NL, MXFP4)."""
    fmt = format_of(kind, exact)
    with kernel(name, fmt, kind, (N,), K, rows, knobs, vnni) as (kern, Tr, (w,)):
        bind_acts(kern, fmt, Tr, K)
        kern.y = T.arg("y", T.buffer((Tr, N), "float32", align=32))
        with T.sblock("root"):   # the form Relax passes expect of a PrimFunc body
            kern.w = T.decl_buffer((N, kern.row_bytes), "uint8", data=w.data, align=32)
            views(kern, w.data, N * kern.row_bytes)
            declare_tables(kern, fmt)
            with T.parallel(0, kern.n_tiles) as nt:
                tile(kern, fmt, nt, knobs.tile_n, N, Tr, knobs.row_group, lambda i: i, lambda i, n: [i, n])
    return kern.func


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
    fmt = format_of(kind, exact)
    with kernel(name, fmt, kind, (X, N), K, rows, knobs, vnni, weights) as (kern, Tr, ws):
        bind_acts(kern, fmt, Tr if shared_x else Tr * n_used, K)
        ids = T.arg("ids", T.buffer((Tr, n_used), "int32", align=32))
        ys = [T.arg(f"y{i}", T.buffer((Tr, n_used, N), "float32", align=32)) for i in range(n_weights)]
        with T.sblock("root"):
            P = Tr * n_used
            pairs_e = T.decl_buffer((P,), "int32", data=ids.data)
            w2 = [T.decl_buffer((X * N, kern.row_bytes), "uint8", data=w.data, align=32) for w in ws]
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
            wviews = []
            for w in w2:
                views(kern, w.data, X * N * kern.row_bytes)
                wviews.append((kern.w8, kern.w16, kern.w16u, kern.w32, kern.w32f))
            declare_tables(kern, fmt)
            with T.parallel(0, T.Bind(n_used_experts[0] * kern.n_tiles)) as it:
                e = T.Bind(used[it // kern.n_tiles])
                nt = T.Bind(it % kern.n_tiles)
                base, count = T.Bind(start[e]), T.Bind(cnt[e])
                pair = lambda i: order[base + i]   # noqa: E731
                row_of = (lambda i: pair(i) // n_used) if shared_x else pair
                for w, v, y in zip(w2, wviews, y2):
                    kern.w, (kern.w8, kern.w16, kern.w16u, kern.w32, kern.w32f), kern.y = w, v, y
                    tile(kern, fmt, nt, knobs.tile_n, N, count, knobs.row_group, row_of, lambda i, n: [pair(i), n],
                         wrow=lambda n: e * N + n)
    return kern.func
