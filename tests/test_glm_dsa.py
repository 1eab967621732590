"""glm-dsa (GLM-5.x): absorbed MLA + DSA lightning indexer + NextN, against ../shared/fixtures/tiny-glm-dsa.

Expected values come from the fixture files (reference.json, reference_logits.npz, hf/config.json) or from
naive numpy written here independently of the IR (expanded K/V attention, explicit indexer, argsort top-k).
The long-context prompt (2220 tokens) is longer than the indexer top-k (2048): the sparse path is what it tests.
"""
import json
import math

import numpy as np
import pytest

from badgguf import with_metadata
from conftest import (FIXTURES, REF_TOL, check_greedy_and_speculative, check_logits, check_mtp_vs_ir,
                      check_split_layout, check_trunk_vs_ir, dequantized, reference, reference_logits)
from test_rope import naive_rope

import nextn.runtime as rt
from nextn.common.compare import rel_err
from nextn.compiler.ir import Graph, interpret
from nextn.compiler.loader.model_files import ModelFiles
from nextn.compiler.models.glm_base import graph as glm_graph
from nextn.compiler.models.glm_dsa import config as dsa_config
from nextn.compiler.models.glm_dsa import graph as dsa_graph

D = FIXTURES / "tiny-glm-dsa"
REF = reference(D)
PROMPTS = {p["kind"]: p for p in REF["prompts"]}
FULL_KINDS = ["code-short", "docs-heading"]
SHORT_KINDS = sorted(k for k in PROMPTS if k != "long-context")
HF = json.loads((D / "hf" / "config.json").read_text())


@pytest.fixture(scope="module")
def dsa(compiled):
    return rt.load(compiled("dsa-bf16", D / "tiny-glm-dsa-BF16.gguf"), ctx_size=4096)


@pytest.fixture(scope="module")
def dsa_dense(compiled):
    return rt.load(compiled("dsa-bf16-dense", D / "tiny-glm-dsa-BF16.gguf", mtp_dense_attention=True), ctx_size=4096)


@pytest.fixture(scope="module")
def bf16_files():
    mf = ModelFiles(D / "tiny-glm-dsa-BF16.gguf", load_mtp=True)
    return mf, dequantized(mf)


# -- loader ---------------------------------------------------------------------------------------
def test_config_matches_hf_config(bf16_files):
    c = bf16_files[0].config
    assert (c.n_layer, c.n_layer_nextn, c.n_embd, c.n_head) == (
        HF["num_hidden_layers"], HF["num_nextn_predict_layers"], HF["hidden_size"], HF["num_attention_heads"])
    assert (c.q_lora, c.kv_lora, c.hd_v, c.n_rot) == (HF["q_lora_rank"], HF["kv_lora_rank"], HF["v_head_dim"],
                                                      HF["qk_rope_head_dim"])
    assert c.hd_k == HF["qk_nope_head_dim"] + HF["qk_rope_head_dim"]
    assert (c.idx_heads, c.idx_hd, c.idx_top_k) == (HF["index_n_heads"], HF["index_head_dim"], HF["index_topk"])
    assert c.idx_full == [int(t == "full") for t in HF["indexer_types"]]
    assert c.kq_scale == pytest.approx(HF["qk_head_dim"] ** -0.5)   # no rope scaling: mscale = 1
    assert (c.n_expert, c.n_expert_used, c.n_lead_dense) == (HF["n_routed_experts"], HF["num_experts_per_tok"],
                                                             HF["first_k_dense_replace"])
    assert c.expert_weights_scale == HF["routed_scaling_factor"] and c.expert_weights_norm == HF["norm_topk_prob"]


def test_yarn_mscale():
    # llama.cpp glm-dsa.cpp with attn_factor 1, yarn_log_multiplier 1, factor 40: attn_factor_org = mscale/attn_factor_org
    # = 1 + 0.1 ln 40
    m = 1.0 + 0.1 * math.log(40.0)
    assert dsa_config.mla_kq_scale(192, 1.0 / 40.0, 1.0, 1.0) == pytest.approx((m * m) ** 2 / math.sqrt(192))
    assert dsa_config.mla_kq_scale(192) == pytest.approx(192 ** -0.5)


