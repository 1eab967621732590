"""Mark the one-row and few-row entry points for CUDA graph capture (TVM Relax `RewriteCUDAGraph`).

A decode or draft step of a large MoE model is hundreds to thousands of kernel launches; replaying them as one
CUDA graph removes the per-launch CPU cost. TVM's pass lifts the static-shape regions of a function into
`vm.builtin.cuda_graph.run_or_capture`, which captures a region once per value of its symbolic sizes and then
replays it. Two things make a whole step one region:

- `num_input = 0`: every parameter counts as static, i.e. at the same address on every call. The weights and
  the KV buffers are; the runtime keeps one buffer per input (tokens, pos, h_prev) and writes into it
  (`Engine.static_inputs`, from the manifest's `cuda_graph.entries`).
- `relax.rewrite_cuda_graph.capture_symbolic_vars = [L, C]`: regions whose shapes use the KV length `L` or the
  context `C` may be captured, one graph per (L, C). The runtime rounds L up to `KV_BUCKET` cells (attention
  masks cells after each row's position), so a context of n cells needs at most n / KV_BUCKET graphs per entry.
- `tir_var_upper_bound = {L: max_ctx, C: max_ctx}`: L-sized intermediates (glm-dsa's index scores and
  selection mask) get static storage, planned for max_ctx cells, instead of splitting the step; the runtime
  refuses a larger context for such an artifact.
- The few-row entries (`graphs.FEW_ROWS`: verify, a draft step 0 with its NextN gap) add their row symbols (T, and
  R for `out_ids`) to both: one graph per (rows, L, C), their intermediates planned for `max_rows` rows. The
  runtime keeps one input buffer per (entry, shapes), so a row count's graph always finds its inputs at the same
  addresses, and refuses more rows than `max_rows` for such an artifact.

Only for CUDA: with another target the VM would look for the CUDA graph builtins and fail to load.
"""
from __future__ import annotations

from tvm import relax

KV_BUCKET = 256
PASS_CONFIG = {"relax.backend.use_cuda_graph": True}


def mark(mod, max_ctx: int, entries, few_rows: dict | None = None, max_rows: int = 1):
    """`mod` with the capture attributes on the Relax functions named in `entries` (the static one-row steps,
    graphs.STATIC) or in `few_rows` (name -> its row symbols, graphs.FEW_ROWS; calls of at most `max_rows` rows),
    for contexts up to `max_ctx` cells; returns (mod, the names present in `mod`)."""
    import tvm

    few_rows = few_rows or {}
    funcs, marked = {}, []
    for gv, f in mod.functions.items():
        name = gv.name_hint
        if isinstance(f, relax.Function) and (name in entries or name in few_rows):
            rows = list(few_rows.get(name, ()))
            f = (f.with_attr("num_input", 0)
                  .with_attr("relax.rewrite_cuda_graph.capture_symbolic_vars", ["L", "C", *rows])
                  .with_attr("tir_var_upper_bound", {"L": max_ctx, "C": max_ctx, **{r: max_rows for r in rows}}))
            marked.append(name)
        funcs[gv] = f
    return tvm.IRModule(funcs, attrs=mod.attrs), sorted(marked)


def rewrite():
    """The pass, to run after StaticPlanBlockMemory (it captures planned storage) with PASS_CONFIG set."""
    return relax.transform.RewriteCUDAGraph()
