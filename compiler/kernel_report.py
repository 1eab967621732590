"""Per GPU kernel of a scheduled module: its schedule rule, the weight bytes it is passed and its launch shape (grid ×
block). Read by `python -m nextn.compiler.schedule_report` and written by `nextn compile --dump-ir DIR` as
DIR/kernel_report.json (compiler/lower/pipeline.py)."""
from __future__ import annotations


def weight_bytes(mod) -> dict[str, int]:
    """PrimFunc name → bytes of the weight buffers its calls are passed (the Relax functions' `weights` tuple items;
    most over its call sites). A buffer's whole size: `get_rows` reads T rows of its table, `mul_mat_id` the selected
    experts only."""
    import numpy as np
    from tvm import relax

    out: dict[str, int] = {}
    call_tir = {"relax.call_tir", "relax.call_tir_inplace"}
    for _gv, fn in mod.functions.items():
        if not isinstance(fn, relax.Function):
            continue
        wparam = [p for p in fn.params if p.name == "weights"]
        if not wparam:
            continue
        weights: dict = {}   # name → the weights item's Var (Relax vars compare as expressions, not in a set)
        for block in fn.body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, relax.TupleGetItem) and v.tuple_value.same_as(wparam[0]):
                    weights[b.var.name] = b.var
                elif isinstance(v, relax.Call) and getattr(v.op, "name", None) in call_tir:
                    args = v.args[1].fields if isinstance(v.args[1], relax.Tuple) else [v.args[1]]
                    n = sum(int(np.prod([int(d) for d in a.ty.shape.values])) * np.dtype(str(a.ty.dtype)).itemsize
                            for a in args if getattr(a, "name", None) in weights and a.same_as(weights[a.name]))
                    name = v.args[0].name_hint
                    out[name] = max(out.get(name, 0), n)
    return out


def kernel_report(mod, rules: dict[str, str]) -> dict[str, dict]:
    """PrimFunc name → {"rule", "launches": [{"grid", "block", "blocks_at_1", "threads"}], "weight_bytes"} for the
    scheduled module `mod` (after the schedule phase) and the rules ScheduleGPU recorded."""
    from tvm import tirx

    from nextn.schedules.gpu_bound import extent_at, launches

    wb = weight_bytes(mod)
    out = {}
    for gv, fn in mod.functions.items():
        if not isinstance(fn, tirx.PrimFunc):
            continue
        ls = launches(fn)
        for ln in ls:
            grid = [extent_at(g) for g in ln["grid"]]
            block = [extent_at(b) for b in ln["block"]]
            ln["blocks_at_1"] = None if None in grid else grid[0] * grid[1] * grid[2]
            ln["threads"] = None if None in block else block[0] * block[1] * block[2]
        out[gv.name_hint] = {"rule": rules.get(gv.name_hint), "launches": ls, "weight_bytes": wb.get(gv.name_hint, 0)}
    return out


def shape_text(launch: dict) -> str:
    """`grid (T * 256) × block 256` with unit dimensions left out."""
    def dims(d):
        kept = [x for x in d if x != "1"] or ["1"]
        return " × ".join(f"({x})" if len(kept) > 1 and not x.isdigit() else x for x in kept)

    return f"grid {dims(launch['grid'])} × block {dims(launch['block'])}"


def launch_text(launch: dict) -> str:
    """`grid 64 × ((T + 3) // 4) × block 32 × 4 (T=1: 64 × 128)`: the launch shape and its blocks × threads at
    T = L = 1 (a decode step)."""
    return f"{shape_text(launch)} (T=1: {launch['blocks_at_1']} × {launch['threads']})"


def kernel_summary(report: dict[str, dict]) -> dict[str, dict]:
    """The manifest's per-kernel record (`gpu_kernels.kernels`) of a `kernel_report`: PrimFunc name → {"rule",
    "weight_bytes", "launches": [`launch_text`, one per kernel launch]}, so that a GPU artifact states each kernel's
    schedule rule, the weight bytes it is passed and its launch shape (a one-block-per-output-element schedule reads
    as `grid (R * 8192) × block 256`) without a GPU or a rebuild."""
    return {k: {"rule": r["rule"], "weight_bytes": r["weight_bytes"],
                "launches": [launch_text(ln) for ln in r["launches"]]} for k, r in sorted(report.items())}
