"""glm5next (GLM-5.3-Flash): KDA + mHC + NoPE MLA with the pooled DSA indexer + NextN, against
../shared/fixtures/tiny-glm5next.

Expected values come from the fixture files (reference.json, reference_logits.npz, hf/config.json) or from naive
numpy written here independently of the IR: the KDA layer as a per-token recurrence in transformers' [key, value]
state layout, the delta rule in float64, pools and their selection by explicit loops, Sinkhorn by loops.
Prompts from docs-heading (116 tokens) on are past the indexer's top-k (96 cells = 24 pools + the tail): the sparse
path is what they test, in the trunk and in the NextN block.
"""
import json
import math
import re

import numpy as np
import pytest

from badgguf import rewrite
from conftest import (FIXTURES, REF_TOL, check_greedy_and_speculative, check_logits, check_split_layout, dequantized,
                      reference, reference_logits, rel_err, zero_states)

import nextn.runtime as rt
from nextn.compiler.ir import Graph, interpret
from nextn.compiler.loader.model_files import ModelFiles
from nextn.compiler.models.glm5next import config as g5c
from nextn.compiler.models.glm5next import graph as g5g
from nextn.common.errors import NextnError

D = FIXTURES / "tiny-glm5next"
BF16, Q8 = D / "tiny-glm5next-BF16.gguf", D / "tiny-glm5next-Q8_0.gguf"
TRUNK, MTP = D / "tiny-glm5next-trunk-Q8_0.gguf", D / "mtp-tiny-glm5next-Q8_0.gguf"
REF = reference(D)
PROMPTS = {p["kind"]: p for p in REF["prompts"]}
FULL_KINDS = ["code-short", "docs-heading"]
SHORT_KINDS = sorted(k for k in PROMPTS if k != "long-context")
HF = json.loads((D / "hf" / "config.json").read_text())["text_config"]
A = "glm5-next."


@pytest.fixture(scope="module")
def g5n(compiled):
    return rt.load(compiled("g5n-bf16", BF16), ctx_size=4096)


@pytest.fixture(scope="module")
def bf16_files():
    mf = ModelFiles(BF16, load_mtp=True)
    return mf, dequantized(mf)


# -- loader ---------------------------------------------------------------------------------------------------------
def test_config_matches_hf_config(bf16_files):
    c = bf16_files[0].config
    assert c.arch == "glm5-next" and c.defaults_applied == []
    assert c.layer_kinds == [g5c.KDA if t == "linear_attention" else g5c.MLA for t in HF["layer_types"]]
    assert (c.n_layer, c.n_layer_nextn, c.n_embd, c.n_head) == (
        HF["num_hidden_layers"], HF["num_nextn_predict_layers"], HF["hidden_size"], HF["num_attention_heads"])
    assert (c.kda_hd, c.conv_k, c.gate_lower_bound) == (HF["linear_head_dim"], HF["linear_conv_kernel_dim"],
                                                         HF["linear_lower_bound"])
    assert (c.q_lora, c.kv_lora, c.hd_k, c.hd_v) == (HF["q_lora_rank"], HF["kv_lora_rank"], HF["qk_nope_head_dim"],
                                                     HF["v_head_dim"])
    assert c.kq_scale == pytest.approx(HF["qk_nope_head_dim"] ** -0.5)
    assert (c.idx_heads, c.idx_hd, c.idx_top_k, c.idx_kpool, c.idx_tail) == (
        HF["index_n_heads"], HF["index_head_dim"], HF["index_topk"], HF["index_kpool"],
        HF["index_kpool_always_select_tail"])
    assert c.idx_full == [int(t == "full") for t in HF["indexer_types"]] and c.idx_norm_eps == pytest.approx(1e-6)
    assert (c.hc_count, c.hc_iters, c.hc_eps) == (HF["hc_mult"], HF["hc_sinkhorn_iters"], pytest.approx(HF["hc_eps"]))
    assert c.clamp_exp == c.clamp_shexp == [HF["swiglu_limit"]] * (c.n_layer + 1)
    assert c.index_share_mtp is HF["index_share_for_mtp_iteration"]
    assert (c.n_expert, c.n_expert_used, c.n_lead_dense, c.n_ff, c.n_ff_exp) == (
        HF["n_routed_experts"], HF["num_experts_per_tok"], HF["first_k_dense_replace"], HF["intermediate_size"],
        HF["moe_intermediate_size"])
    assert c.expert_weights_scale == HF["routed_scaling_factor"] and c.expert_weights_norm == HF["norm_topk_prob"]


def test_both_arch_spellings_and_kpool_keys(tmp_path):
    """`glm5next` with the k-pool size under `indexer.block_size` (the first published GGUFs) reads as the
    `glm5-next` file does and builds the same graphs."""
    from nextn.compiler.graphs import build_graphs

    other = rewrite(Q8, tmp_path / "glm5next.gguf", arch="glm5next", remove=("glm5next.attention.indexer.kpool",),
                    values={"glm5next.attention.indexer.block_size": 4})
    a, b = ModelFiles(Q8, load_mtp=True), ModelFiles(other, load_mtp=True)
    assert b.config.arch == "glm5next" and b.spec.arch == a.spec.arch
    assert b.config.to_json() == {**a.config.to_json(), "arch": "glm5next"}
    ga, gb = build_graphs(a, True), build_graphs(b, True)
    assert {n: g.dump() for n, g in ga.items()} == {n: g.dump() for n, g in gb.items()}


