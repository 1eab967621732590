"""The IR graph of every entry point of a model (fixed names; the runtime never contains model-specific code):

    prefill    trunk over the prompt rows; hidden for `hidden_ids` rows (the last layer's FFN runs on those only),
               logits for `out_ids` rows of those
    verify     trunk over [id_last, d1..dk] (k+1 rows); logits and argmax for every row
    mtp_rows   NextN rows teacher-forced with trunk hidden states (prompt warm-up, after each verify)
    mtp_draft  NextN rows with logits for every row (`mtp_logits` uses T rows)
    decode     `verify` specialised to one row (plain decoding): static shapes, fewer VM shape checks, tunable
    draft      `mtp_draft` specialised to one row (a draft step)
plus an arch's extra entry points (glm-dsa: `mtp_draft_shared`).
"""
from __future__ import annotations

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
# or thread blocks. It computes the same bits as the fused form (lower/flash_attn.py); verify and decode, whose
# rows must agree bit for bit for speculation on ≡ off, also run the very same kernels.
SPLIT_L = frozenset({"verify", "decode", "mtp_draft", "draft", "mtp_draft_shared"})


# Ops whose first input, when a weight, is read through its format's element expression (te_ops._elem) or the
# x86 kernels: a weight only ever used there may stay 16-bit (F16 / BF16) in memory.
ELEMENT_READERS = ("mul_mat", "mul_mat_id", "get_rows")


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
        for name in g.weights:
            fmt = by_ggml_type(mf.file_of(name).tensor_type(name))
            kinds[name] = "f32" if fmt is None or (fmt.dtype != "uint8" and name in elementwise) else fmt.kind
    return kinds


def build_graphs(mf: ModelFiles, with_mtp: bool, options: dict | None = None, kv_types: tuple | None = None):
    """Graphs of every entry point; `options` are compile options (e.g. mtp_dense_attention), passed to the
    arch's builders that declare them (ModelSpec.compile_options). Each graph's `kind` is "trunk" or "mtp".
    `kv_types` = (type_k, type_v) of the KV caches (nextn.common.kv_types; default f32, f32). Raises NextnError
    for a type a cache's rows do not fit."""
    spec, c = mf.spec, mf.config
    opts = {k: v for k, v in (options or {}).items() if k in spec.compile_options}
    graphs = {}
    for name, (kind, all_rows) in ENTRY_POINTS.items():
        if kind == "mtp" and not with_mtp:
            continue
        g = spec.build_trunk(c, mf.has_tensor, all_rows) if kind == "trunk" else spec.build_mtp(c, mf.has_tensor, all_rows, **opts)
        g.name, g.kind = name, kind
        graphs[name] = g
    if spec.extra_entry_points is not None:
        for name, (kind, g) in spec.extra_entry_points(c, mf.has_tensor, **opts).items():
            if kind == "mtp" and not with_mtp:
                continue
            g.name, g.kind = name, kind
            graphs[name] = g
    for g in graphs.values():
        g.set_kv_types(*(kv_types or ("f32", "f32")))
    return graphs