def test_indexer_types_default_pattern():
    class F:
        path = "x.gguf"

        def get(self, key, default=None, kind=None):
            return default

    assert dsa_config._indexer_types(F(), "k", 4, 4096) == [1, 1, 1, 1]                       # GLM-5 / 5.1
    assert dsa_config._indexer_types(F(), "k", 12, 1 << 20) == [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0]   # GLM-5.2


# -- naive numpy references (expanded K/V, no IR) -------------------------------------------------
def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + np.float32(eps)) * w


def _rope_pairs(x, pos, c):
    """NORM rope (adjacent pairs) over the whole last axis of x [T, d] or [T, H, d], with c's rope scaling."""
    x3 = x if x.ndim == 3 else x[:, None, :]
    return naive_rope(x3, pos, x.shape[-1], "norm", **c.rope_args()).reshape(x.shape)


def _naive_attention(c, w, il, x, top_k):
    """One MLA layer the expanded way: kv_b = [attn_k_b^T; attn_v_b] per head, full-width K/V per head, plus the
    DSA indexer computed explicitly and its top-k applied as a mask (transformers GlmMoeDsaAttention)."""
    p, H, T = f"blk.{il}.", c.n_head, x.shape[0]
    pos = np.arange(T)
    h = _rms(x, w(p + "attn_norm.weight"), c.rms_eps)
    qr = _rms(h @ w(p + "attn_q_a.weight").T, w(p + "attn_q_a_norm.weight"), c.rms_eps)
    q = (qr @ w(p + "attn_q_b.weight").T).reshape(T, H, c.hd_k)
    q_nope, q_pe = q[..., :c.nope], _rope_pairs(q[..., c.nope:], pos, c)
    kv = h @ w(p + "attn_kv_a_mqa.weight").T
    ckv = _rms(kv[:, :c.kv_lora], w(p + "attn_kv_a_norm.weight"), c.rms_eps)
    k_pe = _rope_pairs(kv[:, c.kv_lora:], pos, c)
    k_nope = np.einsum("hnr,sr->shn", w(p + "attn_k_b.weight").transpose(0, 2, 1), ckv)   # [T, H, nope]
    v = np.einsum("hvr,sr->shv", w(p + "attn_v_b.weight"), ckv)                          # [T, H, hd_v]
    # indexer
    ip = p + "indexer."
    iq = (qr @ w(ip + "attn_q_b.weight").T).reshape(T, c.idx_heads, c.idx_hd)
    iq = np.concatenate([_rope_pairs(iq[..., :c.n_rot], pos, c), iq[..., c.n_rot:]], -1)
    ik = h @ w(ip + "attn_k.weight").T
    ik = (ik - ik.mean(-1, keepdims=True)) / np.sqrt(ik.var(-1, keepdims=True) + 1e-6) * w(ip + "k_norm.weight") \
        + w(ip + "k_norm.bias")
    ik = np.concatenate([_rope_pairs(ik[:, :c.n_rot], pos, c), ik[:, c.n_rot:]], -1)
    wts = h @ w(ip + "proj.weight").T / np.sqrt(c.idx_hd * c.idx_heads)
    score = np.einsum("th,ths->ts", wts, np.maximum(np.einsum("thd,sd->ths", iq, ik), 0))
    causal = pos[None, :] <= pos[:, None]
    score = np.where(causal, score, -np.inf)
    sel = np.zeros((T, T), bool)
    for t in range(T):
        sel[t, np.argsort(-score[t], kind="stable")[:min(top_k, T)]] = True
    out = np.empty((T, H, c.hd_v), np.float32)
    for hh in range(H):
        s = (q_nope[:, hh] @ k_nope[:, hh].T + q_pe[:, hh] @ k_pe.T) * c.kq_scale
        s = np.where(causal & sel, s, -np.inf)
        pr = np.exp(s - s.max(1, keepdims=True))
        out[:, hh] = (pr / pr.sum(1, keepdims=True)) @ v[:, hh]
    return out.reshape(T, -1) @ w(p + "attn_output.weight").T


