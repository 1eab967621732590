"""No host compute in a GPU module (issue 33): every PrimFunc bound for a CUDA / ROCm module computes on GPU threads.

The BF16 artifacts' `fused_swiglu_mul_mat3` / `fused_swiglu2_mul_mat` were compiled as host code that read device
buffers (an H200 segfault at the first prefill): dlight's LowBatchGEMV left the padded SwiGLU prologue unbound and
TVM's VerifyMemory did not see it. Checked here: the IR check (schedules/gpu_bound.py) finds such code, the build
stops on it naming the PrimFunc (compiler/lower/pipeline.py), the GEMV schedule binds the prologue, and (slow) every
fixture builds for cuda sm_90 with no host compute left in its library (objdump, compiler/check_device_code.py).
"""
from __future__ import annotations

import pytest

from conftest import FIXTURES, G4

from tvm.script import tirx as T  # noqa: E402

pytestmark = pytest.mark.e2e   # lowers and builds GPU modules


# Half of it on GPU threads, half not: the shape of the escaped kernels (an element-wise loop on the host, then a
# launch that reads its result).
@T.prim_func(private=True)
def half_bound(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
    for i in range(64):
        B[i] = A[i] * T.float32(2)
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            C[bx * 32 + tx] = B[bx * 32 + tx] + T.float32(1)


@T.prim_func(private=True)
def all_bound(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
    for i in T.thread_binding(64, thread="threadIdx.x"):
        B[i] = A[i] * T.float32(2)
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            C[bx * 32 + tx] = B[bx * 32 + tx] + T.float32(1)


# fused_swiglu_mul_mat3 of tiny-glm4moe-BF16 as FuseTIR emits it (shapes cut down): SwiGLU of the gate / up rows,
# then the down matmul on a BF16 weight kept as uint16 bits, over a dynamic row count n.
@T.prim_func(private=True, s_tir=True)
def swiglu_mul_mat(var_g: T.handle, var_u: T.handle, W: T.Buffer((T.int64(64), T.int64(256)), "uint16"),
                   var_out: T.handle):
    T.func_attr({"tirx.noalias": True})
    n = T.int64()
    G = T.match_buffer(var_g, (n, T.int64(256)))
    U = T.match_buffer(var_u, (n, T.int64(256)))
    Out = T.match_buffer(var_out, (n, T.int64(64)))
    S = T.sblock_alloc_buffer((n, T.int64(256)))
    for i0, i1 in T.grid(n, T.int64(256)):
        with T.sblock("swiglu"):
            v0, v1 = T.axis.remap("SS", [i0, i1])
            S[v0, v1] = G[v0, v1] / (T.float32(1) + T.exp(T.float32(0) - G[v0, v1])) * U[v0, v1]
    for i0, i1, k in T.grid(n, T.int64(64), T.int64(256)):
        with T.sblock("mul_mat"):
            v0, v1, vk = T.axis.remap("SSR", [i0, i1, k])
            with T.init():
                Out[v0, v1] = T.float32(0)
            Out[v0, v1] = Out[v0, v1] + S[v0, vk] * T.reinterpret(   # BF16 bits -> float32
                "float32", T.Cast("uint32", W[v1, vk]) << T.uint32(16))


def _cuda():
    from nextn.compiler.target import make_target

    return make_target("cuda", ["sm_90"])


def test_host_loop_in_a_gpu_function_is_found_and_stops_the_build():
    import tvm

    from nextn.common.errors import NextnError
    from nextn.compiler.lower.pipeline import check_device_module
    from nextn.schedules.gpu_bound import unbound_accesses

    f = half_bound
    # the host loop's store and load; the launched part's accesses of B / C are inside thread bindings
    assert unbound_accesses(f) == ["store B", "load A"]
    mod = tvm.IRModule({"half_bound": f, "shape_func": f.with_attr("tirx.is_host_func", True)})
    with pytest.raises(NextnError) as e:
        check_device_module(mod, _cuda())
    msg = str(e.value)
    assert "'half_bound'" in msg and "store B" in msg and "shape_func" not in msg and "\n" not in msg
    # the same function with the loop bound passes
    assert unbound_accesses(all_bound) == []
    check_device_module(tvm.IRModule({"all_bound": all_bound}), _cuda())


def test_lowbatch_gemv_binds_its_swiglu_prologue():
    """The cause: dlight's LowBatchGEMV leaves the padded prologue at the root, outside every thread binding;
    schedules/gpu.py inlines it into the GEMV, and the accepted schedule has nothing left on the host."""
    from tvm.s_tir import dlight as dl

    from nextn.schedules.gpu import schedule_func
    from nextn.schedules.gpu_bound import unbound_accesses

    f, tgt = swiglu_mul_mat, _cuda()
    raw = dl.gpu.LowBatchGEMV().apply(f, tgt, False)
    assert raw is not None
    assert unbound_accesses(raw.mod["main"])[:3] == ["store S_pad", "load G", "load U"]
    out, rule = schedule_func(f, tgt, "swiglu_mul_mat")
    assert rule == "LowBatchGEMV" and unbound_accesses(out) == []
    assert "T.exp(" in out.script()   # the SwiGLU is still computed: inside the GEMV's threads


def test_glm4moe_bf16_gpu_module_has_no_host_compute():
    """The model whose kernels escaped on the H200, through the whole Relax pipeline for cuda sm_90 (no codegen): the
    verify phase passes and every matmul (the SwiGLU + projection fusions included) has a GEMV schedule (cuda:gemv
    since compiler/lower/cuda; dlight's leftover that escaped is covered by the synthetic test above)."""
    import tvm

    from nextn.compiler.graphs import SPLIT_L, build_graphs, weight_kinds
    from nextn.compiler.loader.model_files import ModelFiles
    from nextn.compiler.lower import cuda
    from nextn.compiler.lower.pipeline import phases
    from nextn.compiler.lower.to_relax import build_module
    from nextn.schedules.gpu import ScheduleGPU, last_report
    from nextn.schedules.gpu_bound import host_compute

    mf = ModelFiles(str(G4 / "tiny-glm4moe-BF16.gguf"), None, load_mtp=False)
    graphs = build_graphs(mf, mf.has_nextn)
    tgt = _cuda()
    mod = build_module(list(graphs.values()), weight_kinds(mf, graphs.values()), form="gpu", split_l=SPLIT_L)
    names = []
    with tgt:
        for name, passes in phases(tgt, ScheduleGPU(tgt, cuda.RULES)):
            mod = tvm.transform.Sequential(passes)(mod)
            names.append(name)
            if name == "schedule":
                scheduled = mod
    assert names[-1] == "verify_device" and host_compute(mod) == {}
    rep = last_report()
    mm = {k: v for k, v in rep.items() if "mul_mat" in k}
    assert any("swiglu" in k for k in mm) and all(v in ("cuda:gemv", "LowBatchGEMV") for v in mm.values()), mm
    check_kernel_report(scheduled, rep, mf)


def check_kernel_report(mod, rules, mf):
    """The compile report of every kernel: its rule, a launch shape with numbers at T = 1, and weight bytes; the
    LM head's (`output.weight`, BF16 [8192, 256]) equal to the tensor's size in the GGUF."""
    from nextn.compiler.kernel_report import kernel_report

    rep = kernel_report(mod, rules)
    assert set(rep) == set(rules)
    for name, r in rep.items():
        assert r["rule"] == rules[name] and r["launches"], name
        assert all(isinstance(ln["blocks_at_1"], int) and ln["blocks_at_1"] > 0 and 0 < ln["threads"] <= 1024
                   for ln in r["launches"]), (name, r)
    n_head = int(mf.main.tensors["output.weight"].n_bytes)   # the GGUF's tensor table (gguf-py)
    assert n_head == 8192 * 256 * 2
    heads = [k for k, r in rep.items() if r["weight_bytes"] == n_head]
    assert heads and all(r["weight_bytes"] <= n_head for r in rep.values())


def test_launch_shape_of_a_known_kernel():
    """half_bound's launch as written: 2 blocks of 32 threads; an unbound kernel has none."""
    from nextn.compiler.kernel_report import shape_text
    from nextn.schedules.gpu_bound import extent_at, launches

    ls = launches(all_bound)
    assert [ln["grid"] for ln in ls] == [["1", "1", "1"], ["2", "1", "1"]]
    assert [ln["block"] for ln in ls] == [["64", "1", "1"], ["32", "1", "1"]]
    assert shape_text(ls[1]) == "grid 2 × block 32"
    assert launches(half_bound) == [{"grid": ["2", "1", "1"], "block": ["32", "1", "1"]}]   # the host loop: none
    from nextn.schedules.gpu import schedule_func

    out, _rule = schedule_func(swiglu_mul_mat, _cuda(), "s")
    (ln,) = launches(out)   # LowBatchGEMV: rows in blocks of 4 along blockIdx.y
    assert ln["grid"][1] == "(n + 3) // 4" and extent_at(ln["grid"][1]) == 1
    assert extent_at(ln["grid"][1], 9) == 3


FIXTURE_FILES = [f"tiny-{m}/tiny-{m}-{q}.gguf" for m in ("glm4moe", "glm-dsa", "glm5next")
                 for q in ("BF16", "Q8_0", "Q4_K_M")] + [
    f"quants/tiny-glm4moe-{q}.gguf" for q in ("IQ2_M", "IQ3_XXS", "MXFP4_MOE")]


@pytest.mark.slow
@pytest.mark.parametrize("rel", FIXTURE_FILES)
def test_every_fixture_builds_for_cuda_without_host_compute(compiled, rel):
    """Each fixture compiled for cuda sm_90 (the build's verify phase would stop it on an unbound PrimFunc), then
    its library read back: SASS for sm_90, and no PrimFunc whose host half does float arithmetic (objdump)."""
    import shutil

    from nextn.compiler.check_device_code import check_artifact

    art = compiled(f"cuda-{rel.split('/')[-1]}", FIXTURES / rel, kv="f16", target="cuda", arches=["sm_90"])
    rep = check_artifact(art)["model_cuda.so"]
    assert rep["cuda_sass"] == ["sm_90"]
    assert rep["host_compute"] == ([] if shutil.which("objdump") else "not checked (no objdump)")


def test_topk_rank_accumulates_in_a_register():
    """MoE top-k's rank (te_ops.topk_rank: each of 128 experts compared with all the others), which the reduction
    rules decline: SerialReduction maps it as Fallback does (a thread per output, serial over the others) but
    keeps the count in a register and stores it once; Fallback's kernel reads and writes the output in global
    memory in every step of the loop (CUDA source of sm_90 builds of both)."""
    import re

    import tvm
    from tvm import te
    from tvm.s_tir import dlight as dl

    from nextn.compiler.lower import te_ops
    from nextn.schedules.gpu import schedule_func

    x = te.placeholder((te.var("T", "int64"), 128), "float32", name="x")
    f = te.create_prim_func([x, te_ops.topk_rank(x)])
    tgt = _cuda()
    out, rule = schedule_func(f, tgt, "topk_rank")
    assert rule == "SerialReduction"

    from nextn.compiler.gpu_build import build_scope

    def stores_in_loop(func):
        with build_scope("cuda", ["sm_90"]), tgt:   # nvcc, as every GPU build (not TVM's default NVRTC)
            src = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "k")}), target=tgt) \
                .mod.imports[0].inspect_source()
        body = src[src.index("__global__"):]
        i = body.index("{", body.index("for ("))   # the reduction loop's body, to its matching brace
        depth, j = 0, i
        for j, ch in enumerate(body[i:], i):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                break
        return len(re.findall(r"topk_rank_ptr\[[^\]]*\] = ", body[i:j])), body

    n_serial, body = stores_in_loop(out)
    n_fallback, _ = stores_in_loop(dl.gpu.Fallback().apply(f, tgt, False).mod["main"]
                                   .with_attr("tirx.is_scheduled", True))
    assert n_fallback == 1 and n_serial == 0, body   # the register form stores after the loop only
    assert len(re.findall(r"topk_rank_ptr\[[^\]]*\] = ", body)) == 1
