"""`mul_mat` / `mul_mat_id` (ggml semantics, as `te_ops`) with the weight's dequantization as its own stage.

    mul_mat     deq[(B,) n, k] = w(n, k);        y[..., n] = sum_k x[..., k] · deq[(b,) n, k]
    mul_mat_id  deq[t, j, n, k] = w(ids[t, j], n, k);   y[t, j, n] = sum_k x[t, (j,) k] · deq[t, j, n, k]

w(…) is the format's float32 element expression (nextn.compiler.quant, gguf-py's dequantization bit for bit) or
the float32 weight itself. The separate stage is what lets the GPU schedule (`gemv.py`) place the weight read:
it computes `deq` for one lane's few elements into registers once per tile of activation rows, and the row loop
reads the registers; unscheduled, the function is the plain definition (tests/test_cuda_kernels.py builds it for
llvm against float64 numpy). Block names: DEQUANT for the stage, MATMUL for the reduction, SCALE / MIN for the
K-quants' sub-block factors.
"""
from __future__ import annotations

from tvm import te, tirx

from .. import te_ops
from ..te_ops import _elem

DEQUANT, MATMUL, SCALE, MIN = "dequant", "gemv", "wscale", "wmin"
# The integer route's block heads (int8.py, Q4_K / Q5_K: the first 16 bytes of each block as 4 words), read by SCALE
# and MIN
HEAD = "whead"
# A DEQUANT block annotation (int8.py): each 4 bytes the block reads of the weight are one field at a 4-byte-aligned
# address, so the GEMV (gemv.py) may load them as 32-bit words
WORD_LOAD = "nextn.word_load"
# What word_loads.py adds to a DEQUANT block whose 4 words of each group are one 16-byte-aligned field: the GEMV
# (gemv.py) loads the group as one 128-bit vector
WORD_VEC = "nextn.word_vec"
# The activation rows of a symbolic row count padded to whole GEMV row tiles (`padded_rows`; float32 rows: mul_mat;
# the integer route's words: int8.mul_mat): the schedule loads them as a register tile of vectors
X_PAD, XQ_PAD = "x_tile_pad", "xq_pad"
# The integer grouped mul_mat_id's member rows' activation words (int8.mul_mat_id_grouped, 0 past the members): the
# schedule loads them as XQ_PAD's register tile, each row's vectors under its member test
XQ_GROUP = "xq_group"
# Their sums of 16 quants (int8.quantize_rows(sums=True)), padded and gathered alike: register tiles of the GEMV
XS_PAD, XS_GROUP = "xs_pad", "xs_group"