def test_missing_optional_keys_take_llamacpp_defaults(tmp_path):
    """The optional keys whose absence changes the model read as llama.cpp reads them, and say so."""
    gone = ["attention.layer_norm_epsilon", "kda.gate_lower_bound", "swiglu_clamp_exp", "swiglu_clamp_shexp",
            "leading_dense_block_count", "attention.indexer.index_share_mtp"]
    from nextn.common.gguf import GGUFFile

    c = g5c.config_from_gguf(GGUFFile(rewrite(Q8, tmp_path / "d.gguf", remove=[A + k for k in gone])))
    assert (c.idx_norm_eps, c.gate_lower_bound, c.clamp_exp, c.clamp_shexp, c.n_lead_dense, c.index_share_mtp) == (
        0.0, None, [], [], 0, None)
    said = " ".join(c.defaults_applied)
    assert len(c.defaults_applied) == 5 and all(A + k in said for k in gone[:5])
    ops = g5g.build_trunk(c, lambda n: True, True).op_counts()
    assert ops["softplus"] == 2 and ops["clamp"] == c.n_layer     # softplus gates; clamps: only the MoE weight sums
    full = ModelFiles(Q8).config
    assert g5g.build_trunk(full, lambda n: True, True).op_counts().get("softplus") is None


@pytest.mark.parametrize("edit, want", [
    ({"values": {A + "attention.head_count_kv": [0, 1, 0, 1]}}, "'glm5-next.attention.head_count_kv'"),
    ({"values": {A + "attention.head_count_kv": [0, 2, 0, 1, 1]}}, "0 (KDA) or 1 (MLA)"),
    ({"values": {A + "hyper_connection.count": 2}}, "'glm5-next.hyper_connection.count' = 2"),
    ({"values": {A + "attention.indexer.kpool": 5}}, "'glm5-next.attention.indexer.kpool' = 5"),
    ({"values": {A + "rope.dimension_count": 16}}, "'glm5-next.rope.dimension_count'"),
    ({"values": {A + "swiglu_clamp_exp": [10.0, 10.0]}}, "'glm5-next.swiglu_clamp_exp'"),
    ({"values": {A + "attention.indexer.types": [True, False, True, True]}}, "first MLA layer (1) is 'shared'"),
    ({"drop_tensors": ("blk.2.ssm_a",)}, "tensor 'blk.2.ssm_a' is missing"),
    ({"drop_tensors": ("output.weight",)}, "tensor 'output.weight' is missing"),
    ({"drop_tensors": ("blk.3.indexer_compressor_ape.weight",)}, "'blk.3.indexer_compressor_ape.weight' is missing"),
])
def test_bad_gguf_names_the_key_or_tensor(tmp_path, edit, want):
    path = rewrite(Q8, tmp_path / "bad.gguf", **edit)
    with pytest.raises(NextnError, match=re.escape(want)) as e:
        ModelFiles(path, load_mtp=True)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


# -- naive references -----------------------------------------------------------------------------------------------
def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _naive_kda(c, w, il, a):
    """build_kda_layer the transformers way (Glm5NextTextLinearAttention): float64, zero history, state S[key,
    value] per head, decay exp(g) per key channel."""
    p, T, H, dk, K = f"blk.{il}.", a.shape[0], c.n_head, c.kda_hd, c.conv_k
    a = a.astype(np.float64)

    def conv(name):
        x = a @ w(p + f"attn_{name}.weight").T.astype(np.float64)
        wc = w(p + f"ssm_conv1d_{name}.weight").reshape(c.d_inner, K)
        xp = np.concatenate([np.zeros((K - 1, c.d_inner)), x])
        y = sum(wc[:, j] * xp[j:j + T] for j in range(K))
        return (y * _sigmoid(y)).reshape(T, H, dk)

    q, k, v = conv("q"), conv("k"), conv("v")
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / math.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    a_log = np.log(-w(p + "ssm_a").astype(np.float64))                      # ssm_a = -exp(A_log)
    f = (a @ w(p + "ssm_f_a.weight").T @ w(p + "ssm_f_b.weight").T + w(p + "ssm_dt.bias")).reshape(T, H, dk)
    g = c.gate_lower_bound * _sigmoid(np.exp(a_log)[:, None] * f)
    beta = _sigmoid(a @ w(p + "ssm_beta.weight").T)
    S = np.zeros((H, dk, dk))
    o = np.zeros((T, H, dk))
    for t in range(T):
        S = np.exp(g[t])[:, :, None] * S
        kv = np.einsum("hkv,hk->hv", S, k[t])
        S = S + np.einsum("hk,hv->hkv", k[t], beta[t][:, None] * (v[t] - kv))
        o[t] = np.einsum("hkv,hk->hv", S, q[t])
    r = (a @ w(p + "ssm_g_a.weight").T @ w(p + "ssm_g_b.weight").T).reshape(T, H, dk)
    z = _rms(o, w(p + "ssm_norm.weight"), c.rms_eps) * _sigmoid(r)
    return z.reshape(T, -1) @ w(p + "attn_output.weight").T


def _ir_kda(c, w, il, a, chunk):
    T = a.shape[0]
    g = Graph("kda")
    x, pos, rs = g.input("x", (T, c.n_embd)), g.input("pos", (T,), "int32"), g.input("rs_plane", (1,), "int32")
    g.output("y", g5g.kda(g, c, il, x, pos, rs, g5g.kda_states(g, c, il), chunk))
    return interpret.run(g, {"x": a, "pos": np.arange(T, dtype=np.int32), "rs_plane": np.array([0], np.int32)}, w,
                         zero_states(g, T, planes=4), n_kv=T)["y"]


