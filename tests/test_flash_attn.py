"""The flash-attention, DSA index-score and KV-store kernels against naive numpy written here (independent of the
IR and of the kernels): awkward sizes (L not a multiple of the tile or chunk, L = 1, T > 1 causal rows, fully
masked tiles, fully masked rows), every KV type, every form (CPU fused with 1 or 3 rows per task, CPU split over
L with 1, 2 or 4 rows per task, and the GPU kernels built for the CPU with serial threads). Row independence, bit for
bit, is what keeps speculation on ≡ off: a row gives the same bits alone or among others, with L exactly its length
or longer, and in every form of one target."""
from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest
import tvm

from nextn.common.kv_types import KV_TYPES
from nextn.compiler.lower.attention import flash_attn as fa, kv_access
from nextn.compiler.lower.indexer import dsa_kernels

pytestmark = pytest.mark.e2e   # builds TVM kernels or runs the CLI in a subprocess

TARGET = tvm.target.Target("llvm")


def naive_attention(q, k, v, pos, L, scale, mask=None):
    """softmax((q k^T) * scale + mask) v per head over cells < L with c <= pos[t]; GQA by h // (H / Hkv);
    a row with no cell gets 0."""
    T_, H, _ = q.shape
    g = H // k.shape[1]
    out = np.zeros((T_, H, v.shape[2]), np.float64)
    cells = np.arange(L)
    for t in range(T_):
        for h in range(H):
            s = k[:L, h // g].astype(np.float64) @ q[t, h].astype(np.float64) * scale
            if mask is not None:
                s = s + mask[t]
            s = np.where(cells <= pos[t], s, -np.inf)
            if np.isinf(s).all():
                continue
            p = np.exp(s - s.max())
            out[t, h] = p @ v[:L, h // g] / p.sum()
    return out.astype(np.float32)


def storage(kv, x):
    """x's cache storage of KV type kv, as the kernels' buffers hold it."""
    enc = KV_TYPES[kv].encode(x)
    return enc.view(ml_dtypes.bfloat16) if kv == "bf16" else enc


def _compile(funcs: dict):
    return tvm.compile(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()}), target=TARGET)


FORMS = [("cpu", False, 1), ("cpu", False, 3), ("cpu", True, 1), ("cpu", True, 2), ("cpu", True, 4), ("gpu", False, 1),
         ("gpu", True, 1)]


def build_forms(a: fa.AttnShape):
    mods = {}
    for target, split, rb in FORMS:
        if target == "cpu":
            f = {"p": fa.cpu_kernel(a, True, rb), "m": fa.cpu_merge_kernel(a)} if split else \
                {"f": fa.cpu_kernel(a, False, rb)}
        else:
            f = {"p": fa.gpu_kernel(a, True, emulate=True), "m": fa.gpu_merge_kernel(a, emulate=True)} if split else \
                {"f": fa.gpu_kernel(a, False, emulate=True)}
        mods[(target, split, rb)] = _compile(f)
    return mods


