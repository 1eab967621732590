"""glm-dsa (GLM-5 / 5.1 / 5.2) hyper-parameters and tensor table.

Keys and tensors as llama.cpp reads them for LLM_ARCH_GLM_DSA (src/llama-model.cpp `load_hparams` and
`load_tensors`; src/models/glm-dsa.cpp). Absorbed MLA (q/kv LoRA, `attn_k_b` / `attn_v_b`), the DSA lightning
indexer, and the GLM MoE FFN and NextN frame shared with glm4moe (..glm_base.config).
`block_count` includes the NextN block; trunk layers are 0..n_layer-1, the NextN block is blk.{n_layer}.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from nextn.common.errors import NextnError

from ..glm_base.config import (GlmConfig, bounded, ffn_tensors, layer_counts, moe_keys, nextn_frame_tensors,
                               nextn_index, rope_keys, scalar_or_first)

ARCH = "glm-dsa"
INDEXER_K_NORM_EPS = 1e-6   # the model's LayerNorm eps (transformers GlmMoeDsaIndexer); llama.cpp runs it with 0
# (it never reads attention.layer_norm_epsilon for glm-dsa)


@dataclass(frozen=True)
class GlmDsaConfig(GlmConfig):
    """glm-dsa: absorbed MLA (n_rot = qk_rope, NORM rope on the rope slice only) and the DSA indexer."""
    q_lora: int             # attention.q_lora_rank
    kv_lora: int            # attention.kv_lora_rank
    hd_k: int               # attention.key_length_mla = qk_nope + qk_rope
    hd_v: int               # attention.value_length_mla
    kq_scale: float         # mscale^2 / sqrt(hd_k) (llama.cpp glm-dsa.cpp)
    idx_heads: int          # attention.indexer.head_count
    idx_hd: int             # attention.indexer.key_length
    idx_top_k: int          # attention.indexer.top_k
    idx_full: list = field(default_factory=list)   # per trunk layer: 1 = full indexer, 0 = shared (reuses last full)

    @property
    def nope(self) -> int:
        return self.hd_k - self.n_rot

    @property
    def kv_width(self) -> int:
        """Width of one latent KV cell: kv_lora compressed columns followed by the qk_rope key."""
        return self.kv_lora + self.n_rot


def mla_kq_scale(hd_k: int, freq_scale: float = 1.0, attn_factor: float = 1.0, yarn_log_mul: float = 0.0) -> float:
    """kq_scale = mscale^2 / sqrt(hd_k) with mscale the YaRN magnitude factor (llama.cpp src/models/glm-dsa.cpp):
    attn_factor_org = attn_factor (1 + 0.1 ln(1/freq_scale)); mscale = attn_factor_org (1 + 0.1 yarn_log_mul ln(1/freq_scale)).
    `attn_factor` is the rope magnitude argument (config.rope_attn_factor); glm-dsa does not read yarn_log_mul (0).
    Without rope scaling (freq_scale 1) this is 1/sqrt(hd_k)."""
    ln = math.log(1.0 / freq_scale)
    mscale = attn_factor * (1.0 + 0.1 * ln) * (1.0 + 0.1 * yarn_log_mul * ln)
    return mscale * mscale / math.sqrt(hd_k)


def _indexer_types(f, key: str, n_layer: int, n_ctx_train: int) -> list[int]:
    v = f.get(key, None)
    if v is None:   # llama.cpp load_hparams: all full below 1M context (GLM-5/5.1), else the GLM-5.2 pattern
        if n_ctx_train < 1048576:
            return [1] * n_layer
        return [1 if i < 3 or (i - 3) % 4 == 3 else 0 for i in range(n_layer)]
    if not isinstance(v, list) or len(v) < n_layer or any(not isinstance(x, (bool, int)) for x in v):
        raise NextnError(f"{f.path}: metadata key '{key}' = {v!r}, expected an array of {n_layer} flags (1 = full, 0 = shared)")
    out = [int(bool(x)) for x in v[:n_layer]]
    if n_layer and out[0] != 1:
        raise NextnError(f"{f.path}: metadata key '{key}': layer 0 is 'shared', but a shared layer reuses the "
                         f"selection of an earlier full layer")
    return out


def config_from_gguf(f) -> GlmDsaConfig:
    """Read every glm-dsa key (module docstring) from GGUFFile `f` (bundled, trunk-only or MTP-only file)."""
    a = ARCH
    n_layer, n_nextn = layer_counts(f, a)
    n_embd = bounded(f, f"{a}.embedding_length", f.get(f"{a}.embedding_length", kind=int))
    n_head = bounded(f, f"{a}.attention.head_count", scalar_or_first(f, f"{a}.attention.head_count"))
    n_head_kv = scalar_or_first(f, f"{a}.attention.head_count_kv") if f.has(f"{a}.attention.head_count_kv") else 1
    if n_head_kv != 1:
        raise NextnError(f"{f.path}: '{a}.attention.head_count_kv' = {n_head_kv}, expected 1 (absorbed MLA: one latent KV head)")
    q_lora = f.get(f"{a}.attention.q_lora_rank", kind=int)
    kv_lora = f.get(f"{a}.attention.kv_lora_rank", kind=int)
    n_rot = f.get(f"{a}.rope.dimension_count", kind=int)
    key_len = f.get(f"{a}.attention.key_length", kv_lora + n_rot, kind=int)
    val_len = f.get(f"{a}.attention.value_length", kv_lora, kind=int)
    if (key_len, val_len) != (kv_lora + n_rot, kv_lora):
        raise NextnError(f"{f.path}: '{a}.attention.key_length'/'value_length' = {key_len}/{val_len}, expected the MQA view "
                         f"kv_lora_rank + rope = {kv_lora + n_rot} / kv_lora_rank = {kv_lora}")
    hd_k = f.get(f"{a}.attention.key_length_mla", key_len, kind=int)
    hd_v = f.get(f"{a}.attention.value_length_mla", val_len, kind=int)
    if n_rot % 2 or not 0 < n_rot < hd_k:
        raise NextnError(f"{f.path}: '{a}.rope.dimension_count' = {n_rot}, expected an even number < key_length_mla ({hd_k})")
    rope = rope_keys(f, a)
    idx_hd = f.get(f"{a}.attention.indexer.key_length", kind=int)
    if idx_hd <= n_rot:
        raise NextnError(f"{f.path}: '{a}.attention.indexer.key_length' = {idx_hd}, expected > rope dims ({n_rot})")
    n_vocab = f.tensor_shape("token_embd.weight")[0] if f.has_tensor("token_embd.weight") else None
    n_vocab = f.get(f"{a}.vocab_size", n_vocab)
    if n_vocab is None:
        raise NextnError(f"{f.path}: tensor 'token_embd.weight' is missing")
    n_ctx_train = bounded(f, f"{a}.context_length", f.get(f"{a}.context_length", kind=int), 2)
    return GlmDsaConfig(
        arch=a, n_vocab=int(n_vocab), n_embd=n_embd, n_layer=n_layer, n_layer_nextn=n_nextn, n_head=n_head,
        q_lora=q_lora, kv_lora=kv_lora, hd_k=hd_k, hd_v=hd_v, n_rot=n_rot,
        rope_freq_base=f.get(f"{a}.rope.freq_base", 10000.0, kind=float),
        kq_scale=mla_kq_scale(hd_k, rope["rope_freq_scale"], rope["rope_attn_factor"]),
        rms_eps=f.get(f"{a}.attention.layer_norm_rms_epsilon", kind=float),
        **moe_keys(f, a),
        n_ctx_train=n_ctx_train,
        idx_heads=f.get(f"{a}.attention.indexer.head_count", kind=int),
        idx_hd=idx_hd,
        idx_top_k=f.get(f"{a}.attention.indexer.top_k", kind=int),
        idx_full=_indexer_types(f, f"{a}.attention.indexer.types", n_layer, n_ctx_train),
        **rope,
    )


def attention_tensors(c: GlmDsaConfig, il: int, indexer: bool) -> dict[str, tuple[int, ...]]:
    """Row-major shapes of one block's MLA (+ DSA indexer) tensors (llama.cpp load_tensors for LLM_ARCH_GLM_DSA)."""
    p, E, H = f"blk.{il}.", c.n_embd, c.n_head
    t = {
        p + "attn_norm.weight": (E,),
        p + "attn_q_a.weight": (c.q_lora, E),
        p + "attn_q_a_norm.weight": (c.q_lora,),
        p + "attn_q_b.weight": (H * c.hd_k, c.q_lora),
        p + "attn_kv_a_mqa.weight": (c.kv_width, E),
        p + "attn_kv_a_norm.weight": (c.kv_lora,),
        p + "attn_k_b.weight": (H, c.kv_lora, c.nope),      # ggml {nope, kv_lora, n_head}
        p + "attn_v_b.weight": (H, c.hd_v, c.kv_lora),      # ggml {kv_lora, hd_v, n_head}
        p + "attn_output.weight": (E, H * c.hd_v),
        p + "ffn_norm.weight": (E,),
    }
    if indexer:
        t |= {
            p + "indexer.attn_q_b.weight": (c.idx_heads * c.idx_hd, c.q_lora),
            p + "indexer.attn_k.weight": (c.idx_hd, E),
            p + "indexer.k_norm.weight": (c.idx_hd,),
            p + "indexer.k_norm.bias": (c.idx_hd,),
            p + "indexer.proj.weight": (c.idx_heads, E),
        }
    return t


def trunk_tensors(c: GlmDsaConfig) -> dict[str, tuple[int, ...]]:
    t = {"token_embd.weight": (c.n_vocab, c.n_embd), "output_norm.weight": (c.n_embd,)}
    for il in range(c.n_layer):
        t |= attention_tensors(c, il, indexer=bool(c.idx_full[il]))
        t |= ffn_tensors(c, il, moe=il >= c.n_lead_dense)
    return t


def nextn_tensors(c: GlmDsaConfig) -> dict[str, tuple[int, ...]]:
    """NextN block tensors that must be present: MLA + MoE block, eh_proj/enorm/hnorm. The block's own indexer
    tensors are optional here (needed only without --mtp-dense-attention; the graph builder asks for them)."""
    il = nextn_index(c)
    return attention_tensors(c, il, indexer=False) | ffn_tensors(c, il, moe=True) | nextn_frame_tensors(c)
