"""What a GPU artifact does differently, checked on the CPU where it can run: L rounded up to a KV bucket (cells
after each row's position are read and masked) and inputs written into fixed buffers change no bit of the
output, speculation, the glm-dsa / glm5next index sharing and the glm5next pools and recurrent planes included; the NextN DSA selection is stored by position; and
the GPU form of attention / index score / top-k (separate kernels, softmax normalised before P·V) computes the
same model: compiled for llvm, it matches the interpreter and the fixtures' greedy references; its integer route
(int8 activation rows, lower/cuda/int8.py, the default of a GPU artifact) passes the device check's own int8
comparison against the default CPU artifact."""
import numpy as np
import pytest

from conftest import FIXTURES, check_trunk_vs_ir, dequantized, reference

import nextn.runtime as rt
from nextn.compiler.ir import Graph, interpret

CASES = {"glm4moe": FIXTURES / "tiny-glm4moe" / "tiny-glm4moe-Q8_0.gguf",
         "glm-dsa": FIXTURES / "tiny-glm-dsa" / "tiny-glm-dsa-Q8_0.gguf",
         "glm5next": FIXTURES / "tiny-glm5next" / "tiny-glm5next-Q8_0.gguf"}


def _run(m, prompts):
    out = []
    for p in prompts:
        plain = m.generate(p["prompt_ids"], 24, spec_type="none", ignore_eos=True)
        spec = m.generate(p["prompt_ids"], 24, spec_type="draft-mtp", n_max=3, ignore_eos=True)
        out.append((plain.ids, spec.ids, spec.stats.accepted, spec.stats.drafted, m.logits(p["prompt_ids"])))
    return out


@pytest.mark.parametrize("arch", sorted(CASES))
def test_kv_bucket_and_fixed_inputs_are_bit_exact(arch, compiled):
    path = CASES[arch]
    m = rt.load(compiled(f"{arch}-q8", path), ctx_size=512)
    prompts = [p for p in reference(path.parent)["prompts"] if len(p["prompt_ids"]) < 400][:3]
    want = _run(m, prompts)
    e = m.sequence
    # a CUDA artifact's graph entries (compiler/lower/capture_graphs.py): the one-row and the few-row steps
    e.model.kv_bucket = 64
    e.model.static_inputs = {"decode", "draft", "mtp_draft_shared", "verify", "mtp_draft"}
    e.model.graph_max_rows = e.model.max_draft + 1
    assert e.n_kv(1) == 64 and e.n_kv(64) == 64 and e.n_kv(65) == 128 and e.n_kv(500) == 512   # capped at n_ctx
    got = _run(m, prompts)
    fixed = {(k[0], k[1][0]) for k in e._inbuf}    # (entry, rows): one set of fixed buffers per row count
    assert {("decode", 1), ("draft", 1)} <= fixed  # the one-row steps did go through fixed buffers,
    assert len({T for name, T in fixed if name == "verify" and T > 1}) >= 2   # and verifies of several row counts
    assert any(name == "mtp_draft" for name, _ in fixed)
    for (a_plain, a_spec, a_acc, a_dr, a_lg), (b_plain, b_spec, b_acc, b_dr, b_lg) in zip(want, got):
        assert b_plain == a_plain and b_spec == a_spec and (b_acc, b_dr) == (a_acc, a_dr)
        assert np.array_equal(b_lg, a_lg)


def test_graph_entries_refuse_more_rows_than_planned(compiled):
    """A CUDA artifact plans its captured few-row entries for at most `max_rows` rows: more is one clear error,
    before anything runs (the CPU stands in for the GPU: the bound is the runtime's)."""
    from nextn.common.errors import NextnError

    m = rt.load(compiled("glm4moe-q8", CASES["glm4moe"]), ctx_size=512)
    e = m.sequence
    e.model.static_inputs, e.model.graph_max_rows = {"decode", "verify"}, 3
    ids = reference(CASES["glm4moe"].parent)["prompts"][0]["prompt_ids"][:8]
    e.verify(ids[:3], 0)                           # at the bound: runs
    with pytest.raises(NextnError, match=r"^verify: 4 rows, more than the 3 this artifact's CUDA graphs .*"
                                         r"--no-cuda-graph$"):
        e.verify(ids[:4], 0)
    assert e.prefill(np.asarray(ids, np.int32), 0)[2] >= 0   # prefill (never captured) takes any number of rows


