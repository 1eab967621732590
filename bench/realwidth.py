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
     (`runtime.depth.time_call`); the rows are distinct random tokens (the depth calibration's repeated token
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
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from nextn.common.kv_types import DEFAULT as KV_DEFAULT
from nextn.common.kv_types import NAMES as KV_TYPES   # llama.cpp's -ctk / -ctv values that nextn has
from nextn.runtime.threads import physical_cores

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from realwidth_files import SPEED, realwidth_dir  # noqa: E402

DEFAULT_DIR = realwidth_dir()
KNOWN = [f"{n}.gguf" for n in SPEED]
VERIFY_ROWS = (1, 2, 3, 4)          # T = k+1 rows for k = 0 (one decode), 1, 2, 3
PROMPT = "The quick brown fox jumps over the lazy dog, and then"
GB = 1e9


# -- bytes read per decoded token (nextn.common.manifest.read_bytes_per_row) ----------------------------------------
def gguf_info(path: str) -> dict:
    """arch, layer counts, expert counts, vocab, and the tensors [(name, ggml type, bytes)] of a GGUF."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    arch = str(r.fields["general.architecture"].contents())

    def key(k, default=None):
        f = r.fields.get(f"{arch}.{k}")
        return f.contents() if f is not None else default

    n_block = int(key("block_count"))
    n_nextn = int(key("nextn_predict_layers", 0))
    embd = next(t for t in r.tensors if t.name == "token_embd.weight")
    return {"arch": arch, "n_layer": n_block - n_nextn, "n_nextn": n_nextn, "n_expert": int(key("expert_count", 1)),
            "n_expert_used": int(key("expert_used_count", 1)), "n_vocab": int(embd.shape[-1]),
            "tensors": [(t.name, t.tensor_type.name, int(t.n_bytes)) for t in r.tensors]}


def decode_bytes_from_gguf(info: dict) -> dict:
    """Bytes per decoded token from the GGUF's tensor sizes (`gguf_info`): NextN blocks (blk.i, i >= n_layer) excluded."""
    def trunk(name):
        return not name.startswith("blk.") or int(name.split(".")[1]) < info["n_layer"]
    from nextn.common.manifest import read_bytes_per_row

    tensors = [(n, b) for n, _t, b in info["tensors"] if trunk(n)]
    tied = "output.weight" not in {n for n, _t, _b in info["tensors"]}
    return read_bytes_per_row(tensors, info["n_expert"], info["n_expert_used"], info["n_vocab"], tied)


# -- the machine -----------------------------------------------------------------------------------------------------
def stream_bandwidth(threads: int, read_mb: int = 512, copy_mb: int = 256, reps: int = 5) -> dict:
    """GB/s of a multi-threaded read (sum) and of a single-threaded copy (read + write bytes), best of `reps`."""
    from concurrent.futures import ThreadPoolExecutor

    a = np.ones(read_mb * (1 << 20) // 4, np.float32)
    parts = np.array_split(a, threads)
    best_read = 0.0
    with ThreadPoolExecutor(threads) as ex:
        for _ in range(reps):
            t = time.perf_counter()
            list(ex.map(np.sum, parts))
            best_read = max(best_read, a.nbytes / (time.perf_counter() - t))
    del a, parts
    src = np.ones(copy_mb * (1 << 20) // 4, np.float32)
    dst = np.empty_like(src)
    best_copy = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        best_copy = max(best_copy, 2 * src.nbytes / (time.perf_counter() - t))
    return {"read_GBps": best_read / GB, "copy_GBps": best_copy / GB, "threads": threads}


def machine() -> dict:
    from nextn.common.measure import cpu_name

    mem = meminfo()
    return {"cpu": cpu_name(), "physical_cores": physical_cores(), "logical_cpus": os.cpu_count(),
            "cpu_flags": simd_flags(), "mem_total_GB": mem.get("MemTotal", 0) / GB, "loadavg": os.getloadavg(),
            "host": platform.node(), "nextn_commit": nextn_commit()}


def simd_flags() -> list[str]:
    """The SIMD flags that decide which kernels both engines can use (/proc/cpuinfo)."""
    want = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16")
    from nextn.common.measure import cpu_flags

    have = cpu_flags() or set()
    return [x for x in want if x in have]


def nextn_commit() -> str | None:
    """`git describe` of the checkout this script runs from (which nextn was measured)."""
    try:
        r = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True, text=True,
                           timeout=30)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def meminfo() -> dict:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) * 1024
    return out


def proc_mem(pid: int) -> dict:
    """VmRSS / RssAnon / VmHWM bytes of a process (empty when it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "VmHWM"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def run_watched(cmd, budget_bytes: float, env=None, timeout: float = 3600.0, log=None) -> dict:
    """Run cmd; kill it when its anonymous memory passes budget_bytes or MemAvailable < 1 GB.
    Returns rc, stdout, stderr, wall_s, peak_rss, peak_anon (sampled), killed (reason or None).
    peak_rss is the child's own VmHWM, sampled every 0.1 s (a high-water mark: only growth in the last 0.1 s can be
    missed); wait4's ru_maxrss (`peak_rss_ru`) is only the fallback for a child gone before the first sample,
    because Linux carries the spawning process's high-water mark over the exec (this script's 0.5 GB bandwidth
    arrays would show up as the child's peak)."""
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in p.stdout], daemon=True)
    reader.start()
    peak_anon, peak_hwm, killed, status, ru = 0, 0, None, None, None
    while True:
        pid, st, r = os.wait4(p.pid, os.WNOHANG)
        if pid:
            status, ru = st, r
            break
        mem = proc_mem(p.pid)
        peak_anon = max(peak_anon, mem.get("RssAnon", 0))
        peak_hwm = max(peak_hwm, mem.get("VmHWM", 0))
        avail = meminfo().get("MemAvailable", 1 << 40)
        if killed is None:
            if mem.get("RssAnon", 0) > budget_bytes:
                killed = f"anonymous memory {mem['RssAnon'] / GB:.1f} GB > budget {budget_bytes / GB:.1f} GB"
            elif avail < 1e9:
                killed = f"machine MemAvailable {avail / GB:.2f} GB < 1 GB"
            elif time.perf_counter() - t0 > timeout:
                killed = f"timeout {timeout:.0f} s"
            if killed:
                if log:
                    log(f"  killing {os.path.basename(cmd[0])}: {killed}")
                p.kill()
        time.sleep(0.1)
    reader.join(5)
    p.returncode = os.waitstatus_to_exitcode(status)
    err.seek(0)
    return {"rc": p.returncode, "stdout": b"".join(lines.queue).decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"), "wall_s": time.perf_counter() - t0,
            "peak_rss": peak_hwm or ru.ru_maxrss * 1024, "peak_rss_ru": ru.ru_maxrss * 1024, "peak_anon": peak_anon,
            "killed": killed}


