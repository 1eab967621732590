"""glm-dsa trunk and `graph_mtp` builders (llama.cpp src/models/glm-dsa.cpp, the trunk graph and `graph_mtp`;
the DeepSeek-V3.2-Exp / GLM-5 reports for the DSA lightning indexer; docs/design.md "glm-dsa").

Absorbed MLA: the KV cache of a layer stores one latent head per token, `[kv_cmpr (kv_lora) | k_pe (qk_rope)]`;
queries are absorbed through `attn_k_b` (q_nope → kv_lora columns), V is the first kv_lora columns of the
cached K, and the output is expanded through `attn_v_b`. The DSA indexer (full layers) keeps its own key cache,
scores keys with relu'd per-head dot products weighted by `indexer.proj`, and lets each query attend only to its
top-k keys; shared layers reuse the last full layer's selection. The MoE FFN and the NextN frame are the GLM
base's (..glm_base.graph), as glm4moe's.

Where nextn follows the model (transformers) rather than llama.cpp, as the fixtures' references do: the indexer
`k_norm` eps is 1e-6, and the NextN block runs its own indexer (llama.cpp: dense MLA there, our
`mtp_dense_attention=True`).
"""
from __future__ import annotations

from nextn.compiler.ir import Graph

from ..glm_base.config import nextn_index
from ..glm_base.graph import dense_ffn, hidden_ids, linear, moe, nextn_frame, nextn_head, norm, trunk_inputs, trunk_outputs
from .config import INDEXER_K_NORM_EPS, GlmDsaConfig

# Both use NORM rope (adjacent pairs), as llama.cpp: the converter permutes the rope rows of the weights that
# transformers rotates split-half. The indexer's rope slice comes first ([rope | nope]), MLA's last (q_pe, k_pe).
# (Checked on the fixture: NEOX on the indexer moves the long-context logits by 5e-2 relative.)
INDEXER_ROPE_MODE = "norm"
MLA_ROPE_MODE = "norm"


def indexer(g: Graph, c: GlmDsaConfig, il: int, h, qr, pos, ikc):
    """DSA lightning indexer of block `il` (full layers): writes the indexer key cache `ikc` [C, 1, idx_hd] and
    returns the additive selection mask [T, L] (0 on each row's top-k keys, -inf elsewhere)."""
    p = f"blk.{il}.indexer."
    T = h.shape[0]
    iq = g.reshape(linear(g, qr, p + "attn_q_b", c.idx_heads * c.idx_hd), (T, c.idx_heads, c.idx_hd))
    iq = g.rope_ext(iq, pos, c.n_rot, INDEXER_ROPE_MODE, **c.rope_args())   # layout [rope | nope]
    ik = g.norm(linear(g, h, p + "attn_k", c.idx_hd), INDEXER_K_NORM_EPS)
    ik = g.add(g.mul(ik, g.weight(p + "k_norm.weight", (c.idx_hd,))), g.weight(p + "k_norm.bias", (c.idx_hd,)))
    ik = g.rope_ext(g.reshape(ik, (T, 1, c.idx_hd)), pos, c.n_rot, INDEXER_ROPE_MODE, **c.rope_args())
    ikc = g.set_rows(ikc, ik, pos)
    w = g.scale(linear(g, h, p + "proj", c.idx_heads), (c.idx_hd * c.idx_heads) ** -0.5)
    score = g.lightning_indexer(iq, ikc, w, pos)                                        # [T, L]
    return g.top_k_mask(score, pos, c.idx_top_k)


def attention(g: Graph, c: GlmDsaConfig, il: int, x, pos, kvc, ikc=None, mask=None):
    """attn_norm → q LoRA → [indexer] → absorbed MLA over the latent cache `kvc` [C, 1, kv_lora+rope] → Wo.
    `ikc` given: this is a full indexer layer (returns its mask); else `mask` (a shared layer's reused selection,
    or None for dense attention). Returns (out [T, n_embd], mask)."""
    p, H = f"blk.{il}.", c.n_head
    T = x.shape[0]
    h = norm(g, x, p + "attn_norm.weight", c.rms_eps)
    qr = norm(g, linear(g, h, p + "attn_q_a", c.q_lora), p + "attn_q_a_norm.weight", c.rms_eps)
    if ikc is not None:
        mask = indexer(g, c, il, h, qr, pos, ikc)
    q = g.reshape(linear(g, qr, p + "attn_q_b", H * c.hd_k), (T, H, c.hd_k))
    q_nope = g.view(q, 2, 0, c.nope)
    q_pe = g.rope_ext(g.view(q, 2, c.nope, c.n_rot), pos, c.n_rot, MLA_ROPE_MODE, **c.rope_args())
    kv = linear(g, h, p + "attn_kv_a_mqa", c.kv_width)
    kv_cmpr = norm(g, g.view(kv, 1, 0, c.kv_lora), p + "attn_kv_a_norm.weight", c.rms_eps)   # norm after the split
    k_pe = g.rope_ext(g.reshape(g.view(kv, 1, c.kv_lora, c.n_rot), (T, 1, c.n_rot)), pos, c.n_rot,
                      MLA_ROPE_MODE, **c.rope_args())
    q_abs = g.mul_mat(g.weight(p + "attn_k_b.weight", (H, c.kv_lora, c.nope)), q_nope)        # [T, H, kv_lora]
    kvc = g.set_rows(kvc, g.concat(g.reshape(kv_cmpr, (T, 1, c.kv_lora)), k_pe, axis=2), pos)
    o = g.flash_attn_ext_mla(g.concat(q_abs, q_pe, axis=2), kvc, pos, mask, c.kq_scale, c.kv_lora)  # [T, H, kv_lora]
    o = g.mul_mat(g.weight(p + "attn_v_b.weight", (H, c.hd_v, c.kv_lora)), o)                 # [T, H, hd_v]
    return linear(g, g.reshape(o, (T, H * c.hd_v)), p + "attn_output", c.n_embd), mask


