"""glm4moe trunk and `graph_mtp` builders (llama.cpp src/models/glm4-moe.cpp `llm_build_glm4_moe`, and its
`graph_mtp` from llama.cpp PR #26534).

Each builder returns an IR `Graph` for one entry point. Rows: `T` tokens at positions `pos` (int32),
the KV cells written are `pos`, attention reads cells `< L` (= n_past + T) under the causal mask.
The pieces every GLM arch shares (norms, projections, MoE, trunk ends, NextN frame) are ..glm_base.graph.
"""
from __future__ import annotations

import math

from nextn.compiler.ir import Graph

from ..glm_base.graph import dense_ffn, hidden_ids, linear, moe, nextn_frame, nextn_head, norm, trunk_inputs, trunk_outputs
from .config import Glm4MoeConfig, nextn_index


def attention(g: Graph, c: Glm4MoeConfig, il: int, x, pos, kc, vc):
    """attn_norm → Q/K/V (+bias) → per-head q/k rms_norm → NEOX rope → KV store → attention → Wo."""
    p, hd, E = f"blk.{il}.", c.head_dim, c.n_embd
    T = x.shape[0]
    h = norm(g, x, p + "attn_norm.weight", c.rms_eps)
    q = g.reshape(linear(g, h, p + "attn_q", c.n_head * hd, c.qkv_bias), (T, c.n_head, hd))
    k = g.reshape(linear(g, h, p + "attn_k", c.n_head_kv * hd, c.qkv_bias), (T, c.n_head_kv, hd))
    v = g.reshape(linear(g, h, p + "attn_v", c.n_head_kv * hd, c.qkv_bias), (T, c.n_head_kv, hd))
    if c.qk_norm:
        q = norm(g, q, p + "attn_q_norm.weight", c.rms_eps)
        k = norm(g, k, p + "attn_k_norm.weight", c.rms_eps)
    q = g.rope_ext(q, pos, c.n_rot, "neox", **c.rope_args())
    k = g.rope_ext(k, pos, c.n_rot, "neox", **c.rope_args())
    kc = g.set_rows(kc, k, pos)
    vc = g.set_rows(vc, v, pos)
    o = g.flash_attn_ext(q, kc, vc, pos, 1.0 / math.sqrt(hd))
    o = g.reshape(o, (T, c.n_head * hd))
    return linear(g, o, p + "attn_output", E)   # ggml forces F32 precision here; we are f32 throughout


def block(g: Graph, c: Glm4MoeConfig, il: int, x, pos, kc, vc, is_moe: bool, keep=None):
    """One decoder layer; `keep` [H] int32: the rows that go on past attention (prefill's last layer: hidden_ids)."""
    r = g.add(attention(g, c, il, x, pos, kc, vc), x)
    if keep is not None:
        r = g.get_rows(r, keep)
    h2 = norm(g, r, f"blk.{il}.post_attention_norm.weight", c.rms_eps)
    ffn = moe(g, c, il, h2) if is_moe else dense_ffn(g, c, il, h2)
    return g.add(ffn, r)


def _kv_states(g: Graph, c: Glm4MoeConfig, prefix: str, il: int):
    shape = ("C", c.n_head_kv, c.head_dim)      # C = context size, chosen at load time
    return g.kv_state(f"{prefix}k.{il}", shape, "k"), g.kv_state(f"{prefix}v.{il}", shape, "v")


def build_trunk(c: Glm4MoeConfig, has_tensor, all_rows: bool) -> Graph:
    """Trunk forward over T rows. Outputs: `hidden` [H, n_embd] (post output_norm: the MTP seed `t_h_nextn`; the
    `hidden_ids` rows, all T rows if `all_rows`), `logits` [R, n_vocab] and `argmax` [R] for rows `out_ids` of
    those (all rows if `all_rows`)."""
    g = Graph("verify" if all_rows else "prefill")
    pos, x = trunk_inputs(g, c)
    keep = hidden_ids(g, all_rows)
    for il in range(c.n_layer):
        kc, vc = _kv_states(g, c, "", il)
        x = block(g, c, il, x, pos, kc, vc, il >= c.n_lead_dense, keep if il == c.n_layer - 1 else None)
    trunk_outputs(g, c, has_tensor, x, all_rows)
    return g


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
