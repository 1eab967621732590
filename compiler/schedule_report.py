"""Per GPU kernel: which schedule rule took it (schedules/gpu.py records it while it schedules), the weight bytes it is
passed, and its launch shape (grid × block), so a one-block-per-output-element schedule shows without a GPU.

    python -m nextn.compiler.schedule_report MODEL.gguf [--target cuda|rocm] [--arch sm_90] [--json]

prints the PrimFunc → rule, grid × block (extents as expressions of T, L, ...; and their value at T = L = 1, a
decode step), weight MB table without code generation; `nextn compile --dump-ir DIR` on a GPU target writes the rule
table as DIR/schedule_report.json and the full report (`kernel_report`) as DIR/kernel_report.json.
"""
from __future__ import annotations

import json

from .kernel_report import kernel_report, launch_text


def main(argv=None):
    import argparse
    import collections

    import tvm

    from nextn.common.compile_options import parse_arches
    from nextn.schedules.gpu import ScheduleGPU, last_report

    from .graphs import MANY_ROWS, SPLIT_L, build_graphs, weight_kinds
    from .target import make_target
    from .loader.model_files import ModelFiles
    from .lower import cuda
    from .lower.pipeline import phases
    from .lower.to_relax import build_module

    ap = argparse.ArgumentParser(description="Per fused PrimFunc: its GPU schedule rule, launch shape and weight "
                                             "bytes (no codegen).")
    ap.add_argument("model")
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--exact-matmul", action="store_true", help="float activations (the matmuls' float route)")
    a = ap.parse_args(argv)
    mf = ModelFiles(a.model, None, load_mtp=False)
    graphs = build_graphs(mf, mf.has_nextn)
    kinds = weight_kinds(mf, graphs.values())
    tgt = make_target(a.target, [a.arch] if a.arch else None)
    gpu_int8 = None if a.exact_matmul else "cuda" if cuda.int8.has_dot4(tgt) else "plain"   # as compile.plan
    mod = build_module(list(graphs.values()), kinds, form="gpu", split_l=SPLIT_L, gpu_int8=gpu_int8,
                       mma=a.target == "cuda" and cuda.mma.has_mma(parse_arches("cuda", [a.arch] if a.arch else None)),
                       many_rows=MANY_ROWS)
    with tgt:
        for _name, passes in phases(tgt, ScheduleGPU(tgt, cuda.RULES))[:3]:
            mod = tvm.transform.Sequential(passes)(mod)
    rep = kernel_report(mod, last_report())
    if a.json:
        print(json.dumps(rep, indent=1))
        return
    for k in sorted(rep):
        r = rep[k]
        shapes = "; ".join(launch_text(ln) for ln in r["launches"])
        print(f"{k:48s} {r['rule'] or '-':20s} {r['weight_bytes'] / 1e6:9.3f} MB  {shapes}")
    print("counts:", dict(collections.Counter(r["rule"] for r in rep.values())))


if __name__ == "__main__":
    main()
