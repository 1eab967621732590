"""GPU artifacts built on this GPU-less machine: CUDA sm_80/sm_90/sm_120 in one fatbin, ROCm gfx942; the device
code inside each library is read back from its bytes. (Running them needs a GPU: bench/device_check.sh.)"""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import G4

pytestmark = pytest.mark.slow   # CUDA / ROCm artifact builds (minutes each)

CUDA_ARCHES = ["sm_80", "sm_90", "sm_120"]
MODEL = G4 / "tiny-glm4moe-Q8_0.gguf"


@pytest.fixture(scope="module")
def cuda_art(tmp_path_factory):
    from nextn.compiler.compile import compile_model
    from nextn.common.compile_options import CompileOptions

    out = str(tmp_path_factory.mktemp("art-cuda"))
    dump = str(tmp_path_factory.mktemp("ir-cuda"))
    # the build runs in a child process (compiler/reproducible.py): read its rule report from the IR dump
    compile_model(str(MODEL), out, CompileOptions(target="cuda", arches=["sm_80,sm_90", "sm_120"]),
                  log=lambda *_: None, dump_ir=dump)
    return out, json.load(open(f"{dump}/schedule_report.json")), dump


@pytest.fixture(scope="module")
def rocm_art(tmp_path_factory):
    from nextn.compiler.compile import compile_model
    from nextn.common.compile_options import CompileOptions

    out = str(tmp_path_factory.mktemp("art-rocm"))
    compile_model(str(MODEL), out, CompileOptions(target="rocm", arches=["gfx942"]), log=lambda *_: None)
    return out


def _manifest(d):
    with open(f"{d}/manifest.json") as f:
        return json.load(f)


def test_cuda_artifact_carries_each_requested_arch(cuda_art):
    from nextn.common.device_code import device_code
    from nextn.compiler.check_device_code import check_artifact

    d = cuda_art[0]
    m = _manifest(d)
    assert m["target"]["kind"] == "cuda" and m["target"]["arches"] == CUDA_ARCHES
    assert [lib["arches"] for lib in m["libraries"]] == [CUDA_ARCHES]
    info = device_code(f"{d}/{m['libraries'][0]['file']}")
    assert info["cuda_sass"] == sorted(CUDA_ARCHES)          # SASS for exactly the requested arches
    assert info["cuda_ptx"] == ["sm_80"]                      # + PTX of the lowest, for newer GPUs
    assert not info["cuda_source"]                            # compiled code, not CUDA source to JIT
    assert len(info["fatbins"]) >= 1 and all(not e["compressed"] for fb in info["fatbins"] for e in fb)
    rep = check_artifact(d)
    assert rep[m["libraries"][0]["file"]]["expected"] == CUDA_ARCHES


def test_fatbin_headers_agree_with_cubin_elf_flags(cuda_art):
    """Two independent readings of the same bytes: fatbin entry headers and the cubins' own ELF e_flags."""
    from nextn.common.device_code import _elf_archs, _fatbin_entries, FATBIN_MAGIC
    import re

    d = cuda_art[0]
    data = open(f"{d}/model_cuda.so", "rb").read()
    from_headers = sorted({e["arch"] for m in re.finditer(re.escape(FATBIN_MAGIC), data)
                           for e in _fatbin_entries(data, m.start()) if e["kind"] == "sass"})
    cuda_elf, amd = _elf_archs(data)
    assert from_headers == sorted(set(cuda_elf)) == sorted(CUDA_ARCHES) and amd == []


