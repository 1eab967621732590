"""Speculation at real widths, side by side with llama.cpp in one interleaved run (issue 34 items 1 and 2):
nextn plain / draft-mtp n_max 1..3 / auto against llama.cpp plain (`llama-completion`) / `llama-speculative-simple
--spec-type draft-mtp` n_max 1..3, on the *predictable* real-width files (`synth_realwidth.py --mtp-mix ALPHA`:
real tensor sizes, a fixed greedy token chain, NextN agreement set by ALPHA, the same for any engine that
computes the same graph).

    python bench/spec_realwidth.py [FILE ...] [--repeat 2] [-n 128] [-t THREADS] [-c 4096] [-ctk f16 -ctv f16]
                                   [--n-max 1,2,3] [--engines nextn,llama] [--no-kernels] [-o report.json]
                                   [--draft-vocab none,32768,16384] [--draft-vocab-file tokenizer|self|heldout|F]
    python bench/spec_realwidth.py --table report.json      # the tables of a saved report again (summarized anew)

FILE: paths, or names in --dir (default: bench/realwidth_files.py's folder); default: every predictable file
(`realwidth_files.py --set spec`) that exists there, smallest first. Make one with
`python bench/realwidth_files.py glm45air-1-a0.1`. Under the heavy-bench lock on a shared machine:
`flock "$(python bench/realwidth_files.py --lock)" python bench/spec_realwidth.py ...`. The harness is
bench/realwidth.py's, imported from its modules: child processes watched for memory and the memory guard
(guarded.py), the file selection and the report (bench_report.py), the llama.cpp parsers (llama_logs.py), GGUF
byte counts (gguf_bytes.py).

Per file, `--repeat` rounds, each back to back so that drift hits every configuration alike:
  1. nextn in a fresh process (`nextn.runtime.load`, compiled and cached on the first use), after its populate:
     `auto`'s calibration (`runtime.depth.calibrate`, timed: `calibrate_s`), one short warm-up generation per
     configuration, then --inner times (the fastest counts) plain, n_max 1..3 and
     auto, each `Model.generate` of -n tokens after bench_report.PROMPT, greedy, ignore EOS (what `nextn run --json`
     reports: tok/s, acceptance, per-position acceptance, `entry_s` = seconds inside each compiled entry point);
     each speculative run's tokens are checked against plain's (`same_as_plain`). Then, on the file's own greedy
     chain (prompt + plain's tokens, so the rows route as real drafts do), the ms of a verify of T = 1..4 rows, of
     one draft step (`mtp_draft`, 1 row) and of a draft step 0 carrying one gap row (2 rows), min of REPS = 5
     round-robin calls; a verify of what `runtime.depth.calibrate` times for `auto` (`depth.spread_tokens`); the
     distinct experts each verify reads per MoE layer (bench/kernel_profile.routed_experts); and, unless
     --no-kernels, the per-kernel ms of a decode and of the verify of 2 and of 4 rows
     (bench/kernel_profile.profile, best of REPS) in the first round;
  2. llama.cpp: `llama-completion -n N --temp 0 --ignore-eos` (plain: its `eval time` line), then
     `llama-speculative-simple --spec-type draft-mtp --spec-draft-n-max k --temp 0 --ignore-eos -lv 4` for each k
     (its `decoded N tokens in S seconds`, `n_drafted`, `n_accept`, and the trace-level `#acc rate/pos`); same
     prompt, -t, -c, -ctk/-ctv (also for the MTP draft context: -ctkd/-ctvd), flash attention at llama.cpp's
     default (auto: on for the CPU; nextn's attention is always flash).
  3. with --draft-vocab N (the reduced-vocabulary draft head, `--spec-draft-vocab N`; runtime/draft_vocab.py): one
     more nextn process per N (the GGUF compiled and cached with that N), plain, n_max 1..3 and auto as in step 1
     (labels `plain dv32768`, `n_max=1 dv32768`, ...; each ratio to plain and the cost split use the plain run of
     the same process), every run's tokens checked against step 1's plain tokens, and the
     ms of its draft step (`draft dvN`, one row; `draft_2 dvN`, with one gap row) and of a decode in the same
     process (`verify_1 dvN`). The draft head's rows are ranked by --draft-vocab-file: `tokenizer` (the default:
     the tokenizer's merge order), `self` (IN-SAMPLE: the token frequencies of step 1's plain chain, the prompt and
     the tokens it generated, then the merge order; the ceiling of a frequency file that covers the text),
     `heldout` (the frequencies of a plain generation of 4 × -n tokens after HELDOUT_PROMPT, then the merge order:
     what a frequency file counted from other text the model wrote gives) or a file of token ids. Step 1 reports
     how much of the plain chain each source's first N ids cover (`vocab_coverage`).
Best of the rounds counts (max tok/s; min ms); acceptance is deterministic (the same in every round).

Tokens per second: tokens emitted by the decode loop ÷ its seconds (nextn: `stats.emitted / decode_s`, the first
token is prefill's; llama-completion: eval runs ÷ eval time; llama-speculative-simple: its decoded count ÷ its
decode seconds). Per-position acceptance: llama.cpp's `acc per pos` (rounds with >= i+1 accepted ÷ rounds).

Cost per round, nextn, each a multiple of one decode (the plain run's `decode` entry seconds per step), from each
speculative run's `entry_s`: draft steps (`mtp_draft` + `draft`: the k NextN steps; step 0 carries up to
`Drafter.fuse_rows` - 1 gap rows in the same call, its head on the last row), NextN gap rows (`mtp_rows`: a gap
longer than that), verify
(`verify` + `decode`), host (decode seconds outside any entry point: the Python loop, conversions, the
acceptance check), per round (speculative + plain rounds). "The same at the bytes' cost": the tokens per round
÷ (bytes(k+1) ÷ bytes(1) + drafts per round × a draft step's bytes ÷ bytes(1)), what the run would give per
decode-time if every entry point cost what its weight bytes cost (plain: 1). "The same with free drafts": tokens
per round ÷ (bytes(k+1) ÷ bytes(1)), the same with draft steps that cost nothing: no cheaper draft (head, NextN
block, host) can lift a configuration above it at that acceptance and that routing, so a target above it needs
more tokens per round or a verify that reads fewer experts (the projection has the same column at L_real layers).

Verify against its bytes (item 2): bytes(T) = every dense weight once + the lm head once + T rows of token_embd +
each distinct routed expert once (distinct experts from the verify's own expert ids, the same size per layer in
these files); bytes(1) is one decode's (bench/gguf_bytes.decode_bytes_from_gguf). The per-kernel table puts each
kernel family's verify ms ÷ decode ms next to the bytes it reads: routed experts (`matmul_id`) distinct(T) ÷
n_expert_used, every other weight matmul (dense, lm head) 1, the rest (attention, norms, VM bookkeeping) 1 by
convention; "excess ms" = verify ms − that ratio × decode ms is where the verify pays for more than its bytes.
Kernel names of the decode (`_rows1`) and verify (`_rowst`) entries are matched after dropping that suffix and the
numbers Relax appends to fused ops. The instrument adds a Python call per kernel call (in "(step total)").

Projection to the real layer count (46 trunk layers for glm4moe / GLM-4.5-Air, 78 for glm-dsa / GLM-5.2),
labelled a projection: per configuration, the round's measured seconds + (L_real − L_file) × the per-layer ms of
the verify of k+1 rows (plain: of the decode), the per-layer ms being the least-squares slope of that verify's ms
over the trunk layers of the files of the same arch and ALPHA measured in the run (needs two layer counts); draft
steps, gap rows and host time stay as measured (the NextN block is one layer at any depth), tokens per round as
measured (ALPHA sets them, not the depth). Its bytes-bound column is the same ceiling as above at L_real layers
(the dense and routed bytes per layer from the files' tensors, the base file's distinct experts per MoE layer).
The synthetic files have one dense lead layer, GLM-5.2 has three: its two other dense layers are projected as
MoE layers.

Memory guard and the child's watch: as bench/realwidth.py (--mem-budget-gb, --headroom-gb).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_report import (PROMPT, file_entry, file_notes, new_report, peer_tools, resolve_files,  # noqa: E402
                          run_files, saved_report)
from gguf_bytes import decode_bytes_from_gguf, gguf_info  # noqa: E402
from guarded import (RESULT, failure, over_budget, run_watched, run_worker, skipped_for_memory,  # noqa: E402
                     thread_env)
from llama_logs import parse_completion, parse_speculative  # noqa: E402
from machine_probe import GB  # noqa: E402
from realwidth_files import SETS, realwidth_dir  # noqa: E402
from realwidth_table import VERIFY_ROWS, fmt_num  # noqa: E402

from nextn.common.kv_types import DEFAULT as KV_DEFAULT  # noqa: E402
from nextn.common.kv_types import NAMES as KV_TYPES  # noqa: E402
from nextn.runtime.depth import calibrate, spread_tokens  # noqa: E402
from nextn.runtime.threads import physical_cores  # noqa: E402

KNOWN = [f"{n}.gguf" for n in SETS["spec"]]
KERNEL_ROWS = (1, 2, 4)                       # per-kernel profile: the decode and these verifies
REAL_LAYERS = {"glm4moe": 46, "glm-dsa": 78}   # trunk layers of GLM-4.5-Air, GLM-5.2 (HF configs)
REPS = 5                                       # calls per micro timing and per-kernel profile (min counts)
HELDOUT_PROMPT = "Once upon a time, in a small village by the sea,"   # --draft-vocab-file heldout's text
VOCAB_SOURCES = ("tokenizer", "self", "heldout")


def configs(n_max, draft_vocab: int = 0) -> list[tuple[str, str, int | str]]:
    """nextn's configurations: (label, spec_type, n_max); with the reduced draft head of `draft_vocab` rows each
    labelled `... dvN` (its plain run does not draft: the same process's baseline)."""
    cfgs = [("plain", "none", 1)] + [(f"n_max={k}", "draft-mtp", k) for k in n_max] + [("auto", "draft-mtp", "auto")]
    return [(f"{label} dv{draft_vocab}", t, k) for label, t, k in cfgs] if draft_vocab else cfgs


def own_plain(label: str, labels) -> str:
    """The plain run of the process that ran configuration `label` (`plain dvN` for a reduced head's, when run)."""
    N = label_draft_vocab(label)
    return f"plain dv{N}" if N and f"plain dv{N}" in labels else "plain"


def label_draft_vocab(label: str) -> int:
    """N of a configuration label `... dvN` (0: the full draft head)."""
    m = re.search(r" dv(\d+)$", label)
    return int(m.group(1)) if m else 0


# -- bytes -----------------------------------------------------------------------------------------------------------
def verify_bytes(decode_bytes: dict, T: int, distinct: float, n_expert_used: int) -> float:
    """Weight bytes a verify of T rows reads (module doc): one decode's `decode_bytes` (read_bytes_per_row) with
    T rows of token_embd and `distinct` experts per MoE layer (mean over the layers) instead of n_expert_used."""
    return (decode_bytes["total"] + (T - 1) * decode_bytes["token_embd_row"]
            + decode_bytes["routed"] * (distinct / n_expert_used - 1.0))


def draft_bytes(info: dict, draft_vocab: int = 0) -> float:
    """Weight bytes one draft step (one NextN row) reads: the NextN block (blk.i, i >= n_layer; its routed experts at
    n_expert_used / n_expert), one row of token_embd and the lm head (`output.weight`, or the tied token_embd);
    with the reduced draft head (`draft_vocab` N > 0) N of its n_vocab rows."""
    from nextn.common.manifest import read_bytes_per_row

    def nextn(name):
        return not name.startswith("blk.") or int(name.split(".")[1]) >= info["n_layer"]
    tensors = [(n, b) for n, _t, b in info["tensors"] if nextn(n) and n != "output_norm.weight"]
    tied = "output.weight" not in {n for n, _t, _b in info["tensors"]}
    b = read_bytes_per_row(tensors, info["n_expert"], info["n_expert_used"], info["n_vocab"], tied)
    return b["total"] - (b["lm_head"] * (1.0 - draft_vocab / info["n_vocab"]) if draft_vocab else 0.0)


# -- kernels ---------------------------------------------------------------------------------------------------------
def kernel_byte_ratio(key: str, expert_ratio: float) -> float:
    """The bytes a verify's kernel reads ÷ the decode's (module doc): routed-expert matmuls `expert_ratio`
    (distinct experts ÷ n_expert_used), everything else 1."""
    return expert_ratio if "matmul_id" in key else 1.0


def kernel_excess(dec: dict, ver: dict, expert_ratio: float, calls: dict | None = None) -> list[dict]:
    """Per kernel family (kernel_profile.kernel_key): decode ms, verify ms, their ratio, the byte ratio, and the
    excess ms = verify − byte ratio × decode; sorted by excess, largest first. `dec`, `ver`:
    kernel_profile.profile outputs (symbol -> ms); `calls`: the verify's calls per symbol (profile's `calls`)."""
    from kernel_profile import by_family

    (a, _), (b, n) = by_family(dec), by_family(ver, calls)
    rows = []
    for k in sorted(set(a) | set(b)):
        d, v = a.get(k, 0.0), b.get(k, 0.0)
        r = kernel_byte_ratio(k, expert_ratio)
        rows.append({"kernel": k, "decode_ms": d, "verify_ms": v, "ratio": v / d if d > 0 else None,
                     "byte_ratio": r, "excess_ms": v - r * d, "calls": n.get(k)})
    return sorted(rows, key=lambda x: -x["excess_ms"])


# -- nextn (in a worker process) -------------------------------------------------------------------------------------
def cell(r) -> dict:
    """The numbers of one `GenerateResult` (the fields of `nextn run --json`, without the text)."""
    j = r.to_json()
    s = j["stats"]
    return {"tokens": j["tokens"], "emitted": s["emitted"], "decode_s": r.decode_s,
            "tok_s": s["emitted"] / r.decode_s if r.decode_s > 0 else 0.0, "rounds": s["rounds"],
            "plain_rounds": s["plain_rounds"], "drafted": s["drafted"], "accepted": s["accepted"],
            "acceptance": s["acceptance"], "mean_len": s["mean_len"], "per_pos": s["per_pos"],
            "per_pos_rate": s["per_pos_rate"], "drafted_at": list(r.stats.drafted_at),
            "depth_switches": s["depth_switches"], "entry_s": j["timings"]["entry_s"],
            "spec_draft_n_max": j["spec_draft_n_max"], "draft_vocab": j.get("spec_draft_vocab") or 0,
            "threads": j["threads"]}


def vocab_ranks(fields: dict, n_vocab: int, counted=None) -> np.ndarray:
    """The draft head's rank order: the ids of `counted` (token ids of some text) by frequency, then the tokenizer's
    merge order (runtime/draft_vocab.py); only the merge order without `counted`."""
    from nextn.runtime.draft_vocab import frequency_ranks, tokenizer_ranks

    merge = tokenizer_ranks(fields)
    return merge if counted is None else frequency_ranks(counted, n_vocab, merge)


def coverage(tokens, ranks, n: int) -> float:
    """Share of `tokens` (positions, not distinct ids) among the first `n` ids of `ranks`."""
    top = set(np.asarray(ranks[:n]).tolist())
    return sum(int(t) in top for t in tokens) / max(1, len(tokens))


def nextn_measure(m, n_gen: int, n_max=(1, 2, 3), kernels: bool = True, prompt: str | list = PROMPT,
                  inner: int = 1, vocab: dict | None = None) -> dict:
    """One nextn round on a loaded `Model` (module doc, step 1; step 3 when it has a reduced draft head):
    {"runs": {label: cell}, "ms": {...}, "prompt_ids", "verify_experts": {T: routed_experts}, "kernels": {...} or
    None}. `prompt`: text or token ids; `inner`: generations per configuration, interleaved (the fastest counts;
    every one is checked against plain's, or with a reduced head against the first run's). `vocab` (step 1 with
    --draft-vocab): {"ns": [N, ...], "source": VOCAB_SOURCES item or a path, "write": path or None}: adds
    "vocab_coverage" {source: {N: share}} and writes the `source` ranks (self / heldout) to "write"."""
    from nextn.common.timing import round_robin

    from kernel_profile import profile, routed_experts

    seq = m.sequence
    ids = m.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    dv = m.loaded.draft_vocab
    cfgs = configs(n_max, dv)
    t = time.perf_counter()
    calibrate(seq, seq.model.max_draft)      # auto's calibration (once per load, cached on the sequence)
    calibrate_s = time.perf_counter() - t
    for _label, spec_type, k in cfgs:        # warm-up: each entry's first calls
        m.generate(ids, 4, spec_type=spec_type, n_max=k, ignore_eos=True)
    runs, same, first = {}, {}, None
    for _ in range(inner):
        for label, spec_type, k in cfgs:
            c = cell(m.generate(ids, n_gen, spec_type=spec_type, n_max=k, ignore_eos=True))
            first = first or c["tokens"]
            same[label] = same.get(label, True) and c["tokens"] == (runs.get("plain", {}).get("tokens") or first)
            if label not in runs or c["tok_s"] > runs[label]["tok_s"]:
                runs[label] = c
    for label, c in runs.items():
        c["same_as_plain"] = same[label]
    # on the greedy chain: the rows a verify sees when its drafts are the chain's next tokens
    chain = np.asarray(ids + first, np.int32)
    P = len(ids) + 1
    need = P + max(VERIFY_ROWS)
    if len(chain) < need:
        raise SystemExit(f"spec_realwidth: -n {n_gen} is too short: the timings need {need - len(ids)} chain tokens")
    hidden, _lg, am = seq.prefill(chain[:P], 0)
    if dv:     # a reduced draft head: its draft steps and a decode of this process only
        calls = {f"verify_1 dv{dv}": lambda: seq.verify(chain[P:P + 1], P),
                 f"draft dv{dv}": lambda: seq.mtp_draft([int(chain[P])], hidden[-1:], P),
                 f"draft_2 dv{dv}": lambda: seq.mtp_draft([int(chain[P - 1]), int(chain[P])], hidden[-2:], P - 1,
                                                          out_ids=[1])}
        return {"runs": runs, "ms": {k: min(v) * 1e3 for k, v in round_robin(calls, REPS).items()},
                "prompt_ids": ids, "draft_vocab": dv, "calibrate_s": {str(dv): calibrate_s}}
    calls = {f"verify_{T}": (lambda T=T: seq.verify(chain[P:P + T], P)) for T in VERIFY_ROWS}
    V = int(seq.model.hparams["n_vocab"])
    calls.update({f"verify_calib_{T}": (lambda T=T: seq.verify(spread_tokens(T, V), P)) for T in VERIFY_ROWS[1:]})
    if seq.model.has_mtp:
        calls["draft"] = lambda: seq.mtp_draft([int(chain[P])], hidden[-1:], P)
        calls["draft_2"] = lambda: seq.mtp_draft([int(chain[P - 1]), int(chain[P])], hidden[-2:], P - 1, out_ids=[1])
    out = {"runs": runs, "ms": {k: min(v) * 1e3 for k, v in round_robin(calls, REPS).items()},
           "prompt_tokens": len(ids), "prompt_ids": ids, "calibrate_s": {"0": calibrate_s},
           "verify_experts": {str(T): routed_experts(seq, calls[f"verify_{T}"]) for T in VERIFY_ROWS},
           "n_expert_used": int(seq.model.hparams.get("n_expert_used", 1)), "kernels": None}
    if kernels:
        ms, n = {}, {}
        for T in KERNEL_ROWS:
            n[str(T)] = {}
            ms[str(T)] = profile(seq, calls[f"verify_{T}"], REPS, n[str(T)])
        out["kernels"] = {"ms": ms, "calls": n}
    if vocab:
        out["vocab_coverage"] = vocab_sources(m, ids, chain[len(ids):], n_gen, vocab)
    return out


def vocab_sources(m, prompt_ids, generated, n_gen: int, vocab: dict) -> dict:
    """{source: {N: coverage of `generated`}} for the tokenizer's ranks, the in-sample (`self`: `prompt_ids` +
    `generated`) and the `heldout` frequency ranks (module doc, step 3); writes vocab["source"]'s ranks to
    vocab["write"] when it is self or heldout."""
    from nextn.runtime.draft_vocab import write_ranks

    fields, V = m.loaded.files.main.fields, int(m.loaded.hparams["n_vocab"])
    held_ids = m.tokenizer.encode(HELDOUT_PROMPT)
    held = m.generate(held_ids, 4 * n_gen, spec_type="none", ignore_eos=True).ids
    ranks = {"tokenizer": vocab_ranks(fields, V), "self": vocab_ranks(fields, V, [int(t) for t in prompt_ids]
                                                                       + [int(t) for t in generated]),
             "heldout": vocab_ranks(fields, V, held_ids + list(held))}
    if vocab.get("write") and vocab["source"] in ("self", "heldout"):
        what = {"self": f"the prompt and the plain chain after it ({n_gen} tokens; in-sample)",
                "heldout": f"a plain generation of {4 * n_gen} tokens after {HELDOUT_PROMPT!r} (held-out)"}
        write_ranks(vocab["write"], ranks[vocab["source"]],
                    f"spec_realwidth.py: token frequencies of {what[vocab['source']]}, then the merge order")
    return {src: {str(n): coverage(generated, r, n) for n in vocab["ns"]} for src, r in ranks.items()}


def worker(path: str, a) -> dict:
    import nextn.runtime as rt

    t = time.perf_counter()
    dv = {"draft_vocab": a.worker_dv, "draft_vocab_file": None if a.draft_vocab_file in VOCAB_SOURCES
          else a.draft_vocab_file} if a.worker_dv else {}
    m = rt.load(path, ctx_size=a.ctx, log=lambda s: print(s, file=sys.stderr), cache_type_k=a.cache_type_k,
                cache_type_v=a.cache_type_v, **dv)
    m.sequence         # its KV is allocated here: part of the load, as llama.cpp's
    load_s = time.perf_counter() - t
    m.loaded.wait_populated()
    vocab = None
    if not a.worker_dv and a.draft_vocab:
        vocab = {"ns": a.draft_vocab, "source": a.draft_vocab_file or "tokenizer", "write": a.vocab_write}
    res = nextn_measure(m, a.n_gen, a.n_max, kernels=a.kernels and not a.worker_dv, inner=a.inner, vocab=vocab)
    res.update(load_s=load_s, has_mtp=m.loaded.has_mtp, kv_cache=m.sequence.kv_cache,
               threads_env=os.environ.get("TVM_NUM_THREADS"))
    return res


def nextn_round(path, a, log, kernels: bool, draft_vocab: int = 0, vocab_file: str | None = None) -> dict:
    """One nextn worker process (module doc, step 1; step 3 with `draft_vocab` N, its ranks from `vocab_file`:
    a path, or None for the tokenizer's). Step 1 writes the ranks of --draft-vocab-file self / heldout to
    `vocab_file`."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "-n", str(a.n_gen), "-c", str(a.ctx),
           "-ctk", a.cache_type_k, "-ctv", a.cache_type_v, "--n-max", ",".join(map(str, a.n_max)),
           "--inner", str(a.inner)]
    cmd += [] if kernels else ["--no-kernels"]
    if draft_vocab:
        cmd += ["--worker-dv", str(draft_vocab)] + (["--draft-vocab-file", vocab_file] if vocab_file else [])
    elif a.draft_vocab:
        cmd += ["--draft-vocab", ",".join(map(str, a.draft_vocab)), "--draft-vocab-file", a.draft_vocab_file]
        cmd += ["--vocab-write", vocab_file] if vocab_file else []
    return run_worker(cmd, a.mem_budget_gb * GB, env=thread_env(a.threads), log=log)


def vocab_file_for(path: str, a) -> str | None:
    """Where the draft head's ranks of file `path` come from (a path) or go to (self / heldout: written by step 1
    beside -o, else in the temp folder); None for the tokenizer's."""
    if a.draft_vocab_file == "tokenizer":
        return None
    if a.draft_vocab_file not in VOCAB_SOURCES:
        return a.draft_vocab_file
    import tempfile

    base = os.path.splitext(a.output)[0] if a.output else os.path.join(tempfile.gettempdir(), "spec_realwidth")
    return f"{base}-{os.path.basename(path).removesuffix('.gguf')}-vocab-{a.draft_vocab_file}.txt"


