"""glm4moe (GLM-4.5 / 4.6 / 4.7) hyper-parameters and tensor table.

Keys and tensor names: glm-mtp-reference.md §2 and §3.1 (llama.cpp src/llama-model.cpp, src/llama-arch.cpp).
`block_count` includes the NextN block(s); trunk layers are 0..n_layer-1, NextN block k is blk.{n_layer+k}.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from nextn.runtime.errors import NextnError

ARCH = "glm4moe"


@dataclass(frozen=True, kw_only=True)
class GlmConfig:
    """The fields every GLM arch reads the same way (`layer_counts`, `moe_keys`, `rope_keys`); each arch's
    config adds its own. Rope scaling as llama.cpp's context resolves it; its defaults are plain rope."""
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int            # trunk layers (block_count - nextn_predict_layers)
    n_layer_nextn: int
    n_head: int
    n_rot: int              # rope.dimension_count
    rope_freq_base: float
    rms_eps: float
    n_ctx_train: int
    n_ff: int               # dense FFN width (leading dense blocks)
    n_ff_exp: int
    n_expert: int
    n_expert_used: int
    n_expert_shared: int
    n_lead_dense: int
    expert_weights_scale: float   # 0 = no scaling (llama.cpp default when the key is absent)
    expert_weights_norm: bool
    expert_gating_func: int       # 2 = sigmoid (only kind supported here)
    rope_scaling: str = "none"       # none | linear | yarn
    rope_freq_scale: float = 1.0     # 1 / rope.scaling.factor
    rope_ext_factor: float = 0.0     # 1 for YaRN
    rope_attn_factor: float = 1.0    # the rope magnitude argument of ggml_rope_ext
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_n_ctx_orig: int = 0         # rope.scaling.original_context_length (YaRN's correction dims)

    def rope_args(self) -> dict:
        """Keyword arguments of Graph.rope_ext after (x, pos, n_rot, mode)."""
        return dict(freq_base=self.rope_freq_base, freq_scale=self.rope_freq_scale, ext_factor=self.rope_ext_factor,
                    attn_factor=self.rope_attn_factor, beta_fast=self.rope_beta_fast, beta_slow=self.rope_beta_slow,
                    n_ctx_orig=self.rope_n_ctx_orig)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict):
        return cls(**d)


@dataclass(frozen=True)
class Glm4MoeConfig(GlmConfig):
    """glm4moe: GQA attention with NEOX partial rope (pairs (i, i + n_rot/2), i < n_rot/2)."""
    n_head_kv: int
    head_dim: int
    qk_norm: bool
    qkv_bias: bool


def _scalar_or_first(f, key, kind=int):
    v = f.get(key)
    if isinstance(v, list):
        if not v:
            raise NextnError(f"{f.path}: metadata key '{key}' is an empty array, expected a number")
        v = v[0]
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise NextnError(f"{f.path}: metadata key '{key}' has value {v!r}, expected a number")
    return kind(v)


def layer_counts(f, a: str) -> tuple[int, int]:
    """(n_layer, n_layer_nextn): `{a}.block_count` includes the NextN block (reference §1)."""
    n_all = f.get(f"{a}.block_count", kind=int)
    n_nextn = f.get(f"{a}.nextn_predict_layers", 0, kind=int)
    if not 0 <= n_nextn < n_all:
        raise NextnError(f"{f.path}: '{a}.nextn_predict_layers' = {n_nextn}, expected 0 <= n < block_count ({n_all})")
    if n_nextn > 1:
        raise NextnError(f"{f.path}: '{a}.nextn_predict_layers' = {n_nextn}; GLM has exactly one NextN block")
    return n_all - n_nextn, n_nextn


ROPE_SCALING_TYPES = ("none", "linear", "yarn")


def rope_keys(f, a: str) -> dict:
    """The rope keys of reference §2 resolved into ggml_rope_ext's parameters the way llama.cpp does for the GLM
    archs (src/llama-model.cpp load_hparams, src/llama-context.cpp llama_context()), as config fields:

    - `rope.scaling.type` (default "linear"; "none" forces freq_scale 1), `rope.scaling.factor` (or the old
      `rope.scale_linear`): freq_scale = 1/factor;
    - YaRN: ext_factor 1, beta_fast 32, beta_slow 1, n_ctx_orig = `rope.scaling.original_context_length`
      (default `context_length`); the rope magnitude attn_factor = get_mscale(factor) / (1 + 0.1 ln factor),
      which cancels the (1 + 0.1 ln factor) that ggml's rope_yarn multiplies back in;
    - attn_factor *= `rope.scaling.attn_factor` (default 1).
    `rope.scaling.yarn_log_multiplier` is not read for glm4moe / glm-dsa (reference §2), so get_mscale uses 1.
    Raises NextnError for another scaling type (longrope, ...) or a factor <= 0.
    """
    typ = f.get(f"{a}.rope.scaling.type", "linear", kind=str) or "linear"
    if typ not in ROPE_SCALING_TYPES:
        raise NextnError(f"{f.path}: '{a}.rope.scaling.type' = '{typ}', expected one of {', '.join(ROPE_SCALING_TYPES)}")
    key = f"{a}.rope.scaling.factor" if f.has(f"{a}.rope.scaling.factor") else f"{a}.rope.scale_linear"
    factor = f.get(key, 0.0, kind=float)
    if factor < 0.0 or (factor == 0.0 and f.has(key)):
        raise NextnError(f"{f.path}: '{key}' = {factor}, expected a positive context scaling factor")
    freq_scale = 1.0 if factor == 0.0 or typ == "none" else 1.0 / factor
    ext_factor = 1.0 if typ == "yarn" else 0.0
    attn_factor = 1.0
    if ext_factor != 0.0:
        s = 1.0 / freq_scale
        attn_factor = (1.0 + 0.1 * math.log(s) if s > 1.0 else 1.0) / (1.0 + 0.1 * math.log(s))
    attn_factor *= f.get(f"{a}.rope.scaling.attn_factor", 1.0, kind=float)
    n_ctx_orig = f.get(f"{a}.rope.scaling.original_context_length", 0, kind=int) or f.get(f"{a}.context_length", kind=int)
    if typ == "linear" and freq_scale == 1.0:
        typ = "none"
    return dict(rope_scaling=typ, rope_freq_scale=freq_scale, rope_ext_factor=ext_factor, rope_attn_factor=attn_factor,
                rope_beta_fast=32.0, rope_beta_slow=1.0, rope_n_ctx_orig=n_ctx_orig)


