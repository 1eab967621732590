"""Acceptance with a reduced-vocabulary draft head (--spec-draft-vocab N) and the NextN rows a round computes, on the
trained fixtures' prompts (../shared/fixtures/*/reference.json), greedy, n_max 1 and 3.

    python bench/draft_vocab.py [--ns 1024,2048,4096] [--json OUT.json]
    python bench/draft_vocab.py --steps ARTIFACT [-t 2] [--reps 20] [--pos 64]   # an artifact compiled with
                                                                                  # --spec-draft-vocab N

`--steps`: seconds of one decode step, one draft step with the full head (`draft`) and one with the reduced head
(`draft_vocab`) of ARTIFACT, called round-robin (so a burst of load on a shared machine hits each alike) at
position --pos; min and median of --reps, and each draft step as a multiple of the decode step.

Acceptance for each N is that of the full head's draft with its argmax restricted to the N first draft ids
(runtime/draft_vocab.py's default ranks): the same drafts the compiled `_vocab` entries make
(tests/test_draft_vocab.py `test_reduced_acceptance_equals_full_head_restricted_to_its_rows`), without one compile
per N. NextN rows per speculative round: nextn's (its draft steps' rows plus the emitted rows written from the gap,
counted at the engine) against llama.cpp's draft-mtp for the same rounds (common/speculative.cpp: `process()` after
every verify re-runs the NextN row of each of the k + 1 verified rows, then `draft()` runs k one-row steps).
Runs on the CPU; compiles each fixture's BF16 GGUF once (cached, -ctk/-ctv f32 as the references).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "shared", "fixtures")
MODELS = {"glm4moe": "tiny-glm4moe", "glm-dsa": "tiny-glm-dsa", "glm5next": "tiny-glm5next"}


def run_model(arch: str, ns: list[int], n_maxes=(1, 3)) -> dict:
    import nextn.runtime as rt
    from nextn.runtime.draft_vocab import tokenizer_ranks

    d = os.path.join(FIXTURES, MODELS[arch])
    ref = json.load(open(os.path.join(d, "reference.json")))
    m = rt.load(os.path.join(d, f"{MODELS[arch]}-BF16.gguf"), ctx_size=4096, cache_type_k="f32", cache_type_v="f32")
    seq = m.sequence
    ranks = tokenizer_ranks(seq.model.files.main.fields)
    draft, rows_call = seq.mtp_draft, seq.mtp_rows
    count = {"rows": 0, "on": False}
    sel = {"ids": None}

    def mtp_draft(tokens, *a, **kw):
        count["rows"] += len(tokens) if count["on"] else 0
        h, lg, am = draft(tokens, *a, **kw)
        if sel["ids"] is not None:
            am = sel["ids"][np.argmax(lg.numpy()[:, sel["ids"]], axis=1)]
        return h, lg, am

    def mtp_rows(tokens, *a, **kw):
        count["rows"] += len(tokens) if count["on"] else 0
        return rows_call(tokens, *a, **kw)

    seq.mtp_draft, seq.mtp_rows = mtp_draft, mtp_rows
    out = {"n_vocab": int(seq.model.hparams["n_vocab"]), "acceptance": {}, "nextn_rows": {}}
    plain = {p["kind"]: m.generate(p["prompt_ids"], p["n_predict"], spec_type="none", ignore_eos=True).ids
             for p in ref["prompts"]}
    for n in [0] + ns:
        sel["ids"] = ranks[:n] if n else None
        for n_max in n_maxes:
            acc = dr = rounds = rows = rows_llama = 0
            for p in ref["prompts"]:
                count["on"] = False

                def on(_toks):
                    count["on"] = True    # after prefill's token: the prompt warm-up is not counted
                count["rows"] = 0
                r = m.generate(p["prompt_ids"], p["n_predict"], n_max=n_max, ignore_eos=True, on_tokens=on)
                assert r.ids == plain[p["kind"]], (arch, n, n_max, p["kind"])
                s = r.stats
                acc, dr, rounds = acc + s.accepted, dr + s.drafted, rounds + s.rounds
                rows += count["rows"]
                rows_llama += (s.drafted + s.rounds) + s.drafted     # process(): k+1 rows; draft(): k steps
            out["acceptance"].setdefault(str(n or "full"), {})[n_max] = {"accepted": acc, "drafted": dr,
                                                                         "rate": acc / dr, "rounds": rounds}
            if not n:
                out["nextn_rows"][n_max] = {"rounds": rounds, "nextn": rows / rounds, "llama.cpp": rows_llama / rounds}
    return out


def time_steps(artifact: str, reps: int, pos: int, threads: int | None) -> dict:
    import nextn.runtime as rt
    from nextn.common.timing import round_robin

    m = rt.load(artifact, ctx_size=max(512, 2 * pos), threads=threads)
    seq = m.sequence
    if not seq.model.draft_vocab:
        raise SystemExit(f"{artifact}: compiled without --spec-draft-vocab")
    seq.model.wait_populated()
    E = int(seq.model.hparams["n_embd"])
    seq.prefill(list(range(1, pos + 1)), 0)
    h = np.random.default_rng(0).standard_normal((1, E)).astype(np.float32)
    calls = {"decode": lambda: seq._run("verify", [5], pos),
             "draft": lambda: seq._run("mtp_draft", [5], pos, h_prev=h),
             f"draft_vocab ({seq.model.draft_vocab})": lambda: seq._run("mtp_draft_vocab", [5], pos, h_prev=h)}
    t = round_robin(calls, reps + 1)
    out = {k: {"min_s": min(v[1:]), "median_s": float(np.median(v[1:]))} for k, v in t.items()}
    for k in out:
        out[k]["x_decode_min"] = out[k]["min_s"] / out["decode"]["min_s"]
        out[k]["x_decode_median"] = out[k]["median_s"] / out["decode"]["median_s"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1024,2048,4096")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--steps", default=None, help="time the steps of this artifact instead (see above)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--pos", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=None)
    a = ap.parse_args(argv)
    if a.steps:
        r = time_steps(a.steps, a.reps, a.pos, a.threads)
        print("| step | min ms | median ms | min ÷ decode | median ÷ decode |\n|---|---|---|---|---|")
        for k, v in r.items():
            print(f"| {k} | {v['min_s'] * 1e3:.1f} | {v['median_s'] * 1e3:.1f} | {v['x_decode_min']:.3f} | "
                  f"{v['x_decode_median']:.3f} |")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=1)
        return 0
    ns = [int(x) for x in a.ns.split(",")]
    res = {arch: run_model(arch, ns) for arch in a.models.split(",")}
    for arch, r in res.items():
        print(f"\n{arch} (vocab {r['n_vocab']}): acceptance accepted/drafted, all prompts, greedy")
        print("| N | n_max 1 | n_max 3 |\n|---|---|---|")
        for n, row in r["acceptance"].items():
            print(f"| {n} | " + " | ".join(f"{v['rate']:.3f} ({v['accepted']}/{v['drafted']})" for v in row.values())
                  + " |")
        print("| n_max | rounds | NextN rows per round: nextn | llama.cpp draft-mtp |\n|---|---|---|---|")
        for k, v in r["nextn_rows"].items():
            print(f"| {k} | {v['rounds']} | {v['nextn']:.2f} | {v['llama.cpp']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