def merge_draft_vocab(nextn: dict, res: dict, draft_vocab: int) -> None:
    """Fold a reduced-head worker's result `res` into step 1's `nextn` of the same round: its runs (each checked
    against plain's tokens) and its ms; a failure is kept in nextn["draft_vocab_status"]."""
    nextn.setdefault("draft_vocab_status", {})[str(draft_vocab)] = res["status"]
    if res["status"] != "ok" or nextn.get("status") != "ok":
        return
    plain = nextn["runs"]["plain"]["tokens"]
    for label, c in res["runs"].items():
        c["same_as_plain"] = c["same_as_plain"] and c["tokens"] == plain
        nextn["runs"][label] = c
    nextn["ms"].update(res["ms"])
    nextn.setdefault("calibrate_s", {}).update(res.get("calibrate_s") or {})


# -- llama.cpp -------------------------------------------------------------------------------------------------------
def llama_cmds(path: str, a, tools: dict) -> dict:
    """{label: argv} of llama.cpp's runs: plain (llama-completion) and draft-mtp n_max k (llama-speculative-simple),
    the same prompt, tokens, threads, context and KV types as nextn's."""
    common = ["-m", path, "-p", PROMPT, "-n", str(a.n_gen), "-c", str(a.ctx), "-t", str(a.threads),
              "-ctk", a.cache_type_k, "-ctv", a.cache_type_v, "--temp", "0", "--ignore-eos"]
    out = {}
    if "llama-completion" in tools:
        out["plain"] = [tools["llama-completion"], *common, "-no-cnv"]
    if "llama-speculative-simple" in tools:
        for k in a.n_max:
            out[f"n_max={k}"] = [tools["llama-speculative-simple"], *common, "-ctkd", a.cache_type_k,
                                 "-ctvd", a.cache_type_v, "--spec-type", "draft-mtp", "--spec-draft-n-max", str(k),
                                 "-lv", "4"]
    return out