@pytest.mark.e2e
def test_index_mask_store_by_position():
    """state[s] = mask[T-1, s] for cells up to the last row's position, 0 (selected) after it, whatever L is:
    interpreter and kernel."""
    import tvm
    from tvm import relax

    from nextn.compiler.lower.indexer import dsa_kernels

    C, L, T = 40, 32, 2
    rng = np.random.default_rng(3)
    mask = np.where(rng.random((T, L)) < 0.5, 0.0, -np.inf).astype(np.float32)
    pos = np.array([20, 21], np.int32)                   # L (32) is rounded up past the last row (21)
    g = Graph("store")
    st = g.state("m", ("C",))
    g.output("m", g.index_mask_store(st, g.input("mask", (T, "L")), g.input("pos", (T,), "int32")))
    state = {"m": np.full(C, 7.0, np.float32)}
    got = interpret.run(g, {"mask": mask, "pos": pos}, lambda n: None, state, n_kv=L)["m"]
    want = np.zeros(C, np.float32)
    want[:22] = mask[-1, :22]
    assert np.array_equal(got, want)
    bb = relax.BlockBuilder()
    gv = bb.add_func(dsa_kernels.index_mask_store_kernel, "store")
    ex = tvm.compile(tvm.IRModule({"store": bb.get()[gv].with_attr("global_symbol", "store")}), target="llvm")
    buf = tvm.runtime.tensor(np.full(C, 7.0, np.float32))
    ex["store"](buf, mask, pos)
    assert np.array_equal(buf.numpy(), want)


@pytest.mark.parametrize("arch", sorted(CASES))
def test_split_kernels_form(arch, compiled):
    from nextn.compiler.graphs import build_graphs
    from nextn.compiler.loader.model_files import ModelFiles

    path = CASES[arch]
    # float activation rows (exact_matmul): equal to the interpreter and the references
    m = rt.load(compiled(f"{arch}-split-exact", path, split_kernels=True, exact_matmul=True), ctx_size=512)
    assert m.loaded.artifact.manifest["kernel_form"] == "gpu-emulated"
    mf = ModelFiles(path, load_mtp=True)
    ref = reference(path.parent)
    p = next(p for p in ref["prompts"] if p["kind"] == "code-short")
    check_trunk_vs_ir(m.sequence, build_graphs(mf, with_mtp=True), dequantized(mf),
                      np.asarray(p["prompt_ids"], np.int32), rows=3)
    plain = m.generate(p["prompt_ids"], p["n_predict"], spec_type="none", ignore_eos=True)
    assert plain.ids == p["greedy_ids"]
    spec = m.generate(p["prompt_ids"], p["n_predict"], spec_type="draft-mtp", n_max=2, ignore_eos=True)
    assert spec.ids == plain.ids and spec.stats.accepted == p["spec"]["2"]["accepted"]


@pytest.mark.parametrize("arch", sorted(CASES))
def test_split_kernels_integer_route(arch, compiled, tmp_path):
    """The GPU form with its integer route (the default GPU artifact's matmuls: activation rows quantized once per
    matmul as the CPU quantizes them, int32 word sums; the norm + quantizer kernel, the grouped experts of verify),
    built for llvm, held to the default CPU artifact (x86 int8 kernels) exactly as the device check holds a CUDA
    artifact (bench/device_refs.py: `record_expectations`, `compare` at INT8_TOL, near-ties told from differences by
    the expectation's top-2 margins): last logits, greedy ids, spec == off at n_max 1..3, acceptance counts."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "bench"))
    import device_refs

    path = CASES[arch]
    emu = rt.load(compiled(f"{arch}-split", path, split_kernels=True), ctx_size=4096)
    man = emu.loaded.artifact.manifest
    assert man["kernel_form"] == "gpu-emulated" and man["x86_kernels"] is None   # no x86 kernel takes a matmul
    cpu = rt.load(compiled(f"{arch}-q8", path), ctx_size=4096)
    kinds = ["code-short", "docs-heading", "one-token"]
    device_refs.record_expectations(cpu, str(path.parent), str(tmp_path / "expect"), kinds=kinds)
    want = device_refs.expect_want(str(tmp_path / "expect"), None)
    checks = device_refs.compare(device_refs.model_outputs(emu, want, rows=False), want, exact_acceptance=True,
                                 tol=device_refs.INT8_TOL)
    # per prompt: logits, ids, spec == off and counts at n_max 1..3 (+ the shared NextN index run of glm-dsa / glm5next)
    assert len(checks) >= len(kinds) * 8 and all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    # spec == off never a near-tie: the same artifact's verify and decode rows
    assert all(not c.get("undecided") for c in checks if "spec n_max" in c["check"])
    # the int8 rows are another computation than float activations: not the --exact-matmul run's logits
    logits = [float(c["detail"].split()[1].rstrip(",")) for c in checks if c["check"].endswith("last logits")]
    assert max(logits) > 10 * device_refs.GPU_TOL, logits
