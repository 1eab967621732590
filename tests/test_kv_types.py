"""KV cache types (-ctk / -ctv: f32, f16, bf16, q8_0) end to end on the BF16 fixtures.

- The manifest states the types and the bytes one token takes, equal to a count from the model's config here.
- Every entry point equals the interpreter on the same cache contents (`keep_kv`), and the layer-0 caches the
  compiled KV store wrote are the interpreter's rows up to one rounding step on a few elements: storing a row to
  f16 or q8_0 is discontinuous, so rows that differ in their last bit may round one step apart (the store kernel
  itself is bit-exact, tests/test_flash_attn.py), and later layers see those steps in their inputs.
- Greedy ids equal the fixture references, and speculation on ≡ off, for each type. Measured on all 9 prompts
  (`slow` sweep): glm4moe f16 9/9, q8_0 9/9, bf16 7/9; glm-dsa f16 8/9, q8_0 7/9; glm5next f16 9/9, q8_0 9/9
  (its latent and indexer rows take -ctk; its KDA states stay float32). Every divergence is at a near
  tie of the float32 reference (top-2 logit gap 4.5e-5 .. 8.3e-4 of max |logit|: glm-dsa code-module step 12,
  code-class step 27; glm4moe code-class step 33, docs-prose step 43); spec on ≡ off holds on all 9 for every type.
- The CLI: `nextn run MODEL.gguf -ctk q8_0` compiles and caches an artifact for those types; an artifact asked for
  other types gives one line.
"""
from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from conftest import FIXTURES, G4, dequantized, reference, zero_states

import nextn.runtime as rt
from nextn.common.compare import rel_err
from nextn.common.errors import NextnError
from nextn.common.kv_types import KV_TYPES
from nextn.compiler.ir import Graph, interpret

DSA = FIXTURES / "tiny-glm-dsa"
MODELS = {"glm4moe": G4 / "tiny-glm4moe-BF16.gguf", "glm-dsa": DSA / "tiny-glm-dsa-BF16.gguf",
          "glm5next": FIXTURES / "tiny-glm5next" / "tiny-glm5next-BF16.gguf"}
CASES = [("glm4moe", "f16"), ("glm4moe", "q8_0"), ("glm4moe", "bf16"), ("glm-dsa", "f16"), ("glm-dsa", "q8_0"),
         ("glm5next", "f16"), ("glm5next", "q8_0")]
# Prompts whose greedy continuation equals the reference with that KV type (all 9 kinds: the slow sweep)
AGREE = {("glm4moe", "f16"): 9, ("glm4moe", "q8_0"): 9, ("glm4moe", "bf16"): 7, ("glm-dsa", "f16"): 8,
         ("glm-dsa", "q8_0"): 7, ("glm5next", "f16"): 9, ("glm5next", "q8_0"): 9}
DIVERGE = {("glm4moe", "bf16"): {"code-class": 33, "docs-prose": 43}, ("glm-dsa", "f16"): {"code-module": 12},
           ("glm-dsa", "q8_0"): {"code-module": 12, "code-class": 27}}
QUICK = ["code-short", "docs-heading", "one-token"]


@pytest.fixture(scope="module")
def artifact(compiled):
    """artifact(arch, kv) -> the BF16 fixture compiled with -ctk kv -ctv kv (the shared `compiled` fixture)."""
    return lambda arch, kv: compiled(f"{arch}-bf16-kv_{kv}", MODELS[arch], kv=kv)


def decoded(seq) -> dict:
    """Every state buffer of `seq` as float32 values (q8_0 through gguf-py's dequantize)."""
    kc = seq.model.artifact.manifest["kv_cache"]["caches"]
    out = {}
    for name, buf in seq.states.items():
        a = buf.numpy()
        if kc.get(name) == "q8_0":
            out[name] = gguf.quants.dequantize(a.reshape(a.shape[0], -1), gguf.GGMLQuantizationType.Q8_0).reshape(
                *a.shape[:-1], -1)
        else:
            out[name] = a.astype(np.float32)
    return out