def llama_round(path, a, tools, log) -> dict:
    out = {}
    for label, cmd in llama_cmds(path, a, tools).items():
        res = run_watched(cmd, a.mem_budget_gb * GB, log=log)
        text = res["stdout"] + "\n" + res["stderr"]
        got = (parse_completion if label == "plain" else parse_speculative)(text) if res["rc"] == 0 else {}
        mem = {"peak_rss": res["peak_rss"], "wall_s": res["wall_s"]}
        out[label] = {"status": "ok", **got, **mem} if got else {"status": failure(res), **mem}
    for label in ["plain"] + [f"n_max={k}" for k in a.n_max]:
        out.setdefault(label, {"status": "not built: " + ("llama-completion" if label == "plain"
                                                            else "llama-speculative-simple")})
    return out


# -- summary ---------------------------------------------------------------------------------------------------------
def round_split(c: dict, one_decode_s: float) -> dict:
    """Seconds per round of a run `c` (a `cell`) split into draft steps, NextN gap rows, verify and host, each ÷
    `one_decode_s`; `tokens` = tokens emitted per round."""
    e = c["entry_s"]
    n = c["rounds"] + c["plain_rounds"]
    if not n or not one_decode_s:
        return {}
    draft = sum(v for k, v in e.items() if "draft" in k)
    gap = e.get("mtp_rows", 0.0)
    verify = e.get("verify", 0.0) + e.get("decode", 0.0)
    host = max(0.0, c["decode_s"] - sum(e.values()))
    parts = {"draft": draft, "gap": gap, "verify": verify, "host": host}
    out = {k: v / n / one_decode_s for k, v in parts.items()}
    out["total"] = sum(out.values())
    out["tokens"] = c["emitted"] / n
    out["round_s"] = c["decode_s"] / n
    return out


