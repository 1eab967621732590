"""glm5next / glm5-next (GLM-5.3-Flash) hyper-parameters and tensor table.

Keys and defaults: llama.cpp `src/models/glm5-next.cpp` `load_arch_hparams` (both arch spellings: upstream writes
`glm5-next`, the first published GGUFs `glm5next`); tensors: its `load_arch_tensors` and `src/llama-arch.cpp`.
The per-layer type is `attention.head_count_kv[il]`: 0 = KDA (linear attention), 1 = NoPE MLA with the pooled DSA
indexer. Optional keys whose absence silently changes the model (llama.cpp reads them with `required = false` into
zero-initialised hyper-parameters) take llama.cpp's default and are listed in `defaults_applied`, which
`nextn compile` prints: the indexer LayerNorm eps (0), the KDA gate lower bound (none: the softplus gate), the
SwiGLU clamps (none), the leading dense blocks (0).
`block_count` includes the NextN block; trunk layers are 0..n_layer-1, the NextN block is blk.{n_layer}.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from nextn.common.errors import NextnError

from ..glm_base import config as base

ARCHES = ("glm5-next", "glm5next")
KDA, MLA = 0, 1                 # attention.head_count_kv[il]: 0 = recurrent (KDA), 1 = MLA + DSA


@dataclass(frozen=True)
class Glm5NextConfig(base.GlmConfig):
    """GLM-5.3-Flash. `layer_kinds[il]` is KDA (0) or MLA (1) per trunk layer."""
    layer_kinds: list = field(default_factory=list)
    # KDA
    kda_hd: int = 0                 # kda.head_dim (heads = attention.head_count)
    conv_k: int = 0                 # ssm.conv_kernel
    gate_lower_bound: float | None = None   # kda.gate_lower_bound; None: g = ssm_a * softplus(.) (llama.cpp)
    conv_w_4d: bool = True          # ssm_conv1d_* stored as ggml {K, 1, d_inner, 1} (else {K, 1, d_inner})
    # NoPE MLA + pooled DSA indexer
    q_lora: int = 0
    kv_lora: int = 0
    hd_k: int = 0                   # attention.key_length_mla (no rope part)
    hd_v: int = 0                   # attention.value_length_mla
    kq_scale: float = 0.0           # 1 / sqrt(key_length_mla)
    idx_heads: int = 0
    idx_hd: int = 0
    idx_top_k: int = 0              # cells; top_k / kpool pools are selected
    idx_kpool: int = 0
    idx_tail: bool = True           # kpool_select_tail
    idx_norm_eps: float = 0.0       # attention.layer_norm_epsilon (indexer k_norm LayerNorm)
    idx_full: list = field(default_factory=list)   # per trunk layer: 1 = own indexer, 0 = "shared" (last full's)
    index_share_mtp: bool | None = None             # attention.indexer.index_share_mtp; None = not in the file
    # mHC
    hc_count: int = 4
    hc_iters: int = 20
    hc_eps: float = 1e-6
    # SwiGLU clamps per block (incl. NextN); [] = no clamp
    clamp_exp: list = field(default_factory=list)
    clamp_shexp: list = field(default_factory=list)
    defaults_applied: list = field(default_factory=list)

    @property
    def d_inner(self) -> int:
        return self.n_head * self.kda_hd

    @property
    def idx_top_pools(self) -> int:
        return self.idx_top_k // self.idx_kpool

    def with_draft(self, dc: "Glm5NextConfig") -> "Glm5NextConfig":
        """This (trunk-only) config completed by its MTP-only draft's: one NextN block, whose SwiGLU clamps (the
        trunk file's arrays stop at n_layer) and index sharing key are in the draft file."""
        longer = len(dc.clamp_exp) > len(self.clamp_exp)
        return replace(self, n_layer_nextn=1, clamp_exp=dc.clamp_exp if longer else self.clamp_exp,
                       clamp_shexp=dc.clamp_shexp if longer else self.clamp_shexp,
                       index_share_mtp=self.index_share_mtp if self.index_share_mtp is not None else dc.index_share_mtp)

    def clamp(self, il: int, shared: bool) -> float | None:
        """SwiGLU limit of block il's routed experts (`shared` False) or of its shared expert / dense FFN."""
        arr = self.clamp_shexp if shared else self.clamp_exp
        return float(arr[il]) if il < len(arr) and arr[il] > 0 else None


