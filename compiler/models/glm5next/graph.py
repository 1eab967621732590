"""glm5next (GLM-5.3-Flash) trunk and `graph_mtp` builders.

Semantics: llama.cpp `src/models/glm5-next.cpp` (`graph::graph`, `build_hc_pre` / `build_hc_post`,
`build_kda_layer`, `build_dsa_layer`, `build_kpool_select`; `src/models/delta-net-base.cpp` for the gated delta
rule), transformers `models/glm5_next/modeling_glm5_next.py` where the two differ (the fixtures follow the model),
and llama.cpp PR #27917 for the NextN block and `index_share_for_mtp_iteration`. Papers: Kimi Linear / KDA
(arXiv:2510.26692), mHC (arXiv:2512.24880), DeepSeek-V3.2 (DSA lightning indexer).

- Trunk: 4 residual streams (mHC). Every sublayer reads a Sinkhorn-mixed combination of the streams (`hc_pre`)
  and writes back through the mix matrix plus a per-stream gate (`hc_post`); the streams start as 4 copies of the
  embedding and end as their plain mean, then `output_norm`.
- KDA layers (attention.head_count_kv[il] = 0): q/k/v projections, a causal depthwise conv (kernel 4) with SiLU,
  L2-normed q/k, a per-key-channel decay g in (lower_bound, 0), beta, the gated delta rule over a per-head state,
  a gated per-head RMSNorm on the output. The recurrent and conv states are `P`-plane states (ir/graph.py): the
  verify / decode entries keep the state after each row (rollback = choosing a plane), prefill runs the chunked
  form and keeps the last.
- MLA layers (head_count_kv[il] = 1): NoPE absorbed MLA over a latent cache (`kv`) whose keys are attended only on
  the cells the pooled DSA indexer selects: pools of `kpool` consecutive positions with softmax-pooled indexer keys
  (`ikp`, from the per-position `ik` / `ig` rows), the top `top_k / kpool` complete pools per query plus the query's
  incomplete pool (the tail). Ties in the pool scores go to the lower pool index.
- NextN (blk.{n_layer}): the glm4moe frame (eh_proj of [enorm(E[x]) | hnorm(h)], h = the trunk's post-output_norm
  hidden), one MLA layer with its own indexer and caches + MoE, no mHC, shared_head_norm, the shared head.
  `mtp_draft` keeps its last row's cell selection (`nextn.index_mask`); `mtp_draft_shared` (draft steps 1..n-1 with
  index sharing) attends to exactly those cells: the positions draft step 0 selected, none of the draft rows.
"""
from __future__ import annotations

import math

from nextn.compiler.ir import Graph
from nextn.compiler.ir.graph import div_dim

from ..glm_base import graph as base
from ..glm_base.graph import linear, norm
from .config import KDA, Glm5NextConfig, nextn_index

KDA_CHUNK = 16          # rows per chunk of the chunked delta rule (prefill); llama.cpp's chunked KDA uses 16
CHUNK_LOG_DECAY = 80.0  # the most total log-decay a chunk may hold: its kernel factors exp(gamma_t - gamma_r)


