"""The GLM hyper-parameters every arch reads the same way, their GGUF key readers, and the shared tensor tables.

Keys as llama.cpp reads them (src/llama-model.cpp `load_hparams` for LLM_ARCH_GLM4_MOE / LLM_ARCH_GLM_DSA,
src/llama-arch.cpp for the names); `{arch}.block_count` includes the NextN block(s): trunk layers are
0..n_layer-1 and NextN block k is blk.{n_layer+k}.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from nextn.common.errors import NextnError


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

    def with_draft(self, dc: "GlmConfig") -> "GlmConfig":
        """This config (of a trunk-only file) completed by `dc`, the config of its MTP-only draft file: one NextN
        block. Archs whose NextN block reads keys of its own take them from `dc` (glm5next)."""
        return self if self.n_layer_nextn else type(self)(**{**self.to_json(), "n_layer_nextn": 1})

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict):
        return cls(**d)


def scalar_or_first(f, key, kind=int):
    """A number key that some converters write as a per-layer array (head_count, feed_forward_length): its value,
    or the first element. Raises NextnError for an empty array or a non-number."""
    v = f.get(key)
    if isinstance(v, list):
        if not v:
            raise NextnError(f"{f.path}: metadata key '{key}' is an empty array, expected a number")
        v = v[0]
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise NextnError(f"{f.path}: metadata key '{key}' has value {v!r}, expected a number")
    return kind(v)


def bounded(f, key: str, v: int, lo: int = 1, hi: int | None = None, what: str = "") -> int:
    """`v` (the value of `key`) if lo <= v <= hi, else NextnError naming the file and key."""
    if v < lo or (hi is not None and v > hi):
        want = f"{lo} <= n <= {hi}" if hi is not None else f"n >= {lo}"
        raise NextnError(f"{f.path}: metadata key '{key}' = {v}, expected {want}{' (' + what + ')' if what else ''}")
    return v


def last_block(f) -> int:
    """The highest `blk.N.` index among the file's tensors (-1 when there are none)."""
    return max((int(n.split(".")[1]) for n in f.tensors if n.startswith("blk.") and n.split(".")[1].isdigit()),
               default=-1)


def layer_counts(f, a: str) -> tuple[int, int]:
    """(n_layer, n_layer_nextn): `{a}.block_count` includes the NextN block (`{a}.nextn_predict_layers`, at most 1).
    A block count past the file's last `blk.N` tensor (+1: a trunk-only file still counts its NextN block) is an
    error here, before any per-layer table is built."""
    n_all = f.get(f"{a}.block_count", kind=int)
    bounded(f, f"{a}.block_count", n_all, 1, last_block(f) + 2, "the file's tensors stop at "
            f"blk.{last_block(f)}")
    n_nextn = f.get(f"{a}.nextn_predict_layers", 0, kind=int)
    if not 0 <= n_nextn < n_all:
        raise NextnError(f"{f.path}: '{a}.nextn_predict_layers' = {n_nextn}, expected 0 <= n < block_count ({n_all})")
    if n_nextn > 1:
        raise NextnError(f"{f.path}: '{a}.nextn_predict_layers' = {n_nextn}; GLM has exactly one NextN block")
    return n_all - n_nextn, n_nextn


ROPE_SCALING_TYPES = ("none", "linear", "yarn")