def summarize(entry: dict) -> dict:
    """Best of the rounds per configuration and engine, acceptance, the nextn round split, verify vs bytes."""
    nx = [r["nextn"] for r in entry["rounds"] if r["nextn"].get("status") == "ok"]
    ll = [r["llama"] for r in entry["rounds"]]
    labels = list(dict.fromkeys(k for r in nx for k in r["runs"]))
    s: dict = {"nextn": {}, "llama": {}, "ratio": {}, "nextn_status": "ok" if nx else next(
        (r["nextn"]["status"] for r in entry["rounds"]), entry.get("skipped") or "no rounds")}
    for label in labels:
        cells = [r["runs"][label] for r in nx if label in r["runs"]]
        b = max(cells, key=lambda c: c["tok_s"])
        s["nextn"][label] = {k: b[k] for k in ("tok_s", "acceptance", "accepted", "drafted", "rounds",
                                               "plain_rounds", "mean_len", "depth_switches")}
        s["nextn"][label]["draft_vocab"] = b.get("draft_vocab", 0)
        deepest = max((i + 1 for i, d in enumerate(b["drafted_at"]) if d), default=0)
        s["nextn"][label]["per_pos"] = b["per_pos"][:deepest]      # the positions that were drafted
        s["nextn"][label]["same_as_plain"] = all(c["same_as_plain"] for c in cells)
        s["nextn"][label]["best"] = b
    llabels = sorted({k for r in ll for k in r}, key=lambda k: (k != "plain", k))
    for label in llabels:
        ok = [r[label] for r in ll if r.get(label, {}).get("status") == "ok"]
        s["llama"][label] = (max(ok, key=lambda c: c["tok_s"]) if ok else
                             {"status": next((r[label]["status"] for r in ll if label in r), "not run")})
    # ratios per configuration: against llama.cpp's same configuration, and each against its own plain
    for label in set(s["nextn"]) | set(s["llama"]):
        n, q = s["nextn"].get(label, {}), s["llama"].get(label, {})
        q0 = s["llama"].get("plain", {})
        rec = s["ratio"][label] = {}
        rec["nextn_llama"] = _div(n.get("tok_s"), q.get("tok_s"))
        rec["nextn_own_plain"] = _div(n.get("tok_s"), s["nextn"].get(own_plain(label, s["nextn"]), {}).get("tok_s"))
        rec["llama_own_plain"] = _div(q.get("tok_s"), q0.get("tok_s"))
    if "auto" in s["nextn"]:
        fixed = [v["tok_s"] for k, v in s["nextn"].items() if k != "auto"]
        s["auto_vs_best"] = _div(s["nextn"]["auto"]["tok_s"], max(fixed) if fixed else None)
    cov = next((r.get("vocab_coverage") for r in nx if r.get("vocab_coverage")), None)
    if cov:
        s["vocab_coverage"] = cov
    if not nx:
        return s
    ms = s["ms"] = {k: min(r["ms"][k] for r in nx if k in r["ms"]) for k in dict.fromkeys(k for r in nx
                                                                                          for k in r["ms"])}
    plain = s["nextn"]["plain"]["best"]
    one = plain["entry_s"].get("decode", 0.0) / max(1, plain["plain_rounds"])
    s["one_decode_s"] = one
    ones = {label: v["best"]["entry_s"].get("decode", 0.0) / max(1, v["best"]["plain_rounds"])
            for label, v in s["nextn"].items() if label.startswith("plain")}
    s["split"] = {label: round_split(v["best"], ones.get(own_plain(label, ones), one))
                  for label, v in s["nextn"].items()}
    # verify vs bytes
    dec = entry["bytes_per_token"]["gguf"]
    used = nx[0]["n_expert_used"]
    ex = nx[0]["verify_experts"]
    s["verify_bytes"] = {}
    for T in VERIFY_ROWS:
        e = ex.get(str(T))
        distinct = e["distinct"] if e else used
        s["verify_bytes"][str(T)] = {
            "verify_x_decode": ms[f"verify_{T}"] / ms["verify_1"],
            "calib_x_decode": ms[f"verify_calib_{T}"] / ms["verify_1"] if f"verify_calib_{T}" in ms else None,
            "bytes_x_decode": verify_bytes(dec, T, distinct, used) / dec["total"],
            "distinct": distinct, "routed": e["routed"] if e else T * used}
    if "draft" in ms:
        s["draft_x_decode"] = ms["draft"] / ms["verify_1"]
        s["draft2_x_decode"] = ms["draft_2"] / ms["verify_1"]
        s["draft_bytes_x_decode"] = entry["bytes_per_token"].get("draft", 0.0) / dec["total"]
    s["draft_heads"] = draft_heads(entry, ms, s)
    for label, sp in s["split"].items():    # what the same tokens per round would give at the bytes' speed
        b = s["nextn"][label]["best"]
        T = None if label.startswith("auto") else 1 if label == "plain" else b["spec_draft_n_max"] + 1
        if sp and T is not None and str(T) in s["verify_bytes"]:
            drafts = b["drafted"] / b["rounds"] if b["rounds"] else 0.0
            dx = s["draft_heads"].get(label_draft_vocab(label), {}).get("bytes_x_decode") or 0.0
            vx = s["verify_bytes"][str(T)]["bytes_x_decode"]
            sp["bytes_bound"] = sp["tokens"] / (vx + drafts * dx)
            sp["free_draft_bound"] = sp["tokens"] / vx     # ... and if a draft step cost nothing at all
    k = next((r["kernels"] for r in nx if r.get("kernels")), None)
    if k:
        s["kernels"] = {}
        for T in KERNEL_ROWS[1:]:
            vb = s["verify_bytes"][str(T)]
            s["kernels"][str(T)] = kernel_excess(k["ms"]["1"], k["ms"][str(T)], vb["distinct"] / used,
                                                 k["calls"][str(T)])
    return s