def test_checker_reports_missing_arch_and_source_only(cuda_art, tmp_path):
    from nextn.common.device_code import device_code, missing_arches
    from nextn.compiler.check_device_code import check_artifact
    from nextn.common.errors import NextnError

    d = cuda_art[0]
    assert missing_arches(f"{d}/model_cuda.so", ["sm_90", "sm_86"]) == ["sm_86"]
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    m = _manifest(bad)
    m["libraries"][0]["arches"] = CUDA_ARCHES + ["sm_89"]
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(NextnError, match="sm_89"):
        check_artifact(str(bad))
    src = tmp_path / "src.so"
    src.write_bytes(b"\x7fELF" + b"\0" * 60 + b'extern "C" __global__ void k() {}')
    assert device_code(str(src))["cuda_source"] and device_code(str(src))["cuda_sass"] == []


def test_every_primfunc_is_gpu_scheduled_and_gemvs_are_not_fallback(cuda_art):
    rep = cuda_art[1]
    assert len(rep) > 20
    assert set(rep.values()) <= {"cuda:gemv", "cuda:quantize", "LowBatchGEMV", "Matmul", "GEMV", "Reduction",
                                 "GeneralReduction", "SerialReduction", "Fallback", "pre-scheduled"}
    # the integer route (compiler/lower/cuda/int8.py): every activation quantizer takes its own rule
    quantizers = {k for k in rep if k.startswith("quantize_q8")}
    assert quantizers and {k for k, v in rep.items() if v == "cuda:quantize"} == quantizers
    # the hand-written GPU kernels (KV store, flash attention, MoE top-k, norm + quantizer, rope, prefill's
    # tensor-core matmuls and their expert sort) and nothing else come pre-scheduled
    hand = ("set_rows_", "flash_attn", "topk_ids_", "rms_norm_q8_", "rope_pair_", "mul_mat_mma_", "mul_mat_id_mma_",
            "expert_tiles_")
    assert {k for k, v in rep.items() if v == "pre-scheduled"} == {k for k in rep if k.startswith(hand)}
    assert any(k.startswith("mul_mat_mma_") for k in rep)   # sm_90: prefill's matmuls on tensor cores
    gemvs = {k: v for k, v in rep.items() if "mul_mat" in k and "_mma_" not in k}
    assert gemvs and all(v == "cuda:gemv" for v in gemvs.values()), gemvs   # compiler/lower/cuda


def captures(dump: str, fn: str) -> tuple[int, list[str]]:
    """In the lowered VM code of Relax function `fn` (--dump-ir DIR/4_lower.py): how many CUDA graph regions it
    replays, and the kernels it still launches one by one outside them."""
    import re

    s = open(f"{dump}/4_lower.py").read()
    i = re.search(rf"\n    def {fn}\(", s).start()
    j = s.find("\n    @", i + 1)
    body = s[i:j if j > 0 else None]
    return body.count("vm.builtin.cuda_graph.run_or_capture"), [
        k for k in re.findall(r"cls\.(\w+)", body) if "cuda_graph" not in k]


def graph_kernels(dump: str) -> dict:
    """{entry: kernels its CUDA graph capture function(s) call} in the lowered VM code (--dump-ir DIR/4_lower.py),
    counted from the printed code (TIR functions, not the host's shape functions), not from the compiler's count."""
    import re

    s = open(f"{dump}/4_lower.py").read()
    prims = set(re.findall(r"@T\.prim_func[^\n]*\n    def (\w+)\(", s))
    out = {}
    for m in re.finditer(r"\n    def (\w+?)_cuda_graph_capture\w*\(", s):
        j = s.find("\n    @", m.start() + 1)
        calls = [c for c in re.findall(r"cls\.(\w+)", s[m.start():j if j > 0 else None])
                 if c in prims and not c.startswith("shape_func")]
        out[m.group(1)] = out.get(m.group(1), 0) + len(calls)
    return out


def graph_storage(dump: str) -> int:
    """Bytes of the storages the lowered VM code (--dump-ir DIR/4_lower.py) allocates in its `cuda_graph_alloc`
    function(s): read from the printed code, not from the compiler's own count."""
    import re

    s = open(f"{dump}/4_lower.py").read()
    total = 0
    for m in re.finditer(r"\n    def cuda_graph_alloc\w*\(", s):
        body = s[m.start():s.find("\n    @", m.start() + 1)]
        total += sum(int(x) for x in re.findall(r"alloc_storage\(R\.shape\(\[(\d+)\]\)", body))
    return total


