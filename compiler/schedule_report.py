"""Which GPU schedule rule took each fused PrimFunc (schedules/gpu.py records it while it schedules).

    python -m nextn.compiler.schedule_report MODEL.gguf [--target cuda|rocm] [--arch sm_90] [--json]

prints the PrimFunc → rule table without code generation; `nextn compile --dump-ir DIR` on a GPU target writes
the same table as DIR/schedule_report.json.
"""
from __future__ import annotations

import json


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

    ap = argparse.ArgumentParser(description="List which dlight rule schedules each fused PrimFunc (no codegen).")
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
    rep = last_report()
    if a.json:
        print(json.dumps(rep, indent=1))
    else:
        for k in sorted(rep):
            print(f"{k:48s} {rep[k]}")
        print("counts:", dict(collections.Counter(rep.values())))


if __name__ == "__main__":
    main()