def kda_chunk(c: Glm5NextConfig) -> int:
    """Prefill's KDA chunk: KDA_CHUNK rows, fewer if the gate's lower bound allows more than CHUNK_LOG_DECAY of
    decay in a chunk; 0 (the recurrence) when the decay is unbounded (the softplus gate, no lower bound)."""
    if c.gate_lower_bound is None or c.gate_lower_bound >= 0:
        return 0 if c.gate_lower_bound is None else KDA_CHUNK
    return max(1, min(KDA_CHUNK, int(CHUNK_LOG_DECAY // -c.gate_lower_bound)))
L2_EPS = 1e-6           # KDA q/k L2 norm: x / sqrt(sum x^2 + eps) (eps inside the sqrt, FLA's l2norm)


# -- mHC ------------------------------------------------------------------------------------------------------
def hc_pre(g: Graph, c: Glm5NextConfig, il: int, sub: str, X):
    """build_hc_pre: (u [T, E] the sublayer input, post [T, hc], comb [T, hc (src), hc (dst)]) from the stream
    bundle X [T, hc, E] and `blk.il.hc_{sub}_{fn,base,scale}` (sub = attn | ffn)."""
    T, hc, E = X.shape[0], c.hc_count, c.n_embd
    p = f"blk.{il}.hc_{sub}_"
    xn = g.rms_norm(g.reshape(X, (T, hc * E)), c.rms_eps)                 # unweighted RMS over all hc*E values
    m = g.mul_mat(g.weight(p + "fn.weight", ((2 + hc) * hc, hc * E)), xn)   # [T, (2+hc)*hc] mixes
    scale = g.weight(p + "scale.weight", (3,))                            # one scalar per group
    base = g.weight(p + "base.weight", ((2 + hc) * hc,))

    def affine(group: int, start: int, n: int):
        return g.add(g.mul(g.view(m, 1, start, n), g.view(scale, 0, group, 1)), g.view(base, 0, start, n))

    pre = g.scale(g.sigmoid(affine(0, 0, hc)), 1.0, c.hc_eps)             # sigma(.) + eps
    post = g.scale(g.sigmoid(affine(1, hc, hc)), 2.0)                     # 2 sigma(.)
    comb = g.dsv4_hc_comb(g.reshape(affine(2, 2 * hc, hc * hc), (T, hc, hc)), c.hc_eps, c.hc_iters)
    u = None
    for i in range(hc):
        term = g.mul(g.view(pre, 1, i, 1), g.reshape(g.view(X, 1, i, 1), (T, E)))
        u = term if u is None else g.add(u, term)
    return u, post, comb


def hc_post(g: Graph, c: Glm5NextConfig, y, X, post, comb):
    """build_hc_post: X'[dst] = post[dst] * y + sum_src comb[src, dst] * X[src] (the residual only through comb)."""
    T, hc, E = X.shape[0], c.hc_count, c.n_embd
    out = g.mul(g.reshape(post, (T, hc, 1)), g.reshape(y, (T, 1, E)))
    for src in range(hc):
        w = g.reshape(g.view(comb, 1, src, 1), (T, hc, 1))                 # comb[src, :] along dst
        out = g.add(out, g.mul(w, g.view(X, 1, src, 1)))
    return out


def hc_mean(g: Graph, c: Glm5NextConfig, X):
    """build_hc_mean: the plain mean of the streams (GLM has no weighted hc_head)."""
    T, E = X.shape[0], c.n_embd
    s = None
    for i in range(c.hc_count):
        v = g.reshape(g.view(X, 1, i, 1), (T, E))
        s = v if s is None else g.add(s, v)
    return g.scale(s, 1.0 / c.hc_count)


# -- FFN with the SwiGLU clamp (llama.cpp: swiglu_clamp_shexp[il] for every gated FFN, dense ones included) ---------
def dense_ffn(g: Graph, c: Glm5NextConfig, il: int, x):
    return base.dense_ffn(g, c, il, x, limit=c.clamp(il, True))


def moe(g: Graph, c: Glm5NextConfig, il: int, x):
    return base.moe(g, c, il, x, c.clamp(il, False), c.clamp(il, True))


# -- KDA --------------------------------------------------------------------------------------------------------
def kda(g: Graph, c: Glm5NextConfig, il: int, a, pos, rs, st: dict, chunk: int):
    """build_kda_layer over the normed sublayer input a [T, E]; `st` holds this layer's states."""
    p, T, H, dk, D = f"blk.{il}.", a.shape[0], c.n_head, c.kda_hd, c.d_inner
    conv_shape = (1, D, 1, c.conv_k) if c.conv_w_4d else (D, 1, c.conv_k)

    def conv(name):
        w = g.reshape(g.weight(p + f"ssm_conv1d_{name}.weight", conv_shape), (D, c.conv_k))
        x = g.silu(g.ssm_conv(linear(g, a, p + f"attn_{name}", D), w, st[f"conv_{name}"], pos, rs))
        return g.reshape(x, (T, H, dk))

    q, k, v = conv("q"), conv("k"), conv("v")
    # L2 norm as llama.cpp builds it: rms_norm(x, eps / dk) / sqrt(dk); q also takes the 1/sqrt(dk) score scale
    q = g.scale(g.rms_norm(q, L2_EPS / dk), 1.0 / dk)
    k = g.scale(g.rms_norm(k, L2_EPS / dk), 1.0 / math.sqrt(dk))
    f = g.add(linear(g, linear(g, a, p + "ssm_f_a", dk), p + "ssm_f_b", D), g.weight(p + "ssm_dt.bias", (D,)))
    f = g.reshape(f, (T, H, dk))
    ssm_a = g.reshape(g.weight(p + "ssm_a", (H,)), (H, 1))                          # -exp(A_log) per head
    if c.gate_lower_bound is not None:      # g = lb * sigmoid(exp(A_log) (f + dt_bias))
        decay = g.scale(g.sigmoid(g.scale(g.mul(f, ssm_a), -1.0)), c.gate_lower_bound)
    else:                                   # g = -exp(A_log) softplus(f + dt_bias)
        decay = g.mul(g.softplus(f), ssm_a)
    beta = g.sigmoid(linear(g, a, p + "ssm_beta", H))
    o = g.gated_delta_net(q, k, v, decay, beta, st["ssm"], pos, rs, chunk)             # [T, H, dk]
    r = g.reshape(linear(g, linear(g, a, p + "ssm_g_a", dk), p + "ssm_g_b", D), (T, H, dk))
    z = g.mul(norm(g, o, p + "ssm_norm.weight", c.rms_eps), g.sigmoid(r))
    return linear(g, g.reshape(z, (T, D)), p + "attn_output", c.n_embd)


def kda_states(g: Graph, c: Glm5NextConfig, il: int) -> dict:
    conv = ("P", c.conv_k - 1, c.d_inner)
    st = {f"conv_{n}": g.state(f"conv_{n}.{il}", conv) for n in "qkv"}
    st["ssm"] = g.state(f"ssm.{il}", ("P", c.n_head, c.kda_hd, c.kda_hd))      # [plane, head, key, value]
    return st


# -- NoPE MLA + pooled DSA indexer ------------------------------------------------------------------------------
def indexer(g: Graph, c: Glm5NextConfig, il: int, a, qr, pos, st: dict):
    """build_kpool_select: writes the indexer rows (ik, ig), pools every pool a row completes (ikp), scores the
    complete pools and returns the cell mask [T, L] (0 = attended) of the top pools + each row's tail."""
    p, T, Di, Hi, kp = f"blk.{il}.", a.shape[0], c.idx_hd, c.idx_heads, c.idx_kpool
    iq = g.reshape(linear(g, qr, p + "indexer.attn_q_b", Hi * Di), (T, Hi, Di))
    ik = g.norm(linear(g, a, p + "indexer.attn_k", Di), c.idx_norm_eps)
    ik = g.add(g.mul(ik, g.weight(p + "indexer.k_norm.weight", (Di,))), g.weight(p + "indexer.k_norm.bias", (Di,)))
    ig = linear(g, a, p + "indexer_compressor_gate", Di)
    ikc = g.set_rows(st["ik"], g.reshape(ik, (T, 1, Di)), pos)
    igc = g.set_rows(st["ig"], g.reshape(ig, (T, 1, Di)), pos)
    pooled = g.kpool_store(st["ikp"], ikc, igc, g.weight(p + "indexer_compressor_ape.weight", (kp, Di)), pos)
    w = g.scale(linear(g, a, p + "indexer.proj", Hi), (Di * Hi) ** -0.5)
    score = g.lightning_indexer(iq, pooled, w, pos, kpool=kp)                       # [T, L//kpool]
    return g.kpool_expand(g.top_k_mask(score, pos, c.idx_top_pools, kpool=kp), pos, kp, c.idx_tail)


def mla(g: Graph, c: Glm5NextConfig, il: int, a, pos, st: dict, mask=None):
    """build_dsa_layer over the normed input a [T, E]: returns (out [T, E], the cell mask it attended through).
    With indexer states in `st` this layer selects; else it reuses `mask` (a shared layer, or index sharing)."""
    p, T, H = f"blk.{il}.", a.shape[0], c.n_head
    qr = norm(g, linear(g, a, p + "attn_q_a", c.q_lora), p + "attn_q_a_norm.weight", c.rms_eps)
    if "ikp" in st:
        mask = indexer(g, c, il, a, qr, pos, st)
    q = g.reshape(linear(g, qr, p + "attn_q_b", H * c.hd_k), (T, H, c.hd_k))
    kv = norm(g, linear(g, a, p + "attn_kv_a_mqa", c.kv_lora), p + "attn_kv_a_norm.weight", c.rms_eps)
    q_abs = g.mul_mat(g.weight(p + "attn_k_b.weight", (H, c.kv_lora, c.hd_k)), q)     # [T, H, kv_lora]
    kvc = g.set_rows(st["kv"], g.reshape(kv, (T, 1, c.kv_lora)), pos)
    o = g.flash_attn_ext_mla(q_abs, kvc, pos, mask, c.kq_scale, c.kv_lora)            # [T, H, kv_lora]
    o = g.mul_mat(g.weight(p + "attn_v_b.weight", (H, c.hd_v, c.kv_lora)), o)         # [T, H, hd_v]
    return linear(g, g.reshape(o, (T, H * c.hd_v)), p + "attn_output", c.n_embd), mask


def mla_states(g: Graph, c: Glm5NextConfig, prefix: str, il: int, indexer_: bool) -> dict:
    """C = context size, chosen at load time. The latent cache is MLA's K (and V) and the indexer rows are keys:
    they take the K cache type (-ctk), as in llama.cpp; the pooled keys, written by `kpool_store`, stay float32."""
    st = {"kv": g.kv_state(f"{prefix}kv.{il}", ("C", 1, c.kv_lora), "k")}
    if indexer_:
        st["ik"] = g.kv_state(f"{prefix}ik.{il}", ("C", 1, c.idx_hd), "k")
        st["ig"] = g.kv_state(f"{prefix}ig.{il}", ("C", 1, c.idx_hd), "k")
        st["ikp"] = g.state(f"{prefix}ikp.{il}", (div_dim("C", c.idx_kpool), 1, c.idx_hd))
    return st


# -- entry points ------------------------------------------------------------------------------------------------
def build_trunk(c: Glm5NextConfig, has_tensor, all_rows: bool) -> Graph:
    """Trunk forward over T rows. Inputs tokens, pos, rs_plane (the committed plane of the recurrent states).
    Outputs: `hidden` [H, n_embd] (the streams' mean after output_norm: the MTP seed `t_h_nextn`; the `hidden_ids`
    rows, all T rows if `all_rows`), `logits` [R, n_vocab] and `argmax` [R] for rows `out_ids` of those. `all_rows`
    entries (verify, decode) run the KDA recurrence and keep the state after each row; prefill runs the chunked
    form."""
    g = Graph("verify" if all_rows else "prefill")
    tokens = g.input("tokens", ("T",), "int32")
    pos = g.input("pos", ("T",), "int32")
    rs = g.input("rs_plane", (1,), "int32") if KDA in c.layer_kinds else None
    T, E, hc = "T", c.n_embd, c.hc_count
    e = g.reshape(g.get_rows(g.weight("token_embd.weight", (c.n_vocab, E)), tokens), (T, 1, E))
    X = e
    for _ in range(hc - 1):                                # hc_init: every stream starts as the embedding
        X = g.concat(X, e, axis=1)
    chunk = 0 if all_rows else kda_chunk(c)
    keep, mask = base.hidden_ids(g, all_rows), None
    for il, kind in enumerate(c.layer_kinds):
        u, post, comb = hc_pre(g, c, il, "attn", X)
        a = norm(g, u, f"blk.{il}.attn_norm.weight", c.rms_eps)
        if kind == KDA:
            y = kda(g, c, il, a, pos, rs, kda_states(g, c, il), chunk)
        else:
            y, mask = mla(g, c, il, a, pos, mla_states(g, c, "", il, bool(c.idx_full[il])), mask)
        X = hc_post(g, c, y, X, post, comb)
        if keep is not None and il == len(c.layer_kinds) - 1:   # the rows asked for go on (base.hidden_ids)
            X = g.get_rows(g.reshape(X, (T, hc * E)), keep)
            X = g.reshape(X, (X.shape[0], hc, E))
        u, post, comb = hc_pre(g, c, il, "ffn", X)
        m = norm(g, u, f"blk.{il}.ffn_norm.weight", c.rms_eps)
        X = hc_post(g, c, moe(g, c, il, m) if il >= c.n_lead_dense else dense_ffn(g, c, il, m), X, post, comb)
    hN = norm(g, hc_mean(g, c, X), "output_norm.weight", c.rms_eps)
    g.output("hidden", hN)
    base.head(g, c, hN, "output.weight", all_rows)
    return g


MTP_INDEX_MODES = ("own", "store", "reuse")


def build_mtp(c: Glm5NextConfig, has_tensor, all_rows: bool, index: str | None = None) -> Graph:
    """NextN block over T rows (`graph_mtp`): row t pairs tokens[t] with h_prev[t] (the trunk's post-output_norm
    hidden at pos[t]-1, or the previous draft step's `h_nextn`). Outputs `h_nextn` [T, n_embd] (post
    shared_head_norm) and `logits` / `argmax` for the output rows.

    `index`: "own" runs the NextN indexer; "store" (default of `mtp_draft`) also keeps the last row's cell
    selection in `nextn.index_mask` [C] (cells after that row: not selected); "reuse" (`mtp_draft_shared`) runs no
    indexer and attends through the stored selection (index_share_for_mtp_iteration)."""
    il = nextn_index(c)
    index = index or ("store" if all_rows else "own")
    assert index in MTP_INDEX_MODES, index
    g = Graph("mtp_draft" if all_rows else "mtp_rows")
    pos, z = base.nextn_frame(g, c, has_tensor, il)
    a = norm(g, z, f"blk.{il}.attn_norm.weight", c.rms_eps)
    mask = g.index_mask_load(g.state("nextn.index_mask", ("C",))) if index == "reuse" else None
    y, mask = mla(g, c, il, a, pos, mla_states(g, c, "nextn.", il, index != "reuse"), mask)
    r = g.add(y, z)
    out = g.add(moe(g, c, il, norm(g, r, f"blk.{il}.ffn_norm.weight", c.rms_eps)), r)
    base.nextn_head(g, c, has_tensor, il, out, all_rows)
    if index == "store":   # last output: the in-place store must stay live
        g.output("index_mask", g.index_mask_store(g.state("nextn.index_mask", ("C",)), mask, pos, after=-math.inf))
    return g


def extra_entry_points(c: Glm5NextConfig, has_tensor) -> dict:
    """`mtp_draft_shared`: a draft step attending through the selection `mtp_draft` stored (index sharing)."""
    return {"mtp_draft_shared": ("mtp", build_mtp(c, has_tensor, True, index="reuse"))}