def failure(res: dict) -> str:
    """One line on why a `run_watched` process failed: the kill reason, or its exit status and last stderr line."""
    if res["killed"]:
        return f"killed: {res['killed']}"
    tail = [x for x in res["stderr"].strip().splitlines() if x.strip()][-1:] or ["(no output)"]
    return f"exit {res['rc']}: {tail[0][:300]}"


# -- nextn (in a worker process, one per round) ---------------------------------------------------------------------
def worker(path: str, n_gen: int, n_prompt: int, ctx: int, seed: int, cache_type_k: str = KV_DEFAULT,
           cache_type_v: str = KV_DEFAULT) -> dict:
    """One nextn round on `path` in this process; returns the measurements (see the module doc)."""
    import nextn.runtime as rt
    from nextn.common.manifest import step_read_bytes
    from nextn.common.timing import time_call

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
    best = {k: float("inf") for k in calls}
    for _ in range(3):       # round-robin, so a burst of load hits every size alike
        for k, f in calls.items():
            best[k] = min(best[k], time_call(f))
    out["ms"] = {k: v * 1e3 for k, v in best.items()}
    # what the verify of the most rows read of the routed experts: random-weight files can route every row to the
    # same experts, which a verify ratio alone would not show
    out["verify_experts"] = routed_experts(seq, calls[f"verify_{max(VERIFY_ROWS)}"])
    return out


