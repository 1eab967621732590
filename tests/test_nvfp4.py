"""NVFP4 models with their second-level scales (GGUF `X.scale` next to `X.weight`, llama.cpp's `*_s` tensors).

The file: the tiny glm-dsa (or glm4moe) BF16 fixture whose FFN weights — dense, shared expert and routed experts,
trunk and NextN — are requantized to NVFP4 here the way ModelOpt's checkpoints are and convert_hf_to_gguf.py
writes them: a float32 second scale s2 = amax / (6 * 448) per tensor (per expert for the stacked experts) in
`X.scale`, and per 16 weights the unsigned e4m3 byte of the smallest value >= amax16 / 6 over s2, e2m1 codes
rounded to nearest. One weight (blk.0.ffn_gate) is quantized with s2 = 1 and written without `.scale`, as
the converter leaves out a scale of 1. gguf-py has no NVFP4 quantizer; its dequantizer is the reference of the
element path (test_quant.py).

Checks: the graphs multiply each scaled matmul's output by its scale (per expert through the selected ids); the
compiled model (float activations) equals the numpy IR interpreter on the gguf-py-dequantized weights within
float32 rounding, trunk and NextN; its logits keep the BF16 reference's argmax on most rows of a prompt (and
dropping the scales does not); a scale of the wrong shape or on an embedding table is refused in one line.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import badgguf
from conftest import FIXTURES, check_mtp_vs_ir, check_trunk_vs_ir, dequantized, exact_sequence, reference, \
    reference_logits, zero_states
from nextn.common.errors import NextnError
from nextn.compiler.graphs import build_graphs
from nextn.compiler.ir import interpret
from nextn.compiler.loader.model_files import ModelFiles

NV = gguf.quants.NVFP4
QT = gguf.GGMLQuantizationType.NVFP4
E2M1 = np.array(NV.kvalues, np.float32) / 2          # code -> e2m1 value (gguf-py's table holds them doubled)
# byte -> ue4m3 value, increasing over 0 … 0x7E (gguf-py gives them halved); a block's byte is the smallest value
# >= amax16 / 6 (gguf-py's fp32_to_ue4m3, like ggml's, saturates every value >= 256 to 448, so it is not used)
UE4M3 = NV.ue4m3_to_fp32(np.arange(0x7F, dtype=np.uint8)).astype(np.float32) * 2
DSA = FIXTURES / "tiny-glm-dsa"
G4 = FIXTURES / "tiny-glm4moe"
SRC = {"glm-dsa": DSA / "tiny-glm-dsa-BF16.gguf", "glm4moe": G4 / "tiny-glm4moe-BF16.gguf"}
UNSCALED = "blk.0.ffn_gate.weight"                    # quantized with s2 = 1, no `.scale` (the converter's rule)


def quantize(w: np.ndarray, s2) -> np.ndarray:
    """NVFP4 bytes [..., N, K/64*36] of w / s2 (w float32 [..., N, K]; s2 broadcast over w's last two axes)."""
    *lead, K = w.shape
    v = (w / s2).reshape(-1, K // 16, 16)
    d = np.searchsorted(UE4M3, np.abs(v).max(-1) / 6).clip(0, 0x7E).astype(np.uint8)   # [R, K/16] scale bytes
    dv = UE4M3[d][..., None]
    x = np.where(dv > 0, v / np.where(dv > 0, dv, 1), 0)
    q = np.abs(x[..., None] - E2M1).argmin(-1).astype(np.uint8)     # nearest code
    qs = q[..., :8] | (q[..., 8:] << 4)                               # byte j: elements j (low), 8 + j (high)
    blocks = np.concatenate([d.reshape(-1, K // 64, 4), qs.reshape(-1, K // 64, 32)], -1)
    return np.ascontiguousarray(blocks.reshape(*lead, K // 64 * 36), np.uint8)


def ffn_weights(mf: ModelFiles) -> list[str]:
    return [n for n in mf.main.tensors if ".ffn_" in n and n.endswith(".weight") and "gate_inp" not in n
            and mf.main.tensor_type(n) in ("BF16", "F16", "F32") and len(mf.main.tensor_shape(n)) >= 2]


def make_nvfp4(src, dst, extra: dict | None = None):
    """`src` with its FFN weights as NVFP4 plus their `.scale` tensors (module docstring); `extra` {name: tensor}
    added or replacing."""
    mf = ModelFiles(src)
    tensors = {}
    for name in ffn_weights(mf):
        w = mf.load(name, quantized=False).arrays[0]
        if name == UNSCALED:
            s2 = np.float32(1)
        else:
            amax = np.abs(w).max(axis=(-2, -1)) if w.ndim == 3 else np.abs(w).max()
            s2 = (np.atleast_1d(amax) / np.float32(6 * 448)).astype(np.float32)
            tensors[name[:-len(".weight")] + ".scale"] = s2
            s2 = s2[:, None, None] if w.ndim == 3 else s2[0]
        tensors[name] = (quantize(w, s2), QT)
    tensors.update(extra or {})
    return badgguf.copy_gguf(src, dst, tensors=tensors)


@pytest.fixture(scope="module")
def dsa_file(tmp_path_factory):
    return make_nvfp4(SRC["glm-dsa"], tmp_path_factory.mktemp("nvfp4") / "tiny-glm-dsa-NVFP4.gguf")


def test_quantizer_round_trip():
    """The test's quantizer against gguf-py's dequantizer: deq(bytes) * s2 is w within the 4-bit grid's error."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((3, 8, 128)) * 0.05).astype(np.float32)
    s2 = (np.abs(w).max(axis=(1, 2)) / (6 * 448)).astype(np.float32)
    raw = quantize(w, s2[:, None, None])
    back = gguf.quants.dequantize(raw, QT) * s2[:, None, None]
    assert back.shape == w.shape
    blocks = np.abs(w).reshape(3, 8, 8, 16).max(-1, keepdims=True)
    # per block of 16: half the widest e2m1 step (4 -> 6) of a scale >= amax16 / 6 rounded up by at most 1/8
    assert (np.abs(back - w).reshape(3, 8, 8, 16) <= blocks * (1 / 6 * 9 / 8)).all()
    assert np.abs(back - w).mean() < 0.1 * np.abs(w).mean()


@pytest.mark.parametrize("arch", ["glm-dsa", "glm4moe"])
def test_graphs_scale_matmul_outputs(tmp_path, arch):
    """Every NVFP4 weight with a `.scale` has each of its matmuls' outputs multiplied by it (routed experts: by
    the scale of each row's selected expert); the unscaled weight's matmul feeds its consumer directly."""
    path = make_nvfp4(SRC[arch], tmp_path / "m.gguf")
    mf = ModelFiles(path, load_mtp=True)
    scaled = {n[:-len(".scale")] + ".weight" for n in mf.main.tensors if n.endswith(".scale")}
    assert len(scaled) >= 9 and UNSCALED not in scaled
    seen = set()
    for g in build_graphs(mf, with_mtp=True).values():
        consumers = {}
        for n in g.live_nodes():
            for i in n.inputs:
                consumers.setdefault(i.id, []).append(n)
        for n in g.live_nodes():
            if n.op not in ("mul_mat", "mul_mat_id") or n.inputs[0].op != "weight":
                continue
            w = n.inputs[0].name
            uses = consumers[n.id]
            if w not in scaled:
                assert all(u.op != "mul" or u.inputs[1].op != "weight" for u in uses), (g.name, w)
                continue
            assert len(uses) == 1 and uses[0].op == "mul" and uses[0].inputs[0] is n, (g.name, w, uses)
            s = uses[0].inputs[1]
            if n.op == "mul_mat":
                assert s.op == "weight" and s.name == w[:-len(".weight")] + ".scale" and s.shape == (1,)
            else:      # get_rows(reshape(scale [X], [X, 1]), the matmul's ids) -> [T, k, 1]
                assert s.op == "get_rows" and s.inputs[1] is n.inputs[2] and s.shape[-1] == 1
                assert s.inputs[0].op == "reshape" and s.inputs[0].inputs[0].name == w[:-len(".weight")] + ".scale"
            seen.add(w)
    assert seen == scaled


def test_head_scale_and_draft_vocab(tmp_path, dsa_file):
    """A scale on the head (`output.scale`, llama.cpp's `output_s`) scales the logits of every entry, the reduced
    draft head's too (its rows are the head's): the interpreter's logits with a scale of 0.5 are half those
    without, bit for bit; its argmax is unchanged."""
    from nextn.compiler.graphs import DRAFT_HEAD

    halved = make_nvfp4(SRC["glm-dsa"], tmp_path / "head.gguf", {"output.scale": np.full(1, 0.5, np.float32)})
    ids = np.array(next(p for p in reference(DSA)["prompts"] if p["kind"] == "code-short")["prompt_ids"], np.int32)
    out = {}
    for path in (dsa_file, halved):
        mf = ModelFiles(path, load_mtp=True)
        graphs = build_graphs(mf, with_mtp=True, options={"draft_vocab": 100})
        g = graphs["verify"]
        out[path] = interpret.run(g, {"tokens": ids, "pos": np.arange(len(ids), dtype=np.int32)}, dequantized(mf),
                                  zero_states(g, len(ids)), n_kv=len(ids))
        lg = graphs["mtp_draft_vocab"].outputs["logits"]
        mm = lg.inputs[0] if lg.op == "mul" else lg
        assert (lg.op == "mul") == (path == halved) and mm.op == "mul_mat" and mm.inputs[0].name == DRAFT_HEAD
    assert np.array_equal(out[halved]["logits"], out[dsa_file]["logits"] * np.float32(0.5))
    assert np.array_equal(out[halved]["argmax"], out[dsa_file]["argmax"])


@pytest.fixture(scope="module")
def dsa_sequence(compiled, dsa_file):
    return exact_sequence(compiled, "nvfp4-glm-dsa-exact", dsa_file)


@pytest.mark.parametrize("kind", ["code-short", "docs-heading"])
def test_compiled_equals_interpreter(dsa_sequence, dsa_file, kind):
    """The compiled NVFP4 model (kernels reading the file's NVFP4 bytes, scales in the graph) against the numpy IR
    interpreter on gguf-py's dequantization of the same tensors: trunk prefill + verify, NextN rows + a draft."""
    mf = ModelFiles(dsa_file, load_mtp=True)
    graphs, w = build_graphs(mf, with_mtp=True), dequantized(mf)
    ids = np.array(next(p for p in reference(DSA)["prompts"] if p["kind"] == kind)["prompt_ids"], np.int32)
    check_trunk_vs_ir(dsa_sequence, graphs, w, ids, 3)
    check_mtp_vs_ir(dsa_sequence, graphs, w, ids)


def test_default_build_takes_q8_0_rows(compiled, dsa_file):
    """The default build quantizes activations: every NVFP4 weight's matmuls take "q8_0" rows (the manifest; the
    x86 integer kernels, compiler/lower/x86/nvfp4.py, as ggml-cpu's vec_dot_type q8_0 for NVFP4), and the compiled
    logits follow the interpreter given the same int8 rows within test_quant_e2e's bounds (quantization is a step
    function: a float32 rounding difference upstream can move one quantized value by one step)."""
    import nextn.runtime as rt

    from conftest import quantized_activations

    m = rt.load(compiled("nvfp4-glm-dsa", dsa_file), ctx_size=4096)
    q8 = quantized_activations(m.loaded)
    mf = ModelFiles(dsa_file, load_mtp=True)
    nv = [n for n in mf.main.tensors if mf.main.tensor_type(n) == "NVFP4"]
    assert nv and all(q8.get(n) == "q8_0" for n in nv), [n for n in nv if q8.get(n) != "q8_0"]
    g, w = build_graphs(mf, with_mtp=True)["verify"], dequantized(mf)
    ids = np.array(next(p for p in reference(DSA)["prompts"] if p["kind"] == "code-short")["prompt_ids"], np.int32)
    want = interpret.run(g, {"tokens": ids, "pos": np.arange(len(ids), dtype=np.int32)}, w, zero_states(g, 4096),
                         n_kv=len(ids), quantized_activations=q8)["logits"]
    got = m.logits(ids)
    rows = np.abs(got - want).max(1) / np.abs(want).max(1)
    assert rows.max() < 5e-2 and np.median(rows) < 1e-2, (rows.max(), np.median(rows))
    assert _argmax_agreement(got, want) >= 0.97


def _argmax_agreement(logits, want) -> float:
    return float((np.asarray(logits).argmax(-1) == want.argmax(-1)).mean())


def test_logits_follow_the_bf16_model(dsa_file):
    """With its scales the NVFP4 model is the BF16 model to 4-bit precision: the trunk's argmax equals the BF16
    reference's on most rows of a prompt; the same weights with every scale dropped (taken as 1) do not."""
    mf = ModelFiles(dsa_file)
    g = build_graphs(mf, with_mtp=False)["verify"]
    w = dequantized(mf)
    ids = np.array(next(p for p in reference(DSA)["prompts"] if p["kind"] == "code-short")["prompt_ids"], np.int32)
    want = reference_logits(DSA)["code-short/trunk_logits"]

    def run(get):
        st = zero_states(g, len(ids))
        return interpret.run(g, {"tokens": ids, "pos": np.arange(len(ids), dtype=np.int32)}, get, st,
                             n_kv=len(ids))["logits"]

    scaled = _argmax_agreement(run(w), want)
    with np.errstate(over="ignore"):     # unscaled, the FFN outputs are ~1e4 too large: silu's exp overflows
        dropped = _argmax_agreement(run(lambda n: np.ones_like(w(n)) if n.endswith(".scale") else w(n)), want)
    print(f"argmax equal to the BF16 reference on code-short ({len(ids)} rows): NVFP4 {scaled:.2f}, "
          f"NVFP4 without its scales {dropped:.2f}")
    assert scaled > 0.5 > dropped


def test_wrong_scale_shape_refused(tmp_path):
    """A per-expert scale of the wrong length is refused naming the tensor and its expected shape."""
    path = make_nvfp4(SRC["glm-dsa"], tmp_path / "bad.gguf",
                      {"blk.1.ffn_up_exps.scale": np.ones(3, np.float32)})
    with pytest.raises(NextnError, match=r"bad\.gguf: tensor 'blk\.1\.ffn_up_exps\.scale' has ggml shape \[3\], "
                                         r"expected \[8\]"):
        build_graphs(ModelFiles(path), with_mtp=False)


@pytest.mark.e2e
def test_scale_on_embedding_refused_cli(tmp_path):
    """`nextn compile` of a file with a scale on the token embedding (read by get_rows, which no scale follows):
    exit 1, one line naming the tensor, no traceback."""
    from test_bad_input import assert_one_line_error, nextn

    path = make_nvfp4(SRC["glm-dsa"], tmp_path / "emb.gguf", {"token_embd.scale": np.full(1, 0.5, np.float32)})
    rc, _, err = nextn("compile", path, "-o", tmp_path / "out")
    assert rc == 1
    assert_one_line_error(rc, err, "emb.gguf", "'token_embd.scale'", "get_rows")


@pytest.mark.slow
def test_cuda_sm90_build(compiled, dsa_file):
    """The NVFP4 model builds for CUDA sm_90 without a GPU (the element expression through the GPU compute
    definitions, the scales as graph muls): SASS for sm_90, the NVFP4 weights planned as their bytes, the scales
    as float32 buffers."""
    import json
    from pathlib import Path

    from nextn.common.device_code import device_code
    from nextn.common.manifest import MANIFEST

    d = compiled("nvfp4-glm-dsa-cuda90", dsa_file, target="cuda", arches=["sm_90"])
    assert device_code(f"{d}/model_cuda.so")["cuda_sass"] == ["sm_90"]
    plan = json.loads((Path(d) / MANIFEST).read_text())["buffer_plan"]["weights"]
    kinds = {b["tensor"]: b["kind"] for b in plan}
    assert kinds["blk.1.ffn_down_exps.weight"] == kinds[UNSCALED] == "nvfp4"
    assert kinds["blk.1.ffn_down_exps.scale"] == "f32" and UNSCALED.replace(".weight", ".scale") not in kinds