def one_step(kv: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The largest difference a single rounding step of `kv` makes around values a, b (elementwise bound)."""
    m = np.maximum(np.abs(a), np.abs(b))
    if kv == "f16":
        return np.spacing(m.astype(np.float16)).astype(np.float32)
    if kv == "bf16":
        return m * np.float32(2.0 ** -7)
    blocks = m.reshape(*m.shape[:-1], -1, 32)        # q8_0: one quant (d = amax / 127) of the block, both ways
    return np.repeat(blocks.max(-1) / np.float32(127) * np.float32(1.01), 32, axis=-1).reshape(m.shape)


def assert_rows_close(kv, got: dict, want: dict, n: int, caches):
    """The first KV layer's caches (layer 0; glm5next: its first MLA layer, after KDA layers whose float32
    rounding both sides share up to ~1e-6): rows computed from the same inputs on both sides, while deeper layers
    see earlier flips. Bound per element: one rounding step of `kv`, plus the float32 difference of the two
    computations before the store (1e-6 of the row's max |value|): the x86 matmuls sum in another order than the
    interpreter, and a value near zero (f16's subnormal range, spacing 6e-8) can then round a step further."""
    first = min(int(name.split(".")[-1]) for name in caches if not name.startswith("nextn."))
    diff_total, size = 0, 0
    for name, w in want.items():
        if name not in caches or name.startswith("nextn.") or int(name.split(".")[-1]) != first:
            continue
        g = got[name][:n]
        d = np.abs(g - w[:n])
        f32 = np.float32(1e-6) * np.abs(w[:n]).max(axis=-1, keepdims=True)
        assert (d <= one_step(kv, g, w[:n]) + f32).all(), name
        diff_total += int((d > 0).sum())
        size += d.size
    assert diff_total <= 0.01 * size, (diff_total, size)


@pytest.mark.parametrize("arch,kv", [("glm4moe", "f16"), ("glm4moe", "q8_0"), ("glm-dsa", "q8_0"), ("glm-dsa", "bf16"),
                                     ("glm5next", "q8_0")])
@pytest.mark.e2e
def test_compiled_vs_ir_on_the_same_cache(arch, kv, artifact):
    """prefill, verify, mtp_rows and a draft step against the interpreter reading the caches the compiled run
    wrote (1e-5, argmax equal); the interpreter's own rows within one rounding step of the compiled ones.
    glm5next: the indexer rows are K caches too (pooled from their stored values); its recurrent states are
    float32 and the interpreter starts from the plane the compiled call started from (which that call keeps)."""
    from nextn.compiler.graphs import build_graphs
    from nextn.compiler.loader.model_files import ModelFiles

    seq = rt.load(artifact(arch, kv), ctx_size=512).sequence
    mf = ModelFiles(MODELS[arch], load_mtp=True)
    graphs, w = build_graphs(mf, True, kv_types=(kv, kv)), dequantized(mf)
    ids = np.asarray(next(p for p in reference(MODELS[arch].parent)["prompts"] if p["kind"] == "code-short")["prompt_ids"],
                     np.int32)
    T = len(ids)

    def plane(graph):   # the committed recurrent plane, as the engine passes it (glm5next)
        return {"rs_plane": np.array([seq.rs_plane], np.int32)} if "rs_plane" in graph.inputs else {}

    own = zero_states(graphs.values(), seq.n_ctx, seq.model.rs_planes)
    interpret.run(graphs["prefill"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32),
                                      "hidden_ids": np.arange(T, dtype=np.int32),
                                      "out_ids": np.array([T - 1], np.int32), **plane(graphs["prefill"])}, w, own, n_kv=T)
    rs = plane(graphs["prefill"])
    h, last, am = seq.prefill(ids, 0)
    st = decoded(seq)
    assert_rows_close(kv, st, own, T, seq.model.artifact.manifest["kv_cache"]["caches"])
    want = interpret.run(graphs["prefill"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32),
                                             "hidden_ids": np.arange(T, dtype=np.int32),
                                             "out_ids": np.array([T - 1], np.int32), **rs}, w, st, n_kv=T, keep_kv=True)
    assert rel_err(h, want["hidden"]) < 1e-5 and rel_err(last, want["logits"][0]) < 1e-5 and am == want["argmax"][0]
    rows = np.array([am, 17, 99], np.int32)
    rs = plane(graphs["verify"])
    _h, lg, amv = seq.verify(rows, T)
    st = decoded(seq)
    want = interpret.run(graphs["verify"], {"tokens": rows, "pos": np.arange(T, T + 3, dtype=np.int32), **rs}, w, st,
                         n_kv=T + 3, keep_kv=True)
    assert rel_err(lg.numpy(), want["logits"]) < 1e-5 and (amv == want["argmax"]).all()
    h_prev = np.random.default_rng(0).standard_normal((T, seq.model.hparams["n_embd"])).astype(np.float32)
    got = seq.mtp_rows(ids, h_prev, 0)
    st = decoded(seq)
    want = interpret.run(graphs["mtp_rows"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32), "h_prev": h_prev,
                                              "out_ids": np.array([T - 1], np.int32)}, w, st, n_kv=T, keep_kv=True)
    assert rel_err(got, want["h_nextn"]) < 1e-5
    hd, lg, am = seq.mtp_draft(ids[:1], got[-1:], T)
    st = decoded(seq)
    want = interpret.run(graphs["mtp_draft"], {"tokens": ids[:1], "pos": np.array([T], np.int32), "h_prev": got[-1:],
                                               "out_ids": np.array([0], np.int32)}, w, st, n_kv=T + 1, keep_kv=True)
    assert rel_err(hd, want["h_nextn"]) < 1e-5 and rel_err(lg.numpy(), want["logits"]) < 1e-5 and am[0] == want["argmax"][0]