def draft_heads(entry: dict, ms: dict, s: dict) -> dict:
    """{N: {"ms", "x_decode", "x_decode_2", "bytes_x_decode"}} per draft head (N 0: the full head): a draft step's
    ms (one row; `x_decode_2`: with one gap row) ÷ a decode of the same process, and its weight bytes ÷ a decode's."""
    total = entry["bytes_per_token"]["gguf"]["total"]
    out = {}
    if "draft" in ms:
        out[0] = {"ms": ms["draft"], "x_decode": s["draft_x_decode"], "x_decode_2": s["draft2_x_decode"],
                  "bytes_x_decode": s["draft_bytes_x_decode"]}
    for N, b in (entry["bytes_per_token"].get("draft_vocab") or {}).items():
        d, one = ms.get(f"draft dv{N}"), ms.get(f"verify_1 dv{N}")
        out[int(N)] = {"ms": d, "x_decode": _div(d, one), "x_decode_2": _div(ms.get(f"draft_2 dv{N}"), one),
                       "bytes_x_decode": b / total}
    return out


def _div(x, y):
    return x / y if x is not None and y else None


def _alpha(name: str) -> str | None:
    m = re.search(r"-a([\d.]+)(?:\.gguf)?$", name)
    return m.group(1) if m else None


def projection(files: list[dict]) -> list[dict]:
    """The projection to the real layer count (module doc), one entry per (arch, ALPHA) group with >= 2 trunk
    layer counts measured: {"arch", "alpha", "layers": measured counts, "L_real", "base": the file projected from
    (most layers), "per_layer_ms": {T: slope}, "configs": {label: {"tok_s", "x_plain", "round_s", "tokens"}}}."""
    groups: dict = {}
    for e in files:
        s = e.get("summary") or {}
        if s.get("ms") and e.get("arch") in REAL_LAYERS:
            groups.setdefault((e["arch"], _alpha(e["name"])), []).append(e)
    out = []
    for (arch, alpha), es in sorted(groups.items(), key=lambda x: (x[0][0], str(x[0][1]))):
        layers = sorted({e["n_layer"] for e in es})
        if len(layers) < 2:
            continue
        slope = {}
        for T in VERIFY_ROWS:
            x = np.array([e["n_layer"] for e in es], float)
            y = np.array([e["summary"]["ms"][f"verify_{T}"] for e in es], float)
            slope[str(T)] = float(np.polyfit(x, y, 1)[0])
        base = max(es, key=lambda e: e["n_layer"])
        L = REAL_LAYERS[arch]
        dL = L - base["n_layer"]
        # bytes at L layers: the dense and routed bytes per layer from the files' tensors, the base file's experts
        dec = {}
        for key in ("dense", "routed"):
            x = np.array([e["n_layer"] for e in es], float)
            y = np.array([e["bytes_per_token"]["gguf"][key] for e in es], float)
            dec[key] = base["bytes_per_token"]["gguf"][key] + dL * float(np.polyfit(x, y, 1)[0])
        b0 = base["bytes_per_token"]["gguf"]
        dec.update(lm_head=b0["lm_head"], token_embd_row=b0["token_embd_row"])
        dec["total"] = dec["dense"] + dec["routed"] + dec["lm_head"] + dec["token_embd_row"]
        used = base["n_expert_used"]
        vb = base["summary"]["verify_bytes"]
        draft_x = base["bytes_per_token"]["draft"] / dec["total"]
        dv_bytes = base["bytes_per_token"].get("draft_vocab") or {}
        cfg = {}
        for label, v in base["summary"]["nextn"].items():
            if label.startswith("auto"):
                continue      # its depth varies from round to round: no one verify size to scale
            b = v["best"]
            n = b["rounds"] + b["plain_rounds"]
            T = 1 if label == "plain" else int(b["spec_draft_n_max"]) + 1
            round_s = b["decode_s"] / n + dL * slope[str(T)] / 1e3
            cfg[label] = {"round_s": round_s, "tokens": b["emitted"] / n, "tok_s": b["emitted"] / n / round_s}
            drafts = b["drafted"] / b["rounds"] if b["rounds"] else 0.0
            bx = verify_bytes(dec, T, vb[str(T)]["distinct"], used) / dec["total"]
            N = label_draft_vocab(label)
            dx = dv_bytes[str(N)] / dec["total"] if N and str(N) in dv_bytes else draft_x
            cfg[label].update(bytes_x_decode=bx, bytes_bound=cfg[label]["tokens"] / (bx + drafts * dx),
                              free_draft_bound=cfg[label]["tokens"] / bx)
        for c in cfg.values():
            c["x_plain"] = _div(c["tok_s"], cfg["plain"]["tok_s"])
        out.append({"arch": arch, "alpha": alpha, "layers": layers, "L_real": L, "base": base["name"],
                    "per_layer_ms": slope, "bytes_per_token": dec["total"], "draft_bytes_x_decode": draft_x,
                    "configs": cfg})
    return out