def _ir_attention(c, w, il, x, dense=False):
    T = x.shape[0]
    g = Graph("attn")
    xi = g.input("x", (T, c.n_embd))
    pos = g.input("pos", (T,), "int32")
    kvc = g.state("kv", ("C", 1, c.kv_width))
    ikc = None if dense else g.state("ik", ("C", 1, c.idx_hd))
    out, _mask = dsa_graph.attention(g, c, il, xi, pos, kvc, ikc, None)
    g.output("out", out)
    st = {n: np.zeros((T, *s.shape[1:]), np.float32) for n, s in g.states.items()}
    return interpret.run(g, {"x": x, "pos": np.arange(T, dtype=np.int32)}, w, st, n_kv=T)["out"]


@pytest.mark.parametrize("top_k", [2048, 7])
def test_absorbed_mla_equals_naive_expanded(bf16_files, top_k):
    """Absorbed MLA over the latent cache (IR) = expanded K/V attention (naive), dense (top_k 2048 > T) and
    sparse (top_k 7 < T: the indexer's selection decides)."""
    mf, w = bf16_files
    c = dsa_config.GlmDsaConfig(**{**mf.config.to_json(), "idx_top_k": top_k})
    x = w("token_embd.weight")[np.asarray(PROMPTS["code-short"]["prompt_ids"])]
    want = _naive_attention(c, w, 1, x, top_k)
    got = _ir_attention(c, w, 1, x)
    assert rel_err(got, want) < 1e-5
    if top_k < x.shape[0]:   # the selection matters here: dense attention is measurably different
        assert rel_err(_ir_attention(c, w, 1, x, dense=True), want) > 1e-3


# YaRN x4 over 1024 original positions: the ramp spans pairs 1..6 of the fixture's 16 rope pairs (base 1e6)
YARN = {"glm-dsa.rope.scaling.type": "yarn", "glm-dsa.rope.scaling.factor": 4.0,
        "glm-dsa.rope.scaling.original_context_length": 1024}
YARN_MSCALE = 1.0 + 0.1 * math.log(4.0)          # glm-dsa.cpp attn_factor_org with attn_factor 1, factor 4


def _yarn(c):
    return dsa_config.GlmDsaConfig(**{**c.to_json(), "rope_scaling": "yarn", "rope_freq_scale": 0.25,
                                      "rope_ext_factor": 1.0, "rope_n_ctx_orig": 1024,
                                      "kq_scale": YARN_MSCALE ** 2 / math.sqrt(c.hd_k)})


def test_absorbed_mla_yarn_equals_naive(bf16_files):
    """YaRN rope on q_pe / k_pe and the indexer, mscale^2 in the kq scale: IR absorbed MLA = naive expanded path."""
    mf, w = bf16_files
    c = _yarn(dsa_config.GlmDsaConfig(**{**mf.config.to_json(), "idx_top_k": 7}))
    x = w("token_embd.weight")[np.asarray(PROMPTS["code-short"]["prompt_ids"])]
    want = _naive_attention(c, w, 1, x, 7)
    assert rel_err(_ir_attention(c, w, 1, x), want) < 1e-5
    plain = dsa_config.GlmDsaConfig(**{**mf.config.to_json(), "idx_top_k": 7})
    assert rel_err(_ir_attention(plain, w, 1, x), want) > 1e-3      # the scaling is applied


@pytest.fixture(scope="module")
def yarn_q8(tmp_path_factory, compiled):
    path = with_metadata(D / "tiny-glm-dsa-Q8_0.gguf", tmp_path_factory.mktemp("yarn") / "yarn-Q8_0.gguf", YARN)
    # --exact-matmul: float activation rows, so the compiled model equals the interpreter to float32 rounding
    return path, rt.load(compiled("dsa-q8-yarn", path, exact_matmul=True), ctx_size=512)