def _without_quantizers(kernels: list[str]) -> list[str]:
    """`kernels` without the integer route's activation quantizers (quantize_q8*: compiler/lower/cuda/int8.py)."""
    return [k for k in kernels if not k.startswith("quantize_q8")]


def workspaces(dump: str) -> list[str]:
    """PrimFuncs that allocate device memory of their own (a workspace at every call) in the lowered module."""
    import re

    out = []
    for f in re.split(r"\n    @T.prim_func", open(f"{dump}/4_lower.py").read())[1:]:
        allocs = [ln for ln in f.splitlines() if "alloc_buffer(" in ln]
        if any('scope="local"' not in ln and 'scope="shared"' not in ln for ln in allocs):
            out.append(re.search(r"def (\w+)\(", f).group(1))
    return out


def test_cuda_graph_one_region_per_step(cuda_art):
    """decode / draft, and the few-row verify / mtp_draft (one graph per row count, planned for max_draft + 1
    rows), replay as one captured CUDA graph each; only the output tail (final norm, lm head, argmax), which writes
    the step's returned tensors, launches outside. prefill and mtp_rows (any number of rows) stay uncaptured."""
    from nextn.common.manifest import MAX_DRAFT
    from nextn.compiler.loader.model_files import ModelFiles

    d, _rep, dump = cuda_art
    assert _manifest(d)["cuda_graph"] == {"entries": ["decode", "draft", "mtp_draft", "verify"], "kv_bucket": 256,
                                          "max_ctx": ModelFiles(MODEL).config.n_ctx_train, "max_rows": MAX_DRAFT + 1,
                                          "static_bytes": graph_storage(dump), "launches": graph_kernels(dump)}
    assert graph_storage(dump) > 0
    # tiny glm4moe: 1 dense + 3 MoE layers, the NextN block (draft) on its own; a verify's MoE layers add the
    # experts' grouping kernels
    launches = _manifest(d)["cuda_graph"]["launches"]
    assert 60 < launches["decode"] < launches["verify"] and 20 < launches["draft"] < launches["mtp_draft"], launches
    # the few-row ones also compute their symbolic shapes on the host (a VM shape function) first; mtp_draft's head
    # takes its `out_ids` rows (get_rows) and quantizes them in a second, small graph; argmax is two kernels
    for fn, regions, tail in (("decode", 1, 4), ("draft", 1, 4), ("verify", 1, 4), ("mtp_draft", 2, 5)):
        n, outside = captures(dump, fn)
        launched = [k for k in _without_quantizers(outside) if not k.startswith("shape_func")]
        assert n == regions and len(launched) == tail and len(outside) <= 6, (fn, outside)
        assert "mul_mat" in launched[-3] and launched[-2].startswith("argmax_chunks"), (fn, launched)
    for fn in ("prefill", "mtp_rows"):
        assert captures(dump, fn)[0] == 0
    # the GPU form: flash attention keeps its tiles in shared memory and registers, top-k is split into kernels
    # with Relax-planned scratch, so no kernel allocates device memory inside a captured graph
    assert _manifest(d)["kernel_form"] == "gpu" and workspaces(dump) == []


