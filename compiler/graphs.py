"""The IR graph of every entry point of a model (fixed names; the runtime never contains model-specific code):

    prefill    trunk over the prompt rows; hidden for `hidden_ids` rows (the last layer's FFN runs on those only),
               logits for `out_ids` rows of those
    verify     trunk over [id_last, d1..dk] (k+1 rows); logits and argmax for every row
    mtp_rows   NextN rows teacher-forced with trunk hidden states (prompt warm-up, after each verify)
    mtp_draft  NextN rows (h_nextn for every row) with logits and argmax for its `out_ids` rows (`select_head_rows`):
               a draft step 0 with the NextN gap asks for its last row only
    decode     `verify` specialised to one row (plain decoding): static shapes, fewer VM shape checks, tunable
    draft      `mtp_draft` specialised to one row (a draft step)
plus an arch's extra entry points (glm-dsa: `mtp_draft_shared`), and with the compile option `draft_vocab` N
(`--spec-draft-vocab N`) a copy of each drafting entry (`mtp_draft`, `draft`, `mtp_draft_shared`) named with the
suffix `_vocab` whose head multiplies only N token rows (`reduce_head`).
"""
from __future__ import annotations

from nextn.common.errors import NextnError

from .loader.model_files import ModelFiles

ENTRY_POINTS = {
    "prefill": ("trunk", False),
    "verify": ("trunk", True),
    "mtp_rows": ("mtp", False),
    "mtp_draft": ("mtp", True),
    "decode": ("trunk", True),
    "draft": ("mtp", True),
}
# Entry points whose symbols are fixed at compile time; the runtime routes one-row calls to them.
STATIC = {"decode": {"T": 1}, "draft": {"T": 1}, "mtp_draft_shared": {"T": 1}}
# Entry points of few rows (one decode step, a verify pass of k + 1 rows, a draft step) whose attention is split
# over L (flash-decoding: partials per chunk of cells, merged in order), so that a long context spreads over cores
# or thread blocks. It computes the same bits as the fused form (lower/attention/flash_attn.py); verify and decode,
# whose rows must agree bit for bit for speculation on ≡ off, also run the very same kernels.
SPLIT_L = frozenset({"verify", "decode", "mtp_draft", "draft", "mtp_draft_shared"})
# The entries that draft (their `argmax` is the next draft token): with `draft_vocab` each gets a `_vocab` copy.
DRAFTING = ("mtp_draft", "draft", "mtp_draft_shared")
VOCAB_SUFFIX = "_vocab"
for _e in DRAFTING:
    if _e in STATIC:
        STATIC[_e + VOCAB_SUFFIX] = STATIC[_e]
SPLIT_L = SPLIT_L | {e + VOCAB_SUFFIX for e in DRAFTING}
# Entries whose calls carry many rows (a prompt, the NextN rows of its warm-up): on CUDA sm_80+ their GGUF matmuls take
# tensor-core tiles (lower/cuda/mma.py) instead of the decode / verify GEMV; the few-row entries keep the GEMV, so
# verify and decode rows still run the very same kernels. Such an artifact also has a copy of each, named with
# FEW_SUFFIX, that keeps the GEMV: the runtime sends it calls of fewer rows than the tiles pay for (the manifest's
# tensor_core.min_rows).
MANY_ROWS = frozenset({"prefill", "mtp_rows"})
FEW_SUFFIX = "_few"
# Entries of a few rows that CUDA graphs replay too (compiler/lower/capture_graphs.py), one graph per row count: a
# verify of k + 1 rows and a draft step 0 that carries the NextN gap (k <= MAX_DRAFT accepted + id_last rows;
# runtime/speculative.py `Drafter.fuse_rows`). Their row symbols, bounded by `max_rows`. Launched a kernel at a
# time, every round pays each launch's host cost (a verify: ~35 launches per layer at GLM-4.5-Air widths).
FEW_ROWS = {"verify": ("T",), "mtp_draft": ("T", "R")}
FEW_ROWS.update({e + VOCAB_SUFFIX: FEW_ROWS[e] for e in DRAFTING if e in FEW_ROWS})