def test_yarn_gguf_config_and_compiled_vs_ir(yarn_q8):
    """A GGUF with rope.scaling.* = yarn: the config follows llama.cpp (freq_scale 1/4, ext_factor 1, kq_scale
    mscale^2/sqrt(hd_k)) and the compiled trunk and NextN equal the interpreter."""
    path, m = yarn_q8
    mf = ModelFiles(path, load_mtp=True)
    c = mf.config
    assert (c.rope_scaling, c.rope_freq_scale, c.rope_ext_factor, c.rope_attn_factor, c.rope_n_ctx_orig) == (
        "yarn", 0.25, 1.0, 1.0, 1024)
    assert c.kq_scale == pytest.approx(YARN_MSCALE ** 2 / math.sqrt(HF["qk_head_dim"]))
    _check_compiled_vs_ir(m, path)


def test_yarn_gguf_speculative_equals_plain(yarn_q8, compiled):
    _path, m = yarn_q8
    p = PROMPTS["docs-prose"]
    plain = m.generate(p["prompt_ids"], 32, spec_type="none", ignore_eos=True)
    unscaled = rt.load(compiled("dsa-q8", D / "tiny-glm-dsa-Q8_0.gguf"), ctx_size=512)
    assert rel_err(m.logits(p["prompt_ids"]), unscaled.logits(p["prompt_ids"])) > 1e-3
    for n_max in (1, 3):
        r = m.generate(p["prompt_ids"], 32, spec_type="draft-mtp", n_max=n_max, ignore_eos=True)
        assert r.ids == plain.ids and r.stats.drafted > 0


def test_dense_equals_sparse_when_short(bf16_files):
    """n_kv <= top_k: the sparse path selects every causal cell, so it equals dense attention bit for bit."""
    mf, w = bf16_files
    x = w("token_embd.weight")[np.asarray(PROMPTS["docs-heading"]["prompt_ids"])]
    assert np.array_equal(_ir_attention(mf.config, w, 2, x), _ir_attention(mf.config, w, 2, x, dense=True))


@pytest.mark.e2e
@pytest.mark.parametrize("values", ["normal", "edges"])
def test_top_k_mask_kernel_matches_interpreter(values):
    """The bisection top-k kernel vs the interpreter's stable argsort: ties (incl. -0.0 vs 0.0), -inf cells,
    rows with fewer causal cells than k; "edges" adds denormals, ±inf and the largest floats inside the causal
    cells, and rows whose k-th largest is ±0 or negative (the float thresholds' corner cases)."""
    import tvm
    from tvm import relax

    from nextn.compiler.lower.indexer import dsa_kernels

    rng = np.random.default_rng(1)
    T, L, k = 40, 300, 50
    score = rng.standard_normal((T, L)).astype(np.float32)
    score[:, ::7] = np.round(score[:, ::7])                          # many exact ties
    score[::3, 5::11] = -0.0
    score[::3, 6::11] = 0.0
    if values == "edges":
        tiny = np.float32(1e-45)                                     # the smallest denormal
        edge = np.array([tiny, -tiny, 2 * tiny, -2 * tiny, np.inf, -np.inf, 3.4e38, -3.4e38, 0.0, -0.0], np.float32)
        score[:, 1::3] = rng.choice(edge, size=score[:, 1::3].shape)
        score[1::4] = -np.abs(score[1::4])                           # all <= 0: the k-th largest is ±0 or negative
        score[2::4, :] = np.where(rng.random((len(score[2::4]), L)) < 0.8, np.float32(-0.0), score[2::4, :])
        score[3::8, :] = np.where(rng.random((len(score[3::8]), L)) < 0.95, np.float32(-np.inf), score[3::8, :])
    pos = np.sort(rng.integers(0, L, T)).astype(np.int32)
    pos[:3] = [0, k - 1, k]                                          # <= k causal cells: select all
    score = np.where(np.arange(L)[None, :] <= pos[:, None], score, -np.inf).astype(np.float32)
    want = interpret._top_k_mask(score, pos, k)
    bb = relax.BlockBuilder()
    gv = bb.add_func(dsa_kernels._top_k_mask_kernel(k), "top_k_mask")
    mod = bb.get()
    ex = tvm.compile(tvm.IRModule({"top_k_mask": mod[gv].with_attr("global_symbol", "top_k_mask")}), target="llvm")
    out = np.empty((T, L), np.float32)
    ex["top_k_mask"](score, pos, out)
    causal = np.arange(L)[None, :] <= pos[:, None]
    assert np.array_equal(np.where(causal, out, 1.0), np.where(causal, want, 1.0))
    assert ((out[pos >= k] == 0) & causal[pos >= k]).sum(1).tolist() == [k] * int((pos >= k).sum())


