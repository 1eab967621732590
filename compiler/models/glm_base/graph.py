"""Graph pieces shared by the GLM archs, in the op order of llama.cpp's builders (src/models/glm4-moe.cpp,
src/models/glm-dsa.cpp; `build_norm`, `build_moe_ffn` and `build_ffn` in src/llama-graph.cpp).

Rows: `T` tokens at positions `pos` (int32); weights by their GGUF names. The trunk reads `tokens`/`pos`, embeds,
runs its blocks and ends in `output_norm` + the head (`trunk_inputs`, `trunk_outputs`); the NextN block reads
`tokens`/`pos`/`h_prev`, projects [enorm(embedding) | hnorm(h_prev)] through eh_proj, runs one decoder block and
ends in shared_head_norm + shared_head_head (`nextn_frame`, `nextn_head`).
"""
from __future__ import annotations

import math

from nextn.compiler.ir import Graph


def norm(g: Graph, x, w_name: str, eps: float):
    """rms_norm(x) * weight (llama.cpp build_norm with LLM_NORM_RMS)."""
    return g.mul(g.rms_norm(x, eps), g.weight(w_name, (x.shape[-1],)))


def linear(g: Graph, x, name: str, n_out: int, bias: bool = False):
    """x @ `{name}.weight`.T (+ `{name}.bias`)."""
    y = g.mul_mat(g.weight(f"{name}.weight", (n_out, x.shape[-1])), x)
    if bias:
        y = g.add(y, g.weight(f"{name}.bias", (n_out,)))
    return y


def head(g: Graph, c, hs, head_name: str, all_rows: bool):
    """Outputs `logits` [R, n_vocab] and `argmax` [R] of the rows `out_ids` of hs (every row if `all_rows`)."""
    if not all_rows:
        out_ids = g.input("out_ids", ("R",), "int32")
        hs = g.get_rows(hs, out_ids)
    logits = g.mul_mat(g.weight(head_name, (c.n_vocab, c.n_embd)), hs)
    g.output("logits", logits)
    g.output("argmax", g.argmax(logits))


def swiglu(g: Graph, gate, up, limit: float | None = None):
    """ggml GLU SWIGLU, or SWIGLU_CLAMP with `limit` (GLM-5.3-Flash's swiglu_clamp_*): silu(min(gate, limit)) *
    clamp(up, -limit, limit)."""
    if limit is not None:
        gate, up = g.clamp(gate, -math.inf, limit), g.clamp(up, -limit, limit)
    return g.swiglu(gate, up)


def dense_ffn(g: Graph, c, il: int, x, prefix: str = "ffn_", suffix: str = "", n_ff: int | None = None,
              limit: float | None = None):
    """down(silu(gate(x)) * up(x)) with `blk.{il}.{prefix}{gate,up,down}{suffix}` (the shared expert: "_shexp");
    `limit`: the SwiGLU clamp (none for glm4moe, glm-dsa)."""
    p = f"blk.{il}.{prefix}"
    F = n_ff or c.n_ff
    gate = linear(g, x, f"{p}gate{suffix}", F)
    up = linear(g, x, f"{p}up{suffix}", F)
    return linear(g, swiglu(g, gate, up, limit), f"{p}down{suffix}", c.n_embd)


def moe(g: Graph, c, il: int, x, limit_exp: float | None = None, limit_shexp: float | None = None):
    """build_moe_ffn as llama.cpp runs it for GLM: sigmoid router probabilities; `exp_probs_b` biases the top-k
    selection only; the selected probabilities are normalised (expert_weights_norm) and scaled
    (expert_weights_scale); the experts' outputs are summed in top-k slot order; plus the shared expert.
    `limit_exp` / `limit_shexp`: the SwiGLU clamp of the routed / shared experts (none for glm4moe, glm-dsa)."""
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
    down = g.mul_mat_id(g.weight(p + "ffn_down_exps.weight", (X, E, F)), swiglu(g, gate, up, limit_exp),
                        selected)                                                  # [T, k, E]
    down = g.mul(down, w)
    out = g.reshape(g.view(down, 1, 0, 1), (T, E))
    for j in range(1, k):                                                          # sum in top-k slot order
        out = g.add(out, g.reshape(g.view(down, 1, j, 1), (T, E)))
    if c.n_expert_shared > 0:
        out = g.add(out, dense_ffn(g, c, il, x, "ffn_", "_shexp", F * c.n_expert_shared, limit_shexp))
    return out