def max_rows(max_draft: int) -> int:
    """The most rows a `FEW_ROWS` call takes: a draft of `max_draft` tokens verified with id_last, or a draft step 0
    with its gap (at most max_draft accepted tokens + id_last)."""
    return max_draft + 1


# Entries of several rows whose head runs on the `out_ids` rows only (`select_head_rows`); their one-row `STATIC`
# forms (`draft`, `mtp_draft_shared`) have a single row to give and take no `out_ids`.
SELECT_ROWS = frozenset({"mtp_draft", "mtp_draft" + VOCAB_SUFFIX})
# The reduced head's weight: the N rows of the head tensor (node attrs `rows_of`) that the runtime gathers once at
# load, in the order of its input `draft_ids` (runtime/draft_vocab.py ranks the tokens).
DRAFT_HEAD = "draft_vocab.head"


def select_head_rows(g) -> None:
    """Give `g`'s head an input `out_ids` [R] int32 (row indices into the call's T rows): `logits` = W·hs becomes
    W·get_rows(hs, out_ids) [R, n_vocab] and `argmax` [R] follows it; `h_nextn` (and every other output) keeps its
    T rows. The head is where the rows cost: a 151552 x 4096 matmul per row at GLM-4.5-Air's width, so a draft step 0
    that also writes the NextN gap's rows (runtime/speculative.py `Drafter`) asks for its last row alone (llama.cpp's
    `inp_out_ids`: the rows of a batch whose logits are asked for). The same get_rows before the head as `out_ids` in
    glm_base/graph.py `head` (mtp_rows, prefill); per row the same computation. Apply before `reduce_head`, which
    then multiplies the selected rows."""
    logits = g.outputs["logits"]
    w, hs = logits.inputs
    assert logits.op == "mul_mat" and w.op == "weight", logits
    ids = g.input("out_ids", ("R",), "int32")
    picked = g.mul_mat(w, g.get_rows(hs, ids))
    g.outputs["logits"], g.outputs["argmax"] = picked, g.argmax(picked)


def reduce_head(g, n_vocab_draft: int) -> None:
    """FR-Spec's reduced draft head (Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
    Frequency-Ranked Speculative Sampling"; SGLang's speculative token map): replace `g`'s `logits` = W·hs
    (W [n_vocab, E]) by W_r·hs, W_r [N, E] the weight DRAFT_HEAD (W's rows `draft_ids`, int32 [N], an input), and its
    `argmax` by draft_ids[argmax] — a token id of the full vocabulary. Outputs: `logits` [R, N] (the N ranked
    tokens' logits, in draft_ids order), `argmax` [R] int32. Ties go to the first of the N rows, as argmax does."""
    logits = g.outputs["logits"]
    w, hs = logits.inputs
    assert logits.op == "mul_mat" and w.op == "weight", logits
    head_w = g.weight(DRAFT_HEAD, (n_vocab_draft, w.shape[1]))
    head_w.attrs["rows_of"] = w.name
    ids = g.input("draft_ids", (n_vocab_draft,), "int32")
    lr = g.mul_mat(head_w, hs)
    picked = g.get_rows(g.reshape(ids, (n_vocab_draft, 1)), g.argmax(lr))               # [R, 1] int32
    g.outputs["logits"], g.outputs["argmax"] = lr, g.reshape(picked, (picked.shape[0],))
    if not any(w in n.inputs for n in g.live_nodes()):     # the full head is no longer read
        del g.weights[w.name]


# Ops whose first input, when a weight, is read through its format's element expression (te_ops._elem) or the
# x86 kernels: a weight only ever used there may stay 16-bit (F16 / BF16) in memory.
ELEMENT_READERS = ("mul_mat", "mul_mat_id", "get_rows")