def run_form(ex, split, a, q, kst, vst, pos, mask, L):
    dev = [tvm.runtime.tensor(np.ascontiguousarray(x)) for x in (q, kst, vst, pos)]
    m = tvm.runtime.tensor(mask if mask is not None else np.zeros((1, 1), np.float32))
    o = tvm.runtime.empty((q.shape[0], a.H, a.Dv), "float32")
    if split:
        nc = -(-L // fa.CHUNK)
        pacc = tvm.runtime.empty((q.shape[0], a.H, nc, a.Dv), "float32")
        pml = tvm.runtime.empty((q.shape[0], a.H, nc, 2), "float32")
        ex["p"](*dev, m, L, pacc, pml)
        ex["m"](pacc, pml, dev[3], L, o)
    else:
        ex["f"](*dev, m, L, o)
    return o.numpy()


CASES = {
    # id: (H, Hkv, Dk, Dv, T, L, k_type, v_type, mla, mask)
    "gqa-L37": (8, 2, 32, 32, 5, 37, "f32", "f32", False, False),       # L < tile and not a multiple of it
    "gqa-L1": (8, 2, 32, 32, 1, 1, "f32", "f32", False, False),
    "gqa-causal-2chunks": (8, 2, 32, 32, 30, 300, "f32", "f32", False, False),
    "gqa-f16-q8_0": (8, 2, 32, 32, 9, 530, "f16", "q8_0", False, False),
    "gqa-bf16": (12, 4, 64, 64, 4, 290, "bf16", "bf16", False, False),
    # GLM-4.5-Air's group of 12 query heads per KV head: one row's 12 lanes run padded to 16
    "gqa12-q8_0-f16": (24, 2, 64, 64, 2, 777, "q8_0", "f16", False, False),
    "mla-mask": (4, 1, 160, 128, 7, 600, "f32", "f32", True, True),     # fully masked tiles and a fully masked row
    "mla-q8_0-mask": (12, 1, 96, 64, 3, 1000, "q8_0", "q8_0", True, True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flash_attention_forms(case):
    H, Hkv, Dk, Dv, T_, L, kt, vt, mla, with_mask = CASES[case]
    rng = np.random.default_rng(sorted(CASES).index(case))
    a = fa.AttnShape(H, Hkv, Dk, Dv, Dk ** -0.5, kt, kt if mla else vt, mla, with_mask)
    C = L + 7
    q = rng.standard_normal((T_, H, Dk)).astype(np.float32)
    k = KV_TYPES[kt].round(rng.standard_normal((C, Hkv, Dk)).astype(np.float32))
    v = k[..., :Dv] if mla else KV_TYPES[vt].round(rng.standard_normal((C, Hkv, Dv)).astype(np.float32))
    kst = storage(kt, k)
    vst = kst if mla else storage(vt, v)
    pos = np.sort(rng.choice(L, T_, replace=False)).astype(np.int32)
    pos[-1] = L - 1
    mask = None
    if with_mask:
        mask = np.where(rng.random((T_, L)) < 0.6, -np.inf, 0.0).astype(np.float32)
        mask[:, 16:48] = -np.inf                       # whole tiles masked for every row
        mask[1] = -np.inf                              # a row with no cell at all
    want = naive_attention(q, k, v, pos, L, a.scale, mask)
    mods = build_forms(a)
    outs = {form: run_form(ex, form[1], a, q, kst, vst, pos, mask, L) for form, ex in mods.items()}
    for form, got in outs.items():
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), form
        if with_mask:
            assert (got[1] == 0).all()
    cpu = outs[("cpu", False, 1)]
    assert all(np.array_equal(outs[f], cpu) for f in FORMS if f[0] == "cpu")        # rows per task, split: same bits
    assert np.array_equal(outs[("gpu", True, 1)], outs[("gpu", False, 1)])
    # row independence: each row alone, and with L past its position, gives the same bits in every form
    for form, ex in mods.items():
        for t in (0, T_ - 1):
            alone = run_form(ex, form[1], a, q[t:t + 1], kst, vst, pos[t:t + 1],
                             None if mask is None else mask[t:t + 1], L)
            assert np.array_equal(alone[0], outs[form][t]), (form, t)
        if pos[0] + 1 < L:   # row 0 with L = its own length
            n0 = int(pos[0]) + 1
            short = run_form(ex, form[1], a, q[:1], kst, vst, pos[:1], None if mask is None else mask[:1, :n0], n0)
            assert np.array_equal(short[0], outs[form][0]), form


def test_padded_lanes():
    """Lane counts that fill whole vectors stay; others round up to a multiple of 16 (the padding lanes hold no
    cell): 12 heads of one decode row -> 16, 4 rows x 12 -> 48, 3 rows x 4 -> 16."""
    assert [fa.padded_lanes(n) for n in (1, 2, 4, 8, 16, 48, 3, 12, 24, 20)] == [1, 2, 4, 8, 16, 48, 16, 16, 32, 32]


def naive_index_score(q, k, w, pos, L, kpool=1):
    """sum_h relu(q·k) * w over keys (pooled keys: one per kpool cells) causal for each row, -inf elsewhere."""
    n = L // kpool
    s = np.einsum("thd,sd->ths", q.astype(np.float64), k[:n, 0].astype(np.float64))
    score = np.einsum("ths,th->ts", np.maximum(s, 0), w)
    return np.where((np.arange(n)[None, :] + 1) * kpool - 1 <= pos[:, None], score, -np.inf)


@pytest.mark.parametrize("Hi,D,T_,L,kt,kpool", [(4, 64, 5, 37, "f32", 1), (4, 64, 1, 1, "f32", 1),
                                                (32, 128, 3, 600, "f16", 1), (4, 64, 9, 530, "q8_0", 1),
                                                (16, 64, 2, 300, "bf16", 1), (16, 64, 6, 203, "f32", 4)])
def test_lightning_indexer_kernels(Hi, D, T_, L, kt, kpool):
    """Index score [T, L] without a [T, Hi, L] buffer: CPU kernel and GPU kernel (serial threads) against numpy,
    the same bits in both, -inf exactly on the non-causal cells, and row-independent; also over k-pools."""
    rng = np.random.default_rng(Hi + L)
    q = rng.standard_normal((T_, Hi, D)).astype(np.float32)
    w = rng.standard_normal((T_, Hi)).astype(np.float32)
    k = KV_TYPES[kt].round(rng.standard_normal((L + 3, 1, D)).astype(np.float32))
    pos = np.sort(rng.choice(L, T_, replace=False)).astype(np.int32)
    pos[-1] = L - 1
    want = naive_index_score(q, k, w, pos, L, kpool)
    outs = {}
    for mode in ("cpu", "gpu"):
        ex = _compile({"f": dsa_kernels.lightning_indexer_kernel(Hi, D, kt, emulate=mode == "gpu", kpool=kpool)})

        def run(rows, n):
            out = tvm.runtime.empty((len(rows), n // kpool), "float32")
            ex["f"](*[tvm.runtime.tensor(np.ascontiguousarray(x)) for x in (q[rows], storage(kt, k), w[rows], pos[rows])],
                    n, out)
            return out.numpy()

        outs[mode] = got = run(np.arange(T_), L)
        fin = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), fin) and (got[~fin] == -np.inf).all()
        assert np.abs(got[fin] - want[fin]).max() <= 1e-5 * np.abs(want[fin]).max()
        assert np.array_equal(run(np.array([T_ - 1]), L)[0], got[-1])
        n0 = (int(pos[0]) + 1) // kpool * kpool   # L = row 0's own length (whole pools)
        if n0:
            assert np.array_equal(run(np.array([0]), n0)[0], got[0, :n0 // kpool])
    assert np.array_equal(outs["cpu"], outs["gpu"])


def ggml_quantize_row_q8_0_ref(x: np.ndarray) -> bytes:
    """ggml-quants.c quantize_row_q8_0_ref, restated element by element in float32 scalars."""
    out = bytearray()
    f32 = np.float32
    for b in range(0, len(x), 32):
        blk = [f32(v) for v in x[b:b + 32]]
        amax = f32(0)
        for v in blk:
            amax = max(amax, abs(v))
        d = f32(amax / f32(127))
        inv = f32(f32(1) / d) if d != 0 else f32(0)
        out += np.float16(d).tobytes()
        for v in blk:
            x0 = f32(v * inv)
            q = int(np.trunc(x0)) + (int(np.sign(x0)) if abs(x0 - np.trunc(x0)) >= 0.5 else 0)   # roundf
            out += np.int8(q).tobytes()
    return bytes(out)


@pytest.mark.parametrize("kv", sorted(KV_TYPES))
def test_kv_store_kernel(kv):
    """The KV store (ggml set_rows) writes exactly the bytes of the type's encoding at each row's position; q8_0
    bytes are ggml's quantize_row_q8_0_ref and read back by gguf-py's Q8_0 dequantize as KVType.round; f16 / bf16
    round to nearest even (ties included)."""
    H, D, C = 3, 64, 20
    rng = np.random.default_rng(5)
    rows = (rng.standard_normal((5, H, D)) * 3).astype(np.float32)
    rows[0, 0, :32] = 0.0                                   # an all-zero block (d = 0)
    rows[1, 1, :32] = np.arange(32) * 0.5 - 8               # x * id lands on .5 ties
    bits = rows.view(np.uint32)
    bits[2, 2, ::3] = (bits[2, 2, ::3] & 0xFFFF0000) | 0x8000   # bf16 ties
    pos = np.array([3, 7, 8, 12, 19], np.int32)
    t = KV_TYPES[kv]
    shape = t.storage_shape((C, H, D))
    cache = tvm.runtime.tensor(storage(kv, np.zeros((C, H, D), np.float32)))
    ex = _compile({"f": kv_access.store_kernel(kv, H, D)})
    ex["f"](cache, tvm.runtime.tensor(rows), tvm.runtime.tensor(pos))
    got = cache.numpy()
    got = got.view(np.uint16) if kv == "bf16" else got
    assert got.shape == shape and np.array_equal(got[pos], t.encode(rows))
    assert not got[np.setdiff1d(np.arange(C), pos)].any()
    if kv == "q8_0":
        for r in range(5):
            for h in range(H):
                assert got[pos[r], h].tobytes() == ggml_quantize_row_q8_0_ref(rows[r, h])
        deq = gguf.quants.dequantize(got[pos].reshape(-1, t.row_bytes(D)), gguf.GGMLQuantizationType.Q8_0)
        assert np.array_equal(deq.reshape(rows.shape), t.round(rows))
    elif kv == "f16":
        assert np.array_equal(got[pos], rows.astype(np.float16))
    elif kv == "bf16":
        assert np.array_equal(got[pos].view(ml_dtypes.bfloat16), rows.astype(ml_dtypes.bfloat16))