def rope_keys(f, a: str) -> dict:
    """The `{a}.rope.*` keys resolved into ggml_rope_ext's parameters the way llama.cpp does for the GLM archs
    (src/llama-model.cpp load_hparams, src/llama-context.cpp llama_context()), as config fields:

    - `rope.scaling.type` (default "linear"; "none" forces freq_scale 1), `rope.scaling.factor` (or the old
      `rope.scale_linear`): freq_scale = 1/factor;
    - YaRN: ext_factor 1, beta_fast 32, beta_slow 1, n_ctx_orig = `rope.scaling.original_context_length`
      (default `context_length`); the rope magnitude attn_factor = get_mscale(factor) / (1 + 0.1 ln factor),
      which cancels the (1 + 0.1 ln factor) that ggml's rope_yarn multiplies back in;
    - attn_factor *= `rope.scaling.attn_factor` (default 1).
    `rope.scaling.yarn_log_multiplier` is not read for glm4moe / glm-dsa (llama.cpp reads it for the deepseek2 arch),
    so get_mscale uses 1. Raises NextnError for another scaling type (longrope, ...) or a factor <= 0.
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
    """The MoE / FFN keys shared by the GLM archs, as config fields (sigmoid gating only; no group-limited routing)."""
    gating = f.get(f"{a}.expert_gating_func", 2, kind=int)
    if gating != 2:
        raise NextnError(f"{f.path}: '{a}.expert_gating_func' = {gating}, expected 2 (sigmoid) for {a}")
    if f.get(f"{a}.expert_group_count", 1, kind=int) > 1:
        raise NextnError(f"{f.path}: '{a}.expert_group_count' > 1 (group-limited routing) is not supported")
    n_lead = bounded(f, f"{a}.leading_dense_block_count", f.get(f"{a}.leading_dense_block_count", 0, kind=int), 0)
    ff_key = f"{a}.expert_feed_forward_length"
    ff = f.get(ff_key)
    if isinstance(ff, list):   # one width per block (GLM-5.3-Flash's converter may write it so): the MoE ones agree
        widths = {x for x in ff[n_lead:] if isinstance(x, int) and not isinstance(x, bool)}
        if len(widths) != 1 or len(ff) <= n_lead:
            raise NextnError(f"{f.path}: '{ff_key}' = {ff}, expected one expert width for every MoE block")
        n_ff_exp = widths.pop()
    else:
        n_ff_exp = f.get(ff_key, kind=int)
    n_expert = bounded(f, f"{a}.expert_count", f.get(f"{a}.expert_count", kind=int))
    return dict(
        n_ff=bounded(f, f"{a}.feed_forward_length", scalar_or_first(f, f"{a}.feed_forward_length")),
        n_ff_exp=bounded(f, ff_key, n_ff_exp),
        n_expert=n_expert,
        n_expert_used=bounded(f, f"{a}.expert_used_count", f.get(f"{a}.expert_used_count", kind=int), 1, n_expert,
                              "at most expert_count"),
        n_expert_shared=bounded(f, f"{a}.expert_shared_count", f.get(f"{a}.expert_shared_count", kind=int), 0),
        n_lead_dense=n_lead,
        expert_weights_scale=f.get(f"{a}.expert_weights_scale", 0.0, kind=float),
        expert_weights_norm=bool(f.get(f"{a}.expert_weights_norm", False, kind=bool)),
        expert_gating_func=gating,
    )


def ffn_tensors(c: GlmConfig, il: int, moe: bool) -> dict[str, tuple[int, ...]]:
    """Row-major shapes of one block's dense FFN, or its MoE FFN (router, selection bias, experts) plus the shared
    expert."""
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


def nextn_index(c: GlmConfig) -> int:
    """Block index of the NextN block: the first after the trunk."""
    return c.n_layer


def nextn_frame_tensors(c: GlmConfig) -> dict[str, tuple[int, ...]]:
    """The NextN frame's own tensors (eh_proj over [enorm(embedding) | hnorm(hidden)]), required."""
    p = f"blk.{nextn_index(c)}.nextn."
    return {p + "eh_proj.weight": (c.n_embd, 2 * c.n_embd), p + "enorm.weight": (c.n_embd,), p + "hnorm.weight": (c.n_embd,)}


def nextn_optional(c: GlmConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Optional NextN tensors → (the trunk tensor used when absent, shape), as llama.cpp's loader falls back."""
    p = f"blk.{nextn_index(c)}.nextn."
    return {
        p + "embed_tokens.weight": ("token_embd.weight", (c.n_vocab, c.n_embd)),
        p + "shared_head_head.weight": ("output.weight", (c.n_vocab, c.n_embd)),
        p + "shared_head_norm.weight": ("output_norm.weight", (c.n_embd,)),
    }