def test_glm_dsa_cuda_artifact_and_graphs(tmp_path):
    """glm-dsa builds for CUDA too (its top-k kernel needs no scratch buffer); each one-row step, the NextN
    draft with its DSA indexer included, is captured whole (L-sized index tensors get storage planned for
    max_ctx cells)."""
    from nextn.compiler.check_device_code import check_artifact
    from nextn.compiler.compile import compile_model
    from nextn.common.compile_options import CompileOptions

    dsa = G4.parent / "tiny-glm-dsa" / "tiny-glm-dsa-Q8_0.gguf"
    out, dump = str(tmp_path / "art"), str(tmp_path / "ir")
    compile_model(str(dsa), out, CompileOptions(target="cuda", arches=["sm_90"]), log=lambda *_: None, dump_ir=dump)
    assert check_artifact(out)["model_cuda.so"]["expected"] == ["sm_90"]
    assert _manifest(out)["cuda_graph"]["entries"] == ["decode", "draft", "mtp_draft", "mtp_draft_shared", "verify"]
    for fn, regions in (("decode", 1), ("mtp_draft_shared", 1), ("draft", 2)):   # draft: + the index store
        n, outside = captures(dump, fn)
        assert n == regions and len(_without_quantizers(outside)) == 4 and len(outside) <= 5, (fn, n, outside)
    # the few-row entries too: mtp_draft as draft (+ the index store) plus its out_ids rows' quantizer (see above)
    for fn, regions, tail in (("verify", 1, 4), ("mtp_draft", 3, 5)):
        n, outside = captures(dump, fn)
        launched = [k for k in _without_quantizers(outside) if not k.startswith("shape_func")]
        assert n == regions and len(launched) == tail and "mul_mat" in launched[-3] and len(outside) <= 6, (fn, outside)
    assert workspaces(dump) == []
    rep = json.load(open(f"{dump}/schedule_report.json"))
    # attention (MLA, split over L in the one-row steps) and the index score are hand-written GPU kernels, and
    # nothing builds [T, H, L] scores any more
    flash = [k for k in rep if k.startswith(("flash_attn", "lightning_indexer"))]
    assert {k.split("_gpu")[0] for k in flash} == {"flash_attn", "flash_attn_partial", "flash_attn_merge",
                                                   "lightning_indexer"}
    assert all(rep[k] == "pre-scheduled" for k in flash)
    assert not [k for k in rep if k.startswith(("attn_scores", "soft_max", "attn_pv", "index_qk", "index_score"))]


def test_no_cuda_graph_and_context_limit(cuda_art, tmp_path):
    from nextn.compiler.compile import compile_model
    from nextn.common.compile_options import CompileOptions
    from nextn.runtime.artifact import load_artifact
    from nextn.runtime.model import LoadedModel
    from nextn.common.errors import NextnError

    out, dump = str(tmp_path / "art"), str(tmp_path / "ir")
    compile_model(str(MODEL), out, CompileOptions(target="cuda", arches=["sm_90"], cuda_graph=False),
                  log=lambda *_: None, dump_ir=dump)
    regions, launched = captures(dump, "decode")
    assert _manifest(out)["cuda_graph"] is None and regions == 0   # no captured region: every kernel launched alone
    assert len(launched) > 20
    assert workspaces(dump) == []   # without graphs too: flash attention allocates no device memory
    max_ctx = _manifest(cuda_art[0])["cuda_graph"]["max_ctx"]
    with pytest.raises(NextnError, match=f"larger than the {max_ctx} cells .* --no-cuda-graph"):
        LoadedModel(load_artifact(cuda_art[0]), max_ctx + 1)


def test_rocm_gfx942_code_object(rocm_art):
    from nextn.common.device_code import device_code
    from nextn.compiler.check_device_code import check_artifact

    m = _manifest(rocm_art)
    assert m["target"]["kind"] == "rocm" and m["target"]["arches"] == ["gfx942"]
    assert [lib["file"] for lib in m["libraries"]] == ["model_rocm_gfx942.so"]
    info = device_code(f"{rocm_art}/model_rocm_gfx942.so")
    assert info["amdgpu"] == ["gfx942"] and info["cuda_sass"] == []
    check_artifact(rocm_art)