def _array(f, key: str, n: int, kind=(int, float)):
    v = f.get(key)
    if not isinstance(v, list) or len(v) != n or any(isinstance(x, bool) or not isinstance(x, kind) for x in v):
        raise NextnError(f"{f.path}: metadata key '{key}' = {v!r}, expected an array of {n} numbers (block_count)")
    return v


def config_from_gguf(f) -> Glm5NextConfig:
    """Read every GLM-5.3-Flash key from GGUFFile `f` (bundled, trunk-only or MTP-only file)."""
    a = f.get("general.architecture", kind=str)
    if a not in ARCHES:
        raise NextnError(f"{f.path}: general.architecture '{a}', expected one of {', '.join(ARCHES)}")
    n_layer, n_nextn = base.layer_counts(f, a)
    n_all = n_layer + n_nextn
    defaults: list[str] = []

    def opt(key, default, kind, why):
        if f.has(key):
            return f.get(key, kind=kind)
        defaults.append(f"'{key}' is missing: using {default!r} as llama.cpp does ({why})")
        return default

    n_embd = f.get(f"{a}.embedding_length", kind=int)
    n_head = base.scalar_or_first(f, f"{a}.attention.head_count")
    kinds = _array(f, f"{a}.attention.head_count_kv", n_all, int)
    if any(k not in (KDA, MLA) for k in kinds):
        raise NextnError(f"{f.path}: '{a}.attention.head_count_kv' = {kinds}, expected 0 (KDA) or 1 (MLA) per block")
    kinds = [int(k) for k in kinds[:n_layer]]
    if f.get(f"{a}.rope.dimension_count", 0, kind=int) != 0:
        raise NextnError(f"{f.path}: '{a}.rope.dimension_count' = {f.get(f'{a}.rope.dimension_count')}, expected 0 "
                         f"(GLM-5.3-Flash has no rope)")
    q_lora = f.get(f"{a}.attention.q_lora_rank", kind=int)
    kv_lora = f.get(f"{a}.attention.kv_lora_rank", kind=int)
    key_len = f.get(f"{a}.attention.key_length", kv_lora, kind=int)
    val_len = f.get(f"{a}.attention.value_length", kv_lora, kind=int)
    if (key_len, val_len) != (kv_lora, kv_lora):
        raise NextnError(f"{f.path}: '{a}.attention.key_length'/'value_length' = {key_len}/{val_len}, expected the MQA "
                         f"latent view kv_lora_rank = {kv_lora}")
    hd_k = f.get(f"{a}.attention.key_length_mla", kind=int)
    hd_v = f.get(f"{a}.attention.value_length_mla", kind=int)
    kpool_key = f"{a}.attention.indexer.kpool"
    if not f.has(kpool_key) and f.has(f"{a}.attention.indexer.block_size"):
        kpool_key = f"{a}.attention.indexer.block_size"
    kpool = f.get(kpool_key, kind=int)
    top_k = f.get(f"{a}.attention.indexer.top_k", kind=int)
    if kpool <= 1 or top_k % kpool:
        raise NextnError(f"{f.path}: '{kpool_key}' = {kpool} with indexer top_k {top_k}: expected kpool > 1 dividing top_k")
    hc = f.get(f"{a}.hyper_connection.count", kind=int)
    if hc != 4:
        raise NextnError(f"{f.path}: '{a}.hyper_connection.count' = {hc}, expected 4")
    types_key = f"{a}.attention.indexer.types"
    full = [1] * n_layer
    if f.has(types_key):
        v = f.get(types_key)
        if not isinstance(v, list) or len(v) != n_layer or any(not isinstance(x, (bool, int)) for x in v):
            raise NextnError(f"{f.path}: metadata key '{types_key}' = {v!r}, expected {n_layer} flags (1 = full, 0 = shared)")
        full = [int(bool(x)) for x in v]
    first_mla = next((i for i, k in enumerate(kinds) if k == MLA), None)
    if first_mla is not None and not full[first_mla]:
        raise NextnError(f"{f.path}: '{types_key}': the first MLA layer ({first_mla}) is 'shared', but a shared layer "
                         f"reuses the selection of an earlier full layer")
    clamp = {}
    for which in ("exp", "shexp"):
        key = f"{a}.swiglu_clamp_{which}"
        if f.has(key):
            clamp[which] = [float(x) for x in _array(f, key, n_all)]
        elif which == "shexp" and clamp["exp"]:
            clamp[which] = list(clamp["exp"])        # llama.cpp: shexp defaults to the exp array
        else:
            defaults.append(f"'{key}' is missing: no SwiGLU clamp, as llama.cpp does (transformers clamps at 10)")
            clamp[which] = []
    lb_key = f"{a}.kda.gate_lower_bound"
    lower_bound = f.get(lb_key, kind=float) if f.has(lb_key) else None
    if lower_bound is None:
        defaults.append(f"'{lb_key}' is missing: the KDA gate becomes ssm_a * softplus(.), as llama.cpp does "
                        f"(GLM-5.3-Flash uses the lower bound -5)")
    lead_key = f"{a}.leading_dense_block_count"
    if not f.has(lead_key):
        defaults.append(f"'{lead_key}' is missing: every block is MoE, as llama.cpp does (GLM-5.3-Flash has 3 dense)")
    first_kda = next((i for i, k in enumerate(kinds) if k == KDA), None)
    conv_4d = True
    if first_kda is not None and f.has_tensor(f"blk.{first_kda}.ssm_conv1d_q.weight"):
        conv_4d = len(f.tensor_shape(f"blk.{first_kda}.ssm_conv1d_q.weight")) == 4
    n_vocab = f.tensor_shape("token_embd.weight")[0] if f.has_tensor("token_embd.weight") else None
    n_vocab = f.get(f"{a}.vocab_size", n_vocab)
    if n_vocab is None:
        raise NextnError(f"{f.path}: tensor 'token_embd.weight' is missing")
    moe = base.moe_keys(f, a)
    share_key = f"{a}.attention.indexer.index_share_mtp"
    return Glm5NextConfig(
        arch=a, n_vocab=int(n_vocab), n_embd=n_embd, n_layer=n_layer, n_layer_nextn=n_nextn, n_head=n_head,
        n_rot=0, rope_freq_base=10000.0,
        rms_eps=f.get(f"{a}.attention.layer_norm_rms_epsilon", kind=float),
        n_ctx_train=f.get(f"{a}.context_length", kind=int),
        **moe,
        layer_kinds=kinds,
        kda_hd=f.get(f"{a}.kda.head_dim", kind=int),
        conv_k=f.get(f"{a}.ssm.conv_kernel", kind=int),
        gate_lower_bound=lower_bound,
        conv_w_4d=conv_4d,
        q_lora=q_lora, kv_lora=kv_lora, hd_k=hd_k, hd_v=hd_v, kq_scale=1.0 / math.sqrt(hd_k),
        idx_heads=f.get(f"{a}.attention.indexer.head_count", kind=int),
        idx_hd=f.get(f"{a}.attention.indexer.key_length", kind=int),
        idx_top_k=top_k, idx_kpool=kpool,
        idx_tail=bool(f.get(f"{a}.attention.indexer.kpool_select_tail", True, kind=bool)),
        idx_norm_eps=opt(f"{a}.attention.layer_norm_epsilon", 0.0, float,
                         "indexer k_norm LayerNorm eps 0; the model uses 1e-6"),
        idx_full=full,
        index_share_mtp=bool(f.get(share_key, kind=bool)) if f.has(share_key) else None,
        hc_count=hc,
        hc_iters=f.get(f"{a}.hyper_connection.sinkhorn_iterations", kind=int),
        hc_eps=f.get(f"{a}.hyper_connection.epsilon", kind=float),
        clamp_exp=clamp["exp"], clamp_shexp=clamp["shexp"],
        defaults_applied=defaults,
    )