MATMULS = ("mul_mat", "mul_mat_id")
SCALE_SUFFIX = ".scale"


def scale_of(weight: str) -> str | None:
    """The GGUF name of weight `X.weight`'s second-level scale, `X.scale` (None for a name without `.weight`)."""
    return weight[:-len(".weight")] + SCALE_SUFFIX if weight.endswith(".weight") else None


def apply_weight_scales(mf: ModelFiles, graphs) -> None:
    """NVFP4's per-tensor second scale: where the files hold `X.scale` next to a matmul weight `X.weight` (float,
    shape [1]; [n_expert] for a `mul_mat_id` weight [X, N, K]), the matmul's output is multiplied by it, per
    expert through the selected ids for `mul_mat_id`: llama.cpp `build_lora_mm(w, cur, w_s)` /
    `build_lora_mm_id(w, cur, ids, w_s)` (src/llama-graph.cpp), which `build_ffn` / `build_moe_ffn` /
    `build_attn` apply with the `*_s` tensors the loader's generic pass reads (src/llama-model.cpp: `ffn_up_exps_s`
    = `blk.N.ffn_up_exps.scale` …). convert_hf_to_gguf.py writes ModelOpt's `weight_scale_2` there and leaves it
    out when it is 1, so a weight without one is scaled by 1, as in llama.cpp. nextn applies a scale wherever such a
    weight is a matmul weight (glm4moe's FFN included, whose llama.cpp graph passes no FFN scales: the model's
    definition, as the fixtures' references follow it). `X.input_scale` (the activation scale of FP4 tensor-core
    kernels) changes no float value and is not read. Raises NextnError naming the tensor for a scale of a
    weight some op reads other than as a matmul weight (an embedding table), or of the wrong shape."""
    from nextn.common.errors import NextnError

    other: dict[str, str] = {}     # weight → an op that reads it other than as a matmul's weight
    for g in graphs:
        for n in g.live_nodes():
            for i, src in enumerate(n.inputs):
                if src.op == "weight" and not (i == 0 and n.op in MATMULS):
                    other.setdefault(src.attrs.get("rows_of", src.name), n.op)
    for name, op in sorted(other.items()):
        s = scale_of(name)
        if s is not None and mf.has_tensor(s):
            raise NextnError(f"{mf.file_of(s).path}: tensor '{s}' scales '{name}', which {op} reads (not a "
                             f"matmul): nextn applies a '.scale' only to matmul outputs")
    for g in graphs:
        for n in g.live_nodes():
            if n.op not in MATMULS or n.inputs[0].op != "weight":
                continue
            w = n.inputs[0]
            name = w.attrs.get("rows_of", w.name)    # the reduced draft head: its source tensor's scale
            s = scale_of(name)
            if s is None or not mf.has_tensor(s):
                continue
            per_expert = n.op == "mul_mat_id"
            shape = (w.shape[0],) if per_expert else (1,)
            f = mf.file_of(s)
            f.check_tensor(s, shape)
            if f.tensor_type(s) not in ("F32", "F16", "BF16"):
                raise NextnError(f"{f.path_of(s)}: tensor '{s}' (the second-level scale of '{name}') has type "
                                 f"{f.tensor_type(s)}, expected F32")
            if per_expert:
                ids = n.inputs[2]
                g.splice_after(n, lambda y: g.mul(y, g.get_rows(g.reshape(g.weight(s, shape), (shape[0], 1)), ids)))
            else:
                g.splice_after(n, lambda y: g.mul(y, g.weight(s, shape)))