def nextn_round(path, a, log) -> dict:
    env = dict(os.environ, TVM_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", path, "--n-gen", str(a.n_gen),
           "--n-prompt", str(a.n_prompt), "--ctx", str(a.ctx), "-ctk", a.cache_type_k, "-ctv", a.cache_type_v]
    res = run_watched(cmd, a.mem_budget_gb * GB, env=env, log=log)
    mem = {"peak_rss": res["peak_rss"], "peak_anon": res["peak_anon"], "wall_s": res["wall_s"]}
    line = next((x for x in reversed(res["stdout"].splitlines()) if x.startswith("RESULT ")), None)
    if res["rc"] != 0 or line is None:
        return {"status": failure(res), **mem}
    return {"status": "ok", **json.loads(line[len("RESULT "):]), **mem}


# -- llama.cpp ------------------------------------------------------------------------------------------------------
def parse_llama_bench(text: str) -> dict:
    """llama-bench `-o jsonl` lines → {"pp": tok/s, "tg": tok/s, "n_prompt", "n_gen", "n_threads", "build"}."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        kind = "pp" if r["n_prompt"] > 0 and r["n_gen"] == 0 else "tg" if r["n_gen"] > 0 and r["n_prompt"] == 0 else None
        if kind:
            out[kind] = float(r["avg_ts"])
            out[f"n_{'prompt' if kind == 'pp' else 'gen'}"] = int(r["n_prompt" if kind == "pp" else "n_gen"])
            out["n_threads"] = int(r["n_threads"])
            out["build"] = f"{r.get('build_number')} ({r.get('build_commit')})"
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


def warm_page_cache(path: str, chunk: int = 64 << 20) -> float:
    """Read the whole file once so that the run after it finds its pages in the page cache; returns seconds."""
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


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
    env = dict(os.environ, TVM_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
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


# -- summary and table ----------------------------------------------------------------------------------------------
def summarize(entry: dict) -> dict:
    """Best of the rounds and the ratios of one file's entry (rounds of nextn, llama, bandwidth)."""
    def best(rounds, key, fn=max):
        vals = [r[key] for r in rounds if r.get("status") == "ok" and key in r]
        return fn(vals) if vals else None

    nx = [r["nextn"] for r in entry["rounds"]]
    ll = [r["llama"] for r in entry["rounds"]]
    ok = [r for r in nx if r.get("status") == "ok"]
    bws = [r["bandwidth"]["read_GBps"] for r in entry["rounds"] if "bandwidth" in r]
    bw = max(bws) if bws else None
    s = {"read_GBps": bw, "nextn_tg": best(nx, "decode_tok_s"), "nextn_pp": best(nx, "prefill_tok_s"),
         "llama_tg": best(ll, "tg"), "llama_pp": best(ll, "pp")}
    s["ms"] = ms = {k: min(r["ms"][k] for r in ok) for k in ok[0]["ms"]} if ok else {}
    s["verify_x_decode"] = ({str(T): ms[f"verify_{T}"] / ms["verify_1"] for T in VERIFY_ROWS[1:]}   # JSON keys
                            if "verify_1" in ms else None)
    s["draft_x_decode"] = ms["draft"] / ms["verify_1"] if "draft" in ms else None
    s["verify_experts"] = ok[0].get("verify_experts") if ok else None
    gg = entry["bytes_per_token"]["gguf"]["total"]
    plan = ok[0]["plan_bytes_per_token"]["total"] if ok else None
    s["bytes_per_token_gguf"], s["bytes_per_token_plan"] = gg, plan
    s["nextn_GBps"] = s["nextn_tg"] * plan / GB if s["nextn_tg"] and plan else None
    s["llama_GBps"] = s["llama_tg"] * gg / GB if s["llama_tg"] else None
    div = lambda x, y: x / y if x is not None and y else None   # noqa: E731
    s["tg_ratio"] = div(s["nextn_tg"], s["llama_tg"])
    # the same ratio within each round (both engines timed back to back): on a VM whose memory speed drifts
    # between rounds, the best of each engine may come from different rounds
    s["tg_ratio_rounds"] = [r["nextn"]["decode_tok_s"] / r["llama"]["tg"] for r in entry["rounds"]
                            if r["nextn"].get("status") == "ok" and r["llama"].get("status") == "ok"
                            and r["llama"].get("tg")]
    s["pp_ratio"] = div(s["nextn_pp"], s["llama_pp"])
    s["nextn_bw_fraction"] = div(s["nextn_GBps"], bw)
    s["llama_bw_fraction"] = div(s["llama_GBps"], bw)
    failed = lambda rounds: next((r["status"] for r in rounds if r.get("status") != "ok"), "no rounds")  # noqa: E731
    s["nextn_status"] = "ok" if ok else failed(nx)
    s["llama_status"] = "ok" if s["llama_tg"] is not None else failed(ll)
    if entry.get("skipped"):
        s["nextn_status"] = s["llama_status"] = f"skipped: {entry['skipped']}"
    s.update(summarize_first_token(entry))
    return s