# -- tables ----------------------------------------------------------------------------------------------------------
_f = fmt_num


def _pos(p) -> str:
    return "–" if not p else "/".join(f"{x:.2f}" for x in p)


def format_table(report: dict) -> str:
    """Markdown: the cost split, verify vs bytes, the kernels where a verify exceeds its bytes, the projection,
    then the speed table with its ratios last; a line on the machine and settings; failures."""
    files = [e for e in report["files"] if e.get("summary")]
    L = []
    # 1. nextn's cost per round
    L += ["nextn's cost per round, each a multiple of one decode (the plain run's `decode` step):", "",
          "| file | config | tokens / round | draft steps | NextN gap rows | verify | host | round | "
          "tokens per decode-time | the same at the bytes' cost | the same with free drafts |", "|" + "---|" * 11]
    for e in files:
        for label, sp in (e["summary"].get("split") or {}).items():
            if sp:
                L.append(f"| {e['name']} | {label} | {sp['tokens']:.2f} | {sp['draft']:.2f} | {sp['gap']:.2f} | "
                         f"{sp['verify']:.2f} | {sp['host']:.2f} | {sp['total']:.2f} | "
                         f"{_f(_div(sp['tokens'], sp['total']))} | {_f(sp.get('bytes_bound'))} | "
                         f"{_f(sp.get('free_draft_bound'))} |")
    # 2. verify vs bytes
    L += ["", f"A verify of T rows against its bytes (chain tokens; ms of the entry points, min of {REPS} calls "
          "× rounds):",
          "", "| file | decode ms | T | distinct experts / MoE layer (of routed) | verify(T) ÷ decode | "
          "bytes(T) ÷ bytes(1) | the gate's calibration verify ÷ decode | draft ÷ decode (bytes) | "
          "draft+1 gap row ÷ decode | verify ÷ bytes |", "|" + "---|" * 10]
    for e in files:
        s = e["summary"]
        for T, vb in (s.get("verify_bytes") or {}).items():
            if T == "1":
                continue
            L.append(f"| {e['name']} | {s['ms']['verify_1']:.1f} | {T} | {vb['distinct']:.1f} ({vb['routed']}) | "
                     f"{vb['verify_x_decode']:.2f} | {vb['bytes_x_decode']:.2f} | {_f(vb['calib_x_decode'])} | "
                     + (f"{_f(s.get('draft_x_decode'))} ({_f(s.get('draft_bytes_x_decode'))}) | "
                        f"{_f(s.get('draft2_x_decode'))}" if T == "2" else " | ")
                     + f" | {vb['verify_x_decode'] / vb['bytes_x_decode']:.2f} |")
    # 2b. draft heads
    heads = [(e, N, h) for e in files for N, h in sorted((e["summary"].get("draft_heads") or {}).items(),
                                                         key=lambda x: int(x[0]))]
    if any(int(N) for _e, N, _h in heads):
        L += ["", "A draft step per draft head (ms min of the calls; ÷ a decode of the same process; the reduced "
              "head's rows: " + ", ".join(sorted({str(e.get("draft_vocab_source")) for e, _N, _h in heads}))
              + "):", "", "| file | draft head | draft step ms | draft ÷ decode | draft+1 gap row ÷ decode | "
              "draft bytes ÷ decode bytes | coverage of the plain chain by the head's rows |", "|" + "---|" * 7]
        for e, N, h in heads:
            N = int(N)
            cov = ((e["summary"].get("vocab_coverage") or {}).get(str(e.get("draft_vocab_source")), {})
                   .get(str(N))) if N else 1.0
            L.append(f"| {e['name']} | {f'{N} rows' if N else 'full'} | {_f(h['ms'], '{:.1f}')} | "
                     f"{_f(h['x_decode'])} | {_f(h['x_decode_2'])} | {_f(h['bytes_x_decode'])} | {_f(cov)} |")
    # 3. kernels
    for e in files:
        for T, rows in (e["summary"].get("kernels") or {}).items():
            total = next((r for r in rows if r["kernel"] == "(step total)"), None)
            rows = [r for r in rows if r["kernel"] != "(step total)"]
            L += ["", f"{e['name']}: where the verify of {T} rows exceeds its bytes (per kernel family, ms; top 8 "
                  f"by excess; step with the instrument: decode {_f(total and total['decode_ms'], '{:.1f}')}, "
                  f"verify {_f(total and total['verify_ms'], '{:.1f}')}):", "",
                  "| kernel | calls | decode ms | verify ms | verify ÷ decode | bytes ratio | excess ms |",
                  "|" + "---|" * 7]
            for r in rows[:8]:
                L.append(f"| {r['kernel']} | {r['calls'] or '–'} | {r['decode_ms']:.2f} | {r['verify_ms']:.2f} | "
                         f"{_f(r['ratio'])} | {r['byte_ratio']:.2f} | {r['excess_ms']:.2f} |")
            ex = sum(r["excess_ms"] for r in rows)
            L.append(f"| (all kernels) | | {sum(r['decode_ms'] for r in rows):.2f} | "
                     f"{sum(r['verify_ms'] for r in rows):.2f} | | | {ex:.2f} |")
    # 4. projection
    proj = report.get("projection") or projection(report["files"])
    for p in proj:
        labels = list(p["configs"])
        L += ["", f"PROJECTION (not a measurement) to {p['L_real']} trunk layers, {p['arch']} ALPHA {p['alpha']}: "
              f"measured on {', '.join(map(str, p['layers']))} trunk layers, per-layer ms of the verify of 1..4 rows "
              + " / ".join(f"{v:.1f}" for v in p["per_layer_ms"].values()) + f", projected from {p['base']}:", "",
              "| config | tokens / round | verify bytes ÷ decode bytes | projected round ms | projected tok/s | "
              "bytes-bound ÷ plain | the same with free drafts | projected ÷ projected plain |", "|" + "---|" * 8]
        for label in labels:
            c = p["configs"][label]
            L.append(f"| {label} | {c['tokens']:.2f} | {c['bytes_x_decode']:.2f} | {c['round_s'] * 1e3:.0f} | "
                     f"{c['tok_s']:.2f} | {c['bytes_bound']:.2f} | {c['free_draft_bound']:.2f} | {_f(c['x_plain'])} |")
    # 5. speed, ratios last
    L += ["", "| file | config | nextn tok/s | nextn acceptance (acc/drafted) | nextn acc per pos | same tokens as "
          "plain | llama tok/s | llama acceptance | llama acc per pos | nextn ÷ llama | "
          "spec ÷ own plain: nextn / llama |",
          "|" + "---|" * 11]
    notes = []
    for e in report["files"]:
        s = e.get("summary") or {}
        if not file_notes(e, s, notes):
            continue
        labels = list(s.get("nextn") or {}) or list(s.get("llama") or {})
        for label in labels:
            n, q, r = s["nextn"].get(label, {}), s["llama"].get(label, {}), s["ratio"].get(label, {})
            acc_n = (f"{n['acceptance']:.3f} ({n['accepted']}/{n['drafted']})" if n.get("drafted") else "–")
            if label.startswith("auto") and n:
                acc_n += f", {n['rounds']} spec / {n['plain_rounds']} plain rounds"
            acc_q = (f"{q['acceptance']:.3f} ({q['accepted']}/{q['drafted']})" if q.get("drafted") else "–")
            same = "–" if label == "plain" or not n else ("yes" if n["same_as_plain"] else "NO")
            L.append(f"| {e['name']} | {label} | {_f(n.get('tok_s'))} | {acc_n} | {_pos(n.get('per_pos'))} | {same} | "
                     f"{_f(q.get('tok_s'))} | {acc_q} | {_pos(q.get('per_pos'))} | {_f(r.get('nextn_llama'))} | "
                     f"{_f(r.get('nextn_own_plain'))} / {_f(r.get('llama_own_plain'))} |")
            if q.get("status") not in (None, "ok"):
                notes.append(f"- {e['name']} {label}: llama: {q['status']}")
        if s.get("auto_vs_best") is not None:
            notes.append(f"- {e['name']}: auto ÷ the fastest of plain and the fixed depths: {s['auto_vs_best']:.2f}")
    m = report["machine"]
    L += ["", f"{m['cpu']} ({' '.join(m.get('cpu_flags', []))}), {m['physical_cores']} cores, {report['threads']} "
          f"thread(s) both engines, KV -ctk {report['cache_type_k']} -ctv {report['cache_type_v']}, "
          f"-c {report['ctx']}, greedy, -n {report['n_gen']}, best of {report['repeat']} interleaved rounds; nextn "
          f"{m.get('nextn_commit') or '?'}, llama.cpp {(report.get('llama_build') or '?').split()[0]}; "
          f"loadavg at start {m['loadavg'][0]:.2f}" + (" (machine loaded: read the ratios, not the absolute numbers)"
                                      if report.get("loaded") else "")]
    return "\n".join(L + ([""] + notes if notes else []))