def _dequant(w, lead, weight_lead):
    """The DEQUANT stage over (*lead, N, K): weight element (*weight_lead(*l), n, k). For the K-quants the
    float16 x 6- or 8-bit sub-block factors are stages of their own (SCALE, MIN: one value per lead, n and
    sub-block), so a schedule computes them once per sub-block instead of once per element; the element is then
    scale * q (- min), the same float32 operations in the same order as the format's element expression."""
    *_, N, K = w.shape
    kind = getattr(w, "kind", None)

    from nextn.compiler.quant import k_quants
    from nextn.compiler.quant.te import Block, f32

    if kind not in k_quants.SUBBLOCK:
        return te.compute((*lead, N, K), lambda *i: _elem(w, *weight_lead(*i[:-2]), i[-2], i[-1]),
                          name=DEQUANT)
    sub = k_quants.SUBBLOCK[kind]
    size = k_quants.Q6K_SIZE if kind == "q6_k" else k_quants.Q45K[kind][0]

    def block(i, k):   # i = (*lead, n)
        return Block(w.tensors[0], (*weight_lead(*i[:-1]), i[-1], k), 256, size)

    shape = (*lead, N, K // sub)
    if kind == "q6_k":
        scale = te.compute(shape, lambda *i: k_quants.q6k_factor(block(i[:-1], i[-1] * sub), i[-1] % 16),
                           name=SCALE)
        return te.compute((*lead, N, K), lambda *i: scale[(*i[:-1], i[-1] // sub)] * f32(
            k_quants.q6k_quant(block(i[:-1], i[-1]))), name=DEQUANT)

    def factor(i, which):
        return k_quants.q45k_factors(block(i[:-1], i[-1] * sub), i[-1] % (256 // sub))[which]

    scale = te.compute(shape, lambda *i: factor(i, 0), name=SCALE)
    low = te.compute(shape, lambda *i: factor(i, 1), name=MIN)
    return te.compute((*lead, N, K), lambda *i: scale[(*i[:-1], i[-1] // sub)] * f32(
        k_quants.q45k_quant(block(i[:-1], i[-1]), kind)) - low[(*i[:-1], i[-1] // sub)], name=DEQUANT)


# Activation rows per pass of the GEMV (gemv.py) over the weight (per lane: TILE_ROWS accumulators, TILE_ROWS x 8
# activations). 4 covers verify for n_max <= 3 in one pass; a padded tile still does every row's FMAs (a padded row
# reads the last row), and at 8 rows a 4-row verify would need ~60 TFMA/s to keep up with HBM on Q4_K, more than an
# H100/H200 has (~34).
TILE_ROWS = 4


def tile_rows(T):
    """A row count rounded up to whole GEMV row tiles (TILE_ROWS)."""
    return (T + TILE_ROWS - 1) // TILE_ROWS * TILE_ROWS


def padded_rows(x, T, name):
    """x [T, ...] as [tile_rows(T), ...] for a symbolic T (verify, prefill): a padded row reads row T - 1, a row of
    x, so the GEMV's loads of a row tile need no predicate; the padded rows' sums are computed and never stored
    (`unpadded`). The GEMV's accumulators are then a static register tile (a split of T itself would size them by
    T)."""
    return te.compute((tile_rows(T), *x.shape[1:]), lambda t, *r: x[(te.min(t, T - 1), *r)], name=name)


def unpadded(y, T):
    """The first T rows of a matmul over padded rows (`padded_rows`): the values stored."""
    return te.compute((T, *y.shape[1:]), lambda *i: y[i], name=MATMUL + "_pad")


def mul_mat(w, x):
    """te_ops.mul_mat (ggml_mul_mat) reading the DEQUANT stage; a symbolic row count T of x [T, K] (w [N, K]) or
    [T, B, K] (w [B, N, K]) is padded to whole row tiles (`padded_rows`)."""
    deq = _dequant(w, tuple(w.shape[:-2]), lambda *b: b)
    T = x.shape[0]
    if len(x.shape) != len(w.shape) or isinstance(T, tirx.IntImm):
        return te_ops.mul_mat(w, x, weight=lambda *i: deq[i], name=MATMUL)
    return unpadded(te_ops.mul_mat(w, padded_rows(x, T, X_PAD), weight=lambda *i: deq[i], name=MATMUL), T)


def mul_mat_id(w, x, ids):
    """te_ops.mul_mat_id (ggml_mul_mat_id) reading the DEQUANT stage, one weight row set per (row, slot)."""
    T, kk = ids.shape
    deq = _dequant(w, (T, kk), lambda t, j: (ids[t, j].astype("int64"),))
    return te_ops.mul_mat_id(w, x, ids, weight=lambda *i: deq[i], name=MATMUL)


# Rows of a routed-expert group: the verify / prefill rows are taken in windows of GROUP_ROWS consecutive rows, and
# each expert chosen in a window is read once for all the window's rows that chose it (gemv.TILE_ROWS: one register
# row tile of the GEMV schedule).
GROUP_ROWS = 4
EXPERT_GROUPS, GROUPED, GATHER = "expert_groups", "gemv_grouped", "expert_gather"


def _pair(row, slot, kk):
    return (row * kk + slot).astype("int32")


def expert_leaders(ids):
    """int32 [T, n_used]: for pair (t, j) of `ids` (int32 [T, n_used], distinct experts per row, ggml_mul_mat_id's
    ids; pair (t, j) is row t's slot j, flat index t·n_used + j), the first pair of its window (rows W⌊t/W⌋ …
    W⌊t/W⌋ + W - 1, W = GROUP_ROWS) that chose expert ids[t, j]: its group's leader. A kernel of its own (as
    `expert_groups`): in one PrimFunc it would be a workspace allocated at each call."""
    T, kk = ids.shape
    W = GROUP_ROWS
    r, s = te.reduce_axis((0, W), name="r"), te.reduce_axis((0, kk), name="s")

    def first(t, j):
        row = t // W * W + r
        hit = tirx.all(row < T, ids[te.min(row, T - 1), s] == ids[t, j])
        return te.min(tirx.Select(hit, _pair(row, s, kk), tirx.const(2**31 - 1, "int32")), axis=[r, s])

    return te.compute((T, kk), first, name=EXPERT_GROUPS + "_leaders")


def expert_groups(ids, leaders):
    """int32 [T, n_used, GROUP_ROWS + 1]: the routed-expert groups of `ids` (`expert_leaders`' terms). Entry
    [t, j, W] is the leader of pair (t, j); for a leader, entry [t, j, r] (r < W) is the pair of window row r that
    chose the same expert, or -1 (no such row, or past T); for any other pair every r < W entry is -1."""
    T, kk = ids.shape
    W = GROUP_ROWS
    s = te.reduce_axis((0, kk), name="s")

    def member(t, j, q):
        row = t // W * W + te.min(q, W - 1)
        hit = tirx.all(leaders[t, j] == _pair(t, j, kk), row < T, ids[te.min(row, T - 1), s] == ids[t, j])
        entry = tirx.Select(hit, _pair(row, s, kk), tirx.const(-1, "int32"))
        return te.max(tirx.Select(q < W, entry, leaders[t, j]), axis=s)

    return te.compute((T, kk, W + 1), member, name=EXPERT_GROUPS)


def mul_mat_id_grouped(w, x, ids, groups):
    """float32 [T, n_used, GROUP_ROWS, N]: for each group leader (t, j) (`expert_groups`), the products of its
    member rows with expert ids[t, j]: [t, j, r, n] = sum_k x[m, (slot,) k] · w(ids[t, j], n, k) for member pair
    m = groups[t, j, r] >= 0, else 0; every entry of a pair that leads no group is 0 (it has no members), and on
    the GPU its thread block runs nothing and leaves them unwritten (gemv._leaders_only; `expert_gather` reads the
    leaders' entries only). `mul_mat_id` = `expert_gather` of this. w [X, N, K]; x [T, K] or [T, n_used, K] as
    mul_mat_id."""
    _X, N, K = w.shape
    T, kk = ids.shape
    W = GROUP_ROWS
    zero = tirx.const(0.0, "float32")
    # (no test around the weight loads: the GPU schedule runs only the leaders' thread blocks, gemv._leaders_only)
    deq = _dequant(w, (T, kk), lambda t, j: (ids[t, j].astype("int64"),))
    r = te.reduce_axis((0, K), name="k")

    def xs(t, j, q, k):
        m = groups[t, j, q].astype("int64")
        row = te.max(m, tirx.const(0, "int64"))
        v = x[row // kk, k] if len(x.shape) == 2 else x[row // kk, row % kk, k]
        return tirx.if_then_else(m >= 0, v, zero)

    return te.compute((T, kk, W, N), lambda t, j, q, n: te.sum(xs(t, j, q, r) * deq[t, j, n, r], axis=r),
                      name=GROUPED)


def expert_gather(y, groups):
    """float32 [T, n_used, N]: mul_mat_id's output from `mul_mat_id_grouped`'s y: pair (t, j) is the member of
    row t mod W of the group its leader p = groups[t, j, W] leads."""
    T, kk, W, N = y.shape
    lead = lambda t, j: groups[t, j, GROUP_ROWS].astype("int64")   # noqa: E731
    return te.compute((T, kk, N), lambda t, j, n: y[lead(t, j) // kk, lead(t, j) % kk, t % W, n], name=GATHER)


def expert_gather_sum(y, groups, w):
    """float32 [T, N]: the routed experts' output of a MoE layer from `mul_mat_id_grouped`'s down projection y, each
    slot's row (`expert_gather`) times its routing weight w [T, n_used, 1], summed in slot order as the graph sums
    them (compiler/models/glm_base/graph.py `moe`: ((y0 w0 + y1 w1) + y2 w2) + ...; ggml's views and adds, one
    kernel instead of a gather, a product and n_used slot copies)."""
    T, kk, W, N = y.shape
    lead = lambda t, j: groups[t, j, GROUP_ROWS].astype("int64")   # noqa: E731

    def f(t, n):
        acc = None
        for j in range(int(kk)):
            p = y[lead(t, j) // kk, lead(t, j) % kk, t % W, n] * w[t, j, 0]
            acc = p if acc is None else acc + p
        return acc

    return te.compute((T, N), f, name=GATHER + "_sum")


TE_OPS = {"mul_mat": mul_mat, "mul_mat_id": mul_mat_id}
