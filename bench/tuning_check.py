"""Does a tuning log keep or improve each x86 kernel it touches? Each of its knob records for this CPU, re-timed
against the default knobs in a fresh process (not the `nextn tune` run that picked it), on the model's shapes.

    flock /work/realwidth/heavy.lock .venv/bin/python bench/tuning_check.py MODEL.gguf LOG [--rounds 5] [--json out.json]

Per record: both kernels built once, then `--rounds` alternating timings (default, tuned, default, ...), each the
best of 3 passes over enough weight copies to stream from memory (compiler/tune/knobs.py), the same buffers for
both. Reported: µs of each (min over rounds), default / tuned (> 1: the log is faster), and the load average.
Also the log's own before/after (`default_secs` / `run_secs`, the tuning run).
"""
from __future__ import annotations

import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("log")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from nextn.compiler.lower import x86
    from nextn.compiler.target import make_target
    from nextn.compiler.tune import knobs as kn
    from nextn.compiler.tune import log as tlog
    from nextn.compiler.tune.workloads import target_key, x86_specs

    tgt = make_target("llvm")
    width = x86.vector_width(tgt)
    key = target_key(tgt)
    book = tlog.read(args.log)
    recs = [r for r in book.get("x86_knobs", []) if r["target"]["key"] == key]
    specs = {s.key: s for s in x86_specs(args.model, tgt)}
    rows = []
    for r in recs:
        spec = specs.get(r["key"])
        if spec is None:
            rows.append({"key": r["key"], "note": "not a kernel of this model"})
            continue
        default, tuned = x86.default_knobs(spec, width), x86.Knobs(**r["knobs"])
        fd, ft = kn.build_kernel(spec, default, tgt), kn.build_kernel(spec, tuned, tgt)
        buf = kn.stream_args(spec)
        td, tt = [], []
        for _ in range(args.rounds):
            td.append(kn.time_kernel(spec, default, tgt, args=buf, fn=fd))
            tt.append(kn.time_kernel(spec, tuned, tgt, args=buf, fn=ft))
        rows.append({"key": r["key"], "knobs": r["knobs"], "default_us": min(td) * 1e6, "tuned_us": min(tt) * 1e6,
                     "ratio": min(td) / min(tt), "log_ratio": min(r["default_secs"]) / min(r["run_secs"]),
                     "loadavg": os.getloadavg()[0]})
        del buf
    print("| kernel | knobs | default µs | tuned µs | default / tuned | in the tuning run | load |\n|---|---|---|---|---|---|---|")
    for x in rows:
        if "note" in x:
            print(f"| {x['key']} | – | – | – | – | – | {x['note']} |")
            continue
        kb = ",".join(f"{k}={v}" for k, v in x["knobs"].items())
        print(f"| {x['key']} | {kb} | {x['default_us']:.0f} | {x['tuned_us']:.0f} | {x['ratio']:.3f} | "
              f"{x['log_ratio']:.3f} | {x['loadavg']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "log": args.log, "target_key": key, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
