"""The IR op table (compiler/ir/ops.py): every op has an interpreter and a lowering implementation, the import-time
check fires for one without, nodes take their shapes from the table's rules, and those rules give the shapes the
interpreter computes on the fixtures' graphs. No compile: seconds."""
import numpy as np
import pytest

from conftest import FIXTURES, graphs_and_dequantized, reference, zero_states

from nextn.common.manifest import dim_value, div_dim, resolve_shape, split_dim
from nextn.compiler.ir import Graph, interpret, ops
from nextn.compiler.ir.graph import LEAVES, OPS
from nextn.compiler.lower import to_relax


def test_graph_ops_are_the_table():
    assert OPS == set(ops.TABLE) and not OPS & LEAVES
    for name, op in ops.TABLE.items():
        assert op.name == name and op.signature.startswith(name + "(") and op.doc, name


def test_every_op_has_an_interpreter_and_a_lowering():
    assert set(interpret.INTERP) == OPS
    assert set(to_relax.LOWER) == OPS
    ops.check_impls(interpret.INTERP, "interpreter")
    ops.check_impls(to_relax.LOWER, "lowering")


def test_check_fires_for_a_table_entry_without_implementation():
    table = {**ops.TABLE, "fake_op": ops.Op("fake_op", "fake_op(x) -> x.shape", "x", lambda s, at: s[0])}
    for impls in (interpret.INTERP, to_relax.LOWER):
        with pytest.raises(RuntimeError, match=r"without an implementation \['fake_op'\]"):
            ops.check_impls(impls, "here", table)
    with pytest.raises(RuntimeError, match=r"implementations of no op \['rms_norm'\]"):
        ops.check_impls({"rms_norm": None}, "here", {})


def test_registry_refuses_unknown_and_twice_registered_ops():
    impls = {}
    reg = ops.registry(impls, "here")
    reg("silu")(lambda *a: None)
    with pytest.raises(RuntimeError, match="'silu' is registered twice"):
        reg("silu")(lambda *a: None)
    with pytest.raises(RuntimeError, match="'no_such_op' is no IR op"):
        reg("no_such_op")(lambda *a: None)


def test_builders_take_shapes_and_dtypes_from_the_table():
    g = Graph("t")
    x = g.input("x", ("T", 8))
    ids = g.input("ids", ("T",), "int32")
    assert g.get_rows(g.weight("tok", (100, 8)), ids).shape == ("T", 8)
    assert g.get_rows(g.weight("tab", (3, 100, 8)), g.input("bid", (3, 5), "int32")).shape == (3, 5, 8)
    assert g.mul(x, g.weight("b", (1, 8))).shape == ("T", 8)
    with pytest.raises(ValueError, match="do not broadcast"):
        g.add(x, g.weight("c", (7,)))
    assert g.mul_mat(g.weight("w", (16, 8)), x).shape == ("T", 16)
    heads = g.input("h", ("T", 4, 8))
    assert g.mul_mat(g.weight("kb", (4, 6, 8)), heads).shape == ("T", 4, 6)          # batched: one matrix per head
    assert g.mul_mat_id(g.weight("e", (5, 16, 8)), x, g.input("sel", ("T", 2), "int32")).shape == ("T", 2, 16)
    v = g.view(ids, 0, 1, 2)
    assert v.shape == (2,) and v.dtype == "int32"                                  # view keeps its input's dtype
    assert g.concat(x, x, 1).shape == ("T", 16)
    top = g.argsort_top_k(x, 3)
    assert top.shape == ("T", 3) and top.dtype == "int32"
    assert g.argmax(x).shape == ("T",) and g.argmax(x).dtype == "int32"
    assert g.sum_rows(x).shape == ("T", 1)
    q, k = g.input("q", ("T", 4, 8)), g.state("k", ("C//4", 1, 8))
    score = g.lightning_indexer(q, k, g.input("wi", ("T", 4)), ids, kpool=4)
    assert score.shape == ("T", "L//4") and score.attrs == {"kpool": 4}
    assert g.kpool_expand(g.top_k_mask(score, ids, 2, kpool=4), ids, 4, True).shape == ("T", "L")
    assert g.index_mask_load(g.state("m", ("C",))).shape == (1, "L")
    with pytest.raises(AssertionError):
        g._op("clamp", (x,), lo=0.0, hi=1.0, eps=1.0)                             # eps is no attribute of clamp


def test_shape_grammar_has_one_home():
    assert div_dim("C", 4) == "C//4" and div_dim("C", 1) == "C" and div_dim(4096, 4) == 1024
    assert split_dim("C//4") == ("C", 4) and split_dim("L") == ("L", 1)
    assert dim_value("C//4", {"C": 4098}) == 1024 and resolve_shape((2, "P", "C//4"), {"P": 5, "C": 64}) == (2, 5, 16)
    from tvm import tirx

    sym = {"C": tirx.IntImm("int64", 4096), "L": tirx.Var("L", "int64")}
    assert int(to_relax.dim_expr("C//4", sym)) == 1024
    e = to_relax.dim_expr("L//4", sym)
    assert isinstance(e, tirx.FloorDiv) and e.a.same_as(sym["L"]) and int(e.b) == 4
    assert to_relax.dim_expr("L", sym).same_as(sym["L"]) and to_relax.dim_expr(7, sym) == 7


