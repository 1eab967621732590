"""Does a tuning log keep or improve each x86 kernel it touches? Each of its kept knob records for this CPU, re-timed
against the default knobs in a fresh process (not the `nextn tune` run that picked it), on the model's shapes.

    flock "$(python bench/realwidth_files.py --lock)" .venv/bin/python bench/tuning_check.py MODEL.gguf LOG \
        [--rounds 7] [--json out.json] [--decode 4 [-t 2] [--no-control]]

Per record: both kernels built once, then `--rounds` interleaved rounds (default, tuned, default) at each row count
the record was tuned at (compiler/tune/decide.py), each timing the best of a few passes over enough weight copies
to stream from memory (compiler/tune/knobs.py KernelBench), the same buffers for both. Reported per kernel and row
count: ms of each (medians over rounds), default / tuned (> 1: the log is faster) and the log's own figure from the
tuning run; then the verdict over the row counts: `improved` (faster by more than the default's noise measured
here), `kept` (within the noise) or `slower`; and the load average. `--all` also re-times the records that kept
the default (their challenger, to see it still loses).

`--decode R`: then the model end to end with and without the log: MODEL compiled twice (f16 KV; the untuned one from
the compile cache, the tuned one into `--work`), then bench/realwidth.py's nextn round (plain decode of 32 tokens,
prefill of 512, verify of 1-4 rows, one draft step) in a fresh process per arm and round: first one untimed round of
every arm (page cache, libraries, CPU state), then R timed rounds whose order alternates (`arm_orders`: no arm always
runs first; two arms go ABBA, three through all six orders in 6 rounds). Reported per metric: each arm's median over the rounds and tuned / untuned paired within each
round, median (min–max). Unless `--no-control`, the untuned artifact runs a second time as a third arm ("untuned
again"): its ratio to untuned is the A/A control, the spread an A/B of this machine shows with nothing changed.
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
    ap.add_argument("--no-control", dest="control", action="store_false",
                    help="--decode without the A/A arm (the untuned artifact run twice per round)")
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
        default = x86.default_knobs(spec, width, x86.l1d_kb(tgt))   # compile's default (tune/apply.py)
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
        d = dataclasses.asdict(x86.default_knobs(spec, width, x86.l1d_kb(tgt)))
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


# -- end to end: fresh-process rounds of both artifacts, in balanced order ---------------------------------------------
def arm_orders(arms, rounds: int) -> list[tuple]:
    """The order the arms run in, per round: round r rotates `arms` by r // 2 and reverses it on odd r. Two arms give
    A B, B A, B A, A B (ABBA: over every 2 rounds each arm runs first once, and a drift across a round's runs is
    cancelled within 4); three arms give all 6 orders in 6 rounds, each arm first, middle and last twice."""
    arms = list(arms)
    out = []
    for r in range(rounds):
        k = (r // 2) % len(arms)
        o = arms[k:] + arms[:k]
        out.append(tuple(reversed(o) if r % 2 else o))
    return out


def paired_ratios(rounds: list[dict], arm: str, base: str) -> dict:
    """Per metric, `arm` against `base` within each round (the two ran back to back): base ms / arm ms, or arm tok/s /
    base tok/s (> 1: `arm` is faster), with the median over the rounds and its spread (min, max)."""
    import statistics

    out = {}
    for k in rounds[0][base]:
        per = [(r[arm][k] / r[base][k]) if k.endswith("tok_s") else (r[base][k] / r[arm][k]) for r in rounds]
        out[k] = {"median": statistics.median(per), "min": min(per), "max": max(per), "rounds": per}
    return out


def worker_metrics(res: dict) -> dict:
    """bench/realwidth.py's worker RESULT → flat {decode_tok_s, prefill_tok_s, verify_1_ms, ..., draft_ms}."""
    return {"decode_tok_s": res["decode_tok_s"], "prefill_tok_s": res["prefill_tok_s"],
            **{f"{k}_ms": v for k, v in res["ms"].items()}}


def end_to_end(args) -> dict:
    """Decode / prefill / verify of MODEL compiled without and with the log (and, unless --no-control, the untuned
    artifact as a third arm: the A/A noise floor), in fresh-process rounds of balanced order (`arm_orders`) after
    one untimed round of each."""
    import statistics
    import subprocess
    import sys
    import time

    from nextn.compiler.entry import CompileOptions, compile_model, compiled_artifact

    here = os.path.dirname(os.path.abspath(__file__))
    work = args.work or os.path.join(os.path.dirname(os.path.abspath(args.log.rstrip("/"))), "tuning-check-art")
    t = time.perf_counter()
    untuned = compiled_artifact(args.model, CompileOptions(cache_type_k="f16", cache_type_v="f16"))
    arts = {"untuned": untuned,
            "tuned": compile_model(args.model, work, CompileOptions(tuning_log=args.log, cache_type_k="f16",
                                                                    cache_type_v="f16"), log=lambda *_: None)}
    if args.control:
        arts["untuned again"] = untuned
    print(f"compiled both in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    threads = str(args.threads or (os.cpu_count() or 1))
    env = dict(os.environ, TVM_NUM_THREADS=threads, OMP_NUM_THREADS=threads)

    def one(name: str) -> dict:
        r = subprocess.run([sys.executable, os.path.join(here, "realwidth.py"), "--worker", arts[name], "-ctk", "f16",
                            "-ctv", "f16"], capture_output=True, text=True, env=env)
        line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith("RESULT ")), None)
        if r.returncode != 0 or line is None:
            raise SystemExit(f"tuning_check: the {name} round failed: {r.stderr.strip()[-500:]}")
        return worker_metrics(json.loads(line[len("RESULT "):]))

    orders = arm_orders(arts, args.decode)
    for name in orders[0]:     # untimed: the page cache, the libraries and the CPU's state warm for every arm alike
        one(name)
    rounds = []
    for order in orders:
        rounds.append({name: one(name) for name in order})
        print(f"round {len(rounds)}/{len(orders)} ({', '.join(order)}) done, load {os.getloadavg()[0]:.1f}",
              file=sys.stderr)
    med = {name: {k: statistics.median(r[name][k] for r in rounds) for k in rounds[0][name]} for name in arts}
    ratio = paired_ratios(rounds, "tuned", "untuned")
    control = paired_ratios(rounds, "untuned again", "untuned") if args.control else None
    f = lambda x: f"{x['median']:.3f} ({x['min']:.3f}–{x['max']:.3f})"   # noqa: E731
    print(f"\n{os.path.basename(args.model)}, {threads} threads, {args.decode} rounds after one untimed round per "
          f"arm; orders {' | '.join(' '.join('U' if n == 'untuned' else 'T' if n == 'tuned' else 'C' for n in o) for o in orders)}"
          f" (U untuned, T tuned, C untuned again); medians over the rounds, ratios paired within a round "
          f"(> 1: faster than untuned), median (min–max)\n")
    print("| metric | untuned | tuned | tuned / untuned |" + (" A/A: untuned again / untuned |" if control else "")
          + "\n|---|---|---|---|" + ("---|" if control else ""))
    for k in med["untuned"]:
        print(f"| {k.replace('_', ' ')} | {med['untuned'][k]:.2f} | {med['tuned'][k]:.2f} | {f(ratio[k])} |"
              + (f" {f(control[k])} |" if control else ""))
    return {"artifacts": arts, "orders": orders, "rounds": rounds, "median": med, "tuned_vs_untuned": ratio,
            "control_vs_untuned": control, "threads": threads, "loadavg": os.getloadavg()[0]}


if __name__ == "__main__":
    main()
