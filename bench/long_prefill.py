"""Peak memory and prefill speed against prompt length at a fixed context (issue 11: attention must not
materialize [T, H, L]; memory may grow only with the KV, which a static engine allocates for -c cells up front).

    python bench/long_prefill.py MODEL.gguf [-c 32768] [--lengths 1024,8192,32768] [-ctk f16 -ctv f16]
                                 [--python OTHER_VENV/bin/python] [--mem-limit-gb 14] [--tail N] [--json out.json]

Each length runs in a fresh child process (so ru_maxrss is that length's peak): load the model (compiled and
cached first by this process), prefill a deterministic random prompt of that many tokens at -c cells, report
prefill tokens/s, the RSS after loading and the peak RSS, the weight and KV bytes the engine holds. `--python`
runs the children with another checkout's interpreter (e.g. the tree before a change: same command, same
machine; that tree must accept the flags used, so leave -ctk/-ctv out for one without KV types). Children run
under an address-space limit (`--mem-limit-gb`), so a kernel that would allocate a [T, H, L] scratch fails
cleanly instead of taking the machine down. `--tail N`: prompts longer than N run only their last N rows, at
positions length-N.. over all `length` cells (the cells before hold what the cache holds: zeros), i.e. the last
prefill chunks of such a prompt, which attend over the longest L; tok/s is then of those N rows (a real-width
32K prefill takes too long on 2 cores). Real-width GGUFs: run under the heavy lock
(`flock "$(python bench/realwidth_files.py --lock)" ...`).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import subprocess
import sys
import time


def child(args):
    import numpy as np

    import nextn.runtime as rt

    kw = {}
    if args.cache_type_k:
        kw = {"cache_type_k": args.cache_type_k, "cache_type_v": args.cache_type_v}
    m = rt.load(args.model, ctx_size=args.ctx, spec=False, **kw)
    seq = m.sequence
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ids = np.random.default_rng(0).integers(16, seq.model.hparams["n_vocab"], args.length).astype(np.int32)
    pos0 = 0
    if args.tail and args.length > args.tail:
        pos0, ids = args.length - args.tail, ids[-args.tail:]
    # as decode does: one chunk of hidden rows at a time (a tree from before `on_hidden` keeps all T rows)
    kw = {"on_hidden": lambda h, p: None} if "on_hidden" in inspect.signature(seq.prefill).parameters else {}
    t0 = time.perf_counter()
    seq.prefill(ids, pos0, **kw)
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    kc = getattr(seq, "kv_cache", None) or {}
    print(json.dumps({"length": args.length, "ctx": args.ctx, "rows": len(ids), "prefill_s": dt,
                      "tok_s": len(ids) / dt,
                      "rss_after_load": rss_loaded, "peak_rss": peak, "weight_bytes": seq.model.weight_bytes,
                      "kv_bytes": seq.kv_bytes, "type_k": kc.get("type_k", "f32"), "type_v": kc.get("type_v", "f32")}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-c", "--ctx", type=int, default=32768)
    ap.add_argument("--lengths", default="1024,8192,32768")
    ap.add_argument("-ctk", "--cache-type-k", default=None)
    ap.add_argument("-ctv", "--cache-type-v", default=None)
    ap.add_argument("--python", default=sys.executable, help="interpreter of the checkout to measure")
    ap.add_argument("--mem-limit-gb", type=float, default=14.0)
    ap.add_argument("--tail", type=int, default=None, help="run only the last N rows of longer prompts")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child-length", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cache_type_k and not args.cache_type_v:
        args.cache_type_v = args.cache_type_k
    if args.child_length is not None:
        args.length = args.child_length
        return child(args)

    # compile (and cache) once, outside the measured children
    types = ["-ctk", args.cache_type_k, "-ctv", args.cache_type_v] if args.cache_type_k else []
    tail = ["--tail", str(args.tail)] if args.tail else []
    warm = subprocess.run([args.python, __file__, args.model, "-c", "256", *types, "--child-length", "8"],
                          capture_output=True, text=True)
    if warm.returncode:
        sys.exit(f"warm-up failed:\n{warm.stderr[-3000:]}")
    limit = int(args.mem_limit_gb * (1 << 30))
    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        if n > args.ctx:
            print(f"skipping {n}: more than -c {args.ctx}", file=sys.stderr)
            continue
        r = subprocess.run([args.python, __file__, args.model, "-c", str(args.ctx), *types, *tail, "--child-length", str(n)],
                           capture_output=True, text=True,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            row = {"length": n, "ctx": args.ctx, "error": last[:300]}
        else:
            row = json.loads(r.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    print(f"\n{args.model} at -c {args.ctx} ({args.python})\n")
    print("| prompt tokens | rows run | prefill tok/s | RSS after load (GB) | peak RSS (GB) | KV (GB) | weights (GB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['length']} | | failed: {r['error']} | | | | |")
            continue
        g = 1e9
        print(f"| {r['length']} | {r.get('rows', r['length'])} | {r['tok_s']:.1f} | {r['rss_after_load'] / g:.2f} | {r['peak_rss'] / g:.2f} | "
              f"{r['kv_bytes'] / g:.2f} | {r['weight_bytes'] / g:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "ctx": args.ctx, "python": args.python, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
