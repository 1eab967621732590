"""Real-width speed and memory, side by side in one run: nextn vs llama.cpp (the peer) on the same GGUFs.

    python bench/realwidth.py [FILE ...] [--repeat 3] [-t THREADS] [-ctk f16 -ctv f16] [-o report.json]
    python bench/realwidth.py --table report.json          # the tables of a saved report again (summarized anew)

FILE: paths, or names in --dir (default bench/realwidth_files.py's folder: $NEXTN_REALWIDTH or
~/.cache/nextn-realwidth); default: every file of KNOWN that exists there (glm45air-1, its IQ4_XS and Q8_0 variants,
glm45air-3, glm52-1), smallest first. `python bench/realwidth_files.py` makes them (synth_realwidth.py, and the peer's
llama-quantize for the variants). On a shared machine run it under the heavy-bench lock:
`flock "$(python bench/realwidth_files.py --lock)" python bench/realwidth.py ...`.
Prints two tables: speed (issue 12: decode vs tg, prefill vs pp, bandwidth, verify and draft per decode) and
memory / first token (issue 11: peak RSS against file + KV bytes, `run -n 1` wall against `llama-completion -n 1`,
decode vs tg).

Both engines get the same settings: `-t` threads (nextn: TVM_NUM_THREADS, and `run -t` where nextn has it) and
KV cache types `-ctk/-ctv` (default f16, llama.cpp's; the memory table shows the types each engine allocated);
llama.cpp keeps its default flash attention (`-fa auto`: on for the CPU), nextn's attention is always flash.

Per file, `--repeat` rounds; each round measures, back to back so that drift hits all three alike:
  1. the machine's read bandwidth: `-t` numpy threads each summing its share of a 512 MB float32 array (STREAM-like
     "sum"; numpy releases the GIL in reductions), and a single-threaded 256 MB copy;
  2. nextn in a fresh process (`nextn.runtime.load`, compiled and cached on the first round), timed once its
     background populate of the mapped GGUF is done (`LoadedModel.wait_populated`; llama.cpp's load maps with
     MAP_POPULATE): plain decode tok/s (`Model.generate(spec_type="none")`, --n-gen decoded tokens after an 8-token
     prompt), prefill tok/s (`Sequence.prefill(last_only=True)` of --n-prompt random tokens, the last row's output
     only, as llama-bench's pp and plain decoding: one untimed call, then the best of 2, as llama-bench times pp
     after its warm-up run), and the ms of `Sequence.verify` over k+1 = 1..4 rows and of one
     `Sequence.mtp_draft` row at the position after that prompt, each the min of 3 round-robin calls
     (`nextn.common.timing.round_robin`); the rows are distinct random tokens (the depth calibration's repeated token
     would route every row to the same experts), yet a random-weight file can route distinct tokens alike: the
     table's "experts of verify 4" column gives the distinct experts per MoE layer that the verify of 4 read
     against the 4 x n_expert_used routed (bench/kernel_profile.routed_experts), since a verify's expert bytes
     follow the distinct ones;
  3. `llama-bench -p N_PROMPT -n N_GEN -r 1 -t THREADS` (pp and tg, llama-bench's own warm-up).
Best of the rounds counts (max tok/s, min ms). After the rounds, once per file: `nextn run FILE -n 1` and
`llama-completion -m FILE -n 1 -no-cnv` (both -c 4096), each right after reading the whole file once (warm page
cache): wall seconds and peak RSS, against the file's bytes + the KV bytes each engine allocated (nextn: the
engine's own count; llama.cpp: its `llama_kv_cache: size =` lines, which is why it runs with `-v`).

Weight bytes read per decoded token (`nextn.common.manifest.read_bytes_per_row`): every trunk weight once, except
the routed experts (`ffn_{gate,up,down}_exps`), of which n_expert_used / n_expert are read, and `token_embd`, of
which one row is read (unless the model has no `output.weight` and ties its lm head to it). NextN weights are not
read by plain decoding; KV reads are left out (an 8..40-cell context). Counted twice: from the GGUF's tensor sizes
(what llama.cpp reads) and from the buffers the artifact's `decode` entry takes (`step_read_bytes`: what nextn's
kernels stream; larger where a format is repacked). GB/s per engine = its bytes per token × its tok/s.

Memory guard (a 24 GB machine; glm52-1 alone is 12.7 GB): a file is measured only when MemAvailable (page cache
counts as available) holds the file + --headroom-gb (default 2), else it is reported as skipped; each measured
process is watched (/proc) and killed when its anonymous memory passes --mem-budget-gb (default 12; mapped file
pages do not count) or the machine's MemAvailable falls under 1 GB, and nextn is not loaded again for that file;
the report records it and goes on. Peak RSS is the child's VmHWM (/proc), mapped file pages included.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from nextn.common.kv_types import DEFAULT as KV_DEFAULT
from nextn.common.kv_types import NAMES as KV_TYPES   # llama.cpp's -ctk / -ctv values that nextn has
from nextn.runtime.threads import physical_cores

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# the harness, one concern a module (bench/spec_realwidth.py imports the same)
from bench_report import (PROMPT, file_entry, new_report, peer_tools, resolve_files, run_files,  # noqa: E402
                          saved_report)
from gguf_bytes import decode_bytes_from_gguf, gguf_info  # noqa: E402
from guarded import (RESULT, failure, over_budget, run_watched, run_worker, skipped_for_memory,  # noqa: E402
                     thread_env, warm_page_cache)
from llama_logs import parse_llama_bench, parse_llama_kv  # noqa: E402
from machine_probe import GB, stream_bandwidth  # noqa: E402
from realwidth_files import SPEED, realwidth_dir  # noqa: E402
from realwidth_table import VERIFY_ROWS, format_table, summarize  # noqa: E402

DEFAULT_DIR = realwidth_dir()
KNOWN = [f"{n}.gguf" for n in SPEED]


# -- nextn (in a worker process, one per round) ---------------------------------------------------------------------
def worker(path: str, n_gen: int, n_prompt: int, ctx: int, seed: int, cache_type_k: str = KV_DEFAULT,
           cache_type_v: str = KV_DEFAULT) -> dict:
    """One nextn round on `path` in this process; returns the measurements (see the module doc)."""
    import nextn.runtime as rt
    from nextn.common.manifest import step_read_bytes
    from nextn.common.timing import round_robin, time_call

    from kernel_profile import routed_experts

    t = time.perf_counter()
    m = rt.load(path, ctx_size=ctx, log=lambda s: print(s, file=sys.stderr), cache_type_k=cache_type_k,
                cache_type_v=cache_type_v)
    seq = m.sequence   # its KV is allocated here: part of the load, as llama.cpp's
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    populated = seq.model.wait_populated()
    populate_s = time.perf_counter() - t
    rng = np.random.default_rng(seed)
    V = int(seq.model.hparams["n_vocab"])
    out = {"load_s": load_s, "populate": populated, "populate_wait_s": populate_s, "weight_bytes": seq.model.weight_bytes, "kv_bytes": seq.kv_bytes, "kv_cache": seq.kv_cache,
           "copied_weight_bytes": getattr(seq.model.device, "copied_weight_bytes", None),
           "plan_bytes_per_token": step_read_bytes(seq.model.artifact.manifest, "decode"), "threads_env":
           os.environ.get("TVM_NUM_THREADS"), "has_mtp": seq.model.has_mtp}
    ids = m.tokenizer.encode(PROMPT)[:8]
    m.generate(ids, 3, spec_type="none", ignore_eos=True)                  # warm-up: first calls of each entry
    g = m.generate(ids, n_gen + 1, spec_type="none", ignore_eos=True)    # first token comes from prefill
    out["decode_tok_s"] = n_gen / g.decode_s
    out["python_share"] = g.python_share
    toks = rng.integers(0, V, n_prompt).astype(np.int32)
    # Only the last row's output, as llama-bench's pp (llama_batch_get_one: one output row) and plain decoding's
    # prefill. One untimed call first, as llama-bench's warm-up: first-call costs at this row count are not throughput.
    seq.prefill(toks, 0, last_only=True)
    out["prefill_tok_s"] = n_prompt / time_call(lambda: seq.prefill(toks, 0, last_only=True), reps=2)
    hidden, _lg, am = seq.prefill(toks[:8], 0)
    pos = 8
    rows = rng.integers(0, V, max(VERIFY_ROWS)).astype(np.int32)
    calls = {f"verify_{T}": (lambda T=T: seq.verify(rows[:T], pos)) for T in VERIFY_ROWS}
    if seq.model.has_mtp:
        calls["draft"] = lambda: seq.mtp_draft([am], hidden[-1:], pos)
    out["ms"] = {k: min(v) * 1e3 for k, v in round_robin(calls, 3).items()}
    # what the verify of the most rows read of the routed experts: random-weight files can route every row to the
    # same experts, which a verify ratio alone would not show
    out["verify_experts"] = routed_experts(seq, calls[f"verify_{max(VERIFY_ROWS)}"])
    return out


def nextn_round(path, a, log) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "--n-gen", str(a.n_gen),
           "--n-prompt", str(a.n_prompt), "--ctx", str(a.ctx), "-ctk", a.cache_type_k, "-ctv", a.cache_type_v]
    return run_worker(cmd, a.mem_budget_gb * GB, env=thread_env(a.threads), log=log)


# -- llama.cpp ------------------------------------------------------------------------------------------------------
def llama_round(path, a, tools, log) -> dict:
    if "llama-bench" not in tools:
        return {"status": tools["missing llama-bench"]}
    cmd = [tools["llama-bench"], "-m", path, "-p", str(a.n_prompt), "-n", str(a.n_gen), "-r", "1",
           "-t", str(a.threads), "-ctk", a.cache_type_k, "-ctv", a.cache_type_v, "-o", "jsonl"]
    res = run_watched(cmd, a.mem_budget_gb * GB, log=log)
    parsed = parse_llama_bench(res["stdout"]) if res["rc"] == 0 else {}
    mem = {"peak_rss": res["peak_rss"], "peak_anon": res["peak_anon"], "wall_s": res["wall_s"]}
    if "tg" not in parsed or "pp" not in parsed:
        return {"status": failure(res), **mem}
    return {"status": "ok", **parsed, **mem}


def nextn_run_flags(nextn_cli: str) -> dict:
    """Whether this checkout's `nextn run` takes llama.cpp's `-t/--threads` ({"threads": bool}; without it nextn's
    threads come from TVM_NUM_THREADS alone, which is set either way)."""
    try:
        h = subprocess.run([nextn_cli, "run", "--help"], capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.SubprocessError):
        h = ""
    return {"threads": "--threads" in h}


def first_token_cmds(path, a, tools, nextn_cli, flags) -> dict:
    """{engine: (argv, env)} of the `-n 1` runs: the same prompt, context, threads and KV types on both sides."""
    env = thread_env(a.threads)
    nx = [nextn_cli, "run", path, "-p", PROMPT, "-n", "1", "-c", str(a.ctx)]
    nx += ["-t", str(a.threads)] if flags.get("threads") else []
    nx += ["-ctk", a.cache_type_k, "-ctv", a.cache_type_v, "--json"]
    runs = {"nextn": (nx, env)}
    if "llama-completion" in tools:
        runs["llama"] = ([tools["llama-completion"], "-m", path, "-p", PROMPT, "-n", "1", "-c", str(a.ctx),
                          "-t", str(a.threads), "-ctk", a.cache_type_k, "-ctv", a.cache_type_v, "-no-cnv", "-v"], None)
    return runs


def first_token(path, a, tools, log, skip_nextn=None, kv_nextn=None) -> dict:
    """`nextn run -n 1` and `llama-completion -n 1` wall seconds, peak RSS and KV bytes, each after a read of the
    file (warm page cache). `skip_nextn`: why nextn is not run (it went over the memory budget in the rounds);
    `kv_nextn`: the KV the rounds' engine allocated (same -c and types), when `run --json` does not say."""
    out = {"nextn": {"status": f"not run ({skip_nextn} in the rounds)"}} if skip_nextn else {}
    nextn_cli = os.path.join(os.path.dirname(sys.executable), "nextn")
    flags = nextn_run_flags(nextn_cli) if "nextn" in a.engines and "nextn" not in out else {}
    for name, (cmd, e) in first_token_cmds(path, a, tools, nextn_cli, flags).items():
        if name not in a.engines or name in out:
            continue
        warm_s = warm_page_cache(path)
        log(f"  first token: {name} (page cache warmed in {warm_s:.1f} s)")
        res = run_watched(cmd, a.mem_budget_gb * GB, env=e, log=log)
        r = out[name] = {"status": "ok" if res["rc"] == 0 and not res["killed"] else failure(res), "cmd": cmd,
                         "wall_s": res["wall_s"], "peak_rss": res["peak_rss"], "peak_anon": res["peak_anon"],
                         "warm_s": warm_s}
        if name == "llama":
            r["kv"] = parse_llama_kv(res["stderr"])
        else:
            r["flags"] = flags
            js = next((x for x in reversed(res["stdout"].splitlines()) if x.startswith("{")), None)
            kv = (json.loads(js).get("kv_cache") if js else None) or kv_nextn
            r["kv"] = dict(kv) if kv else None
        if r["status"] == "ok":
            log(f"  {name}: {r['wall_s']:.1f} s, peak RSS {r['peak_rss'] / GB:.2f} GB"
                + (f", KV {r['kv']['bytes'] / GB:.2f} GB ({r['kv']['type_k']}/{r['kv']['type_v']})" if r["kv"] else ""))
    return out


