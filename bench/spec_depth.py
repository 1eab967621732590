"""Decode and draft-mtp at depth (issue 34 item 5): nextn plain / draft-mtp n_max 1..k / auto after a prompt of D
tokens, against `llama-bench -d D -n N -p 0 -fa on` (plain decoding at depth) and llama.cpp's draft-mtp
(`llama-speculative-simple --spec-type draft-mtp -fa on`) after a prompt of D tokens, on one predictable real-width
file (`synth_realwidth.py --mtp-mix ALPHA`, see bench/spec_realwidth.py), in one interleaved run.

    python bench/spec_depth.py [FILE ...] [--depth 8192,32768] [-n 32] [-t THREADS] [-c 32768]
                               [-ctk f16 -ctv f16] [--n-max 1,2] [--tail 64] [--llama-spec-depth 8192]
                               [--repeat 1] [--inner 2] [--engines nextn,llama] [-o report.json]
    python bench/spec_depth.py --table report.json

FILE: paths or names in --dir (default glm45air-1-a0.1). Under the heavy-bench lock on a shared machine:
`flock "$(python bench/realwidth_files.py --lock)" python bench/spec_depth.py ...`.

The context of both engines is -c, raised to D + n + 16 where a depth needs it (llama-bench sizes its own context
to d + n). Per file, `--repeat` rounds, each: nextn (one process), then llama.cpp.

nextn (one process, `nextn.runtime.load` at that context): per depth D, a prompt of D token ids (the file's chain
from PROMPT, repeated). Its first D - tail cells are taken as already in the KV cache (`speculative.decode`'s
`n_cached`, the prompt cache a server slot uses): prefill runs only the last `tail` rows (at positions D - tail..,
attending over every cell before them), so a 32K depth costs seconds, not the half hour a 2-core prefill of 32K
tokens would. The decode reads all D cells in every step either way (the kernels' work does not depend on the cells'
values); on these files attention does not reach the residual stream (synth_realwidth zeroes attn_output), so the
tokens are those of a full prefill too. `--tail 0` prefills the whole prompt. Then, interleaved `--inner` times
(the fastest counts), plain, n_max 1..k and auto each decode -n tokens (greedy, EOS ignored), each speculative run
checked against plain's tokens (`same_as_plain`); then the entry points at position D and at position 64 (min of
REPS round-robin calls): a decode (verify of 1 row), a verify of 2 and 3 rows (the chain's next tokens), a draft
step (`mtp_draft`, one NextN row), so "at D ÷ at 64" is what the attention over D cells adds.

llama.cpp, per depth, shallowest first: `llama-bench -m F -d D -n N -p 0 -fa on -r 1 -t -ctk -ctv -o jsonl` (tg
tok/s at depth D, as `-d D1,D2` gives it, one process per depth so that --timeout stops only the deepest; its own
warm-up; it fills the depth by a real prefill) and, where D is in --llama-spec-depth (default: every depth),
`llama-speculative-simple -f PROMPT_D --spec-type draft-mtp --spec-draft-n-max k -fa on -n N -c CTX -b CTX` for
each k (decoded tokens ÷ decode seconds, acceptance; its real prefill of the D-token prompt is not timed in tok/s:
the depth it reports, `encoded N tokens`, is kept). PROMPT_D: PROMPT repeated, cut to D tokens by nextn's
tokenizer (the file's vocabulary) and written back as text; llama.cpp's own count is reported.

Ratios (the table, last columns): nextn ÷ llama at each depth and configuration (plain: nextn plain ÷ llama-bench
tg), spec ÷ own plain for both (llama.cpp's plain: llama-bench tg at that depth).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_report import (PROMPT, file_notes, new_report, resolve_files, run_files, saved_report,  # noqa: E402
                          shown_path)
from guarded import failure, run_watched, skipped_for_memory  # noqa: E402
from llama_logs import llama_bench_build, llama_bench_rows  # noqa: E402
from machine_probe import GB  # noqa: E402
from realwidth_table import fmt_num  # noqa: E402
import spec_realwidth as sr  # noqa: E402
from realwidth_files import realwidth_dir  # noqa: E402

from nextn.common.kv_types import DEFAULT as KV_DEFAULT  # noqa: E402
from nextn.common.kv_types import NAMES as KV_TYPES  # noqa: E402
from nextn.runtime.threads import physical_cores  # noqa: E402

DEFAULT_FILE = "glm45air-1-a0.1.gguf"
SHALLOW = 64          # the position the entry points are also timed at (attention over few cells)
REPS = 5              # round-robin calls per entry-point timing (min counts)


def ctx_for(ctx: int, depths, n_gen: int) -> int:
    """The context both engines get: `ctx`, raised to the deepest depth + n_gen + 16 (module doc)."""
    return max(ctx, max(depths) + n_gen + 16)


def depth_ids(base: list[int], D: int) -> list[int]:
    """D token ids: `base` repeated and cut (the prompt of depth D)."""
    if not base:
        raise ValueError("depth_ids: empty base")
    return (base * (D // len(base) + 1))[:D]


# -- nextn (in a worker process) -------------------------------------------------------------------------------------
def nextn_generate(m, ids: list[int], n_gen: int, spec_type: str, n_max, tail: int):
    """One greedy generation of n_gen tokens after `ids` with the first len(ids) - tail cells taken as cached (module
    doc; tail 0: all prefilled); a `GenerateResult` as `Model.generate` returns it."""
    from nextn.runtime.api import GenerateResult
    from nextn.runtime.params import SamplingParams, SpecParams
    from nextn.runtime.speculative import generate
    from nextn.runtime.threads import runtime_threads

    spec = spec_type == "draft-mtp"
    eff = "auto" if n_max == "auto" else min(int(n_max), m.max_draft)
    n_cached = max(0, len(ids) - tail) if tail else 0
    g = generate(m.sequence, ids, SamplingParams(n_predict=n_gen, ignore_eos=True),
                 SpecParams(spec_type, eff if spec else 1), n_cached=n_cached)
    return GenerateResult(len(ids), g.tokens, "", g.stats, g.prefill_s, g.decode_s, g.finish_reason, spec_type,
                          eff if spec else 0, g.vm_s, seed=g.seed, n_max_requested=n_max if spec else 0,
                          threads=runtime_threads())


def nextn_depth(m, D: int, n_gen: int, n_max, tail: int, inner: int, base: list[int]) -> dict:
    """nextn at depth D on a loaded `Model` (module doc): {"runs": {label: cell}, "ms": {call@pos: ms},
    "prefill_s", "n_cached"}."""
    from nextn.common.timing import time_call

    eng = m.sequence
    ids = depth_ids(base, D)
    cfgs = sr.configs(n_max)
    for _label, spec_type, k in cfgs:        # warm-up at this depth: first calls, auto's calibration
        nextn_generate(m, ids, 2, spec_type, k, tail)
    runs, same = {}, {}
    for _ in range(inner):
        for label, spec_type, k in cfgs:
            c = sr.cell(nextn_generate(m, ids, n_gen, spec_type, k, tail))
            same[label] = same.get(label, True) and c["tokens"] == (runs.get("plain") or c)["tokens"]
            if label not in runs or c["tok_s"] > runs[label]["tok_s"]:
                runs[label] = c
    for label, c in runs.items():
        c["same_as_plain"] = same[label]
    chain = [int(t) for t in runs["plain"]["tokens"]]
    E = int(m.loaded.hparams["n_embd"])
    z = np.zeros((1, E), np.float32)
    calls = {}
    for P in (SHALLOW, D):
        calls[f"decode@{P}"] = lambda P=P: eng.verify(chain[:1], P)
        for T in (2, 3):
            calls[f"verify_{T}@{P}"] = lambda P=P, T=T: eng.verify(chain[:T], P)
        if m.has_mtp:
            calls[f"draft@{P}"] = lambda P=P: eng.mtp_draft(chain[:1], z, P)
    best = {k: float("inf") for k in calls}
    for _ in range(REPS):
        for k, f in calls.items():
            best[k] = min(best[k], time_call(f))
    t = time.perf_counter()
    g = nextn_generate(m, ids, 1, "none", 1, tail)
    return {"runs": runs, "ms": {k: v * 1e3 for k, v in best.items()}, "prefill_s": g.prefill_s,
            "prefill_wall_s": time.perf_counter() - t, "n_cached": max(0, D - tail) if tail else 0}


def worker(path: str, a) -> dict:
    import nextn.runtime as rt

    ctx = ctx_for(a.ctx, a.depth, a.n_gen)
    t = time.perf_counter()
    m = rt.load(path, ctx_size=ctx, log=lambda s: print(s, file=sys.stderr), cache_type_k=a.cache_type_k,
                cache_type_v=a.cache_type_v)
    load_s = time.perf_counter() - t
    seq = m.sequence          # its KV is allocated here: part of the load, as llama.cpp's
    m.loaded.wait_populated()
    base = m.tokenizer.encode(PROMPT)
    out = {"depths": {}, "load_s": load_s, "n_ctx": seq.n_ctx, "kv_cache": seq.kv_cache,
           "threads_env": os.environ.get("TVM_NUM_THREADS")}
    if m.has_mtp:     # what `auto` pays once per load before its first generation (outside tok/s)
        from nextn.runtime.depth import calibrate

        t = time.perf_counter()
        costs = calibrate(seq, m.max_draft)
        out["calibrate"] = {"s": time.perf_counter() - t, "k_max": m.max_draft, "verify_s": costs[0],
                            "draft_s": costs[1], "row_s": costs[2]}
    for D in a.depth:
        print(f"nextn: depth {D}", file=sys.stderr, flush=True)
        out["depths"][str(D)] = nextn_depth(m, D, a.n_gen, a.n_max, a.tail, a.inner, base)
    return out


def nextn_round(path, a, log) -> dict:
    env = dict(os.environ, TVM_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "-n", str(a.n_gen), "-c", str(a.ctx),
           "-ctk", a.cache_type_k, "-ctv", a.cache_type_v, "--n-max", ",".join(map(str, a.n_max)),
           "--inner", str(a.inner), "--depth", ",".join(map(str, a.depth)), "--tail", str(a.tail)]
    res = run_watched(cmd, a.mem_budget_gb * GB, env=env, log=log, timeout=a.timeout)
    mem = {"peak_rss": res["peak_rss"], "wall_s": res["wall_s"]}
    line = next((x for x in reversed(res["stdout"].splitlines()) if x.startswith("RESULT ")), None)
    if res["rc"] != 0 or line is None:
        return {"status": failure(res), **mem}
    return {"status": "ok", **json.loads(line[len("RESULT "):]), **mem}


# -- llama.cpp -------------------------------------------------------------------------------------------------------
def parse_bench_depths(text: str) -> dict:
    """llama-bench `-o jsonl` lines of tg tests → {str(n_depth): {"tg": tok/s, "n_gen", "type_k", "type_v",
    "flash_attn", "build"}}."""
    out = {}
    for r in llama_bench_rows(text):
        if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
            out[str(int(r.get("n_depth", 0)))] = {
                "tg": float(r["avg_ts"]), "n_gen": int(r["n_gen"]), "n_threads": int(r["n_threads"]),
                "build": llama_bench_build(r),
                **{k: r[k] for k in ("type_k", "type_v", "flash_attn") if k in r}}
    return out


def parse_encoded(text: str) -> int | None:
    """The prompt tokens llama-speculative-simple reports (`encoded N tokens in S seconds`), or None."""
    m = re.search(r"encoded\s+(\d+) tokens in", text)
    return int(m.group(1)) if m else None


def bench_cmd(path: str, a, tool: str, D: int) -> list[str]:
    return [tool, "-m", path, "-d", str(D), "-n", str(a.n_gen), "-p", "0", "-fa", "on",
            "-r", "1", "-t", str(a.threads), "-ctk", a.cache_type_k, "-ctv", a.cache_type_v, "-o", "jsonl"]


def spec_cmd(path: str, a, tool: str, prompt_file: str, k: int) -> list[str]:
    # -b: llama-speculative-simple decodes the whole prompt in one batch ("the prompt exceeds the batch size")
    c = str(ctx_for(a.ctx, a.depth, a.n_gen))
    return [tool, "-m", path, "-f", prompt_file, "-n", str(a.n_gen), "-c", c, "-b", c,
            "-t", str(a.threads), "-ctk", a.cache_type_k, "-ctv", a.cache_type_v, "-ctkd", a.cache_type_k,
            "-ctvd", a.cache_type_v, "-fa", "on", "--temp", "0", "--ignore-eos", "--spec-type", "draft-mtp",
            "--spec-draft-n-max", str(k), "-lv", "4"]


def prompt_files(path: str, depths, folder: str) -> dict:
    """{D: path of a text file of ~D tokens} (module doc): PROMPT repeated, cut to D tokens by nextn's tokenizer
    (the GGUF's vocabulary), decoded back to text."""
    import gguf

    from nextn.runtime.tokenizer import Tokenizer

    fields = {key: f.contents() for key, f in gguf.GGUFReader(path).fields.items() if key.startswith("tokenizer.")}
    tok = Tokenizer.from_gguf_fields(fields, source=path)
    unit = PROMPT + " "
    ids = tok.encode(unit * (max(depths) * 5 // 4 // max(1, len(tok.encode(unit))) + 2))
    out = {}
    for D in depths:
        n = D
        for _ in range(4):      # a cut text may read back as fewer tokens (merges across the cut): take more
            text = tok.decode(ids[:n])
            got = len(tok.encode(text))
            if got >= D:
                break
            n += D - got
        out[D] = os.path.join(folder, f"prompt-{D}.txt")
        with open(out[D], "w") as f:
            f.write(text)
    return out


def llama_round(path, a, tools, prompts: dict, log) -> dict:
    """llama.cpp at each depth, shallowest first: llama-bench at D (one process per depth, so a --timeout on the
    deepest costs only that one), then draft-mtp n_max k at D where D is in --llama-spec-depth."""
    out = {"bench": {"depths": {}, "status": {}}, "spec": {}}
    for D in a.depth:
        if "llama-bench" in tools:
            res = run_watched(bench_cmd(path, a, tools["llama-bench"], D), a.mem_budget_gb * GB, log=log,
                                 timeout=a.timeout)
            got = parse_bench_depths(res["stdout"]) if res["rc"] == 0 else {}
            out["bench"]["depths"].update(got)
            out["bench"]["status"][str(D)] = "ok" if got else failure(res)
            log(f"  llama-bench depth {D}: " + (f"tg {got[str(D)]['tg']:.2f} tok/s" if str(D) in got
                                                 else out["bench"]["status"][str(D)]) + f" ({res['wall_s']:.0f} s)")
        if "llama-speculative-simple" in tools and D in a.llama_spec_depth:
            for k in a.n_max:
                res = run_watched(spec_cmd(path, a, tools["llama-speculative-simple"], prompts[D], k),
                                     a.mem_budget_gb * GB, log=log, timeout=a.timeout)
                text = res["stdout"] + "\n" + res["stderr"]
                got = sr.parse_speculative(text) if res["rc"] == 0 else {}
                cellv = {"status": "ok", **got} if got else {"status": failure(res)}
                cellv.update(wall_s=res["wall_s"], encoded=parse_encoded(text))
                out["spec"].setdefault(str(D), {})[f"n_max={k}"] = cellv
                log(f"  llama draft-mtp depth {D} n_max {k}: " + (f"{got['tok_s']:.2f} tok/s" if got
                                                                  else cellv["status"]) + f" ({res['wall_s']:.0f} s)")
    return out


# -- summary and table -----------------------------------------------------------------------------------------------
def summarize(entry: dict) -> dict:
    """Per depth: the best nextn cell per configuration, llama-bench's tg, llama.cpp's draft-mtp, the ratios, the
    entry points at depth ÷ at SHALLOW."""
    nx = [r["nextn"] for r in entry["rounds"] if r["nextn"].get("status") == "ok"]
    ll = [r["llama"] for r in entry["rounds"]]
    out = {"nextn_status": "ok" if nx else next((r["nextn"].get("status") for r in entry["rounds"]), "no rounds"),
           "depths": {}}
    depths = sorted({int(d) for r in nx for d in r["depths"]} | {int(d) for r in ll
                                                                  for d in (r.get("bench") or {}).get("depths", {})})
    for D in depths:
        d = str(D)
        s: dict = {"nextn": {}, "llama": {}, "ratio": {}}
        cells = [r["depths"][d] for r in nx if d in r["depths"]]
        for label in (list(cells[0]["runs"]) if cells else []):
            b = max((c["runs"][label] for c in cells), key=lambda c: c["tok_s"])
            s["nextn"][label] = {k: b[k] for k in ("tok_s", "acceptance", "accepted", "drafted", "rounds",
                                                   "plain_rounds", "per_pos")}
            s["nextn"][label]["same_as_plain"] = all(c["runs"][label]["same_as_plain"] for c in cells)
        if cells:
            s["ms"] = {k: min(c["ms"][k] for c in cells) for k in cells[0]["ms"]}
            s["n_cached"] = cells[0]["n_cached"]
            s["deep_x_shallow"] = {k.split("@")[0]: s["ms"][k] / s["ms"][k.split("@")[0] + f"@{SHALLOW}"]
                                   for k in s["ms"] if k.endswith(f"@{D}") and D != SHALLOW}
        tg = [r["bench"]["depths"][d]["tg"] for r in ll if d in (r.get("bench") or {}).get("depths", {})]
        if tg:
            s["llama"]["plain"] = {"tok_s": max(tg), "tool": "llama-bench"}
        for r in ll:
            for label, c in (r.get("spec") or {}).get(d, {}).items():
                if c.get("status") == "ok" and c["tok_s"] > s["llama"].get(label, {}).get("tok_s", -1):
                    s["llama"][label] = c
                s["llama"].setdefault(label, c)
        n0, q0 = s["nextn"].get("plain", {}), s["llama"].get("plain", {})
        for label in set(s["nextn"]) | set(s["llama"]):
            n, q = s["nextn"].get(label, {}), s["llama"].get(label, {})
            s["ratio"][label] = {"nextn_llama": sr._div(n.get("tok_s"), q.get("tok_s")),
                                 "nextn_own_plain": sr._div(n.get("tok_s"), n0.get("tok_s")),
                                 "llama_own_plain": sr._div(q.get("tok_s"), q0.get("tok_s"))}
        out["depths"][d] = s
    return out


_f = fmt_num


def format_table(report: dict) -> str:
    """Markdown: the entry points at depth ÷ at SHALLOW, then the speed table with its ratios last; a line on the
    machine and settings; failures."""
    L = []
    for e in report["files"]:
        c = next((r["nextn"]["calibrate"] for r in e.get("rounds", []) if r["nextn"].get("calibrate")), None)
        if c:
            L += [f"{e['name']}: `auto`'s calibration at load (k_max {c['k_max']}): {c['s']:.1f} s = "
                  f"{c['s'] / c['verify_s'][0]:.0f} decodes at position 0 (verify of 1..{c['k_max'] + 1} rows "
                  f"{' / '.join(f'{x * 1e3:.0f}' for x in c['verify_s'])} ms, draft step {c['draft_s'] * 1e3:.0f} ms, "
                  f"NextN row {c['row_s'] * 1e3:.1f} ms)", ""]
    L += ["nextn's entry points at depth D ÷ at position " f"{SHALLOW} (min of {REPS} calls; what attention over D "
          "cells adds):", "", "| file | D | decode ms at D | decode | verify 2 | verify 3 | draft step |",
         "|" + "---|" * 7]
    notes = []
    for e in report["files"]:
        for d, s in (e.get("summary") or {}).get("depths", {}).items():
            x = s.get("deep_x_shallow")
            if x:
                L.append(f"| {e['name']} | {d} | {s['ms'][f'decode@{d}']:.1f} | {_f(x.get('decode'))} | "
                         f"{_f(x.get('verify_2'))} | {_f(x.get('verify_3'))} | {_f(x.get('draft'))} |")
    L += ["", "| file | D | config | nextn tok/s | nextn acceptance | same tokens as plain | llama tok/s | "
          "llama acceptance (prompt tokens) | nextn ÷ llama | spec ÷ own plain: nextn / llama |", "|" + "---|" * 10]
    for e in report["files"]:
        s0 = e.get("summary") or {}
        if not file_notes(e, s0, notes):
            continue
        for d, s in s0.get("depths", {}).items():
            for label in list(s["nextn"]) + [k for k in s["llama"] if k not in s["nextn"]]:
                n, q, r = s["nextn"].get(label, {}), s["llama"].get(label, {}), s["ratio"].get(label, {})
                acc_n = f"{n['acceptance']:.3f} ({n['accepted']}/{n['drafted']})" if n.get("drafted") else "–"
                if label == "auto" and n:
                    acc_n += f", {n['rounds']} spec / {n['plain_rounds']} plain rounds"
                same = "–" if label == "plain" or not n else ("yes" if n["same_as_plain"] else "NO")
                acc_q = (f"{q['acceptance']:.3f} ({q['accepted']}/{q['drafted']})" if q.get("drafted")
                         else "llama-bench tg" if label == "plain" and q else "–")
                if q.get("encoded"):
                    acc_q += f" ({q['encoded']})"
                L.append(f"| {e['name']} | {d} | {label} | {_f(n.get('tok_s'))} | {acc_n} | {same} | "
                         f"{_f(q.get('tok_s'))} | {acc_q} | {_f(r.get('nextn_llama'))} | "
                         f"{_f(r.get('nextn_own_plain'))} / {_f(r.get('llama_own_plain'))} |")
                if q and q.get("status") not in (None, "ok"):
                    notes.append(f"- {e['name']} D {d} {label}: llama: {q['status']}")
    m = report["machine"]
    L += ["", f"{m['cpu']}, {m['physical_cores']} cores, {report['threads']} thread(s) both engines, KV -ctk "
          f"{report['cache_type_k']} -ctv {report['cache_type_v']}, context {report['ctx_used']}, -fa on (llama.cpp), "
          f"greedy, -n {report['n_gen']}, nextn prefill tail {report['tail'] or 'all'} rows, best of "
          f"{report['repeat']} round(s); nextn {m.get('nextn_commit') or '?'}, llama.cpp "
          f"{(report.get('llama_build') or '?').split()[0]}; loadavg at start {m['loadavg'][0]:.2f}"
          + (" (machine loaded: read the ratios, not the absolute numbers)" if report.get("loaded") else "")]
    return "\n".join(L + ([""] + notes if notes else []))


# -- the run ---------------------------------------------------------------------------------------------------------
def measure_file(path, a, tools, log) -> dict:
    entry = {"name": os.path.basename(path), "path": shown_path(os.path.abspath(path)),
             "size": os.path.getsize(path), "rounds": []}
    if skipped_for_memory(entry, a.headroom_gb, log):
        return entry
    with tempfile.TemporaryDirectory() as folder:
        prompts = prompt_files(path, a.llama_spec_depth, folder) if a.llama_spec_depth and "llama" in a.engines \
            else {}
        for r in range(a.repeat):
            rnd = {}
            if "nextn" in a.engines:
                log(f"{entry['name']}: round {r + 1}/{a.repeat}: nextn")
                n = rnd["nextn"] = nextn_round(path, a, log)
                log(f"  nextn: {n['status']}" + "".join(
                    f"; D {d}: " + ", ".join(f"{k} {c['tok_s']:.2f}" for k, c in v["runs"].items())
                    for d, v in n.get("depths", {}).items()))
            else:
                rnd["nextn"] = {"status": "not run (--engines)"}
            rnd["llama"] = {}
            if "llama" in a.engines:
                log(f"{entry['name']}: round {r + 1}/{a.repeat}: llama.cpp")
                rnd["llama"] = llama_round(path, a, tools, prompts, log)
            entry["rounds"].append(rnd)
    return entry


def _ints(text: str, what: str, lo: int) -> list[int]:
    try:
        v = [int(x) for x in text.split(",") if x.strip()]
        assert all(x >= lo for x in v)
        return v
    except (ValueError, AssertionError):
        raise SystemExit(f"spec_depth: {what} {text}: expected a comma list of integers >= {lo}") from None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help=f"GGUF paths or names in --dir [default: {DEFAULT_FILE}]")
    ap.add_argument("--dir", default=realwidth_dir())
    ap.add_argument("--depth", default="8192,32768", help="prompt depths, comma list [default: 8192,32768]")
    ap.add_argument("--llama-spec-depth", default=None,
                    help="depths of llama.cpp's draft-mtp runs (each a real prefill) [default: every --depth]")
    ap.add_argument("--tail", type=int, default=64,
                    help="nextn: prompt rows actually prefilled, the rest taken as cached; 0: all [default: 64]")
    ap.add_argument("--repeat", type=int, default=1, choices=range(1, 100), metavar="N")
    ap.add_argument("--inner", type=int, default=2, choices=range(1, 100), metavar="N",
                    help="nextn generations per configuration and depth, interleaved (fastest counts) [default: 2]")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="tokens per generation (llama-bench -n) [default: 32]")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads, both engines [default: physical cores]")
    ap.add_argument("-c", "--ctx", type=int, default=32768, help="context, raised where a depth needs it")
    ap.add_argument("-ctk", "--cache-type-k", default=KV_DEFAULT, choices=KV_TYPES)
    ap.add_argument("-ctv", "--cache-type-v", default=KV_DEFAULT, choices=KV_TYPES)
    ap.add_argument("--n-max", default="1,2", help="the fixed draft depths, comma list [default: 1,2]")
    ap.add_argument("--engines", default="nextn,llama", help="comma list: nextn, llama")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per measured process [default: 3600]")
    ap.add_argument("--mem-budget-gb", type=float, default=12.0)
    ap.add_argument("--headroom-gb", type=float, default=2.0)
    ap.add_argument("-o", "--output", default=None, help="write the JSON report here (after each file)")
    ap.add_argument("--table", metavar="REPORT", default=None, help="print the tables of a saved report")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.depth = _ints(a.depth, "--depth", 1)
    a.n_max = _ints(a.n_max, "--n-max", 1)
    a.llama_spec_depth = a.depth if a.llama_spec_depth is None else _ints(a.llama_spec_depth, "--llama-spec-depth", 1)
    if a.tail < 0:
        raise SystemExit(f"spec_depth: --tail {a.tail}: expected an integer >= 0")
    if a.worker:
        print("RESULT " + json.dumps(worker(a.worker, a)), flush=True)
        return
    if a.table:
        print(format_table(saved_report(a.table, summarize)))
        return
    a.threads = a.threads or physical_cores()
    a.engines = set(a.engines.split(","))
    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    from peer import PeerMissing, peer_tool

    tools = {}
    if "llama" in a.engines:
        for t in ("llama-bench", "llama-speculative-simple"):
            try:
                tools[t] = peer_tool(t)
            except PeerMissing as e:
                log(f"spec_depth: {e}")
    files = resolve_files(a.files or [DEFAULT_FILE], a.dir)
    if not files:
        raise SystemExit(f"spec_depth: no file found in {a.dir} (make one: python bench/realwidth_files.py "
                         f"glm45air-1-a0.1)")
    report = new_report(a, argv, n_max=a.n_max, depths=a.depth, tail=a.tail,
                           ctx_used=ctx_for(a.ctx, a.depth, a.n_gen), llama_spec_depths=a.llama_spec_depth)
    run_files(report, files, lambda path: measure_file(path, a, tools, log), summarize, a.output)
    print(format_table(report))


if __name__ == "__main__":
    main()
