"""The frequency and magnitude terms of ggml's `rope_ext`, YaRN included, defined once for the interpreter and
the TVM lowering (ggml/src/ggml-cpu/ops.cpp: `rope_yarn`, `rope_yarn_ramp`; ggml/src/ggml.c:
`ggml_rope_yarn_corr_dims`; YaRN: Peng et al. 2023, arXiv:2309.00071).

For pair i (0 <= i < n_rot/2; NORM pairs dims (2i, 2i+1), NEOX pairs (i, i + n_rot/2)) at position p:

    theta_extrap = p * freq_base^(-2i/n_rot)
    theta_interp = freq_scale * theta_extrap
    ramp_mix     = ext_factor * (1 - clamp((i - low) / max(0.001, high - low), 0, 1))
    theta        = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
    cos, sin     = cos(theta) * mscale, sin(theta) * mscale
    mscale       = attn_factor * (1 + 0.1 ln(1/freq_scale)) if ext_factor != 0 else attn_factor

with (low, high) the YaRN correction dims from beta_fast / beta_slow and n_ctx_orig. With the defaults
(freq_scale 1, ext_factor 0, attn_factor 1) this is plain rope.
"""
from __future__ import annotations

import math

import numpy as np

DEFAULTS = dict(freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=0)
PARAMS = ("freq_base", *DEFAULTS)    # the order of rope_ext's attributes after n_rot and mode


def corr_dims(n_rot: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """(low, high): the pair indices where YaRN's ramp starts and ends (ggml_rope_yarn_corr_dims).
    A pair that turns fewer than beta times over n_ctx_orig positions is interpolated, one that turns more
    than beta_fast times is extrapolated (kept as trained)."""
    def dim(beta):
        return n_rot * math.log(n_ctx_orig / (beta * 2.0 * math.pi)) / (2.0 * math.log(freq_base))
    return max(0.0, math.floor(dim(beta_fast))), min(n_rot - 1.0, math.ceil(dim(beta_slow)))


def magnitude(freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, **_) -> float:
    """mscale multiplying cos and sin (rope_yarn)."""
    if ext_factor != 0.0:
        return attn_factor * (1.0 + 0.1 * math.log(1.0 / freq_scale))
    return attn_factor


def pair_freqs(n_rot: int, freq_base: float, freq_scale=1.0, ext_factor=0.0, beta_fast=32.0, beta_slow=1.0,
               n_ctx_orig=0, **_) -> np.ndarray:
    """float64 [n_rot/2]: theta / p for each pair, i.e. the angle per position (see the module docstring)."""
    i = np.arange(n_rot // 2, dtype=np.float64)
    extrap = freq_base ** (-2.0 * i / n_rot)
    if ext_factor == 0.0:
        return extrap * freq_scale
    low, high = corr_dims(n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow)
    mix = ext_factor * (1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0))
    return extrap * (freq_scale * (1.0 - mix) + mix)