def summarize_first_token(entry: dict) -> dict:
    """The `-n 1` runs of one file: per engine its wall seconds (`{eng}_ft_s`), peak RSS, KV bytes and types, and
    peak RSS ÷ (file bytes + KV bytes) (`{eng}_rss_x_file_kv`, the issue-11 target is ≤ 1.05); `ft_ratio` =
    nextn wall ÷ llama.cpp wall (target ≤ 1.5)."""
    size = entry.get("size")
    s = {"file_bytes": size}
    for eng in ("nextn", "llama"):
        r = (entry.get("first_token") or {}).get(eng) or {}
        ok = r.get("status") == "ok"
        kv = r.get("kv") or {}
        s[f"{eng}_ft_s"] = r["wall_s"] if ok else None
        s[f"{eng}_rss"] = r["peak_rss"] if ok else None
        s[f"{eng}_kv_bytes"] = kv.get("bytes")
        s[f"{eng}_kv_types"] = f"{kv['type_k']}/{kv['type_v']}" if "type_k" in kv else None
        s[f"{eng}_rss_x_file_kv"] = (r["peak_rss"] / (size + kv["bytes"])
                                     if ok and size and kv.get("bytes") is not None else None)
    s["ft_ratio"] = s["nextn_ft_s"] / s["llama_ft_s"] if s["nextn_ft_s"] and s["llama_ft_s"] else None
    return s


def fmt_num(x, fmt="{:.2f}"):
    """A table cell: x formatted, or an en dash for None."""
    return "–" if x is None else fmt.format(x)


def _per_round(ratios) -> str:
    if not ratios:
        return "–"
    return f"{float(np.median(ratios)):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def _experts(e) -> str:
    return "–" if not e else f"{e['distinct']:.1f} / {e['routed']}"


