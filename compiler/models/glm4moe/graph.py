"""glm4moe trunk and `graph_mtp` builders (llama.cpp src/models/glm4-moe.cpp; glm-mtp-reference.md §4.1, §5.2).

Each builder returns an IR `Graph` for one entry point. Rows: `T` tokens at positions `pos` (int32),
the KV cells written are `pos`, attention reads cells `< L` (= n_past + T) under the causal mask.
"""
from __future__ import annotations

import math

from nextn.compiler.ir import Graph

from .config import Glm4MoeConfig, nextn_index


def _norm(g: Graph, x, w_name: str, eps: float):
    return g.mul(g.rms_norm(x, eps), g.weight(w_name, (x.shape[-1],)))


def _linear(g: Graph, x, name: str, n_out: int, bias: bool = False):
    y = g.mul_mat(g.weight(f"{name}.weight", (n_out, x.shape[-1])), x)
    if bias:
        y = g.add(y, g.weight(f"{name}.bias", (n_out,)))
    return y


def attention(g: Graph, c: Glm4MoeConfig, il: int, x, pos, kc, vc):
    """attn_norm → Q/K/V (+bias) → per-head q/k rms_norm → NEOX rope → KV store → attention → Wo."""
    p, hd, E = f"blk.{il}.", c.head_dim, c.n_embd
    T = x.shape[0]
    h = _norm(g, x, p + "attn_norm.weight", c.rms_eps)
    q = g.reshape(_linear(g, h, p + "attn_q", c.n_head * hd, c.qkv_bias), (T, c.n_head, hd))
    k = g.reshape(_linear(g, h, p + "attn_k", c.n_head_kv * hd, c.qkv_bias), (T, c.n_head_kv, hd))
    v = g.reshape(_linear(g, h, p + "attn_v", c.n_head_kv * hd, c.qkv_bias), (T, c.n_head_kv, hd))
    if c.qk_norm:
        q = _norm(g, q, p + "attn_q_norm.weight", c.rms_eps)
        k = _norm(g, k, p + "attn_k_norm.weight", c.rms_eps)
    q = g.rope_ext(q, pos, c.n_rot, "neox", **c.rope_args())
    k = g.rope_ext(k, pos, c.n_rot, "neox", **c.rope_args())
    kc = g.set_rows(kc, k, pos)
    vc = g.set_rows(vc, v, pos)
    o = g.flash_attn_ext(q, kc, vc, pos, 1.0 / math.sqrt(hd))
    o = g.reshape(o, (T, c.n_head * hd))
    return _linear(g, o, p + "attn_output", E)   # ggml forces F32 precision here; we are f32 throughout


def dense_ffn(g: Graph, c: Glm4MoeConfig, il: int, x, prefix: str = "ffn_", suffix: str = "", n_ff: int | None = None):
    p = f"blk.{il}.{prefix}"
    F = n_ff or c.n_ff
    gate = _linear(g, x, f"{p}gate{suffix}", F)
    up = _linear(g, x, f"{p}up{suffix}", F)
    return _linear(g, g.swiglu(gate, up), f"{p}down{suffix}", c.n_embd)


def moe(g: Graph, c: Glm4MoeConfig, il: int, x):
    """build_moe_ffn (reference §1.1): sigmoid probs, exp_probs_b for selection only, norm, scale; + shared expert."""
    p, X, F, E, k = f"blk.{il}.", c.n_expert, c.n_ff_exp, c.n_embd, c.n_expert_used
    T = x.shape[0]
    logits = g.mul_mat(g.weight(p + "ffn_gate_inp.weight", (X, E)), x)             # [T, X]
    probs = g.sigmoid(logits)
    selection = g.add(probs, g.weight(p + "exp_probs_b.bias", (X,)))
    selected = g.argsort_top_k(selection, k)                                       # [T, k]
    w = g.get_rows(g.reshape(probs, (T, X, 1)), selected)                          # [T, k, 1]
    if c.expert_weights_norm:
        wsum = g.clamp(g.sum_rows(g.reshape(w, (T, k))), 6.103515625e-5, math.inf)    # [T, 1]
        w = g.div(w, g.reshape(wsum, (T, 1, 1)))
    if c.expert_weights_scale not in (0.0, 1.0):
        w = g.scale(w, c.expert_weights_scale)
    up = g.mul_mat_id(g.weight(p + "ffn_up_exps.weight", (X, F, E)), x, selected)      # [T, k, F]
    gate = g.mul_mat_id(g.weight(p + "ffn_gate_exps.weight", (X, F, E)), x, selected)
    down = g.mul_mat_id(g.weight(p + "ffn_down_exps.weight", (X, E, F)), g.swiglu(gate, up), selected)  # [T, k, E]
    down = g.mul(down, w)
    out = g.reshape(g.view(down, 1, 0, 1), (T, E))
    for j in range(1, k):                                                          # sum in top-k slot order
        out = g.add(out, g.reshape(g.view(down, 1, j, 1), (T, E)))
    if c.n_expert_shared > 0:
        out = g.add(out, dense_ffn(g, c, il, x, "ffn_", "_shexp", F * c.n_expert_shared))
    return out


