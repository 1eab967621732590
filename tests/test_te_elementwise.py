"""Elementwise TE ops on the CPU: swiglu against float64 numpy over the whole float range its exp sees, and the
CPU schedule's parallel elementwise stages (schedules/cpu.py) giving the unscheduled kernels' bits."""
import numpy as np
import pytest
import tvm
from tvm import te, tirx

from nextn.compiler.compile import make_target
from nextn.compiler.lower import te_ops
from nextn.schedules.cpu import schedule_func

pytestmark = pytest.mark.e2e   # builds TVM kernels or runs the CLI in a subprocess

TARGET = make_target("llvm")
RNG = np.random.default_rng(0)


def _build(make, shapes, dtypes, scheduled):
    T = tirx.Var("T", "int64")
    phs = [te.placeholder([T if d == "T" else d for d in s], dt, name=f"a{i}") for i, (s, dt) in enumerate(zip(shapes, dtypes))]
    f = te.create_prim_func([*phs, make(*phs)]).with_attr("global_symbol", "main")
    if scheduled:
        sf = schedule_func(f)
        assert "T.parallel" in sf.script()     # the rule applied (symbolic T)
        f = sf
    return tvm.compile(tvm.IRModule({"main": f}), target=TARGET).mod["main"]


def _call(fn, args, out_shape):
    out = tvm.runtime.empty(out_shape, "float32")
    fn(*[tvm.runtime.tensor(a) for a in args], out)
    return out.numpy()


def test_swiglu_over_the_whole_range():
    """SiLU(g) * u where exp(-g) is subnormal, overflows or is ordinary: as float64 numpy, within float32."""
    g = np.concatenate([np.array([0.0, -0.0, 86.9, 87.0, 87.5, 88.5, 100.0, 1e4, 3e38, -86.9, -87.5, -88.0,
                                  -88.5, -100.0, -1e4, -3e38]), RNG.standard_normal(1024 - 16) * 30]).astype(np.float32)
    u = RNG.standard_normal(g.shape).astype(np.float32)
    g, u = g.reshape(4, 256), u.reshape(4, 256)
    g64 = g.astype(np.float64)
    with np.errstate(over="ignore"):
        want = g64 / (1.0 + np.exp(-g64)) * u
    got = _call(_build(te_ops.swiglu, [("T", 256)] * 2, ["float32"] * 2, True), [g, u], (4, 256))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("op", ["rope_neox", "rope_norm", "concat", "swiglu"])
def test_parallel_elementwise_stages_keep_the_bits(op):
    T = 37                                                   # not a multiple of anything
    if op.startswith("rope"):
        mode = op.split("_")[1]
        make = lambda x, p: te_ops.rope_ext(x, p, 64, mode, 1e6)   # noqa: E731; dims 64..95 pass through
        shapes, dtypes = [("T", 5, 96), ("T",)], ["float32", "int32"]
        args = [RNG.standard_normal((T, 5, 96)).astype(np.float32), RNG.integers(0, 5000, T).astype(np.int32)]
        out = (T, 5, 96)
    elif op == "concat":
        make = lambda a, b: te_ops.concat(a, b, 2)          # noqa: E731
        shapes, dtypes = [("T", 3, 40), ("T", 3, 8)], ["float32"] * 2
        args = [RNG.standard_normal((T, 3, n)).astype(np.float32) for n in (40, 8)]
        out = (T, 3, 48)
    else:
        make, shapes, dtypes = te_ops.swiglu, [("T", 300)] * 2, ["float32"] * 2
        args = [(RNG.standard_normal((T, 300)) * 50).astype(np.float32) for _ in range(2)]
        out = (T, 300)
    plain = _call(_build(make, shapes, dtypes, False), args, out)
    par = _call(_build(make, shapes, dtypes, True), args, out)
    assert np.array_equal(plain.view(np.uint32), par.view(np.uint32))
    if op == "concat":
        assert np.array_equal(par, np.concatenate(args, axis=2))


def test_elementwise_chain_is_one_pass_with_the_same_bits():
    """The MoE combine as glm_base.graph.moe builds it (down * w, a view per top-k slot, the slot adds in order,
    then the shared expert): each stage its consumer reads once is inlined (schedules/cpu.py
    inline_elementwise_chain), so only the product read by all eight views keeps a buffer, and the result is
    numpy's float32 sum in slot order, bit for bit, as the unscheduled kernel's is."""
    T, K, E = 13, 8, 72
    Tv = tirx.Var("T", "int64")
    down = te.placeholder((Tv, K, E), "float32", name="down")
    w = te.placeholder((Tv, K, 1), "float32", name="w")
    sh = te.placeholder((Tv, E), "float32", name="shexp")
    m = te.compute((Tv, K, E), lambda t, j, e: down[t, j, e] * w[t, j, 0], name="m")
    def view(j):
        return te.compute((Tv, E), lambda t, e: m[t, j, e], name=f"view{j}")

    def add(a, b, name):
        return te.compute((Tv, E), lambda t, e: a[t, e] + b[t, e], name=name)

    out = view(0)
    for j in range(1, K):
        out = add(out, view(j), f"add{j}")
    out = add(out, sh, "out")
    f = te.create_prim_func([down, w, sh, out]).with_attr("global_symbol", "main")
    sf = schedule_func(f)
    assert f.script().count("sblock_alloc_buffer") == 2 * K and sf.script().count("sblock_alloc_buffer") == 1
    args = [RNG.standard_normal((T, K, E)).astype(np.float32), RNG.random((T, K, 1)).astype(np.float32),
            RNG.standard_normal((T, E)).astype(np.float32)]
    prod = args[0] * args[1]
    want = prod[:, 0]
    for j in range(1, K):
        want = want + prod[:, j]
    want = want + args[2]
    got = [_call(tvm.compile(tvm.IRModule({"main": g}), target=TARGET).mod["main"], args, (T, E)) for g in (f, sf)]
    for g in got:
        assert np.array_equal(g.view(np.uint32), want.view(np.uint32))