def hc_tensors(c: Glm5NextConfig, il: int) -> dict[str, tuple[int, ...]]:
    """mHC tensors of trunk block il: per sublayer (attn, ffn) fn [(2+hc)*hc, hc*E], base [(2+hc)*hc], scale [3]."""
    p, hc, E = f"blk.{il}.", c.hc_count, c.n_embd
    t = {}
    for sub in ("attn", "ffn"):
        t |= {p + f"hc_{sub}_fn.weight": ((2 + hc) * hc, hc * E), p + f"hc_{sub}_base.weight": ((2 + hc) * hc,),
              p + f"hc_{sub}_scale.weight": (3,)}
    return t


def kda_tensors(c: Glm5NextConfig, il: int) -> dict[str, tuple[int, ...]]:
    p, E, D, H, r = f"blk.{il}.", c.n_embd, c.d_inner, c.n_head, c.kda_hd
    conv = (1, D, 1, c.conv_k) if c.conv_w_4d else (D, 1, c.conv_k)
    return {
        p + "attn_q.weight": (D, E), p + "attn_k.weight": (D, E), p + "attn_v.weight": (D, E),
        p + "ssm_conv1d_q.weight": conv, p + "ssm_conv1d_k.weight": conv, p + "ssm_conv1d_v.weight": conv,
        p + "ssm_f_a.weight": (r, E), p + "ssm_f_b.weight": (D, r), p + "ssm_dt.bias": (D,), p + "ssm_a": (H,),
        p + "ssm_beta.weight": (H, E), p + "ssm_g_a.weight": (r, E), p + "ssm_g_b.weight": (D, r),
        p + "ssm_norm.weight": (r,), p + "attn_output.weight": (E, D),
    }


