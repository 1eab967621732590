"""Does a tuning log keep or improve each x86 kernel it touches? Each of its kept knob records for this CPU, re-timed
against the default knobs in a fresh process (not the `nextn tune` run that picked it), on the model's shapes.

    flock /work/realwidth/heavy.lock .venv/bin/python bench/tuning_check.py MODEL.gguf LOG [--rounds 7] [--json out.json]
        [--decode 2 [-t 2]]

Per record: both kernels built once, then `--rounds` interleaved rounds (default, tuned, default) at each row count
the record was tuned at (compiler/tune/decide.py), each timing the best of a few passes over enough weight copies
to stream from memory (compiler/tune/knobs.py KernelBench), the same buffers for both. Reported per kernel and row
count: ms of each (medians over rounds), default / tuned (> 1: the log is faster) and the log's own figure from the
tuning run; then the verdict over the row counts: `improved` (faster by more than the default's noise measured
here), `kept` (within the noise) or `slower`; and the load average. `--all` also re-times the records that kept
the default (their challenger, to see it still loses).

`--decode R`: then the model end to end with and without the log: MODEL compiled twice (f16 KV; the untuned one from
the compile cache, the tuned one into `--work`), then R alternating rounds (untuned, tuned, untuned, ...) of
bench/realwidth.py's nextn round in a fresh process each (plain decode of 32 tokens, prefill of 512, verify of
1-4 rows); the best of the rounds per artifact, and tuned / untuned.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("log")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per kernel (0: re-time no kernel)")
    ap.add_argument("--all", action="store_true", help="also the records that kept the default")
    ap.add_argument("--json", default=None)
    ap.add_argument("--decode", type=int, default=0, metavar="R", help="end-to-end rounds with and without the log")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads of the end-to-end rounds")
    ap.add_argument("--work", default=None, help="where the tuned artifact goes [default: LOG/../tuning-check-art]")
    args = ap.parse_args()

    from nextn.compiler.lower import x86
    from nextn.compiler.target import make_target
    from nextn.compiler.tune import decide
    from nextn.compiler.tune import knobs as kn
    from nextn.compiler.tune import log as tlog
    from nextn.compiler.tune.workloads import target_key, x86_specs

    tgt = make_target("llvm")
    width = x86.vector_width(tgt)
    key = target_key(tgt)
    book = tlog.read(args.log)
    recs = [r for r in book.get("x86_knobs", []) if r["target"]["key"] == key and (r["kept"] or args.all)]
    recs = recs if args.rounds > 0 else []   # --rounds 0: only the end-to-end comparison
    specs = {s.key: s for s in x86_specs(args.model, tgt)}
    rows = []
    for r in recs:
        spec = specs.get(r["key"])
        if spec is None:
            rows.append({"key": r["key"], "note": "not a kernel of this model"})
            continue
        default = x86.default_knobs(spec, width)
        tuned = dataclasses.replace(default, **r["knobs"])
        bench = kn.KernelBench(spec, tgt)
        o = decide.interleaved(bench.time, default, [tuned], r["rows"], args.rounds)[tuned]
        del bench
        slower = min(o.speedups) < 1 - o.noise
        verdict = "slower" if slower else "improved" if o.speedup > 1 + max(o.noise, decide.MIN_GAIN) else "kept"
        rows.append({"key": r["key"], "knobs": r["knobs"], "kept_in_log": r["kept"], "rows": o.rows,
                     "default_ms": [x * 1e3 for x in o.default_secs], "tuned_ms": [x * 1e3 for x in o.run_secs],
                     "ratio": o.speedups, "log_ratio": r["speedups"], "speedup": o.speedup, "noise": o.noise,
                     "verdict": verdict, "loadavg": os.getloadavg()[0]})
    print("| kernel | knobs (changed) | rows | default ms | tuned ms | default / tuned | in the tuning run | noise | "
          "verdict | load |\n|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        if "note" in x:
            print(f"| {x['key']} | – | – | – | – | – | – | – | {x['note']} | – |")
            continue
        spec = specs[x["key"]]
        d = dataclasses.asdict(x86.default_knobs(spec, width))
        kb = ",".join(f"{k}={v}" for k, v in x["knobs"].items() if d.get(k) != v) or "(default)"
        f = lambda v, p=3: " / ".join(f"{a:.{p}f}" for a in v)   # noqa: E731
        tag = x["verdict"] if x["kept_in_log"] else f"challenger {x['verdict']}; the log keeps the default"
        print(f"| {x['key']} | {kb} | {'/'.join(map(str, x['rows']))} | {f(x['default_ms'])} | {f(x['tuned_ms'])} | "
              f"{f(x['ratio'])} | {f(x['log_ratio'])} | {x['noise']:.1%} | {tag} | {x['loadavg']:.1f} |")
    report = {"model": args.model, "log": args.log, "target_key": key, "rows": rows}
    if args.decode:
        report["decode"] = end_to_end(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


def end_to_end(args) -> dict:
    """Decode / prefill / verify of MODEL compiled without and with the log, alternating fresh-process rounds."""
    import subprocess
    import sys
    import time

    from nextn.compiler.compile import compile_model
    from nextn.compiler.entry import compiled_artifact

    here = os.path.dirname(os.path.abspath(__file__))
    work = args.work or os.path.join(os.path.dirname(os.path.abspath(args.log.rstrip("/"))), "tuning-check-art")
    t = time.perf_counter()
    arts = {"untuned": compiled_artifact(args.model, "llvm", cache_type_k="f16", cache_type_v="f16"),
            "tuned": compile_model(args.model, work, tuning_log=args.log, cache_type_k="f16", cache_type_v="f16",
                                   log=lambda *_: None)}
    print(f"compiled both in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    threads = str(args.threads or (os.cpu_count() or 1))
    env = dict(os.environ, TVM_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
    best: dict = {k: {} for k in arts}
    for _ in range(args.decode):
        for name, art in arts.items():
            r = subprocess.run([sys.executable, os.path.join(here, "realwidth.py"), "--worker", art, "-ctk", "f16",
                                "-ctv", "f16"], capture_output=True, text=True, env=env)
            line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith("RESULT ")), None)
            if r.returncode != 0 or line is None:
                raise SystemExit(f"tuning_check: the {name} round failed: {r.stderr.strip()[-500:]}")
            res = json.loads(line[len("RESULT "):])
            b = best[name]
            for k in ("decode_tok_s", "prefill_tok_s"):
                b[k] = max(b.get(k, 0.0), res[k])
            for k, v in res["ms"].items():
                b[f"{k}_ms"] = min(b.get(f"{k}_ms", float("inf")), v)
    print(f"\n| {os.path.basename(args.model)} ({args.decode} rounds, {threads} threads) | untuned | tuned | tuned / untuned |"
          "\n|---|---|---|---|")
    for k in best["untuned"]:
        u, tt = best["untuned"][k], best["tuned"][k]
        ratio = tt / u if k.endswith("tok_s") else u / tt   # > 1: the tuned artifact is faster
        print(f"| {k.replace('_', ' ')} | {u:.2f} | {tt:.2f} | {ratio:.3f} |")
    return {"artifacts": arts, "best": best, "threads": threads, "loadavg": os.getloadavg()[0]}


if __name__ == "__main__":
    main()
