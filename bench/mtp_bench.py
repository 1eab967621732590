"""MTP acceptance benchmark for any llama-server–compatible server (`nextn serve`, `llama-server`), in the format
the llama.cpp MTP pull requests report: one line per prompt kind with `pred / draft / acc / rate / tok/s`, then
an aggregate JSON object.

Each prompt is one non-streaming POST /v1/chat/completions with a fixed seed, temperature and max_tokens; the
numbers are read from the response's llama-server `timings`: predicted_n (pred), draft_n (draft),
draft_n_accepted (acc), acc / draft (rate) and predicted_per_second (tok/s). A server that made no drafts reports
no draft_n: draft = acc = 0. Only the standard library is used, so the script runs wherever Python does.

    python bench/mtp_bench.py --url http://127.0.0.1:8080 [--max-tokens 128] [--seed 42] [-o report.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

REVIEW_CODE = '''def load_users(path):
    users = []
    f = open(path)
    for line in f.readlines():
        parts = line.split(",")
        if len(parts) < 3:
            continue
        user = {"name": parts[0], "age": int(parts[1]), "email": parts[2]}
        users.append(user)
    return users


def oldest(users):
    best = None
    for u in users:
        if best == None or u["age"] > best["age"]:
            best = u
    return best


def emails_by_domain(users):
    out = {}
    for u in users:
        domain = u["email"].split("@")[1]
        if domain in out:
            out[domain].append(u["email"])
        else:
            out[domain] = [u["email"]]
    return out
'''

PROMPTS = [
    ("code_python", "Write a Python function merge_sorted(a, b) that merges two sorted lists into one sorted list "
                    "without calling sort(). Include a docstring and three assert-based tests."),
    ("code_cpp", "Write a C++17 class RingBuffer that stores up to N integers, with push, pop, size and full "
                 "methods, and a short main() that exercises it."),
    ("explain_concept", "Explain how a hash table gives constant-time lookups on average, and what happens when two "
                        "keys collide."),
    ("summarize", "Summarize in three sentences: When Python imports a module it first looks in sys.modules, the "
                  "cache of modules already loaded. If the module is not there, the import system asks each finder "
                  "on sys.meta_path whether it can locate the module; the path-based finder searches the entries of "
                  "sys.path for a matching package directory or source file. Once found, a loader creates the "
                  "module object, executes its code in the module's namespace and stores it in sys.modules, so that "
                  "later imports return the same object without running the code again."),
    ("qa_factual", "What is the difference between a list and a tuple in Python, and when would you choose each?"),
    ("translation", "Translate into French and then into German: \"The meeting has been moved to Thursday morning "
                    "because the quarterly report is not ready yet.\""),
    ("creative_short", "Write a short poem of eight lines about a lighthouse keeper who counts the ships at night."),
    ("stepwise_math", "A train leaves at 09:40 and covers 180 km at an average speed of 72 km/h. At what time does it "
                      "arrive? Work it out step by step."),
    ("long_code_review", "Review this Python code. List the bugs and style problems, then give a corrected "
                         "version:\n\n" + REVIEW_CODE),
]


def post(url: str, body: dict, api_key: str | None, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run(url: str, max_tokens: int, seed: int, temperature: float, api_key: str | None, timeout: float,
        model: str | None = None, log=print) -> dict:
    rows = []
    t0 = time.perf_counter()
    for kind, text in PROMPTS:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "seed": seed,
                "temperature": temperature, "stream": False}
        if model:
            body["model"] = model
        r = post(url.rstrip("/") + "/v1/chat/completions", body, api_key, timeout)
        t = r.get("timings", {})
        pred, draft, acc = int(t.get("predicted_n", 0)), int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))
        row = {"kind": kind, "pred": pred, "draft": draft, "acc": acc, "rate": acc / draft if draft else 0.0,
               "tok_s": float(t.get("predicted_per_second", 0.0)), "finish_reason": r["choices"][0]["finish_reason"]}
        rows.append(row)
        log(f"{kind:<17} pred {pred:5d}  draft {draft:5d}  acc {acc:5d}  rate {row['rate']:.3f}  "
            f"tok/s {row['tok_s']:8.2f}")
    pred, draft, acc = (sum(r[k] for r in rows) for k in ("pred", "draft", "acc"))
    return {"url": url, "max_tokens": max_tokens, "seed": seed, "temperature": temperature, "n_prompts": len(rows),
            "pred": pred, "draft": draft, "acc": acc, "rate": acc / draft if draft else 0.0,
            "tok_s_mean": sum(r["tok_s"] for r in rows) / len(rows), "wall_s": time.perf_counter() - t0,
            "prompts": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None, help="model field of the requests (llama-server ignores it)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("-o", "--output", default=None, help="also write the aggregate JSON here")
    a = ap.parse_args(argv)
    try:
        rep = run(a.url, a.max_tokens, a.seed, a.temperature, a.api_key, a.timeout, a.model)
    except (urllib.error.URLError, OSError) as e:
        print(f"mtp_bench: {a.url}: {e}", file=sys.stderr)
        return 1
    agg = {k: v for k, v in rep.items() if k != "prompts"}
    print(json.dumps(agg))
    if a.output:
        with open(a.output, "w") as f:
            json.dump(rep, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
