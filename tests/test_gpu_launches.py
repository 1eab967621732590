"""What the CUDA graphs of a GPU artifact launch, read from the lowered VM code of one sm_90 build of tiny glm4moe Q8_0
(1 dense + 3 MoE layers, with a reduced draft head: --spec-draft-vocab 2048; `nextn compile --dump-ir`), each
hand-written or fused kernel where it belongs:

- decode: the router's GEMV, then the routing in one kernel (lower/topk.py), then the experts' GEMV reading the
  post-attention norm's int8 rows; no rank / select / sum_rows / SwiGLU kernel; three gate + SwiGLU GEMVs;
- decode: every norm that feeds integer-route matmuls is lower/cuda/norm_q8.py's kernel, and the next matmul reads
  its int8 rows (outputs 1 and 2 of its call);
- decode: one rope kernel per layer with the q / k norms in it (lower/rope_pair.py), one K + V store per layer;
- verify: the routed experts' tails in two kernels per MoE layer (gpu_forms `_gather_swiglu`, `_slot_sum`), no
  slot copy (`view`) kernel left, where FuseOps had left a gather, a gather + SwiGLU, a gather + product and
  n_used views;
- the manifest's `cuda_graph.launches` is the count read here, per captured entry (the `_vocab` ones too), and lower
  than before these kernels
  (decode 103, verify 127 kernels in the session-10 build; docs/gpu.md).
"""
from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.e2e   # one CUDA compile (nvcc)

MOE_LAYERS, LAYERS = 3, 4


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    from conftest import G4

    from nextn.common.compile_options import CompileOptions
    from nextn.compiler.compile import compile_model

    d = tmp_path_factory.mktemp("launches")
    compile_model(str(G4 / "tiny-glm4moe-Q8_0.gguf"), str(d / "art"),
                  CompileOptions(target="cuda", arches=["sm_90"], draft_vocab=2048), log=lambda *_: None,
                  dump_ir=str(d / "ir"))
    return open(d / "ir" / "4_lower.py").read(), json.load(open(d / "art" / "manifest.json"))


def _code(s: str, fn: str) -> str:
    """The code of Relax function `fn` in the printed module `s`."""
    m = re.search(rf"\n    def {fn}\(", s)
    assert m, fn
    j = s.find("\n    @", m.start() + 1)
    return s[m.start():j if j > 0 else None]


def _body(s: str, fn: str) -> str:
    """The code of the CUDA graph capture function(s) entry `fn` runs (mtp_draft has two regions; the `_vocab`
    entries run their full-head twins' regions, which RewriteCUDAGraph lifts once)."""
    regions = sorted(set(re.findall(r"cls\.(\w+_cuda_graph_capture\w*)", _code(s, fn))))
    assert regions, fn
    return "".join(_code(s, r) for r in regions)


def _kernels(s: str, fn: str) -> list[str]:
    """The TIR kernels `fn`'s CUDA graph capture calls, in order (not the host's shape functions)."""
    prims = set(re.findall(r"@T\.prim_func[^\n]*\n    def (\w+)\(", s))
    return [k for k in re.findall(r"cls\.(\w+)", _body(s, fn)) if k in prims and not k.startswith("shape_func")]


def test_decode_routes_in_one_kernel(build):
    kernels = _kernels(build[0], "decode")
    routers = [i for i, name in enumerate(kernels) if re.fullmatch(r"fused_mul_mat\d*_sigmoid\d*", name)]
    assert len(routers) == MOE_LAYERS, kernels
    for i in routers:   # the routing in one kernel, then the experts' GEMV on the post-attention norm's int8 rows
        assert re.fullmatch(r"topk_ids_8_2", kernels[i + 1]), kernels[i:i + 3]
        assert re.fullmatch(r"mul_mat_id\d*", kernels[i + 2]), kernels[i:i + 4]
    assert not [name for name in kernels if re.search(r"topk_rank|argsort|sum_rows|^swiglu", name)], kernels
    assert len([name for name in kernels if re.fullmatch(r"fused_mul_mat_id\d*_swiglu\d*", name)]) == MOE_LAYERS


def test_decode_norms_quantize_in_one_kernel(build):
    kernels = _kernels(build[0], "decode")
    norms = [i for i, k in enumerate(kernels) if k.startswith("rms_norm_q8")]
    assert len(norms) == 2 * LAYERS, kernels   # attention and post-attention norms (the output norm: the tail)
    assert not [k for k in kernels if "rms_norm" in k and not k.startswith("rms_norm_q8")], kernels
    for i in norms:   # the next kernel is a matmul (q, the router or the dense FFN), not a quantizer
        assert re.match(r"(fused_)?mul_mat", kernels[i + 1]), kernels[i:i + 3]
    body = _body(build[0], "decode")
    calls = list(re.finditer(r"cls\.rms_norm_q8\w*\(([^)]*)\)", body))
    assert len(calls) == 2 * LAYERS, body[:2000]
    for call, after in zip(calls, [c.start() for c in calls[1:]] + [len(body)]):
        outs = [a.strip() for a in call.group(1).split(",")][-3:]   # y, xq, xd: the call's output buffers
        # the matmuls up to the next norm: those on the integer route read xq and xd (the router: y, float)
        mats = [[a.strip() for a in m.group(2).split(",")]
                for m in re.finditer(r"cls\.(fused_)?mul_mat\w*\(([^)]*)\)", body[call.end():after])]
        assert any(outs[1] in a and outs[2] in a for a in mats), (outs, mats)


def test_decode_rope_and_kv_store_per_layer(build):
    kernels = _kernels(build[0], "decode")
    ropes = [k for k in kernels if "rope" in k]
    assert len(ropes) == LAYERS and all(k.startswith("rope_pair_8_2_d32_") for k in ropes), kernels
    stores = [k for k in kernels if k.startswith("set_rows")]
    assert len(stores) == LAYERS and all(k.startswith("set_rows_pair_f16") for k in stores), kernels


def test_verify_expert_tails_in_two_kernels(build):
    kernels = _kernels(build[0], "verify")
    assert len([k for k in kernels if k.startswith("expert_gather_swiglu_2x")]) == MOE_LAYERS, kernels
    assert len([k for k in kernels if re.search(r"expert_gather_sum_2x", k)]) == MOE_LAYERS, kernels
    assert not [k for k in kernels if re.fullmatch(r"view\d*", k) or re.fullmatch(r"(fused_)?expert_gather_\d.*", k)]


def test_manifest_counts_and_fewer_than_before(build):
    s, manifest = build
    launches = manifest["cuda_graph"]["launches"]
    # every captured entry, the reduced draft head's too (--spec-draft-vocab: the same regions as the full head's,
    # whose head GEMV runs after the graph)
    assert set(launches) == set(manifest["cuda_graph"]["entries"]) >= {"draft_vocab", "mtp_draft_vocab"}
    assert launches == {fn: len(_kernels(s, fn)) for fn in launches}
    assert launches["draft_vocab"] == launches["draft"] and launches["mtp_draft_vocab"] == launches["mtp_draft"]
    assert launches["decode"] <= 103 - 6 * LAYERS and launches["verify"] <= 127 - 6 * LAYERS - 3 * MOE_LAYERS