def trunk_inputs(g: Graph, c):
    """Inputs `tokens` [T] and `pos` [T] (int32); returns (pos, the token embeddings [T, n_embd])."""
    tokens = g.input("tokens", ("T",), "int32")
    pos = g.input("pos", ("T",), "int32")
    return pos, g.get_rows(g.weight("token_embd.weight", (c.n_vocab, c.n_embd)), tokens)


def hidden_ids(g: Graph, all_rows: bool):
    """Prefill's input `hidden_ids` [H] int32 (ascending row indices into the call's T rows), else None: the rows
    whose output the call returns. The last trunk layer runs its FFN on these rows only, and `hidden` / the head see
    only them (llama.cpp's `inp_out_ids`: src/models/glm4-moe.cpp and glm-dsa.cpp `get_rows` at il == n_layer - 1).
    Plain decoding asks for the last row; MTP warm-up asks for every row. Per row the same computation either way."""
    return None if all_rows else g.input("hidden_ids", ("H",), "int32")


def trunk_outputs(g: Graph, c, has_tensor, x, all_rows: bool) -> None:
    """Output `hidden` [H, n_embd] = output_norm(x) (the MTP seed `t_h_nextn`; H = T for all_rows entries, else the
    `hidden_ids` rows x holds), then the head over it (its `out_ids` index these rows): `output`, or the tied
    `token_embd` when the GGUF has no `output.weight`."""
    hN = norm(g, x, "output_norm.weight", c.rms_eps)
    g.output("hidden", hN)
    head(g, c, hN, "output.weight" if has_tensor("output.weight") else "token_embd.weight", all_rows)


def nextn_frame(g: Graph, c, has_tensor, il: int):
    """The NextN input frame shared by the GLM archs: inputs tokens/pos/h_prev, then
    z = eh_proj · [rms(E[tok]) * enorm | rms(h_prev) * hnorm] (E: the block's embed_tokens, else token_embd).
    Returns (pos, z)."""
    p = f"blk.{il}.nextn."
    tokens = g.input("tokens", ("T",), "int32")
    pos = g.input("pos", ("T",), "int32")
    h = g.input("h_prev", ("T", c.n_embd), "float32")
    emb = p + "embed_tokens.weight" if has_tensor(p + "embed_tokens.weight") else "token_embd.weight"
    e = g.get_rows(g.weight(emb, (c.n_vocab, c.n_embd)), tokens)
    en = norm(g, e, p + "enorm.weight", c.rms_eps)
    hn = norm(g, h, p + "hnorm.weight", c.rms_eps)
    return pos, linear(g, g.concat(en, hn, axis=1), p + "eh_proj", c.n_embd)     # order: [enorm(e) | hnorm(h)]


def nextn_head(g: Graph, c, has_tensor, il: int, x, all_rows: bool):
    """The NextN output: hs = rms(x) * shared_head_norm (fallback output_norm) is output `h_nextn` (`t_h_nextn`,
    the next draft step's h_prev); logits = shared_head_head (fallback output, then token_embd) over hs."""
    p = f"blk.{il}.nextn."
    norm_w = p + "shared_head_norm.weight" if has_tensor(p + "shared_head_norm.weight") else "output_norm.weight"
    hs = norm(g, x, norm_w, c.rms_eps)
    g.output("h_nextn", hs)
    head_w = p + "shared_head_head.weight" if has_tensor(p + "shared_head_head.weight") else (
        "output.weight" if has_tensor("output.weight") else "token_embd.weight")
    head(g, c, hs, head_w, all_rows)
    return hs
