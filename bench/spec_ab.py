"""Two nextn builds side by side on one GGUF, interleaved (issue 34: a runtime / compiler change against its base):
each build's Python (a worktree's venv) runs a fresh worker process per round, alternating A, B, A, B, ...; each
worker loads the file (compiled and cached by that build on first use), warms up, then generates -n tokens after
bench_report.PROMPT plainly and at each --n-max (an int or `auto`; greedy, ignore EOS, f16 KV, -c 4096), best of
--inner generations.

    python bench/spec_ab.py FILE --a A_PYTHON --b B_PYTHON [-n 64] [--repeat 2] [--n-max 2,3] [-o report.json]

Printed per build and round: tok/s per configuration; then per configuration the cost per round in decodes (the
plain run's `decode` entry seconds per step) split by entry point: `mtp_rows` (NextN gap rows written apart),
`mtp_draft` (draft step 0, the gap riding along), `draft` (one-row steps), verify (`verify` + `decode`), host.
Every speculative run's tokens are checked against its own plain run's. Run it under the heavy-job lock
(`flock "$(python bench/realwidth_files.py --lock)" ...`)."""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_report import PROMPT  # noqa: E402  (this tree's prompt, whichever build's python runs the worker)
from spec_realwidth import cell, round_split  # noqa: E402


def worker(path: str, n_gen: int, n_max: list, inner: int) -> dict:
    import nextn.runtime as rt

    m = rt.load(path, ctx_size=4096, cache_type_k="f16", cache_type_v="f16")
    m.sequence
    m.loaded.wait_populated()
    cfgs = ["plain", *n_max]
    run = lambda c, n: m.generate(PROMPT, n, spec_type="none" if c == "plain" else "draft-mtp",   # noqa: E731
                                  n_max=3 if c == "plain" else c, ignore_eos=True)
    for c in cfgs:
        run(c, 8)
    out = {}
    for c in cfgs:
        best = max((run(c, n_gen) for _ in range(inner)), key=lambda r: r.tokens_per_s)
        out[str(c)] = cell(best)
    return out


def split(run: dict, c: str) -> dict:
    """Configuration `c` of one worker's `run` (spec_realwidth `cell`s) against its plain run: spec_realwidth
    `round_split`'s parts per round in decodes, NextN as the gap rows (`mtp_rows`) plus the draft steps, shown per
    entry too (`mtp_draft`: step 0 with the gap riding along; `draft`: the one-row steps)."""
    plain, x = run["plain"], run[c]
    one = plain["entry_s"]["decode"] / plain["plain_rounds"]
    parts = round_split(x, one)
    n = x["rounds"] + x["plain_rounds"]
    d = {"mtp_rows": parts["gap"], **{k: x["entry_s"].get(k, 0.0) / n / one for k in ("mtp_draft", "draft")},
         "nextn": parts["draft"] + parts["gap"], "verify": parts["verify"], "host": parts["host"]}
    return {"tok_s": x["tok_s"], "x_plain": x["tok_s"] / plain["tok_s"], "decode_ms": one * 1e3,
            "accepted": f"{x['accepted']}/{x['drafted']}", "same_as_plain": x["tokens"] == plain["tokens"],
            **{k: round(val, 3) for k, val in d.items()},
            **({"rounds": f"{x['rounds']} spec / {x['plain_rounds']} plain", "depth_switches": x["depth_switches"]}
               if c == "auto" else {})}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--a", required=True, help="build A's python")
    ap.add_argument("--b", required=True, help="build B's python")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--inner", type=int, default=2)
    ap.add_argument("--n-max", default="2,3")
    ap.add_argument("-o", "--output", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    n_max = [x if x == "auto" else int(x) for x in a.n_max.split(",")]
    if a.worker:
        print("JSON" + json.dumps(worker(a.file, a.n_gen, n_max, a.inner)))
        return
    res = {"A": [], "B": []}
    for i in range(a.repeat):
        for k, py in (("A", a.a), ("B", a.b)):
            t = time.time()
            p = subprocess.run([py, __file__, a.file, "--a", a.a, "--b", a.b, "-n", str(a.n_gen), "--inner",
                                str(a.inner), "--n-max", a.n_max, "--worker"], capture_output=True, text=True)
            line = [s for s in p.stdout.splitlines() if s.startswith("JSON")]
            if not line:
                sys.exit(f"spec_ab: build {k} failed:\n{p.stderr[-3000:]}")
            res[k].append(json.loads(line[0][4:]))
            print(k, i, f"{time.time() - t:.0f} s", {c: round(v["tok_s"], 2) for c, v in res[k][-1].items()},
                  flush=True)
    for k, runs in res.items():
        for i, run in enumerate(runs):
            for c in map(str, n_max):
                print(k, i, f"n_max={c}", split(run, c))
    if a.output:
        with open(a.output, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