def weight_kinds(mf: ModelFiles, graphs) -> dict[str, str]:
    """Buffer-plan kind of every weight of `graphs`: its GGUF format's kind (the file's bytes; nextn.common.quant),
    or "f32" for F32 tensors and for F16 / BF16 tensors that some op reads other than as a matmul / embedding
    weight (norms, biases: widened to float32 at load, a few KB)."""
    from nextn.common.quant import by_ggml_type

    elementwise = set()
    for g in graphs:
        for n in g.live_nodes():
            for i, src in enumerate(n.inputs):
                if src.op == "weight" and not (i == 0 and n.op in ELEMENT_READERS):
                    elementwise.add(src.name)
    kinds = {}
    for g in graphs:
        for name, node in g.weights.items():
            src = node.attrs.get("rows_of", name)      # a gathered head: its source tensor's format
            fmt = by_ggml_type(mf.file_of(src).tensor_type(src))
            kinds[name] = "f32" if fmt is None or (fmt.dtype != "uint8" and name in elementwise) else fmt.kind
    return kinds


def build_graphs(mf: ModelFiles, with_mtp: bool, options: dict | None = None, kv_types: tuple | None = None,
                 few_rows: bool = False):
    """Graphs of every entry point; `options` are compile options (e.g. mtp_dense_attention), passed to the
    arch's builders that declare them (ModelSpec.compile_options). Each graph's `kind` is "trunk" or "mtp".
    `kv_types` = (type_k, type_v) of the KV caches (nextn.common.kv_types; default f32, f32). Raises NextnError
    for a type a cache's rows do not fit. The option `draft_vocab` N (0 < N < n_vocab; 0 or absent: none) adds the
    `_vocab` copies of the DRAFTING entries (`reduce_head`); NextnError for an N outside that range. `few_rows`:
    also the FEW_SUFFIX copies of the MANY_ROWS entries."""
    spec, c = mf.spec, mf.config
    opts = {k: v for k, v in (options or {}).items() if k in spec.compile_options}
    n_draft = int((options or {}).get("draft_vocab") or 0)
    if n_draft and not 0 < n_draft < c.n_vocab:
        raise NextnError(f"--spec-draft-vocab {n_draft}: expected 0 < N < {c.n_vocab} (the model's vocabulary)")
    def entry(name):   # entry point `name`'s graph, built afresh (graphs are not shared)
        kind, all_rows = ENTRY_POINTS[name]
        return spec.build_trunk(c, mf.has_tensor, all_rows) if kind == "trunk" else \
            spec.build_mtp(c, mf.has_tensor, all_rows, **opts)

    graphs = {}
    for name, (kind, all_rows) in ENTRY_POINTS.items():
        if kind == "mtp" and not with_mtp:
            continue
        g = entry(name)
        g.name, g.kind = name, kind
        if name in SELECT_ROWS:
            select_head_rows(g)
        graphs[name] = g
    if spec.extra_entry_points is not None:
        for name, (kind, g) in spec.extra_entry_points(c, mf.has_tensor, **opts).items():
            if kind == "mtp" and not with_mtp:
                continue
            g.name, g.kind = name, kind
            graphs[name] = g
    if n_draft and with_mtp:   # built again from the same builders (graphs are not shared), then the head reduced
        for name in DRAFTING:
            if name not in graphs:
                continue
            g = entry(name) if name in ENTRY_POINTS else spec.extra_entry_points(c, mf.has_tensor, **opts)[name][1]
            if name + VOCAB_SUFFIX in SELECT_ROWS:
                select_head_rows(g)
            reduce_head(g, n_draft)
            g.name, g.kind = name + VOCAB_SUFFIX, "mtp"
            graphs[g.name] = g
    if few_rows:   # the same graphs under another name (lowered with the GEMV: to_relax `many_rows`)
        for name in sorted(MANY_ROWS & set(graphs)):
            g = entry(name)
            g.name, g.kind = name + FEW_SUFFIX, ENTRY_POINTS[name][0]
            graphs[g.name] = g
    apply_weight_scales(mf, graphs.values())
    for g in graphs.values():
        g.set_kv_types(*(kv_types or ("f32", "f32")))
    return graphs