@pytest.mark.parametrize("il", [0, 2])
def test_kda_layer_equals_naive_recurrence(bf16_files, il):
    """The KDA layer of the IR, recurrent (decode / verify) and chunked (prefill), = the naive transformers-layout
    recurrence, on the fixture's weights over 292 rows (19 chunks)."""
    mf, w = bf16_files
    c = mf.config
    x = w("token_embd.weight")[np.asarray(PROMPTS["code-class"]["prompt_ids"])]
    a = _rms(x, w(f"blk.{il}.attn_norm.weight"), c.rms_eps).astype(np.float32)
    want = _naive_kda(c, w, il, a)
    for chunk in (0, g5g.KDA_CHUNK):
        assert rel_err(_ir_kda(c, w, il, a, chunk), want) < 1e-5, chunk


def _delta_rule_graph(T, H, Dk, Dv, chunk):
    g = Graph("gdn")
    ins = [g.input(n, (T, H, d)) for n, d in (("q", Dk), ("k", Dk), ("v", Dv), ("g", Dk))]
    beta, pos, rs = g.input("beta", (T, H)), g.input("pos", (T,), "int32"), g.input("rs_plane", (1,), "int32")
    g.output("o", g.gated_delta_net(*ins, beta, g.state("S", ("P", H, Dk, Dv)), pos, rs, chunk))
    return g


def _delta_rule_inputs(rng, T, H, Dk, Dv):
    def l2(x):
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    g = np.where(rng.random((T, H, Dk)) < 0.5, rng.uniform(-5.0, -4.0, (T, H, Dk)), rng.uniform(-1e-3, 0, (T, H, Dk)))
    k = l2(rng.standard_normal((T, H, Dk)) + 2.0)        # strongly correlated keys
    return {"q": l2(rng.standard_normal((T, H, Dk))) / np.float32(math.sqrt(Dk)), "k": k,
            "v": rng.standard_normal((T, H, Dv)).astype(np.float32), "g": g.astype(np.float32),
            "beta": rng.uniform(0.0, 1.0, (T, H)).astype(np.float32)}


def _naive_delta_rule(x, S0, rows):
    """float64 recurrence: (outputs, the state after each row in `rows`) with S[h, key, value]."""
    S, o, kept = S0.astype(np.float64).copy(), [], {}
    for t in range(len(x["q"])):
        S = S * np.exp(x["g"][t].astype(np.float64))[:, :, None]
        d = x["beta"][t][:, None] * (x["v"][t] - np.einsum("hij,hi->hj", S, x["k"][t]))
        S = S + x["k"][t][:, :, None] * d[:, None, :]
        o.append(np.einsum("hij,hi->hj", S, x["q"][t]))
        if t in rows:
            kept[t] = S.copy()
    return np.array(o), kept


@pytest.mark.e2e
def test_delta_rule_chunked_and_recurrent_equal_naive_with_strong_decay():
    """gated_delta_net both ways (interpreter and compiled kernels) = the float64 recurrence within float32 rounding:
    decays down to -5 per row and correlated keys over 150 rows (10 chunks). A call continuing from a committed
    plane (pos0 > 0) reads it; the recurrence keeps the state after each of the last P-1 rows in its slot's plane,
    the chunked form only after the last."""
    rng = np.random.default_rng(0)
    T, H, Dk, Dv, P = 150, 2, 32, 16, 5
    x = _delta_rule_inputs(rng, T, H, Dk, Dv)
    S0 = rng.standard_normal((H, Dk, Dv)).astype(np.float32)
    want, kept = _naive_delta_rule(x, S0, range(T - P + 1, T))
    vm = _compile([_delta_rule_graph("T", H, Dk, Dv, 0), _delta_rule_graph("T", H, Dk, Dv, 16)],
                  names=["recurrent", "chunked"])
    for name, chunk in (("recurrent", 0), ("chunked", 16)):
        g = _delta_rule_graph(T, H, Dk, Dv, chunk)
        inp = {**x, "pos": np.arange(7, 7 + T, dtype=np.int32), "rs_plane": np.array([2], np.int32)}
        state = np.zeros((P, H, Dk, Dv), np.float32)
        state[2] = S0
        st, sv = {"S": state.copy()}, {"S": state.copy()}
        got = {"ir": (interpret.run(g, inp, {}, st, n_kv=T + 7)["o"], st["S"]),
               "compiled": (_run_vm(vm, name, inp, sv, T + 7)[0], sv["S"])}
        for how, (o, S) in got.items():
            assert rel_err(o.reshape(T, -1), want.reshape(T, -1)) < 1e-5, (name, how)
            assert np.array_equal(S[2], S0), (name, how)       # the committed plane is never written
            slots = range(P - 1) if chunk == 0 else [0]
            for s in slots:
                np.testing.assert_allclose(S[(2 + 1 + s) % P], kept[T - 1 - s], rtol=0, atol=1e-5)
    # a sequence start (pos[0] = 0) ignores the committed plane
    g = _delta_rule_graph(T, H, Dk, Dv, 16)
    o = interpret.run(g, {**x, "pos": np.arange(T, dtype=np.int32), "rs_plane": np.array([1], np.int32)}, {},
                      {"S": np.full((P, H, Dk, Dv), 7.0, np.float32)}, n_kv=T)["o"]
    assert rel_err(o.reshape(T, -1), _naive_delta_rule(x, np.zeros_like(S0), ())[0].reshape(T, -1)) < 1e-5


