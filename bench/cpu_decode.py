"""Decode speed on this CPU: spec off vs draft-mtp n_max 1..3 and auto on the fixture prompts, and where the time goes.

    python bench/cpu_decode.py [--model artifacts/tiny-glm4moe-Q8_0.gguf] [--repeat 3] [--json out.json]

For every prompt kind: tokens/s of plain decoding and of draft-mtp at each n_max and auto (same engine, same run,
best of --repeat), acceptance, and the share of decode time spent outside the compiled entry points (Python:
the draft/verify loop, argument conversion, host copies).

glm-dsa (GLM-5.x) row: `--model ../shared/fixtures/tiny-glm-dsa/tiny-glm-dsa-Q8_0.gguf`; GLM-5.3-Flash:
`--model ../shared/fixtures/tiny-glm5next/tiny-glm5next-Q8_0.gguf`. For a model with DSA index sharing it also
times one NextN draft step past the indexer top-k (the long-context prompt, untruncated), with the NextN indexer
run (step 0) and with step 0's selection reused (steps 1..n_max-1). Last, the cost of a verify of 2..4 rows and of
a draft step relative to one decode step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "shared", "fixtures")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(HERE, "..", "artifacts", "tiny-glm4moe-Q8_0.gguf"))
    ap.add_argument("--prompts", default=os.path.join(FIXTURES, "prompts.json"))
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import nextn.runtime as rt

    m = rt.load(args.model, ctx_size=4096, log=lambda s: print(s, file=sys.stderr))
    seq = m.sequence
    prompts = json.load(open(args.prompts))
    configs = [("off", "none", 0)] + [(f"n_max={k}", "draft-mtp", k) for k in (1, 2, 3)] + [("auto", "draft-mtp", "auto")]
    rows, tot = [], {c[0]: [0, 0.0, 0.0] for c in configs}
    for p in prompts:
        ids = m.tokenizer.encode(p["text"])[-2000:]
        row = {"kind": p["kind"], "prompt_tokens": len(ids)}
        for label, spec_type, k in configs:
            best = None
            for _ in range(args.repeat):
                r = m.generate(ids, args.n_predict, spec_type=spec_type, n_max=k if k == "auto" else max(k, 1),
                               ignore_eos=True)
                if best is None or r.decode_s < best.decode_s:
                    best = r
            r = best
            py_share = r.python_share
            row[label] = {"tok_s": r.tokens_per_s, "acceptance": r.stats.acceptance, "mean_len": r.stats.mean_len,
                          "python_share": py_share}
            tot[label][0] += len(r.ids)
            tot[label][1] += r.decode_s
            tot[label][2] += py_share * r.decode_s
        rows.append(row)

    head = ["kind", "T"] + [c[0] for c in configs]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for row in rows:
        cells = [row["kind"], str(row["prompt_tokens"]), f"{row['off']['tok_s']:.0f}"]
        for label, _s, _k in configs[1:]:
            c = row[label]
            cells.append(f"{c['tok_s']:.0f} ({c['acceptance']:.2f}, x{c['tok_s'] / row['off']['tok_s']:.2f})")
        print("| " + " | ".join(cells) + " |")
    cells = ["all", ""] + [f"{tot[c[0]][0] / tot[c[0]][1]:.0f}" for c in configs]
    print("| " + " | ".join(cells) + " |")
    print("\ncells: tok/s (acceptance, speed-up over spec off); python share of decode time: " + ", ".join(
        f"{c[0]} {tot[c[0]][2] / tot[c[0]][1] * 100:.0f}%" for c in configs))
    print(f"model {os.path.basename(args.model)}, {seq.model.weight_bytes / 1e6:.1f} MB weights, n_predict {args.n_predict}, "
          f"best of {args.repeat}, {os.cpu_count()} CPUs")
    draft_cost = dsa_draft_step_cost(m, prompts, args.repeat) if "mtp_draft_shared" in seq.model.fn else None
    costs = step_costs(m, prompts)
    if args.json:
        json.dump({"rows": rows, "model": args.model, "dsa_draft_step": draft_cost, "step_costs": costs},
                  open(args.json, "w"), indent=1)


def step_costs(m, prompts, steps: int = 100) -> dict:
    """Median seconds of one-row decode, of a verify of 2..4 rows and of a draft step, at the docs-prose prompt's
    context, and their ratios to decode. Nothing is committed: the timing calls leave every state as it was."""
    import numpy as np

    from nextn.common.timing import round_robin

    seq = m.sequence
    p = next((q for q in prompts if q["kind"] == "docs-prose"), prompts[0])
    ids = np.asarray(m.tokenizer.encode(p["text"])[-2000:], np.int32)
    hidden, _lg, am = seq.prefill(ids, 0)
    n = len(ids)
    calls = {"decode": lambda: seq.verify([am], n)}
    calls |= {f"verify_{k}": (lambda k=k: seq.verify([am] * k, n)) for k in (2, 3, 4)}
    if seq.model.has_mtp:
        seq.mtp_rows(ids, np.concatenate([np.zeros((1, hidden.shape[1]), np.float32), hidden[:-1]]), 0)
        calls["draft"] = lambda: seq.mtp_draft([am], hidden[-1:], n)
    med = {k: float(np.median(v)) for k, v in round_robin(calls, steps).items()}
    print(f"\nstep costs at {n} cells: decode {med['decode'] * 1e3:.3f} ms; " + ", ".join(
        f"{k} {v / med['decode']:.2f}x" for k, v in med.items() if k != "decode"))
    return {"n_kv": n, "seconds": med, "vs_decode": {k: v / med["decode"] for k, v in med.items()}}


def dsa_draft_step_cost(m, prompts, repeat: int, steps: int = 50) -> dict:
    """Median seconds of a one-row NextN draft step at n_kv past the indexer top-k: own indexer vs shared index."""
    import time

    import numpy as np

    seq = m.sequence
    p = max(prompts, key=lambda q: len(q["text"]))
    ids = np.asarray(m.tokenizer.encode(p["text"])[: seq.n_ctx - 8], np.int32)
    hidden, _lg, am = seq.prefill(ids, 0)
    seq.mtp_rows(ids, np.concatenate([np.zeros((1, hidden.shape[1]), np.float32), hidden[:-1]]), 0)
    n = len(ids)
    times = {}
    for label, reuse in (("own_indexer", False), ("shared_index", True)):
        seq.mtp_draft([am], hidden[-1:], n)            # step 0 stores the selection the shared steps read
        ts = []
        for _ in range(max(repeat, 1) * steps):
            t0 = time.perf_counter()
            seq.mtp_draft([am], hidden[-1:], n + 1, reuse_index=reuse)
            ts.append(time.perf_counter() - t0)
        times[label] = float(np.median(ts))
    top_k = seq.model.hparams.get("idx_top_k")
    print(f"\nNextN draft step at n_kv = {n + 2} (indexer top-k {top_k}): NextN indexer "
          f"{times['own_indexer'] * 1e3:.3f} ms, shared index {times['shared_index'] * 1e3:.3f} ms "
          f"({(1 - times['shared_index'] / times['own_indexer']) * 100:.0f}% less per step 1..n_max-1)")
    return {"n_kv": n + 2, "top_k": top_k, **times}


if __name__ == "__main__":
    main()