def expected_bytes_per_token(arch: str, c, kv: str) -> dict:
    """Bytes per context cell counted from the config: K and V rows per layer (glm4moe), the latent row and the
    indexer key row on full layers, and the stored DSA selection (4 bytes) of the NextN block (glm-dsa)."""
    row = KV_TYPES[kv].row_bytes
    if arch == "glm4moe":
        per_layer = 2 * c.n_head_kv * row(c.head_dim)
        return {"trunk": c.n_layer * per_layer, "nextn": per_layer}
    if arch == "glm5next":   # MLA layers: latent, indexer key and gate rows (K type), a float32 pooled key per kpool
        mla = row(c.kv_lora) + 2 * row(c.idx_hd) + c.idx_hd * 4 // c.idx_kpool
        return {"trunk": sum(k == 1 for k in c.layer_kinds) * mla, "nextn": mla + 4}   # 1: MLA (glm5next.config)
    trunk = c.n_layer * row(c.kv_lora + c.n_rot) + sum(c.idx_full) * row(c.idx_hd)
    return {"trunk": trunk, "nextn": row(c.kv_lora + c.n_rot) + row(c.idx_hd) + 4}


@pytest.mark.e2e
@pytest.mark.parametrize("arch,kv", CASES)
def test_manifest_types_and_bytes_per_token(arch, kv, artifact):
    from nextn.compiler.loader.model_files import ModelFiles

    m = rt.load(artifact(arch, kv), ctx_size=300)
    kc = m.loaded.artifact.manifest["kv_cache"]
    assert (kc["type_k"], kc["type_v"]) == (kv, kv)
    c = ModelFiles(MODELS[arch]).config
    want = expected_bytes_per_token(arch, c, kv)
    assert kc["bytes_per_token"] == {**want, "total": want["trunk"] + want["nextn"]}
    assert set(kc["caches"].values()) == {kv}
    # what the engine allocated: every state buffer, whose cells are each `bytes_per_token`, plus the float32
    # recurrent states (glm5next), one plane per draft row + 2
    rec = kc["recurrent_bytes_per_plane"] * m.loaded.rs_planes
    assert m.sequence.kv_bytes == 300 * kc["bytes_per_token"]["total"] + rec
    assert (rec > 0) == (arch == "glm5next") and m.sequence.kv_cache["recurrent_bytes"] == rec
    assert {str(s.dtype) for n, s in m.sequence.states.items() if n in kc["caches"]} == {KV_TYPES[kv].storage_dtype}


def check_greedy(m, p, depths=(1, 3), agree=True):
    plain = m.generate(p["prompt_ids"], p["n_predict"], spec_type="none", ignore_eos=True)
    if agree:
        assert plain.ids == p["greedy_ids"], p["kind"]
    for n in depths:
        r = m.generate(p["prompt_ids"], p["n_predict"], spec_type="draft-mtp", n_max=n, ignore_eos=True)
        assert r.ids == plain.ids and r.stats.drafted > 0, (p["kind"], n)
    return plain.ids


@pytest.mark.e2e
@pytest.mark.parametrize("arch,kv", CASES)
def test_greedy_equals_reference_and_spec_on_equals_off(arch, kv, artifact):
    m = rt.load(artifact(arch, kv), ctx_size=1024)
    for p in reference(MODELS[arch].parent)["prompts"]:
        if p["kind"] in QUICK:
            check_greedy(m, p)


@pytest.mark.slow
@pytest.mark.parametrize("arch,kv", CASES)
def test_greedy_sweep_all_prompts(arch, kv, artifact):
    """All 9 prompt kinds: greedy = reference on AGREE[arch, kv] of them; the others match it up to the step
    DIVERGE names (a near tie of the reference) and differ there; speculation (n_max 3) on ≡ off on all 9."""
    m = rt.load(artifact(arch, kv), ctx_size=4096)
    agree = 0
    for p in reference(MODELS[arch].parent)["prompts"]:
        step = DIVERGE.get((arch, kv), {}).get(p["kind"])
        ids = check_greedy(m, p, (3,), agree=step is None)
        if step is None:
            agree += 1
        else:
            assert ids[:step] == p["greedy_ids"][:step] and ids[step] != p["greedy_ids"][step]
    assert agree == AGREE[arch, kv]