def _naive_pool_mask(iq, ik, ig, ape, w, kp, top, tail):
    """Explicit loops: pools of kp positions, pooled keys, each row's top pools among the complete ones (ties to the
    lower pool) plus its incomplete pool. Returns the cell mask [T, T] (True = attended)."""
    T = len(iq)
    n_pool = T // kp
    pooled = np.zeros((n_pool, ik.shape[1]))
    for p in range(n_pool):
        z = ig[kp * p:kp * p + kp].astype(np.float64) + ape
        e = np.exp(z - z.max(0))
        pooled[p] = (e / e.sum(0) * ik[kp * p:kp * p + kp]).sum(0)
    sel = np.zeros((T, T), bool)
    for t in range(T):
        visible = [p for p in range(n_pool) if kp * p + kp - 1 <= t]
        score = {p: sum(w[t, h] * max(0.0, float(iq[t, h] @ pooled[p])) for h in range(iq.shape[1])) for p in visible}
        for p in sorted(visible, key=lambda p: (-score[p], p))[:top]:
            sel[t, kp * p:kp * p + kp] = True
        if tail and (t + 1) % kp:
            sel[t, kp * ((t + 1) // kp):t + 1] = True
    return sel


def _pool_graph(T, Hi, Di, kp, top, tail):
    g = Graph("pool")
    iq, ik, ig = g.input("iq", (T, Hi, Di)), g.input("ik", (T, 1, Di)), g.input("ig", (T, 1, Di))
    ape, w, pos = g.input("ape", (kp, Di)), g.input("w", (T, Hi)), g.input("pos", (T,), "int32")
    ikc = g.set_rows(g.state("ik", ("C", 1, Di)), ik, pos)
    igc = g.set_rows(g.state("ig", ("C", 1, Di)), ig, pos)
    pooled = g.kpool_store(g.state("ikp", (f"C//{kp}", 1, Di)), ikc, igc, ape, pos)
    score = g.lightning_indexer(iq, pooled, w, pos, kpool=kp)
    g.output("mask", g.kpool_expand(g.top_k_mask(score, pos, top, kpool=kp), pos, kp, tail))
    return g


@pytest.mark.e2e
@pytest.mark.parametrize("tail", [True, False])
def test_pooled_indexer_equals_naive_selection(tail):
    """Pooling, pool visibility (complete at the row), top pools with exact ties (two pools with equal keys), the
    tail; one call and two calls (pools straddling them), interpreter and compiled kernels."""
    rng = np.random.default_rng(1)
    T, Hi, Di, kp, top = 70, 3, 8, 4, 3
    x = {"iq": rng.standard_normal((T, Hi, Di)), "ik": rng.standard_normal((T, 1, Di)),
         "ig": rng.standard_normal((T, 1, Di)), "ape": rng.standard_normal((kp, Di)), "w": rng.random((T, Hi))}
    x = {k: v.astype(np.float32) for k, v in x.items()}
    x["ik"][20:24], x["ig"][20:24] = x["ik"][8:12], x["ig"][8:12]          # pools 2 and 5: the same pooled key
    want = _naive_pool_mask(x["iq"], x["ik"][:, 0], x["ig"][:, 0], x["ape"], x["w"], kp, top, tail)
    vm = _compile([_pool_graph("T", Hi, Di, kp, top, tail)], names=["pool"])
    for how in ("ir", "compiled"):
        st = {"ik": np.zeros((T, 1, Di), np.float32), "ig": np.zeros((T, 1, Di), np.float32),
              "ikp": np.zeros((T // kp, 1, Di), np.float32)}
        rows = []
        for lo, hi in ((0, 41), (41, T)):
            inp = {k: v[lo:hi] for k, v in x.items() if k != "ape"} | {"ape": x["ape"],
                                                                       "pos": np.arange(lo, hi, dtype=np.int32)}
            if how == "ir":
                m = interpret.run(_pool_graph(hi - lo, Hi, Di, kp, top, tail), inp, {}, st, n_kv=hi)["mask"]
            else:
                m = _run_vm(vm, "pool", inp, st, hi)[0]
            rows.append(np.pad(m, ((0, 0), (0, T - hi)), constant_values=-np.inf))
        got = np.concatenate(rows) == 0
        causal = np.tri(T, dtype=bool)
        assert np.array_equal(got & causal, want), how
    assert (want.sum(1)[top * kp + kp:] <= top * kp + kp - 1).all()      # sparse rows attend to at most the budget


@pytest.mark.e2e
def test_hc_comb_equals_naive_sinkhorn():
    """dsv4_hc_comb = Sinkhorn by loops in transformers' [src][dst] view (interpreter and kernel); its last step
    normalises over src (20 iterations need not converge the other way on large logits)."""
    rng = np.random.default_rng(2)
    c = (rng.standard_normal((9, 4, 4)) * 3).astype(np.float32)
    eps, iters = 1e-6, 20
    want = np.empty((9, 4, 4))
    for t in range(9):
        m = c[t].astype(np.float64)
        m = np.exp(m - m.max(1, keepdims=True))
        m = m / m.sum(1, keepdims=True) + eps
        for it in range(iters):
            if it:
                for s in range(4):
                    m[s, :] /= m[s, :].sum() + eps
            for d in range(4):
                m[:, d] /= m[:, d].sum() + eps
        want[t] = m
    g = Graph("hc")
    g.output("c", g.dsv4_hc_comb(g.input("c", ("T", 4, 4)), eps, iters))
    got_ir = interpret.run(g, {"c": c}, {}, {}, n_kv=1)["c"]
    got_vm = _run_vm(_compile([g], names=["hc"]), "hc", {"c": c}, {}, 1)[0]
    for got in (got_ir, got_vm):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(want.sum(1), 1.0, atol=1e-5)


def _compile(graphs, names):
    """Small IR graphs → one llvm VM (the compiler's own pipeline and CPU schedules)."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from nextn.compiler.target import make_target
    from nextn.compiler.lower.pipeline import make_pipeline
    from nextn.compiler.lower.to_relax import build_module
    from nextn.schedules import schedule_pass

    for g, n in zip(graphs, names):
        g.name = n
    tgt = make_target("llvm")
    with tgt:
        ex = tvm.compile(build_module(graphs, {}), target=tgt, relax_pipeline=make_pipeline(tgt, schedule_pass(tgt)))
    vm = VirtualMachine(ex, tvm.cpu())
    vm.graphs = dict(zip(names, graphs))
    return vm


def _run_vm(vm, name, inputs, states, n_kv):
    """Call `name` with inputs / states by name; returns its outputs (numpy), the states updated in place."""
    import tvm
    import tvm_ffi

    g = vm.graphs[name]
    st = {n: tvm.runtime.tensor(states[n]) for n in g.states}
    # to_relax's signature: inputs, n_kv, then the states and the weights as one tuple each (no weights here)
    out = vm[name](*[tvm.runtime.tensor(np.ascontiguousarray(inputs[n])) for n in g.inputs], tvm_ffi.Shape([n_kv]),
                   tvm_ffi.convert(list(st.values())), tvm_ffi.convert([]))
    for n in g.states:
        states[n][...] = st[n].numpy()
    return [out[i].numpy() for i in range(len(g.outputs))]


# -- compiled, against the fixture references -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", FULL_KINDS)
def test_trunk_and_mtp_logits(g5n, kind):
    check_logits(g5n, D, kind)


@pytest.mark.parametrize("kind", SHORT_KINDS)
def test_greedy_and_speculative(g5n, kind, monkeypatch):
    """Last logits, greedy continuation, and spec on ≡ off at n_max 1, 2, 3 with the reference's rounds (drafted
    ids and accepted count of every round), with the GGUF's index sharing."""
    p = PROMPTS[kind]
    _h, last, am = g5n.sequence.prefill(np.asarray(p["prompt_ids"], np.int32), 0)
    assert rel_err(last, reference_logits(D)[f"{kind}/last_logits"]) < REF_TOL and am == p["last_logits_argmax"]
    check_greedy_and_speculative(g5n, p, monkeypatch)


def test_long_context_sparse(g5n, monkeypatch):
    """2220 tokens (the indexer selects 24 of up to 555 pools per row): last logits (all rows and last row only),
    greedy, speculation."""
    p = PROMPTS["long-context"]
    h, last, am = g5n.sequence.prefill(np.asarray(p["prompt_ids"], np.int32), 0)
    assert rel_err(last, reference_logits(D)["long-context/last_logits"]) < REF_TOL and am == p["last_logits_argmax"]
    # plain decoding's prefill (5 chunks, each one's last layer on its last row, base.hidden_ids): the same bits
    h1, last1, am1 = g5n.sequence.prefill(np.asarray(p["prompt_ids"], np.int32), 0, last_only=True)
    assert (h1 == h[-1:]).all() and (last1 == last).all() and am1 == am
    check_greedy_and_speculative(g5n, p, monkeypatch)


@pytest.mark.parametrize("kind", sorted(k for k in PROMPTS if PROMPTS[k].get("spec_no_index_share")))
def test_index_share_off_matches_reference(g5n, kind, monkeypatch):
    """With index sharing off the NextN indexer runs at every draft step: the reference's spec_no_index_share."""
    seq = g5n.sequence
    assert seq.model.share_mtp_index is True                     # the GGUF's attention.indexer.index_share_mtp
    try:
        seq.model.share_mtp_index = False
        check_greedy_and_speculative(g5n, PROMPTS[kind], monkeypatch, "spec_no_index_share")
    finally:
        seq.model.share_mtp_index = True


def test_states_are_static_and_in_the_manifest(g5n):
    """Per KDA layer the recurrent and conv states ([P, ...] planes), per MLA layer the latent cache and the
    indexer rows and pooled keys ([C, ...], [C/kpool, ...]); the NextN block its own; verify / decode keep the
    state after each row, prefill (chunked) after its last."""
    seq, c = g5n.sequence, g5c.Glm5NextConfig.from_json(g5n.loaded.hparams)
    C, P = seq.n_ctx, seq.model.rs_planes
    assert P == seq.model.max_draft + 2
    want = {}
    for il, kind in enumerate(c.layer_kinds):
        if kind == g5c.KDA:
            want |= {f"ssm.{il}": (P, c.n_head, c.kda_hd, c.kda_hd)}
            want |= {f"conv_{n}.{il}": (P, c.conv_k - 1, c.d_inner) for n in "qkv"}
        else:
            want |= {f"kv.{il}": (C, 1, c.kv_lora), f"ik.{il}": (C, 1, c.idx_hd), f"ig.{il}": (C, 1, c.idx_hd),
                     f"ikp.{il}": (C // c.idx_kpool, 1, c.idx_hd)}
    n = c.n_layer
    want |= {f"nextn.kv.{n}": (C, 1, c.kv_lora), f"nextn.ik.{n}": (C, 1, c.idx_hd), f"nextn.ig.{n}": (C, 1, c.idx_hd),
             f"nextn.ikp.{n}": (C // c.idx_kpool, 1, c.idx_hd), "nextn.index_mask": (C,)}
    assert {k: tuple(v.shape) for k, v in seq.states.items()} == want
    assert seq.recurrent == {k for k in want if k.startswith(("ssm.", "conv_"))}
    eps = seq.model.artifact.manifest["entry_points"]
    assert [eps[e]["keeps_row_states"] for e in ("prefill", "verify", "decode")] == [False, True, True]
    assert all(("rs_plane" in [i["name"] for i in ep["inputs"]]) == (ep["graph"] == "trunk") for ep in eps.values())


def test_planes_follow_the_draft_depth(compiled):
    """max_draft + 2 recurrent planes (a verify of max_draft + 1 rows keeps every row's state beside the committed
    one); one plane, updated in place, without speculation. Both decode as the references."""
    path = compiled("g5n-bf16", BF16)
    p = PROMPTS["docs-heading"]
    plain = rt.load(path, spec=False)
    assert plain.loaded.rs_planes == 1 and plain.sequence.states["ssm.0"].shape[0] == 1
    assert plain.generate(p["prompt_ids"], p["n_predict"], spec_type="none", ignore_eos=True).ids == p["greedy_ids"]
    m3 = rt.load(path, max_draft=3, mtp_index_share=False)
    assert m3.loaded.rs_planes == 5 and m3.max_draft == 3 and m3.loaded.share_mtp_index is False
    m3.loaded.share_mtp_index = True
    r = m3.generate(p["prompt_ids"], p["n_predict"], n_max=3, ignore_eos=True)
    want = p["spec"]["3"]
    assert r.ids == p["greedy_ids"] and (r.stats.rounds, r.stats.drafted, r.stats.accepted) == (
        want["steps"], want["drafted"], want["accepted"])
    assert m3.generate(p["prompt_ids"], 8, n_max=5, ignore_eos=True).n_max == 3


def _committed_states(seq):
    """The committed part of every trunk state: the committed plane of each recurrent state, the cells (and
    complete pools) below the committed position of each position-indexed one."""
    n, kp = seq.rs_pos, seq.model.hparams["idx_kpool"]
    out = {}
    for name, s in seq.states.items():
        if name.startswith("nextn."):
            continue
        a = s.numpy()
        out[name] = a[seq.rs_plane] if name in seq.recurrent else a[:n // kp] if name.startswith("ikp.") else a[:n]
    return out


def _assert_states_equal(got, want):
    assert got.keys() == want.keys()
    for name in want:
        assert np.abs(got[name] - want[name]).max() <= 1e-5 * max(1.0, np.abs(want[name]).max()), name


def test_rollback_every_state_equals_fresh_recompute(g5n, compiled):
    """Verify rounds of 4 rows with random drafts, each keeping a random number of rows (0..3 accepted): after each,
    every committed trunk state equals a fresh prefill of the committed tokens (no replay happened: the engine
    only changed plane). Then a speculative generation with rejected drafts: the same, and its text is plain
    decoding's."""
    seq = g5n.sequence
    fresh = rt.load(compiled("g5n-bf16", BF16), ctx_size=4096).sequence
    rng = np.random.default_rng(3)
    toks = list(PROMPTS["docs-heading"]["prompt_ids"])
    _h, _lg, id_last = seq.prefill(np.asarray(toks, np.int32), 0)
    keeps = [0, 3, 1, 2, 0, 3, 2, 1]
    for keep in keeps:
        drafts = [int(t) for t in rng.integers(0, 8192, 3)]
        calls = dict(seq.vm_seconds)
        _h, _lg, am = seq.verify([id_last] + drafts, len(toks))
        seq.commit(keep + 1)
        assert {k for k in seq.vm_seconds if seq.vm_seconds[k] != calls[k]} == {"verify"}   # one call per round
        toks += [id_last] + drafts[:keep]
        id_last = int(am[keep])
        fresh.prefill(np.asarray(toks, np.int32), 0)
        assert seq.rs_pos == fresh.rs_pos == len(toks)
        _assert_states_equal(_committed_states(seq), _committed_states(fresh))
    p = PROMPTS["docs-prose"]
    r = g5n.generate(p["prompt_ids"], 40, spec_type="draft-mtp", n_max=3, ignore_eos=True)
    assert r.stats.drafted - r.stats.accepted >= 10 and r.ids == p["greedy_ids"][:40]
    fresh.prefill(np.asarray(p["prompt_ids"] + r.ids[:-1], np.int32), 0)
    _assert_states_equal(_committed_states(seq), _committed_states(fresh))


def test_commit_checks(g5n):
    """A commit keeps only rows whose state the call kept; a trunk call continues at the committed position."""
    seq = g5n.sequence
    ids = np.asarray(PROMPTS["code-short"]["prompt_ids"], np.int32)
    seq.prefill(ids, 0)
    with pytest.raises(NextnError, match="continue there"):
        seq.verify([1, 2], len(ids) + 3)
    seq._run("prefill", [1, 2, 3], len(ids), hidden_ids=np.arange(3, dtype=np.int32), out_ids=np.array([2], np.int32))
    with pytest.raises(NextnError, match="kept the recurrent state after its last 1 row"):
        seq.commit(2)
    seq.commit(3)
    assert seq.rs_pos == len(ids) + 3


def test_prefill_chunked_equals_verify_recurrent(g5n):
    """The same 211 rows through prefill (chunked KDA) and through verify (the recurrence): hidden states and the
    committed recurrent states agree within float32 rounding."""
    seq = g5n.sequence
    ids = np.asarray(PROMPTS["docs-prose"]["prompt_ids"], np.int32)
    h_chunked = seq.prefill(ids, 0)[0]
    s_chunked = _committed_states(seq)
    h_rec = seq.verify(ids, 0)[0]
    seq.commit(len(ids))
    assert rel_err(h_chunked, h_rec) < 1e-5
    _assert_states_equal(_committed_states(seq), s_chunked)


@pytest.mark.slow
def test_gpu_form_on_the_cpu(compiled, monkeypatch):
    """The GPU artifacts' arithmetic built for llvm (attention, index score and top-k as separate kernels; the KDA
    recurrence for prefill too): logits and speculation as the references."""
    m = rt.load(compiled("g5n-bf16-split", BF16, split_kernels=True), ctx_size=4096)
    assert m.loaded.artifact.manifest["entry_points"]["prefill"]["keeps_row_states"] is True
    p = PROMPTS["docs-heading"]
    npz = reference_logits(D)
    assert rel_err(m.logits(p["prompt_ids"]), npz["docs-heading/trunk_logits"]) < REF_TOL
    assert rel_err(m.mtp_logits(p["prompt_ids"]), npz["docs-heading/mtp_logits"]) < REF_TOL
    check_greedy_and_speculative(m, p, monkeypatch)


def test_q8_compiled_vs_ir_every_entry_point(compiled):
    """Q8_0 bundle built with --exact-matmul (in-kernel dequantization incl. the BF16-kept KDA / indexer tensors) on docs-heading (sparse from
    row 99): prefill, verify, decode, mtp_rows, mtp_draft, draft and mtp_draft_shared against the interpreter on
    gguf-py-dequantized weights, outputs and every state (all planes, all cells)."""
    from nextn.compiler.graphs import build_graphs

    m = rt.load(compiled("glm5next-q8-exact", Q8, exact_matmul=True), ctx_size=256)   # float activation rows
    seq = m.sequence
    mf = ModelFiles(Q8, load_mtp=True)
    graphs, w = build_graphs(mf, with_mtp=True), dequantized(mf)
    st = zero_states(graphs.values(), seq.n_ctx, seq.model.rs_planes)
    ids = np.asarray(PROMPTS["docs-heading"]["prompt_ids"], np.int32)
    T = len(ids)
    rs = [0]

    def ir(entry, tokens, pos0, **extra):
        graph = graphs[entry]
        inp = {"tokens": np.asarray(tokens, np.int32), "pos": np.arange(pos0, pos0 + len(tokens), dtype=np.int32),
               **extra}
        if "rs_plane" in graph.inputs:
            inp["rs_plane"] = np.array([rs[0]], np.int32)
        return interpret.run(graph, inp, w, st, n_kv=pos0 + len(tokens))

    def close(got, want):
        assert rel_err(got, want) < 1e-5

    want = ir("prefill", ids, 0, hidden_ids=np.arange(T, dtype=np.int32), out_ids=np.array([T - 1], np.int32))
    h, last, am = seq.prefill(ids, 0)
    rs[0] = (rs[0] + 1) % seq.model.rs_planes
    close(h, want["hidden"]), close(last, want["logits"][0])
    assert am == want["argmax"][0]
    rows = [am, 17, 99, 5]
    want = ir("verify", rows, T)
    h, lg, amv = seq.verify(rows, T)
    close(h, want["hidden"]), close(lg.numpy(), want["logits"])
    assert (amv == want["argmax"]).all()
    seq.commit(2)
    rs[0] = (rs[0] + 1 + 2) % seq.model.rs_planes
    want = ir("decode", [int(amv[1])], T + 2)
    h, lg, amd = seq.verify([int(amv[1])], T + 2)
    close(lg.numpy(), want["logits"])
    assert seq.vm_seconds["decode"] > 0 and amd[0] == want["argmax"][0]
    seq.commit(1)
    hp = np.random.default_rng(0).standard_normal((T + 3, seq.model.hparams["n_embd"])).astype(np.float32)
    want = ir("mtp_rows", ids, 0, h_prev=hp[:T], out_ids=np.array([T - 1], np.int32))
    close(seq.mtp_rows(ids, hp[:T], 0), want["h_nextn"])
    for entry, tokens, pos0, reuse in (("draft", [7], T, False), ("mtp_draft_shared", [8], T + 1, True),
                                       ("mtp_draft", [9, 10], T + 2, False)):
        sel = {"out_ids": np.array([len(tokens) - 1], np.int32)} if entry == "mtp_draft" else {}   # the last row's head
        want = ir(entry, tokens, pos0, h_prev=hp[pos0 - T:pos0 - T + len(tokens)], **sel)
        h, lg, am = seq.mtp_draft(tokens, hp[pos0 - T:pos0 - T + len(tokens)], pos0, reuse_index=reuse,
                                  out_ids=sel.get("out_ids"))
        close(h, want["h_nextn"]), close(lg.numpy(), want["logits"])
        assert (am == want["argmax"]).all() and seq.vm_seconds[entry] > 0, entry
    for name, a in st.items():   # (the NextN selection holds -inf: equal as such)
        np.testing.assert_allclose(seq.states[name].numpy(), a, rtol=0,
                                   atol=1e-5 * max(1.0, np.abs(a[np.isfinite(a)]).max()), err_msg=name)


def test_index_share_state(bf16_files):
    """mtp_draft keeps step 0's cell selection (24 pools + the tail of the row at n_past; every later cell not
    selected); mtp_draft_shared runs no indexer and attends through exactly that selection, not to its own row."""
    mf, w = bf16_files
    c = mf.config
    ids = np.asarray(PROMPTS["docs-heading"]["prompt_ids"], np.int32)
    T, E, n = len(ids), c.n_embd, c.n_layer
    h_prev = np.random.default_rng(0).standard_normal((T + 2, E)).astype(np.float32)
    graphs = {k: g5g.build_mtp(c, mf.has_tensor, True, index=k) for k in ("store", "reuse")}
    st = zero_states([g5g.build_mtp(c, mf.has_tensor, False), *graphs.values()], T + 4)
    interpret.run(g5g.build_mtp(c, mf.has_tensor, False), {"tokens": ids, "pos": np.arange(T, dtype=np.int32),
                                                          "h_prev": h_prev[:T], "out_ids": np.array([T - 1], np.int32)},
                  w, st, n_kv=T)
    interpret.run(graphs["store"], {"tokens": ids[:1], "pos": np.array([T], np.int32), "h_prev": h_prev[T:T + 1]},
                  w, st, n_kv=T + 1)
    m = st["nextn.index_mask"]
    tail = (T + 1) % c.idx_kpool
    assert (m == 0).sum() == c.idx_top_k + tail and np.isinf(m[T + 1:]).all() and (m[T - tail + 1:T + 1] == 0).all()
    assert not any(k.startswith("nextn.i") for k in graphs["reuse"].states if k != "nextn.index_mask")
    kv_before = st[f"nextn.kv.{n}"].copy()
    got = interpret.run(graphs["reuse"], {"tokens": ids[1:2], "pos": np.array([T + 1], np.int32),
                                          "h_prev": h_prev[T + 1:T + 2]}, w, st, n_kv=T + 2)
    # the same step with the stored selection given as an explicit mask
    g = Graph("check")
    pos, z = g5g.base.nextn_frame(g, c, mf.has_tensor, n)
    mask = g.input("mask", (1, "L"))
    a = g5g.norm(g, z, f"blk.{n}.attn_norm.weight", c.rms_eps)
    y, _ = g5g.mla(g, c, n, a, pos, {"kv": g.state(f"nextn.kv.{n}", ("C", 1, c.kv_lora))}, mask)
    r = g.add(y, z)
    out = g.add(g5g.moe(g, c, n, g5g.norm(g, r, f"blk.{n}.ffn_norm.weight", c.rms_eps)), r)
    g.output("h", g5g.norm(g, out, f"blk.{n}.nextn.shared_head_norm.weight", c.rms_eps))
    want = interpret.run(g, {"tokens": ids[1:2], "pos": np.array([T + 1], np.int32), "h_prev": h_prev[T + 1:T + 2],
                             "mask": m[None, :T + 2]}, w, {f"nextn.kv.{n}": kv_before}, n_kv=T + 2)
    assert np.array_equal(got["h_nextn"], want["h"])
    assert m[T + 1] == -np.inf                            # the draft row's own cell is not in the selection


def test_trunk_only_plus_mtp_only_pair_equals_bundle(compiled):
    """Split layout (converter --no-mtp / --mtp): trunk-only GGUF + MTP-only draft = the Q8_0 bundle, speculation
    included (the NextN keys: clamp at the NextN index, index sharing, come from the draft); trunk-only alone
    decodes plainly."""
    pair = rt.load(compiled("g5n-pair", TRUNK, MTP))
    bundle = rt.load(compiled("glm5next-q8", Q8))
    assert pair.loaded.share_mtp_index is True
    cfg = [g5c.Glm5NextConfig.from_json(m.loaded.hparams) for m in (pair, bundle)]
    assert cfg[0].clamp(4, False) == cfg[1].clamp(4, False) == 10.0 and cfg[0].clamp(3, False) == 10.0
    check_split_layout(pair, bundle, rt.load(compiled("g5n-trunk", TRUNK), spec=False), PROMPTS["docs-prose"])


def test_serve_index_share_flag(compiled):
    """`nextn serve` takes run's --mtp-index-share/--no-mtp-index-share (one option), and every slot's engine
    follows it: on by default (the fixture GGUF's index_share_mtp), off with --no-mtp-index-share."""
    import socket

    from nextn.runtime.cli import cli
    from nextn.runtime.server import Running, ServeOptions

    run_opt, serve_opt = (next(o for o in cli.commands[c].params if o.name == "mtp_index_share") for c in ("run", "serve"))
    assert run_opt.opts == serve_opt.opts == ["--mtp-index-share"] and serve_opt.secondary_opts == ["--no-mtp-index-share"]
    art = compiled("g5n-bf16", BF16)
    for flag, want in ((None, True), (False, False)):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        srv = Running(ServeOptions(model=art, port=port, n_parallel=2, mtp_index_share=flag),
                      log=lambda m: None).start_background()
        try:
            assert srv.loaded.wait(120) and srv.error is None, srv.error
            assert [sl.seq.model.share_mtp_index for sl in srv.state.scheduler.slots] == [want, want]
        finally:
            srv.stop()


def test_cli_index_share_flag(compiled, tmp_path):
    """`nextn run ART --prompt-file F --spec-draft-n-max 3 --json`: by default the NextN steps share step 0's selection
    (the GGUF's index_share_mtp) and `--no-mtp-index-share` recomputes it; the prompt text tokenizes to the
    fixture's ids, so each run's rounds / drafted / accepted are the reference's spec and spec_no_index_share, and
    the tokens the greedy reference."""
    import subprocess
    import sys

    art = compiled("g5n-bf16", BF16)
    p = PROMPTS["code-class"]            # a prompt where the two differ: 29 vs 30 accepted at n_max 3
    text = next(q["text"] for q in json.loads((FIXTURES / "prompts.json").read_text()) if q["kind"] == p["kind"])
    f = tmp_path / "prompt.txt"
    f.write_text(text, encoding="utf-8")
    for flag, key in ((), "spec"), (("--no-mtp-index-share",), "spec_no_index_share"):
        r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "run", art, "--prompt-file", str(f), "-n",
                            str(p["n_predict"]), "--spec-draft-n-max", "3", "--ignore-eos", "--json", *flag],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        out, want = json.loads(r.stdout), p[key]["3"]
        assert out["prompt_tokens"] == len(p["prompt_ids"]) and out["tokens"] == p["greedy_ids"]
        assert (out["stats"]["rounds"], out["stats"]["drafted"], out["stats"]["accepted"]) == (
            want["steps"], want["drafted"], want["accepted"]), (flag, out["stats"])