def format_table(report: dict) -> str:
    """Markdown: the speed table (one row per file, ratios last), the memory / first-token table (ratios last),
    a line on the machine and the settings, then any failures."""
    head = ["file", "MB/token GGUF / plan", "read GB/s", "nextn tg", "llama tg", "nextn pp", f"llama pp{report['n_prompt']}",
            "nextn GB/s", "llama GB/s", "verify 2/3/4 rows ÷ decode",
            f"experts of verify {max(VERIFY_ROWS)}: distinct / routed", "draft ÷ decode",
            "tg nextn/llama per round: median (min–max)", "tg nextn/llama", "pp nextn/llama", "nextn/read BW",
            "llama/read BW"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for e in report["files"]:
        s = e["summary"]
        vx = s.get("verify_x_decode")
        plan_mb = s["bytes_per_token_plan"] and s["bytes_per_token_plan"] / 1e6
        cells = [e["name"], f"{s['bytes_per_token_gguf'] / 1e6:.0f} / {fmt_num(plan_mb, '{:.0f}')}",
                 fmt_num(s["read_GBps"], "{:.1f}"), fmt_num(s["nextn_tg"]), fmt_num(s["llama_tg"]),
                 fmt_num(s["nextn_pp"], "{:.1f}"), fmt_num(s["llama_pp"], "{:.1f}"), fmt_num(s["nextn_GBps"], "{:.1f}"),
                 fmt_num(s["llama_GBps"], "{:.1f}"),
                 " / ".join(fmt_num(vx[str(T)]) for T in VERIFY_ROWS[1:]) if vx else "–",
                 _experts(s.get("verify_experts")), fmt_num(s.get("draft_x_decode")),
                 _per_round(s.get("tg_ratio_rounds")), fmt_num(s["tg_ratio"]), fmt_num(s["pp_ratio"]),
                 fmt_num(s["nextn_bw_fraction"]), fmt_num(s["llama_bw_fraction"])]
        lines.append("| " + " | ".join(cells) + " |")
        if e.get("skipped"):
            notes.append(f"- {e['name']}: skipped: {e['skipped']}")
            continue
        for eng in ("nextn", "llama"):
            if s[f"{eng}_status"] != "ok" and not s[f"{eng}_status"].startswith("not run"):
                notes.append(f"- {e['name']}: {eng}: {s[f'{eng}_status']}")
    if any(e.get("first_token") for e in report["files"]):
        lines += ["", f"| file | file GB | KV GB nextn / llama | KV types nextn / llama | nextn peak RSS GB | "
                  f"llama peak RSS GB | nextn run -n 1 s | llama-completion -n 1 s | nextn tg | llama tg{report['n_gen']} | "
                  "RSS ÷ (file+KV) nextn / llama | wall nextn/llama | tg nextn/llama |", "|" + "---|" * 13]
        for e in report["files"]:
            s = e["summary"]
            kv = " / ".join(fmt_num(s[f"{x}_kv_bytes"] and s[f"{x}_kv_bytes"] / GB) for x in ("nextn", "llama"))
            types = " / ".join(s[f"{x}_kv_types"] or "–" for x in ("nextn", "llama"))
            cells = [e["name"], fmt_num(e.get("size") and e["size"] / GB), kv, types,
                     fmt_num(s["nextn_rss"] and s["nextn_rss"] / GB), fmt_num(s["llama_rss"] and s["llama_rss"] / GB),
                     fmt_num(s["nextn_ft_s"], "{:.1f}"), fmt_num(s["llama_ft_s"], "{:.1f}"), fmt_num(s["nextn_tg"]),
                     fmt_num(s["llama_tg"]), f"{fmt_num(s['nextn_rss_x_file_kv'])} / {fmt_num(s['llama_rss_x_file_kv'])}",
                     fmt_num(s["ft_ratio"]), fmt_num(s["tg_ratio"])]
            lines.append("| " + " | ".join(cells) + " |")
            for eng, r in (e.get("first_token") or {}).items():
                if r.get("status") != "ok" and not r["status"].startswith("not run"):
                    notes.append(f"- {e['name']}: first token, {eng}: {r['status']}")
    m = report["machine"]
    kv = f", KV -ctk {report['cache_type_k']} -ctv {report['cache_type_v']}" if "cache_type_k" in report else ""
    lines += ["", f"{m['cpu']} ({' '.join(m.get('cpu_flags', []))}), {m['physical_cores']} cores, "
              f"{report['threads']} thread(s) both engines{kv}, -c {report.get('ctx', '?')}, best of "
              f"{report['repeat']} interleaved rounds, tg = {report['n_gen']} decoded tokens; nextn "
              f"{m.get('nextn_commit') or '?'}, llama.cpp {(report.get('llama_build') or '?').split()[0]}; loadavg at start "
              f"{m['loadavg'][0]:.2f} (others' load; ours adds up to {report['threads']})"
              + (" (machine loaded: read the ratios, not the absolute numbers)" if report["loaded"] else "")]
    return "\n".join(lines + ([""] + notes if notes else []))


def over_budget(entry: dict) -> str | None:
    """The status of an earlier nextn round of this file that went over the memory budget, if any."""
    return next((x["nextn"]["status"] for x in entry["rounds"] if x["nextn"]["status"].startswith("killed: anon")), None)


# -- the run --------------------------------------------------------------------------------------------------------
def resolve_files(names, directory, known=None) -> list[str]:
    """The GGUF paths to measure, smallest first: `names` (paths, or names in `directory`, .gguf optional;
    SystemExit naming a missing one), or else the files of `known` (default KNOWN) that exist in `directory`."""
    if not names:
        cands = [os.path.join(directory, n) for n in (KNOWN if known is None else known)]
        paths = [p for p in cands if os.path.isfile(p)]
    else:
        paths = []
        for n in names:
            p = next((c for c in (n, os.path.join(directory, n), os.path.join(directory, f"{n}.gguf"))
                      if os.path.isfile(c)), n)
            if not os.path.isfile(p):
                raise SystemExit(f"realwidth: {n}: no such file (looked in . and {directory})")
            paths.append(p)
    return sorted(paths, key=os.path.getsize)


def memory_check(size: int, headroom_gb: float, available: int | None = None) -> str | None:
    """Why a file of `size` bytes is not measured now (None: it may be): its pages and `headroom_gb` of working
    memory must fit in MemAvailable (which counts the reclaimable page cache, this file's own pages included)."""
    available = meminfo().get("MemAvailable", 0) if available is None else available
    need = size + headroom_gb * GB
    if available >= need:
        return None
    return (f"needs {size / GB:.1f} GB (file) + {headroom_gb:.1f} GB (--headroom-gb) of memory, MemAvailable is "
            f"{available / GB:.1f} GB")


def measure_file(path, a, tools, log) -> dict:
    """The rounds and the first-token runs of one file (module doc) → its report entry."""
    info = gguf_info(path)
    entry = {"name": os.path.basename(path), "path": os.path.abspath(path), "size": os.path.getsize(path),
             "arch": info["arch"], "n_layer": info["n_layer"],
             "tensor_types": sorted({t for _n, t, _b in info["tensors"]}),
             "bytes_per_token": {"gguf": decode_bytes_from_gguf(info)}, "rounds": []}
    skip = memory_check(entry["size"], a.headroom_gb)
    if skip:
        log(f"{entry['name']}: skipped: {skip}")
        entry["skipped"] = skip
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
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads for both engines [default: physical cores]")
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
    ap.add_argument("--table", metavar="REPORT", default=None, help="print the tables of a saved JSON report, measure nothing")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        res = worker(a.worker, a.n_gen, a.n_prompt, a.ctx, seed=0, cache_type_k=a.cache_type_k,
                     cache_type_v=a.cache_type_v)
        print("RESULT " + json.dumps(res), flush=True)
        return
    if a.table:
        with open(a.table) as f:
            report = json.load(f)
        for e in report["files"]:      # summarized again from the saved rounds: a report of an older tree too
            e["summary"] = summarize(e)
        print(format_table(report))
        return
    a.threads = a.threads or physical_cores()
    a.engines = set(a.engines.split(","))
    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    sys.path.insert(0, HERE)
    from peer import PeerMissing, peer_tool

    tools = {}
    if "llama" in a.engines:
        for t in ("llama-bench", "llama-completion"):
            try:
                tools[t] = peer_tool(t)
            except PeerMissing as e:
                tools[f"missing {t}"] = str(e)
                log(f"realwidth: {e}")
    files = resolve_files(a.files, a.dir)
    if not files:
        raise SystemExit(f"realwidth: no real-width GGUF found in {a.dir} (make them: python bench/realwidth_files.py)")
    report = new_report(a, argv, n_prompt=a.n_prompt)
    run_files(report, files, lambda path: measure_file(path, a, tools, log), summarize, a.output)
    print(format_table(report))


def new_report(a, argv, **extra) -> dict:
    """The head of a run's report: the machine (its load before the run: `loaded`), the settings both engines got
    (`a`: threads, cache_type_k/v, repeat, n_gen, ctx, engines), the command line, the peer's build; `extra`."""
    from peer import peer_version

    report = {"machine": machine(), "threads": a.threads, "cache_type_k": a.cache_type_k,
              "cache_type_v": a.cache_type_v, "repeat": a.repeat, "n_gen": a.n_gen, "ctx": a.ctx,
              "engines": sorted(a.engines), "argv": sys.argv[1:] if argv is None else list(argv),
              "llama_build": peer_version(), **extra, "files": []}
    # Our own processes raise the load during the run, so only the load before it says whether others were busy.
    report["loaded"] = report["machine"]["loadavg"][0] > 0.5
    return report


def run_files(report: dict, files, measure, summarize, output: str | None, after=None) -> dict:
    """Measure `files` in turn into report["files"]: entry = measure(path), entry["summary"] = summarize(entry),
    then after(report) if given; the report is written to `output` after each file (what is measured so far is
    kept) and at the end, with the load average then."""
    t0 = time.perf_counter()
    for path in files:
        entry = measure(path)
        entry["summary"] = summarize(entry)
        report["files"].append(entry)
        if after is not None:
            after(report)
        report["wall_s"] = time.perf_counter() - t0
        if output:
            write_report(report, output)
    report["loadavg_end"] = os.getloadavg()
    if output:
        write_report(report, output)
    return report


def write_report(report: dict, path: str) -> None:
    """Write a JSON report through a .tmp beside it, then renamed: a reader never sees half a report."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
