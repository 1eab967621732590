"""What llama.cpp's tools print, parsed: llama-bench's jsonl, the KV allocation of a `-v` log, llama-completion's
perf lines and llama-speculative-simple's summary (the peer of bench/realwidth.py and bench/spec_realwidth.py)."""
from __future__ import annotations

import json
import re


def llama_bench_rows(text: str):
    """The test records of llama-bench's `-o jsonl` output (one JSON object per line; other lines skipped)."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            yield json.loads(line)


def llama_bench_build(r: dict) -> str:
    """A llama-bench record's build, as "NUMBER (COMMIT)"."""
    return f"{r.get('build_number')} ({r.get('build_commit')})"


def parse_llama_bench(text: str) -> dict:
    """llama-bench `-o jsonl` lines → {"pp": tok/s, "tg": tok/s, "n_prompt", "n_gen", "n_threads", "build"}."""
    out = {}
    for r in llama_bench_rows(text):
        kind = ("pp" if r["n_prompt"] > 0 and r["n_gen"] == 0 else "tg" if r["n_gen"] > 0 and r["n_prompt"] == 0
                else None)
        if kind:
            out[kind] = float(r["avg_ts"])
            out[f"n_{'prompt' if kind == 'pp' else 'gen'}"] = int(r["n_prompt" if kind == "pp" else "n_gen"])
            out["n_threads"] = int(r["n_threads"])
            out["build"] = llama_bench_build(r)
            for k in ("type_k", "type_v", "flash_attn"):
                if k in r:
                    out[k] = r[k]
    return out


def parse_llama_kv(stderr: str) -> dict | None:
    """llama.cpp's KV allocation from a `-v` log: the `llama_kv_cache*: size = X MiB ..., K (t): ..., V (t): ...`
    lines of the last `llama_context` built (llama-completion builds a throw-away one first while it fits the
    parameters to memory; glm-dsa has two caches, summed) → {"bytes", "type_k", "type_v"}, or None."""
    import re

    text = stderr.rsplit("constructing llama_context", 1)[-1]
    pat = re.compile(r"llama_kv_cache\w*: size =\s*([\d.]+) MiB.*?K \((\w+)\).*?V \((\w+)\)")
    found = pat.findall(text)
    if not found:
        return None
    return {"bytes": sum(float(m) for m, _k, _v in found) * (1 << 20), "type_k": found[0][1], "type_v": found[0][2]}


def parse_completion(text: str) -> dict:
    """llama-completion's perf lines (common/sampling.cpp common_perf_print) → {"tok_s": eval runs ÷ eval seconds,
    "n_eval", "eval_ms", "prompt_tok_s"}; {} when the eval line is missing."""
    ev = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", text.replace("prompt eval time", "prompt_eval"))
    if not ev:
        return {}
    ms, n = float(ev.group(1)), int(ev.group(2))
    out = {"tok_s": n / ms * 1e3 if ms > 0 else 0.0, "n_eval": n, "eval_ms": ms}
    pp = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", text)
    if pp and float(pp.group(1)) > 0:
        out["prompt_tok_s"] = int(pp.group(2)) / float(pp.group(1)) * 1e3
    return out


def parse_speculative(text: str) -> dict:
    """llama-speculative-simple's summary (examples/speculative-simple: `decoded N tokens in S seconds`,
    `n_drafted`, `n_accept`) and, at -lv 4, common_speculative_print_stats' `#mean acc len` and `#acc rate/pos`
    → {"tok_s", "decoded", "decode_s", "drafted", "accepted", "acceptance", "mean_len", "per_pos"}; {} without
    the decoded line."""
    d = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
    if not d:
        return {}
    n, s = int(d.group(1)), float(d.group(2))
    out = {"decoded": n, "decode_s": s, "tok_s": n / s if s > 0 else 0.0}
    for key, pat in (("drafted", r"n_drafted\s*=\s*(\d+)"), ("accepted", r"n_accept\s*=\s*(\d+)")):
        m = re.search(pat, text)
        out[key] = int(m.group(1)) if m else None
    if out["drafted"]:
        out["acceptance"] = out["accepted"] / out["drafted"]
    m = re.search(r"#mean acc len\s*=\s*([\d.]+)", text)
    out["mean_len"] = float(m.group(1)) if m else None
    m = re.search(r"#acc rate/pos\s*=\s*\(([^)]*)\)", text)
    out["per_pos"] = [float(x) for x in m.group(1).split(",") if x.strip()] if m else None
    return out
