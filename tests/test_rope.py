"""rope_ext with linear and YaRN scaling: the interpreter and the compiled TE kernel against a naive restatement of
ggml's CPU rope (ggml-cpu/ops.cpp rope_yarn, ggml.c ggml_rope_yarn_corr_dims), written here per element, and the
GGUF keys resolved as llama.cpp's context does (llama-context.cpp)."""
import math

import numpy as np
import pytest
import tvm
from tvm import te

from nextn.common.errors import NextnError
from nextn.compiler.ir import Graph, interpret, rope
from nextn.compiler.lower import te_ops
from nextn.compiler.models.glm_base import config as glm_config


def naive_rope(x, pos, n_dims, mode, freq_base, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0,
               beta_slow=1.0, n_ctx_orig=0):
    """ggml's rope, one element pair at a time, in float64."""
    def corr_dim(beta):
        return n_dims * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(freq_base))

    low = max(0.0, math.floor(corr_dim(beta_fast))) if ext_factor else 0.0
    high = min(n_dims - 1.0, math.ceil(corr_dim(beta_slow))) if ext_factor else 0.0
    out = x.astype(np.float64).copy()
    T, H, _ = x.shape
    for t in range(T):
        for i0 in range(0, n_dims, 2):
            theta_extrap = pos[t] * freq_base ** (-i0 / n_dims)
            theta_interp = freq_scale * theta_extrap
            theta, mscale = theta_interp, attn_factor
            if ext_factor != 0.0:
                y = (i0 // 2 - low) / max(0.001, high - low)
                ramp_mix = (1 - min(1.0, max(0.0, y))) * ext_factor
                theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
                mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
            c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
            a, b = (i0 // 2, i0 // 2 + n_dims // 2) if mode == "neox" else (i0, i0 + 1)
            for h in range(H):
                x0, x1 = float(x[t, h, a]), float(x[t, h, b])
                out[t, h, a], out[t, h, b] = x0 * c - x1 * s, x0 * s + x1 * c
    return out.astype(np.float32)


CASES = {
    "plain": dict(freq_base=10000.0),
    "linear x4": dict(freq_base=10000.0, freq_scale=0.25),
    "yarn x4 glm-dsa fixture": dict(freq_base=1e6, freq_scale=0.25, ext_factor=1.0, n_ctx_orig=1024),
    "yarn x40 deepseek": dict(freq_base=10000.0, freq_scale=1 / 40, ext_factor=1.0, n_ctx_orig=4096, attn_factor=0.9),
}
POS = np.array([0, 1, 7, 1000, 4095, 163839], np.int32)   # the last is 40 x 4096 - 1


def _compiled_rope(shape, n_rot, mode, params):
    x = te.placeholder(shape, "float32", name="x")
    pos = te.placeholder((shape[0],), "int32", name="pos")
    args = [params.get(k, rope.DEFAULTS.get(k)) for k in rope.PARAMS]
    f = te.create_prim_func([x, pos, te_ops.rope_ext(x, pos, n_rot, mode, *args)])
    return tvm.compile(tvm.IRModule({"rope": f.with_attr("global_symbol", "rope")}), target="llvm")["rope"]


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["neox", "norm"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rope_ext_interpreter_and_kernel_equal_naive(case, mode):
    p, n_rot, shape = CASES[case], 64, (len(POS), 3, 80)     # dims 64..79 pass through
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    want = naive_rope(x, POS, n_rot, mode, **p)
    g = Graph("rope")
    out = g.rope_ext(g.input("x", shape), g.input("pos", (len(POS),), "int32"), n_rot, mode, **p)
    g.output("y", out)
    got = interpret.run(g, {"x": x, "pos": POS}, lambda n: None, {}, n_kv=0)["y"]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    assert np.array_equal(got[..., n_rot:], x[..., n_rot:])
    y = np.empty_like(x)
    _compiled_rope(shape, n_rot, mode, p)(x, POS, y)
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-5)
    if case != "plain":   # the scaling is really applied: plain rope differs at large positions
        plain = naive_rope(x, POS, n_rot, mode, p["freq_base"])
        assert np.abs(plain[3:] - want[3:]).max() > 0.1


def test_yarn_corr_dims_by_hand():
    # n_rot 64, 4096 original positions, base 10000 (DeepSeek-V3): 64 ln(4096/(32·2π)) / (2 ln 1e4) = 10.47 → 10,
    # 64 ln(4096/2π) / (2 ln 1e4) = 22.50 → 23
    assert rope.corr_dims(64, 4096, 10000.0, 32.0, 1.0) == (10.0, 23.0)
    # pairs below `low` keep the trained frequency, pairs above `high` are divided by the factor
    f = rope.pair_freqs(64, 10000.0, 1 / 40, 1.0, 32.0, 1.0, 4096)
    i = np.arange(32)
    assert np.allclose(f[:11], 10000.0 ** (-2 * i[:11] / 64)) and np.allclose(f[23:], 10000.0 ** (-2 * i[23:] / 64) / 40)
    assert rope.magnitude(1 / 40, 1.0, 1.0) == pytest.approx(1 + 0.1 * math.log(40))


def test_yarn_factor_one_is_plain_rope():
    x = np.random.default_rng(2).standard_normal((len(POS), 2, 32)).astype(np.float32)
    a = naive_rope(x, POS, 32, "norm", 1e6)
    b = naive_rope(x, POS, 32, "norm", 1e6, freq_scale=1.0, ext_factor=1.0, n_ctx_orig=1024)
    assert np.array_equal(a, b)


class _Keys:
    """A GGUFFile stand-in holding metadata only."""
    path = "model.gguf"

    def __init__(self, **kv):
        self.kv = {"glm4moe.context_length": 8192, **{f"glm4moe.rope.scaling.{k}": v for k, v in kv.items()}}

    def has(self, key):
        return key in self.kv

    def get(self, key, default=None, kind=None):
        return self.kv.get(key, default)


def test_rope_keys_resolved_as_llama_context():
    r = glm_config.rope_keys(_Keys(), "glm4moe")                       # no keys: "linear" with factor 1 = plain rope
    assert (r["rope_scaling"], r["rope_freq_scale"], r["rope_ext_factor"], r["rope_attn_factor"]) == ("none", 1, 0, 1)
    r = glm_config.rope_keys(_Keys(type="linear", factor=4.0), "glm4moe")
    assert (r["rope_scaling"], r["rope_freq_scale"], r["rope_ext_factor"]) == ("linear", 0.25, 0.0)
    r = glm_config.rope_keys(_Keys(type="none", factor=4.0), "glm4moe")
    assert r["rope_freq_scale"] == 1.0
    r = glm_config.rope_keys(_Keys(type="yarn", factor=40.0, attn_factor=0.5), "glm4moe")
    # get_mscale(40) / (1 + 0.1 ln 40) cancels; the key's attn_factor stays; n_ctx_orig defaults to context_length
    assert (r["rope_freq_scale"], r["rope_ext_factor"], r["rope_n_ctx_orig"]) == (1 / 40, 1.0, 8192)
    assert r["rope_attn_factor"] == pytest.approx(0.5)
    assert (r["rope_beta_fast"], r["rope_beta_slow"]) == (32.0, 1.0)
    r = glm_config.rope_keys(_Keys(type="yarn", factor=40.0, original_context_length=4096), "glm4moe")
    assert r["rope_n_ctx_orig"] == 4096 and r["rope_attn_factor"] == pytest.approx(1.0)


@pytest.mark.parametrize("kv, needle", [(dict(type="longrope"), "'glm4moe.rope.scaling.type' = 'longrope'"),
                                         (dict(type="yarn", factor=-2.0), "'glm4moe.rope.scaling.factor' = -2.0"),
                                         (dict(type="yarn", factor=0.0), "'glm4moe.rope.scaling.factor' = 0.0")])
def test_rope_keys_bad_values(kv, needle):
    with pytest.raises(NextnError, match="model.gguf: " + needle.replace(".", r"\.")):
        glm_config.rope_keys(_Keys(**kv), "glm4moe")