def _recorded(monkeypatch) -> list:
    """(node, value shape, value dtype, n_kv) of every op the interpreter computes from now on."""
    seen = []

    def wrap(fn):
        def run(n, a, cx):
            r = fn(n, a, cx)
            seen.append((n, r.shape, r.dtype, cx.n_kv))
            return r
        return run

    for op, fn in list(interpret.INTERP.items()):
        monkeypatch.setitem(interpret.INTERP, op, wrap(fn))
    return seen


@pytest.mark.parametrize("model", ["tiny-glm4moe", "tiny-glm-dsa", "tiny-glm5next"])
def test_shape_rules_match_the_interpreter(model, monkeypatch):
    """Every node the fixture's prefill and verify compute has the shape its op's rule gives, symbols resolved."""
    graphs, w = graphs_and_dequantized(FIXTURES / model / f"{model}-Q8_0.gguf")
    ids = np.asarray(reference(FIXTURES / model)["prompts"][0]["prompt_ids"][:9], np.int32)
    seen = _recorded(monkeypatch)
    n_ctx, planes = 64, 4
    st = zero_states(graphs["prefill"], n_ctx, planes)
    T, R = len(ids), 2
    rs = {"rs_plane": np.zeros(1, np.int32)} if "rs_plane" in graphs["prefill"].inputs else {}
    interpret.run(graphs["prefill"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32), **rs,
                                      "hidden_ids": np.arange(T, dtype=np.int32),
                                      "out_ids": np.arange(T - R, T, dtype=np.int32)}, w, st, n_kv=T)
    interpret.run(graphs["verify"], {"tokens": ids[:3], "pos": np.arange(T, T + 3, dtype=np.int32), **rs}, w, st,
                  n_kv=T + 3)
    assert len(seen) > 100
    for n, shape, dtype, n_kv in seen:
        rows = T if n_kv == T else 3
        sizes = {"T": rows, "R": R if n_kv == T else rows, "H": rows, "L": n_kv, "C": n_ctx, "P": planes}
        assert resolve_shape(n.shape, sizes) == shape, (n, shape)
        assert str(dtype) == n.dtype, (n, dtype)


def test_shape_rules_of_the_ops_the_fixtures_prefill_does_not_use(monkeypatch):
    """softplus, index_mask_store / index_mask_load (the DSA draft's shared selection): shapes by the rules, values
    by a naive reading of ops.TABLE's semantics."""
    seen = _recorded(monkeypatch)
    g = Graph("t")
    x = g.input("x", ("T", 3))
    pos = g.input("pos", ("T",), "int32")
    g.output("sp", g.softplus(x))
    g.output("load", g.index_mask_load(g.index_mask_store(g.state("sel", ("C",)), g.input("m", ("T", "L")), pos,
                                                          after=-np.inf)))
    xv = np.array([[-1.0, 0.0, 30.0], [2.0, -40.0, 1.0]], np.float32)
    m = np.array([[0, -np.inf, 0, 0, 0, 0], [-np.inf, 0, 0, -np.inf, 0, 0]], np.float32)
    sel = np.full(8, 7.0, np.float32)
    out = interpret.run(g, {"x": xv, "pos": np.array([2, 3], np.int32), "m": m}, {}, {"sel": sel}, n_kv=6)
    np.testing.assert_allclose(out["sp"], np.log1p(np.exp(xv.astype(np.float64))), rtol=1e-6)
    want = np.array([-np.inf, 0, 0, -np.inf, -np.inf, -np.inf, -np.inf, -np.inf], np.float32)   # row 1 to pos 3
    np.testing.assert_array_equal(sel, want)
    np.testing.assert_array_equal(out["load"], want[None, :6])
    assert {n.op for n, *_ in seen} == {"softplus", "index_mask_store", "index_mask_load"}
    for n, shape, dtype, n_kv in seen:
        assert resolve_shape(n.shape, {"T": 2, "L": 6, "C": 8}) == shape and str(dtype) == n.dtype, n


@pytest.mark.parametrize("row_format,K", [("q8_0", 64), ("q8", 256)])
def test_int8_mode_takes_per_head_weights(row_format, K):
    """The interpreter's int8 mode (`quantized_activations`) on a per-head mul_mat (w [H, N, K], rows [T, H, K]:
    glm-dsa's attn_k_b / attn_v_b): head h's rows are head h's 2-D int8 product (x' = what the quantized rows of
    that head stand for, nextn.common.quant.activation), which differs from the float product."""
    from nextn.common.quant import activation

    rng = np.random.default_rng(K)
    H, N, T = 3, 5, 4
    w = rng.standard_normal((H, N, K)).astype(np.float32)
    x = rng.standard_normal((T, H, K)).astype(np.float32)
    g = Graph("per_head")
    y = g.mul_mat(g.weight("w", (H, N, K)), g.input("x", (T, H, K)))
    g.output("y", y)
    got = interpret.run(g, {"x": x}, {"w": w}, {}, quantized_activations={"w": row_format})["y"]
    assert got.shape == (T, H, N)
    for h in range(H):
        want = activation.round_trip(x[:, h], row_format) @ w[h].astype(np.float64).T
        assert np.array_equal(got[:, h], want.astype(np.float32)), h
    assert np.abs(got - np.einsum("thk,hnk->thn", x, w)).max() > 1e-4