def test_arch_parsing():
    from nextn.common.compile_options import parse_arches
    from nextn.compiler.gpu_build import gencode_flags
    from nextn.common.errors import NextnError

    assert parse_arches("cuda", ["sm_90,80", "sm_120", "sm_90"]) == ["sm_90", "sm_80", "sm_120"]
    assert parse_arches("cuda", None) == CUDA_ARCHES
    assert parse_arches("llvm", None) == []
    with pytest.raises(NextnError, match="sm_61"):
        parse_arches("cuda", ["sm_61"])
    with pytest.raises(NextnError, match="takes no --arch"):
        parse_arches("llvm", ["sm_80"])
    assert gencode_flags(["sm_90", "sm_80"]) == ["-gencode", "arch=compute_80,code=sm_80", "-gencode",
                                                 "arch=compute_90,code=sm_90", "-gencode",
                                                 "arch=compute_80,code=compute_80"]


def test_cli_bad_arch_and_device(cuda_art, capsys):
    from nextn.runtime.cli import main

    for argv, want in ((["compile", str(MODEL), "--target", "cuda", "--arch", "sm_61"], "sm_61"),
                       (["compile", str(MODEL), "--target", "rocm", "--arch", "sm_90"], "sm_90"),
                       (["run", cuda_art[0], "-p", "x"], "--device cuda:0"),
                       (["run", cuda_art[0], "-p", "x", "--device", "tpu:0"], "tpu:0")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 1 and len(err.splitlines()) == 1 and want in err, (argv, err)


@pytest.mark.slow
def test_glm5next_cuda_rocm_artifacts_and_graphs(tmp_path):
    """GLM-5.3-Flash builds for CUDA sm_80/sm_90/sm_120 (one fatbin) and ROCm gfx942. Its hand-written kernels (KDA
    conv and delta rule, Sinkhorn, k-pooling) come thread-bound; no kernel allocates scratch; each one-row step
    (decode, draft, mtp_draft_shared) and each few-row one (verify, mtp_draft) is captured whole, its
    recurrent-state planes included (outside: the output tail, the draft's index store, and host shape functions
    such as L // kpool)."""
    from nextn.compiler.check_device_code import check_artifact
    from nextn.compiler.compile import compile_model
    from nextn.common.compile_options import CompileOptions

    g5n = G4.parent / "tiny-glm5next" / "tiny-glm5next-Q8_0.gguf"
    out, dump = str(tmp_path / "cuda"), str(tmp_path / "ir")
    compile_model(str(g5n), out, CompileOptions(target="cuda"), log=lambda *_: None, dump_ir=dump)
    assert check_artifact(out)["model_cuda.so"]["cuda_sass"] == sorted(CUDA_ARCHES)
    assert _manifest(out)["cuda_graph"]["entries"] == ["decode", "draft", "mtp_draft", "mtp_draft_shared", "verify"]
    # the few-row verify / mtp_draft too (mtp_draft: + its out_ids rows' quantizer, as glm-dsa's)
    for fn, regions, tail in (("decode", 1, 4), ("mtp_draft_shared", 1, 4), ("draft", 2, 4), ("verify", 1, 4),
                              ("mtp_draft", 3, 5)):
        n, outside = captures(dump, fn)
        kernels = _without_quantizers([k for k in outside if not k.startswith("shape_func")])
        assert n == regions and len(kernels) == tail, (fn, n, outside)
    assert workspaces(dump) == []
    rep = json.load(open(f"{dump}/schedule_report.json"))
    hand = {k: v for k, v in rep.items() if k.startswith(("ssm_conv", "gated_delta_net", "dsv4_hc_comb", "kpool_store"))}
    assert len(hand) == 4 and set(hand.values()) == {"pre-scheduled"}, hand
    assert all(v != "Fallback" for k, v in rep.items() if "mul_mat" in k)
    rocm = str(tmp_path / "rocm")
    compile_model(str(g5n), rocm, CompileOptions(target="rocm", arches=["gfx942"]), log=lambda *_: None)
    assert check_artifact(rocm)["model_rocm_gfx942.so"]["amdgpu"] == ["gfx942"]
