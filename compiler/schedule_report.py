"""Per GPU kernel: which schedule rule took it (schedules/gpu.py records it while it schedules), the weight bytes it is
passed, and its launch shape (grid × block), so a one-block-per-output-element schedule shows without a GPU.

    python -m nextn.compiler.schedule_report MODEL.gguf [--target cuda|rocm] [--arch sm_90] [--json]

prints the PrimFunc → rule, grid × block (extents as expressions of T, L, ...; and their value at T = L = 1, a
decode step), weight MB table without code generation; `nextn compile --dump-ir DIR` on a GPU target writes the rule
table as DIR/schedule_report.json and the full report (`kernel_report`) as DIR/kernel_report.json.
"""
from __future__ import annotations

import json


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


def main(argv=None):
    import argparse
    import collections

    import tvm

    from nextn.schedules.gpu import ScheduleGPU, last_report

    from .graphs import SPLIT_L, build_graphs, weight_kinds
    from .target import make_target
    from .loader.model_files import ModelFiles
    from .lower.pipeline import phases
    from .lower.to_relax import build_module

    ap = argparse.ArgumentParser(description="Per fused PrimFunc: its GPU schedule rule, launch shape and weight "
                                             "bytes (no codegen).")
    ap.add_argument("model")
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    mf = ModelFiles(a.model, None, load_mtp=False)
    graphs = build_graphs(mf, mf.has_nextn)
    kinds = weight_kinds(mf, graphs.values())
    tgt = make_target(a.target, [a.arch] if a.arch else None)
    mod = build_module(list(graphs.values()), kinds, form="gpu", split_l=SPLIT_L)
    with tgt:
        for _name, passes in phases(tgt, ScheduleGPU(tgt))[:3]:
            mod = tvm.transform.Sequential(passes)(mod)
    rep = kernel_report(mod, last_report())
    if a.json:
        print(json.dumps(rep, indent=1))
        return
    for k in sorted(rep):
        r = rep[k]
        shapes = "; ".join(f"{shape_text(ln)} (T=1: {ln['blocks_at_1']} × {ln['threads']})" for ln in r["launches"])
        print(f"{k:48s} {r['rule'] or '-':20s} {r['weight_bytes'] / 1e6:9.3f} MB  {shapes}")
    print("counts:", dict(collections.Counter(r["rule"] for r in rep.values())))


if __name__ == "__main__":
    main()
