"""glm4moe (GLM-4.5 / 4.6 / 4.7) hyper-parameters and tensor table.

Keys and tensor names as llama.cpp reads them for LLM_ARCH_GLM4_MOE (src/llama-model.cpp `load_hparams` and
`load_tensors`, src/llama-arch.cpp); the fields and readers every GLM arch shares are in ..glm_base.config.
`block_count` includes the NextN block(s); trunk layers are 0..n_layer-1, NextN block k is blk.{n_layer+k}.
"""
from __future__ import annotations

from dataclasses import dataclass

from nextn.common.errors import NextnError

from ..glm_base.config import (GlmConfig, bounded, ffn_tensors, layer_counts, moe_keys, nextn_frame_tensors,
                               nextn_index, rope_keys, scalar_or_first)

ARCH = "glm4moe"


@dataclass(frozen=True)
class Glm4MoeConfig(GlmConfig):
    """glm4moe: GQA attention with NEOX partial rope (pairs (i, i + n_rot/2), i < n_rot/2)."""
    n_head_kv: int
    head_dim: int
    qk_norm: bool
    qkv_bias: bool


def config_from_gguf(f) -> Glm4MoeConfig:
    """Read every glm4moe key from GGUFFile `f` (the trunk or the bundled file)."""
    a = ARCH
    n_layer, n_nextn = layer_counts(f, a)
    n_all = n_layer + n_nextn
    n_embd = bounded(f, f"{a}.embedding_length", f.get(f"{a}.embedding_length", kind=int))
    n_head = bounded(f, f"{a}.attention.head_count", scalar_or_first(f, f"{a}.attention.head_count"))
    n_head_kv = scalar_or_first(f, f"{a}.attention.head_count_kv") if f.has(f"{a}.attention.head_count_kv") else n_head
    bounded(f, f"{a}.attention.head_count_kv", n_head_kv, 1, n_head, "at most head_count")
    if n_head % n_head_kv:
        raise NextnError(f"{f.path}: '{a}.attention.head_count' = {n_head} is not a multiple of "
                         f"'{a}.attention.head_count_kv' = {n_head_kv} (grouped-query attention)")
    head_dim = bounded(f, f"{a}.attention.key_length", f.get(f"{a}.attention.key_length", n_embd // n_head, kind=int))
    v_len = f.get(f"{a}.attention.value_length", head_dim, kind=int)
    if v_len != head_dim:
        raise NextnError(f"{f.path}: '{a}.attention.value_length' = {v_len}, expected key_length ({head_dim})")
    n_rot = f.get(f"{a}.rope.dimension_count", head_dim, kind=int)
    if n_rot % 2 or n_rot > head_dim:
        raise NextnError(f"{f.path}: '{a}.rope.dimension_count' = {n_rot}, expected an even number <= {head_dim}")
    sections = f.get(f"{a}.rope.dimension_sections", None)
    if isinstance(sections, list) and len(sections) >= 2 and sections[0] > 0 and sections[1] > 0:
        raise NextnError(f"{f.path}: '{a}.rope.dimension_sections' selects M-RoPE (GLM-4.xV), which nextn does not support")
    n_vocab = None
    if f.has("token_embd.weight"):
        n_vocab = f.tensor_shape("token_embd.weight")[0]
    n_vocab = f.get(f"{a}.vocab_size", n_vocab)
    if n_vocab is None:
        toks = f.get("tokenizer.ggml.tokens", None)
        if toks is None:
            raise NextnError(f"{f.path}: tensor 'token_embd.weight' is missing")
        n_vocab = len(toks)
    return Glm4MoeConfig(
        arch=a,
        n_vocab=int(n_vocab),
        n_embd=n_embd,
        n_layer=n_layer,
        n_layer_nextn=n_nextn,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_rot=n_rot,
        rope_freq_base=f.get(f"{a}.rope.freq_base", 10000.0, kind=float),
        rms_eps=f.get(f"{a}.attention.layer_norm_rms_epsilon", kind=float),
        **moe_keys(f, a),
        n_ctx_train=bounded(f, f"{a}.context_length", f.get(f"{a}.context_length", kind=int), 2),
        qk_norm=f.has_tensor("blk.0.attn_q_norm.weight") or f.has_tensor(f"blk.{n_all - n_nextn}.attn_q_norm.weight"),
        qkv_bias=f.has_tensor("blk.0.attn_q.bias") or f.has_tensor(f"blk.{n_all - n_nextn}.attn_q.bias"),
        **rope_keys(f, a),
    )


def block_tensors(c: Glm4MoeConfig, il: int, moe: bool) -> dict[str, tuple[int, ...]]:
    """Row-major shapes of one decoder block's tensors (trunk or NextN)."""
    E, hd = c.n_embd, c.head_dim
    p = f"blk.{il}."
    t = {
        p + "attn_norm.weight": (E,),
        p + "attn_q.weight": (c.n_head * hd, E),
        p + "attn_k.weight": (c.n_head_kv * hd, E),
        p + "attn_v.weight": (c.n_head_kv * hd, E),
        p + "attn_output.weight": (E, c.n_head * hd),
        p + "post_attention_norm.weight": (E,),
    }
    if c.qkv_bias:
        t |= {p + "attn_q.bias": (c.n_head * hd,), p + "attn_k.bias": (c.n_head_kv * hd,), p + "attn_v.bias": (c.n_head_kv * hd,)}
    if c.qk_norm:
        t |= {p + "attn_q_norm.weight": (hd,), p + "attn_k_norm.weight": (hd,)}
    return t | ffn_tensors(c, il, moe)


def trunk_tensors(c: Glm4MoeConfig) -> dict[str, tuple[int, ...]]:
    t = {"token_embd.weight": (c.n_vocab, c.n_embd), "output_norm.weight": (c.n_embd,)}
    for il in range(c.n_layer):
        t |= block_tensors(c, il, moe=il >= c.n_lead_dense)
    return t


def nextn_tensors(c: Glm4MoeConfig) -> dict[str, tuple[int, ...]]:
    """NextN block tensors that must be present (the MoE block + eh_proj/enorm/hnorm)."""
    return block_tensors(c, nextn_index(c), moe=True) | nextn_frame_tensors(c)