def moe_keys(f, a: str) -> dict:
    """The MoE / FFN keys shared by the GLM archs (reference §1.1, §2), as config fields."""
    gating = f.get(f"{a}.expert_gating_func", 2, kind=int)
    if gating != 2:
        raise NextnError(f"{f.path}: '{a}.expert_gating_func' = {gating}, expected 2 (sigmoid) for {a}")
    if f.get(f"{a}.expert_group_count", 1, kind=int) > 1:
        raise NextnError(f"{f.path}: '{a}.expert_group_count' > 1 (group-limited routing) is not supported")
    return dict(
        n_ff=_scalar_or_first(f, f"{a}.feed_forward_length"),
        n_ff_exp=f.get(f"{a}.expert_feed_forward_length", kind=int),
        n_expert=f.get(f"{a}.expert_count", kind=int),
        n_expert_used=f.get(f"{a}.expert_used_count", kind=int),
        n_expert_shared=f.get(f"{a}.expert_shared_count", kind=int),
        n_lead_dense=f.get(f"{a}.leading_dense_block_count", 0, kind=int),
        expert_weights_scale=f.get(f"{a}.expert_weights_scale", 0.0, kind=float),
        expert_weights_norm=bool(f.get(f"{a}.expert_weights_norm", False, kind=bool)),
        expert_gating_func=gating,
    )


def config_from_gguf(f) -> Glm4MoeConfig:
    """Read every key of reference §2 for glm4moe from GGUFFile `f` (the trunk or the bundled file)."""
    a = ARCH
    n_layer, n_nextn = layer_counts(f, a)
    n_all = n_layer + n_nextn
    n_embd = f.get(f"{a}.embedding_length", kind=int)
    n_head = _scalar_or_first(f, f"{a}.attention.head_count")
    n_head_kv = _scalar_or_first(f, f"{a}.attention.head_count_kv") if f.has(f"{a}.attention.head_count_kv") else n_head
    head_dim = f.get(f"{a}.attention.key_length", n_embd // n_head, kind=int)
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
        n_ctx_train=f.get(f"{a}.context_length", kind=int),
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


def ffn_tensors(c, il: int, moe: bool) -> dict[str, tuple[int, ...]]:
    """One block's dense or MoE + shared-expert FFN tensors (shared by the GLM archs; `c` needs n_embd, n_ff,
    n_expert, n_ff_exp, n_expert_shared)."""
    E, p, t = c.n_embd, f"blk.{il}.", {}
    if not moe:
        t |= {p + "ffn_gate.weight": (c.n_ff, E), p + "ffn_up.weight": (c.n_ff, E), p + "ffn_down.weight": (E, c.n_ff)}
    else:
        X, F = c.n_expert, c.n_ff_exp
        t |= {
            p + "ffn_gate_inp.weight": (X, E),
            p + "exp_probs_b.bias": (X,),
            p + "ffn_gate_exps.weight": (X, F, E),
            p + "ffn_up_exps.weight": (X, F, E),
            p + "ffn_down_exps.weight": (X, E, F),
        }
        if c.n_expert_shared > 0:
            S = F * c.n_expert_shared
            t |= {p + "ffn_gate_shexp.weight": (S, E), p + "ffn_up_shexp.weight": (S, E), p + "ffn_down_shexp.weight": (E, S)}
    return t


def trunk_tensors(c: Glm4MoeConfig) -> dict[str, tuple[int, ...]]:
    t = {"token_embd.weight": (c.n_vocab, c.n_embd), "output_norm.weight": (c.n_embd,)}
    for il in range(c.n_layer):
        t |= block_tensors(c, il, moe=il >= c.n_lead_dense)
    return t


def nextn_index(c: Glm4MoeConfig) -> int:
    return c.n_layer


def nextn_tensors(c: Glm4MoeConfig) -> dict[str, tuple[int, ...]]:
    """NextN block tensors that must be present (the MoE block + eh_proj/enorm/hnorm)."""
    il = nextn_index(c)
    p = f"blk.{il}.nextn."
    t = block_tensors(c, il, moe=True)
    t |= {p + "eh_proj.weight": (c.n_embd, 2 * c.n_embd), p + "enorm.weight": (c.n_embd,), p + "hnorm.weight": (c.n_embd,)}
    return t


def nextn_optional(c: Glm4MoeConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Optional NextN tensors → (fallback tensor, shape), reference §3.1."""
    p = f"blk.{nextn_index(c)}.nextn."
    return {
        p + "embed_tokens.weight": ("token_embd.weight", (c.n_vocab, c.n_embd)),
        p + "shared_head_head.weight": ("output.weight", (c.n_vocab, c.n_embd)),
        p + "shared_head_norm.weight": ("output_norm.weight", (c.n_embd,)),
    }