def block(g: Graph, c: GlmDsaConfig, il: int, x, pos, kvc, ikc, mask, is_moe: bool, keep=None):
    """One decoder layer; `keep` [H] int32: the rows that go on past attention (prefill's last layer: hidden_ids)."""
    a, mask = attention(g, c, il, x, pos, kvc, ikc, mask)
    r = g.add(a, x)
    if keep is not None:
        r = g.get_rows(r, keep)
    h2 = norm(g, r, f"blk.{il}.ffn_norm.weight", c.rms_eps)
    ffn = moe(g, c, il, h2) if is_moe else dense_ffn(g, c, il, h2)
    return g.add(ffn, r), mask


def _kv_state(g: Graph, c: GlmDsaConfig, prefix: str, il: int):
    # C = context size, chosen at load time; the latent cache is MLA's K (and V): it takes -ctk, as llama.cpp's
    return g.kv_state(f"{prefix}kv.{il}", ("C", 1, c.kv_width), "k")


def _ik_state(g: Graph, c: GlmDsaConfig, prefix: str, il: int):
    return g.kv_state(f"{prefix}ik.{il}", ("C", 1, c.idx_hd), "k")   # the indexer's key cache: -ctk too


def build_trunk(c: GlmDsaConfig, has_tensor, all_rows: bool) -> Graph:
    """Trunk forward over T rows. Outputs: `hidden` [H, n_embd] (post output_norm: the MTP seed `t_h_nextn`; the
    `hidden_ids` rows, all T rows if `all_rows`), `logits` [R, n_vocab] and `argmax` [R] for rows `out_ids` of
    those (all rows if `all_rows`).
    States: `kv.{il}` [C, 1, kv_lora+rope] per trunk layer, `ik.{il}` [C, 1, idx_hd] on full indexer layers."""
    g = Graph("verify" if all_rows else "prefill")
    pos, x = trunk_inputs(g, c)
    keep, mask = hidden_ids(g, all_rows), None
    for il in range(c.n_layer):
        ikc = _ik_state(g, c, "", il) if c.idx_full[il] else None
        x, mask = block(g, c, il, x, pos, _kv_state(g, c, "", il), ikc, mask, il >= c.n_lead_dense,
                        keep if il == c.n_layer - 1 else None)
    trunk_outputs(g, c, has_tensor, x, all_rows)
    return g


MTP_INDEX_MODES = ("own", "store", "reuse")


def build_mtp(c: GlmDsaConfig, has_tensor, all_rows: bool, mtp_dense_attention: bool = False,
              index: str | None = None) -> Graph:
    """NextN block over T rows (`graph_mtp`, glm4moe frame): row t pairs `tokens[t]` with `h_prev[t]`.
    Outputs `h_nextn` [T, n_embd] (post shared_head_norm) and `logits` / `argmax` for the output rows.

    Attention: the NextN block's own indexer (default), or dense MLA (`mtp_dense_attention`, llama.cpp's graph).
    `index` (ignored when dense): "own" computes the selection; "store" (the default of `mtp_draft`) also keeps
    the last row's selection in the state `nextn.index_mask` [C] (cells after the last row stored as selected); "reuse"
    (`mtp_draft_shared`, draft steps 1..n_max-1: index_share_for_mtp_iteration) skips the indexer and attends
    to the stored selection plus every cell written after it (the draft's own rows)."""
    il = nextn_index(c)
    if index is None:
        index = "store" if all_rows else "own"
    assert index in MTP_INDEX_MODES, index
    g = Graph("mtp_draft" if all_rows else "mtp_rows")
    pos, z = nextn_frame(g, c, has_tensor, il)
    kvc = _kv_state(g, c, "nextn.", il)
    ikc, mask = None, None
    if not mtp_dense_attention:
        if index == "reuse":
            mask = g.index_mask_load(g.state("nextn.index_mask", ("C",)))
        else:
            ikc = _ik_state(g, c, "nextn.", il)
    x, mask = block(g, c, il, z, pos, kvc, ikc, mask, True)
    nextn_head(g, c, has_tensor, il, x, all_rows)
    if not mtp_dense_attention and index == "store":   # last output: the in-place store must stay live
        g.output("index_mask", g.index_mask_store(g.state("nextn.index_mask", ("C",)), mask, pos))
    return g


def extra_entry_points(c: GlmDsaConfig, has_tensor, mtp_dense_attention: bool = False) -> dict:
    """`mtp_draft_shared`: a draft step that reuses the selection stored by `mtp_draft` (index sharing);
    absent with dense NextN attention (nothing to share)."""
    if mtp_dense_attention:
        return {}
    return {"mtp_draft_shared": ("mtp", build_mtp(c, has_tensor, True, index="reuse"))}