# -- the run --------------------------------------------------------------------------------------------------------
def measure_file(path, a, tools, log) -> dict:
    """The rounds and the first-token runs of one file (module doc) → its report entry."""
    info = gguf_info(path)
    entry = file_entry(path, info, tensor_types=sorted({t for _n, t, _b in info["tensors"]}),
                       bytes_per_token={"gguf": decode_bytes_from_gguf(info)})
    if skipped_for_memory(entry, a.headroom_gb, log):
        return entry
    for r in range(a.repeat):
        log(f"{entry['name']}: round {r + 1}/{a.repeat}: bandwidth")
        rnd = {"bandwidth": stream_bandwidth(a.threads)}
        log(f"  read {rnd['bandwidth']['read_GBps']:.1f} GB/s, copy {rnd['bandwidth']['copy_GBps']:.1f} GB/s")
        over = over_budget(entry)
        if over:   # memory use does not change from round to round: do not load it again
            rnd["nextn"] = {"status": f"not run again ({over} in an earlier round)"}
        elif "nextn" in a.engines:
            log(f"{entry['name']}: round {r + 1}/{a.repeat}: nextn")
            n = rnd["nextn"] = nextn_round(path, a, log)
            log(f"  nextn: {n['status']}" + (f": tg {n['decode_tok_s']:.2f} tok/s, pp {n['prefill_tok_s']:.1f} tok/s, "
                                            f"load {n['load_s']:.0f} s, peak RSS {n['peak_rss'] / GB:.1f} GB "
                                            f"(anon {n['peak_anon'] / GB:.1f})" if n["status"] == "ok" else ""))
        else:
            rnd["nextn"] = {"status": "not run (--engines)"}
        if "llama" in a.engines:
            log(f"{entry['name']}: round {r + 1}/{a.repeat}: llama-bench")
            q = rnd["llama"] = llama_round(path, a, tools, log)
            log(f"  llama: {q['status']}" + (f": tg {q['tg']:.2f} tok/s, pp {q['pp']:.1f} tok/s, peak RSS "
                                            f"{q['peak_rss'] / GB:.1f} GB (anon {q['peak_anon'] / GB:.1f})"
                                            if q["status"] == "ok" else ""))
        else:
            rnd["llama"] = {"status": "not run (--engines)"}
        entry["rounds"].append(rnd)
    if not a.no_first_token:
        kv = next((x["nextn"]["kv_cache"] for x in entry["rounds"] if x["nextn"].get("kv_cache")), None)
        entry["first_token"] = first_token(path, a, tools, log, skip_nextn=over_budget(entry), kv_nextn=kv)
    return entry


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="GGUF paths or names in --dir [default: the known real-width files there]")
    ap.add_argument("--dir", default=DEFAULT_DIR)
    ap.add_argument("--repeat", type=int, default=3, choices=range(1, 100), metavar="N",
                    help="interleaved rounds per file (best counts) [default: 3]")
    ap.add_argument("-t", "--threads", type=int, default=None,
                    help="threads for both engines [default: physical cores]")
    ap.add_argument("-ctk", "--cache-type-k", default=KV_DEFAULT, choices=KV_TYPES,
                    help=f"KV cache type for K, both engines [default: {KV_DEFAULT}, llama.cpp's]")
    ap.add_argument("-ctv", "--cache-type-v", default=KV_DEFAULT, choices=KV_TYPES,
                    help=f"KV cache type for V, both engines [default: {KV_DEFAULT}]")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="decoded tokens (llama-bench -n)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512, help="prefill tokens (llama-bench -p)")
    ap.add_argument("-c", "--ctx", type=int, default=4096, help="context of the nextn engine and the first-token runs")
    ap.add_argument("--engines", default="nextn,llama", help="comma list: nextn, llama")
    ap.add_argument("--no-first-token", action="store_true", help="skip the `run -n 1` wall time / peak RSS runs")
    ap.add_argument("--mem-budget-gb", type=float, default=12.0, help="kill a measured process above this anon memory")
    ap.add_argument("--headroom-gb", type=float, default=2.0,
                    help="measure a file only when MemAvailable holds it + this much [default: 2]")
    ap.add_argument("-o", "--output", default=None, help="write the JSON report here (after each file)")
    ap.add_argument("--table", metavar="REPORT", default=None,
                    help="print the tables of a saved JSON report, measure nothing")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        res = worker(a.worker, a.n_gen, a.n_prompt, a.ctx, seed=0, cache_type_k=a.cache_type_k,
                     cache_type_v=a.cache_type_v)
        print(RESULT + json.dumps(res), flush=True)
        return
    if a.table:
        print(format_table(saved_report(a.table, summarize)))
        return
    a.threads = a.threads or physical_cores()
    a.engines = set(a.engines.split(","))
    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    tools = peer_tools(("llama-bench", "llama-completion"), log, "realwidth") if "llama" in a.engines else {}
    files = resolve_files(a.files, a.dir, KNOWN)
    if not files:
        raise SystemExit(f"realwidth: no real-width GGUF found in {a.dir} (make them: python bench/realwidth_files.py)")
    report = new_report(a, argv, n_prompt=a.n_prompt)
    run_files(report, files, lambda path: measure_file(path, a, tools, log), summarize, a.output)
    print(format_table(report))


if __name__ == "__main__":
    main()