def test_q8_0_needs_rows_of_whole_blocks():
    g = Graph("x")
    g.kv_state("k.0", ("C", 2, 48), "k")
    g.kv_state("v.0", ("C", 2, 48), "v")
    g.set_kv_types("f16", "bf16")
    assert g.kv_types() == {"k.0": "f16", "v.0": "bf16"}
    with pytest.raises(NextnError, match="q8_0 .*blocks of 32.*'v.0' has rows of 48"):
        g.set_kv_types("f16", "q8_0")
    with pytest.raises(NextnError, match="--cache-type-k q4_0: expected one of f32, f16, bf16, q8_0"):
        g.set_kv_types("q4_0", "f16")


def nextn(*args):
    r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.e2e
def test_cli_run_gguf_with_types_and_refused_artifact(tmp_path):
    """`run MODEL.gguf -ctk q8_0 -ctv q8_0` uses (compiles and caches) the artifact of those types and --json says
    so; `run ARTIFACT -ctk f16` on that artifact, and an unknown type, give one line. The one compile of the suite
    outside `compiled` besides test_split_gguf's: what is tested is the CLI finding the user's compile cache entry."""
    from nextn.compiler import entry

    # the same cache entry the CLI resolves the GGUF to
    art = entry.compiled_artifact(str(MODELS["glm4moe"]), entry.CompileOptions(cache_type_k="q8_0",
                                                                               cache_type_v="q8_0"))
    rc, out, err = nextn("run", MODELS["glm4moe"], "-p", "def f(x):", "-n", "4", "-ctk", "q8_0", "-ctv", "q8_0",
                         "--json", "--spec-type", "none", "-c", "256")
    assert rc == 0, err
    kc = json.loads(out)["kv_cache"]
    assert (kc["type_k"], kc["type_v"], kc["n_ctx"]) == ("q8_0", "q8_0", 256)
    assert kc["bytes"] == 256 * kc["bytes_per_token"]["trunk"]   # speculation off: no NextN cache allocated
    assert "compiling" not in err   # the cached artifact, no second compile
    rc, _, err = nextn("run", art, "-p", "x", "-n", "1", "-ctk", "f16")
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and "compiled with KV cache types -ctk q8_0 -ctv q8_0" in lines[0] \
        and "--cache-type-k f16" in lines[0], err
    rc, _, err = nextn("run", art, "-p", "x", "-n", "1", "-ctv", "q4_0")
    assert rc != 0 and "Traceback" not in err and "q4_0" in err


@pytest.mark.e2e
@pytest.mark.parametrize("arch", ["glm4moe", "glm-dsa"])
def test_kv_bytes_bench_counts_as_the_manifest(arch, artifact, tmp_path):
    """bench/kv_bytes.py (the manifest's accounting over graphs rebuilt for N layers, no compile): at the file's
    layer count it equals the compiled manifest; at 3x the layers (and GLM-5.2's indexer pattern) the count from
    the config."""
    import dataclasses
    from pathlib import Path

    from nextn.compiler.loader.model_files import ModelFiles

    script = Path(__file__).resolve().parents[1] / "bench" / "kv_bytes.py"
    c = ModelFiles(MODELS[arch]).config

    def rows(*args):
        out = tmp_path / "kv.json"
        r = subprocess.run([sys.executable, str(script), str(MODELS[arch]), "--json", str(out), *map(str, args)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return {row["type"]: row for row in json.loads(out.read_text())["rows"]}

    want = artifact(arch, "q8_0")
    with open(Path(want) / "manifest.json") as f:
        kc = json.load(f)["kv_cache"]["bytes_per_token"]
    got = rows()["q8_0"]
    assert {k: got[k] for k in kc} == kc
    n = 3 * c.n_layer
    variants = [((), {"n_layer": n})]
    if arch == "glm-dsa":
        variants = [((), {"n_layer": n, "idx_full": [c.idx_full[min(i, c.n_layer - 1)] for i in range(n)]}),
                    (("--indexer", "glm52"), {"n_layer": n, "idx_full": [int(i < 3 or i % 4 == 2) for i in range(n)]})]
    for extra, over in variants:
        got = rows("--layers", n, *extra)
        for kv in KV_TYPES:
            w = expected_bytes_per_token(arch, dataclasses.replace(c, **over), kv)
            assert (got[kv]["trunk"], got[kv]["nextn"]) == (w["trunk"], w["nextn"]), (extra, kv)