# -- the run ---------------------------------------------------------------------------------------------------------
def measure_file(path, a, tools, log) -> dict:
    info = gguf_info(path)
    entry = file_entry(path, info, n_expert_used=info["n_expert_used"],
                       bytes_per_token={"gguf": decode_bytes_from_gguf(info), "draft": draft_bytes(info),
                                        "draft_vocab": {str(N): draft_bytes(info, N) for N in a.draft_vocab}})
    if a.draft_vocab:
        entry["draft_vocab_source"] = a.draft_vocab_file
    if skipped_for_memory(entry, a.headroom_gb, log):
        return entry
    for r in range(a.repeat):
        rnd = {}
        if "nextn" in a.engines and not over_budget(entry):
            log(f"{entry['name']}: round {r + 1}/{a.repeat}: nextn")
            vf = vocab_file_for(path, a) if a.draft_vocab else None
            n = rnd["nextn"] = nextn_round(path, a, log, kernels=a.kernels and r == 0, vocab_file=vf)
            log(f"  nextn: {n['status']}" + ("".join(f", {k} {c['tok_s']:.2f} tok/s" for k, c in n["runs"].items())
                                             if n["status"] == "ok" else ""))
            for N in a.draft_vocab:
                log(f"{entry['name']}: round {r + 1}/{a.repeat}: nextn --spec-draft-vocab {N}")
                d = nextn_round(path, a, log, kernels=False, draft_vocab=N, vocab_file=vf)
                merge_draft_vocab(n, d, N)
                log(f"  nextn dv{N}: {d['status']}" + ("".join(f", {k} {c['tok_s']:.2f} tok/s"
                                                              for k, c in d["runs"].items())
                                                      if d["status"] == "ok" else ""))
        else:
            rnd["nextn"] = {"status": over_budget(entry) or "not run (--engines)"}
        if "llama" in a.engines:
            log(f"{entry['name']}: round {r + 1}/{a.repeat}: llama.cpp")
            q = rnd["llama"] = llama_round(path, a, tools, log)
            log("  llama: " + ", ".join(f"{k} {c['tok_s']:.2f} tok/s" if c["status"] == "ok" else f"{k} {c['status']}"
                                        for k, c in q.items()))
        else:
            rnd["llama"] = {}
        entry["rounds"].append(rnd)
    return entry


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="GGUF paths or names in --dir [default: the predictable files there]")
    ap.add_argument("--dir", default=realwidth_dir())
    ap.add_argument("--repeat", type=int, default=2, choices=range(1, 100), metavar="N",
                    help="interleaved rounds per file (best counts) [default: 2]")
    ap.add_argument("-n", "--n-gen", type=int, default=128, help="tokens per generation [default: 128]")
    ap.add_argument("-t", "--threads", type=int, default=None,
                    help="threads for both engines [default: physical cores]")
    ap.add_argument("-c", "--ctx", type=int, default=4096, help="context of both engines [default: 4096]")
    ap.add_argument("-ctk", "--cache-type-k", default=KV_DEFAULT, choices=KV_TYPES)
    ap.add_argument("-ctv", "--cache-type-v", default=KV_DEFAULT, choices=KV_TYPES)
    ap.add_argument("--n-max", default="1,2,3", help="the fixed draft depths, comma list [default: 1,2,3]")
    ap.add_argument("--inner", type=int, default=2, choices=range(1, 100), metavar="N",
                    help="nextn generations per configuration in a round, interleaved (fastest counts) [default: 2]")
    ap.add_argument("--engines", default="nextn,llama", help="comma list: nextn, llama")
    ap.add_argument("--no-kernels", dest="kernels", action="store_false",
                    help="skip the per-kernel profile of the decode and the verifies")
    ap.add_argument("--mem-budget-gb", type=float, default=12.0, help="kill a measured process above this anon memory")
    ap.add_argument("--headroom-gb", type=float, default=2.0,
                    help="measure a file only when MemAvailable holds it + this much [default: 2]")
    ap.add_argument("-o", "--output", default=None, help="write the JSON report here (after each file)")
    ap.add_argument("--table", metavar="REPORT", default=None,
                    help="print the tables of a saved report, measure nothing")
    ap.add_argument("--draft-vocab", default="none",
                    help="comma list: none (the full draft head) and/or N, the reduced draft head's rows "
                         "(--spec-draft-vocab N; module doc, step 3) [default: none]")
    ap.add_argument("--draft-vocab-file", default="tokenizer",
                    help="the reduced head's ranks: tokenizer (merge order), self (in-sample token frequencies "
                         "of the plain chain), heldout (of a generation after another prompt) or a file of token "
                         "ids [default: tokenizer]")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-dv", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--vocab-write", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        a.n_max = [int(x) for x in a.n_max.split(",")]
        assert a.n_max and all(k >= 1 for k in a.n_max)
    except (ValueError, AssertionError):
        raise SystemExit(f"spec_realwidth: --n-max {a.n_max}: expected a comma list of integers >= 1") from None
    try:
        a.draft_vocab = [int(x) for x in a.draft_vocab.split(",") if x != "none"]
        assert all(n >= 1 for n in a.draft_vocab)
    except (ValueError, AssertionError):
        raise SystemExit(f"spec_realwidth: --draft-vocab {a.draft_vocab}: expected a comma list of none and "
                         "integers >= 1") from None
    if a.draft_vocab_file not in VOCAB_SOURCES and not a.worker and not os.path.isfile(a.draft_vocab_file):
        raise SystemExit(f"spec_realwidth: --draft-vocab-file {a.draft_vocab_file}: expected tokenizer, self, "
                         "heldout or a file of token ids")
    if a.worker:
        print(RESULT + json.dumps(worker(a.worker, a)), flush=True)
        return
    if a.table:
        report = saved_report(a.table, summarize)
        report["projection"] = projection(report["files"])
        print(format_table(report))
        return
    a.threads = a.threads or physical_cores()
    a.engines = set(a.engines.split(","))
    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    tools = (peer_tools(("llama-completion", "llama-speculative-simple"), log, "spec_realwidth")
             if "llama" in a.engines else {})
    files = resolve_files(a.files, a.dir, known=KNOWN)
    if not files:
        raise SystemExit(f"spec_realwidth: no predictable file in {a.dir} "
                         f"(make one: python bench/realwidth_files.py glm45air-1-a0.1)")
    report = new_report(a, argv, n_max=a.n_max, draft_vocab=a.draft_vocab, draft_vocab_source=a.draft_vocab_file)

    def project(rep):
        rep["projection"] = projection(rep["files"])
    run_files(report, files, lambda path: measure_file(path, a, tools, log), summarize, a.output, after=project)
    print(format_table(report))


if __name__ == "__main__":
    main()