def block(g: Graph, c: Glm4MoeConfig, il: int, x, pos, kc, vc, is_moe: bool):
    r = g.add(attention(g, c, il, x, pos, kc, vc), x)
    h2 = _norm(g, r, f"blk.{il}.post_attention_norm.weight", c.rms_eps)
    ffn = moe(g, c, il, h2) if is_moe else dense_ffn(g, c, il, h2)
    return g.add(ffn, r)


def _kv_states(g: Graph, c: Glm4MoeConfig, prefix: str, il: int):
    shape = ("C", c.n_head_kv, c.head_dim)      # C = context size, chosen at load time
    return g.state(f"{prefix}k.{il}", shape), g.state(f"{prefix}v.{il}", shape)


def _head(g: Graph, c: Glm4MoeConfig, hs, head_name: str, all_rows: bool):
    if not all_rows:
        out_ids = g.input("out_ids", ("R",), "int32")
        hs = g.get_rows(hs, out_ids)
    logits = g.mul_mat(g.weight(head_name, (c.n_vocab, c.n_embd)), hs)
    g.output("logits", logits)
    g.output("argmax", g.argmax(logits))


def build_trunk(c: Glm4MoeConfig, has_tensor, all_rows: bool) -> Graph:
    """Trunk forward over T rows. Outputs: `hidden` [T, n_embd] (post output_norm: the MTP seed
    `t_h_nextn`), `logits` [R, n_vocab] and `argmax` [R] for rows `out_ids` (all rows if `all_rows`)."""
    g = Graph("verify" if all_rows else "prefill")
    tokens = g.input("tokens", ("T",), "int32")
    pos = g.input("pos", ("T",), "int32")
    x = g.get_rows(g.weight("token_embd.weight", (c.n_vocab, c.n_embd)), tokens)
    for il in range(c.n_layer):
        kc, vc = _kv_states(g, c, "", il)
        x = block(g, c, il, x, pos, kc, vc, il >= c.n_lead_dense)
    hN = _norm(g, x, "output_norm.weight", c.rms_eps)
    g.output("hidden", hN)
    _head(g, c, hN, "output.weight" if has_tensor("output.weight") else "token_embd.weight", all_rows)
    return g


def nextn_frame(g: Graph, c, has_tensor, il: int):
    """The NextN input frame shared by the GLM archs (reference §5.1): inputs tokens/pos/h_prev, then
    z = eh_proj · [rms(E[tok]) * enorm | rms(h_prev) * hnorm]. Returns (pos, z)."""
    p = f"blk.{il}.nextn."
    tokens = g.input("tokens", ("T",), "int32")
    pos = g.input("pos", ("T",), "int32")
    h = g.input("h_prev", ("T", c.n_embd), "float32")
    emb = p + "embed_tokens.weight" if has_tensor(p + "embed_tokens.weight") else "token_embd.weight"
    e = g.get_rows(g.weight(emb, (c.n_vocab, c.n_embd)), tokens)
    en = _norm(g, e, p + "enorm.weight", c.rms_eps)
    hn = _norm(g, h, p + "hnorm.weight", c.rms_eps)
    return pos, _linear(g, g.concat(en, hn, axis=1), p + "eh_proj", c.n_embd)     # order: [enorm(e) | hnorm(h)]


def nextn_head(g: Graph, c, has_tensor, il: int, x, all_rows: bool):
    """The NextN output (reference §5.1 steps 6-8): hs = rms(x) * shared_head_norm (fallback output_norm) is
    `h_nextn` (`t_h_nextn`, the next draft step's h); logits = shared_head_head (fallback output, token_embd)."""
    p = f"blk.{il}.nextn."
    norm = p + "shared_head_norm.weight" if has_tensor(p + "shared_head_norm.weight") else "output_norm.weight"
    hs = _norm(g, x, norm, c.rms_eps)
    g.output("h_nextn", hs)
    head = p + "shared_head_head.weight" if has_tensor(p + "shared_head_head.weight") else (
        "output.weight" if has_tensor("output.weight") else "token_embd.weight")
    _head(g, c, hs, head, all_rows)
    return hs


def build_mtp(c: Glm4MoeConfig, has_tensor, all_rows: bool) -> Graph:
    """NextN block over T rows (`graph_mtp`). Row t pairs `tokens[t]` with `h_prev[t]` (a post-norm hidden:
    the trunk's `output_norm` output at position pos[t]-1, or the previous draft step's `t_h_nextn`).
    Outputs: `h_nextn` [T, n_embd] (post shared_head_norm) and `logits` / `argmax` for the output rows."""
    il = nextn_index(c)
    g = Graph("mtp_draft" if all_rows else "mtp_rows")
    pos, z = nextn_frame(g, c, has_tensor, il)
    kc, vc = _kv_states(g, c, "nextn.", il)
    nextn_head(g, c, has_tensor, il, block(g, c, il, z, pos, kc, vc, True), all_rows)
    return g