# -- compiled, against the fixture references -------------------------------------------------------
@pytest.mark.parametrize("kind", FULL_KINDS)
def test_trunk_and_mtp_logits(dsa, kind):
    check_logits(dsa, D, kind)


def test_mtp_dense_attention_equals_indexer_when_short(dsa, dsa_dense):
    """--mtp-dense-attention (llama.cpp's graph_mtp) and the NextN indexer agree when n_kv <= top_k."""
    assert dsa_dense.loaded.artifact.manifest["options"] == {"mtp_dense_attention": True}
    assert not any("ik" in s or "index" in s for s in dsa_dense.sequence.states if s.startswith("nextn."))
    ids = PROMPTS["docs-heading"]["prompt_ids"]
    assert rel_err(dsa_dense.mtp_logits(ids), reference_logits(D)["docs-heading/mtp_logits"]) < REF_TOL
    np.testing.assert_allclose(dsa_dense.mtp_logits(ids), dsa.mtp_logits(ids), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", SHORT_KINDS)
def test_greedy_and_speculative(dsa, kind):
    """Last logits, greedy continuation and spec on ≡ spec off with the reference acceptance (n_kv <= top_k)."""
    p = PROMPTS[kind]
    _h, last, am = dsa.sequence.prefill(np.asarray(p["prompt_ids"], np.int32), 0)
    assert rel_err(last, reference_logits(D)[f"{kind}/last_logits"]) < REF_TOL and am == p["last_logits_argmax"]
    check_greedy_and_speculative(dsa, p)


def test_long_context_sparse(dsa, bf16_files):
    """2220 tokens > top_k 2048: last logits and greedy text equal the reference; acceptance equals it with the
    NextN index recomputed every step (the reference rule); with sharing on, the text is still identical and the
    shared-index draft entry is what runs at steps 1..n_max-1."""
    p, seq = PROMPTS["long-context"], dsa.sequence
    assert len(p["prompt_ids"]) > bf16_files[0].config.idx_top_k
    _h, last, am = seq.prefill(np.asarray(p["prompt_ids"], np.int32), 0)
    assert rel_err(last, reference_logits(D)["long-context/last_logits"]) < REF_TOL and am == p["last_logits_argmax"]
    plain = dsa.generate(p["prompt_ids"], p["n_predict"], spec_type="none", ignore_eos=True)
    assert plain.ids == p["greedy_ids"]
    try:
        seq.model.share_mtp_index = False
        r = dsa.generate(p["prompt_ids"], p["n_predict"], spec_type="draft-mtp", n_max=3, ignore_eos=True)
        want = p["spec"]["3"]
        assert r.ids == plain.ids
        assert (r.stats.rounds, r.stats.drafted, r.stats.accepted) == (want["steps"], want["drafted"], want["accepted"])
        assert r.vm_s.get("mtp_draft_shared", 0.0) == 0.0
        seq.model.share_mtp_index = True
        r = dsa.generate(p["prompt_ids"], p["n_predict"], spec_type="draft-mtp", n_max=3, ignore_eos=True)
        assert r.ids == plain.ids
        assert r.vm_s["mtp_draft_shared"] > 0.0
    finally:
        seq.model.share_mtp_index = True


def test_kv_states_trunk_and_nextn_separate(dsa, bf16_files):
    """Trunk cache: trunk layers only (latent KV + indexer keys on full layers); NextN cache: the NextN layer only."""
    c, st = bf16_files[0].config, dsa.sequence.states
    C = dsa.sequence.n_ctx
    want = {f"kv.{i}": (C, 1, c.kv_lora + c.n_rot) for i in range(c.n_layer)}
    want |= {f"ik.{i}": (C, 1, c.idx_hd) for i in range(c.n_layer) if c.idx_full[i]}
    want |= {f"nextn.kv.{c.n_layer}": (C, 1, c.kv_lora + c.n_rot), f"nextn.ik.{c.n_layer}": (C, 1, c.idx_hd),
             "nextn.index_mask": (C,)}
    assert {n: tuple(s.shape) for n, s in st.items()} == want


def test_index_share_state(bf16_files):
    """mtp_draft stores step 0's selection (k cells of the causal prefix, later cells selected); mtp_draft_shared
    reusing it equals a NextN step attending through exactly that mask."""
    mf, w = bf16_files
    c = dsa_config.GlmDsaConfig(**{**mf.config.to_json(), "idx_top_k": 6})
    ids = np.asarray(PROMPTS["code-short"]["prompt_ids"], np.int32)
    T, E = len(ids), c.n_embd
    rng = np.random.default_rng(0)
    h_prev = rng.standard_normal((T + 2, E)).astype(np.float32)
    rows = dsa_graph.build_mtp(c, mf.has_tensor, False)
    draft = dsa_graph.build_mtp(c, mf.has_tensor, True)
    shared = dsa_graph.build_mtp(c, mf.has_tensor, True, index="reuse")
    st = {"nextn.kv.4": np.zeros((T + 4, 1, c.kv_width), np.float32), "nextn.ik.4": np.zeros((T + 4, 1, c.idx_hd), np.float32),
          "nextn.index_mask": np.full((T + 4,), 7.0, np.float32)}
    interpret.run(rows, {"tokens": ids, "pos": np.arange(T, dtype=np.int32), "h_prev": h_prev[:T],
                         "out_ids": np.array([T - 1], np.int32)}, w, st, n_kv=T)
    interpret.run(draft, {"tokens": ids[:1], "pos": np.array([T], np.int32), "h_prev": h_prev[T:T + 1]}, w, st, n_kv=T + 1)
    m = st["nextn.index_mask"]
    assert (m[:T + 1] == 0).sum() == 6 and set(np.unique(m[:T + 1])) == {0.0, -np.inf} and (m[T + 1:] == 0).all()
    kv_before = st["nextn.kv.4"].copy()
    got = interpret.run(shared, {"tokens": ids[1:2], "pos": np.array([T + 1], np.int32), "h_prev": h_prev[T + 1:T + 2]},
                        w, st, n_kv=T + 2)
    assert "nextn.ik.4" not in shared.states   # no indexer work on a shared step
    # the same step with the stored mask given explicitly
    g = Graph("check")
    tok, pos, hp = g.input("tokens", (1,), "int32"), g.input("pos", (1,), "int32"), g.input("h_prev", (1, E))
    mk = g.input("mask", (1, "L"))
    p = "blk.4.nextn."
    z = glm_graph.linear(g, g.concat(glm_graph.norm(g, g.get_rows(g.weight("token_embd.weight", (c.n_vocab, E)), tok),
                                                    p + "enorm.weight", c.rms_eps),
                                     glm_graph.norm(g, hp, p + "hnorm.weight", c.rms_eps), axis=1), p + "eh_proj", E)
    x, _ = dsa_graph.block(g, c, 4, z, pos, g.state("nextn.kv.4", ("C", 1, c.kv_width)), None, mk, True)
    g.output("h", glm_graph.norm(g, x, p + "shared_head_norm.weight", c.rms_eps))
    want = interpret.run(g, {"tokens": ids[1:2], "pos": np.array([T + 1], np.int32), "h_prev": h_prev[T + 1:T + 2],
                             "mask": m[None, :T + 2]}, w, {"nextn.kv.4": kv_before}, n_kv=T + 2)
    assert np.array_equal(got["h_nextn"], want["h"])


def _check_compiled_vs_ir(m, path):
    """Prefill + verify, then NextN rows + a draft step, of artifact `m` against the IR interpreter on the
    gguf-py-dequantized weights of `path`."""
    from nextn.compiler.graphs import build_graphs

    mf = ModelFiles(path, load_mtp=True)
    graphs, weights = build_graphs(mf, with_mtp=True), dequantized(mf)
    ids = np.asarray(PROMPTS["code-short"]["prompt_ids"], np.int32)
    check_trunk_vs_ir(m.sequence, graphs, weights, ids, rows=3)
    check_mtp_vs_ir(m.sequence, graphs, weights, ids)


def test_q8_0_compiled_vs_ir(compiled):
    """Q8_0 bundle built with --exact-matmul (float activation rows): kernels (in-kernel dequantization, incl. the
    per-head attn_k_b / attn_v_b) vs the IR interpreter on gguf-py-dequantized weights, prefill then a NextN draft
    step. (The default build's "q8_0" activation rows: test_compiled_vs_ir.py on the glm4moe bundle.)"""
    path = D / "tiny-glm-dsa-Q8_0.gguf"
    _check_compiled_vs_ir(rt.load(compiled("dsa-q8-exact", path, exact_matmul=True), ctx_size=512), path)


def test_trunk_only_plus_mtp_only_pair_equals_bundle(compiled):
    """glm-dsa split layout (llama.cpp converter --no-mtp / --mtp): trunk-only GGUF + MTP-only draft GGUF
    behave exactly as the Q8_0 bundle (same tensors), speculation included."""
    import nextn.runtime as rt

    pair = rt.load(compiled("dsa-pair", D / "tiny-glm-dsa-trunk-Q8_0.gguf", D / "mtp-tiny-glm-dsa-Q8_0.gguf"))
    bundle = rt.load(compiled("dsa-q8", D / "tiny-glm-dsa-Q8_0.gguf"))
    assert any(k.startswith("nextn.") for k in pair.sequence.states)
    p = next(x for x in reference(D)["prompts"] if x["kind"] == "docs-prose")
    check_split_layout(pair, bundle, rt.load(compiled("dsa-trunk", D / "tiny-glm-dsa-trunk-Q8_0.gguf"), spec=False), p)


@pytest.mark.slow
def test_default_build_follows_the_int8_activation_semantics(compiled):
    """The default Q8_0 build quantizes the activation rows of its Q8_0 matmuls, the per-head attn_k_b / attn_v_b
    included ("q8_0" rows, each head's row on its own); its logits over every row of two prompts follow the
    interpreter given the same int8 rows (its int8 mode, per-head weights included) and the compiled model's own KV
    and indexer rows (`keep_kv`), within glm4moe's bounds (test_compiled_vs_ir: quantization is a step function, so
    a float32 rounding difference upstream can move one int8 value by a step and that row by ~1e-2; the other rows
    agree to float32 rounding): median row within 1e-5, every row within 5e-2, argmax equal on >= 97 % of rows, and
    >= 85 % of the 138 rows within 1e-4 (measured: 123, 89 %; the 15 others 1e-4 .. 9.0e-3, more than glm4moe's share
    of moved rows: each glm-dsa layer quantizes more matmul inputs, the indexer's and the per-head ones included)."""
    from conftest import graphs_and_dequantized, quantized_activations

    path = D / "tiny-glm-dsa-Q8_0.gguf"
    m = rt.load(compiled("dsa-q8", path), ctx_size=4096)
    acts = quantized_activations(m.loaded)
    assert set(acts.values()) == {"q8_0"} and any(n.endswith("attn_k_b.weight") for n in acts) \
        and any(n.endswith("attn_v_b.weight") for n in acts), sorted(acts)
    graphs, w = graphs_and_dequantized(path)
    g = graphs["prefill"]
    rows_all = []
    for kind in FULL_KINDS:
        ids = np.asarray(PROMPTS[kind]["prompt_ids"], np.int32)
        T = len(ids)
        got = m.logits(ids)
        st = {n: m.sequence.states[n].numpy() for n in g.states}
        inputs = {"tokens": ids, "pos": np.arange(T, dtype=np.int32), "hidden_ids": np.arange(T, dtype=np.int32),
                  "out_ids": np.arange(T, dtype=np.int32)}
        want = interpret.run(g, inputs, w, st, n_kv=T, keep_kv=True, quantized_activations=acts)["logits"]
        rows = np.abs(got - want).max(1) / np.abs(want).max(1)
        assert np.median(rows) < 1e-5 and rows.max() < 5e-2, (kind, rows)
        assert (got.argmax(1) == want.argmax(1)).mean() >= 0.97, kind
        rows_all.append(rows)
    assert (np.concatenate(rows_all) < 1e-4).mean() >= 0.85