def mla_tensors(c: Glm5NextConfig, il: int, indexer: bool) -> dict[str, tuple[int, ...]]:
    """NoPE MLA (absorbed attn_k_b / attn_v_b) and, on a full layer, the pooled DSA indexer."""
    p, E, H = f"blk.{il}.", c.n_embd, c.n_head
    t = {
        p + "attn_q_a.weight": (c.q_lora, E), p + "attn_q_a_norm.weight": (c.q_lora,),
        p + "attn_q_b.weight": (H * c.hd_k, c.q_lora),
        p + "attn_kv_a_mqa.weight": (c.kv_lora, E), p + "attn_kv_a_norm.weight": (c.kv_lora,),
        p + "attn_k_b.weight": (H, c.kv_lora, c.hd_k),      # ggml {hd_k, kv_lora, n_head}
        p + "attn_v_b.weight": (H, c.hd_v, c.kv_lora),      # ggml {kv_lora, hd_v, n_head}
        p + "attn_output.weight": (E, H * c.hd_v),
    }
    if indexer:
        Di = c.idx_hd
        t |= {
            p + "indexer.attn_q_b.weight": (c.idx_heads * Di, c.q_lora), p + "indexer.attn_k.weight": (Di, E),
            p + "indexer.k_norm.weight": (Di,), p + "indexer.k_norm.bias": (Di,),
            p + "indexer.proj.weight": (c.idx_heads, E),
            p + "indexer_compressor_gate.weight": (Di, E), p + "indexer_compressor_ape.weight": (c.idx_kpool, Di),
        }
    return t


def trunk_tensors(c: Glm5NextConfig) -> dict[str, tuple[int, ...]]:
    E = c.n_embd
    t = {"token_embd.weight": (c.n_vocab, E), "output_norm.weight": (E,), "output.weight": (c.n_vocab, E)}
    for il, kind in enumerate(c.layer_kinds):
        t |= {f"blk.{il}.attn_norm.weight": (E,), f"blk.{il}.ffn_norm.weight": (E,)} | hc_tensors(c, il)
        t |= kda_tensors(c, il) if kind == KDA else mla_tensors(c, il, indexer=bool(c.idx_full[il]))
        t |= base.ffn_tensors(c, il, moe=il >= c.n_lead_dense)
    return t


nextn_index = base.nextn_index
nextn_optional = base.nextn_optional   # embed_tokens / shared_head_head / shared_head_norm → fallbacks


def nextn_tensors(c: Glm5NextConfig) -> dict[str, tuple[int, ...]]:
    """The NextN block: an MLA layer with its own indexer (always full) + MoE, no mHC, and eh_proj/enorm/hnorm."""
    il, E = nextn_index(c), c.n_embd
    t = {f"blk.{il}.attn_norm.weight": (E,), f"blk.{il}.ffn_norm.weight": (E,)}
    return t | mla_tensors(c, il, indexer=True) | base.ffn_tensors(c, il, moe=True) | base.nextn_frame_tensors(c)
