"""An agentic session replayed against `nextn serve` and llama-server on the same GGUF (issue 37 item 8).

A fixed conversation (a system prompt, then per turn a user message of code and a fixed assistant reply) is replayed
turn by turn as a coding agent sends it: the whole conversation every turn, streamed, `temperature 0`, the reply
capped at --max-tokens and then replaced by the conversation's own assistant message, so both servers see the same
prompts and every turn's prompt extends the previous one (the slot's prompt cache covers it). Per turn: time to first
token (client side: request sent -> first streamed delta), decode tok/s (client side: (n - 1) tokens over first ->
last delta; the server's `timings.predicted_per_second` when the text came in one delta), and the server's own
`timings` (cache_n, prompt_n, predicted_per_second). Then -np 4 with four concurrent clients, each its own session (a
different system prompt): aggregate tok/s = all generated tokens / wall time.

Each configuration (server x speculation on/off) starts its server, runs, stops it; configurations are interleaved
(nextn spec, llama spec, [nextn spec cold], nextn plain, llama plain) and repeated --rounds times, never two servers at
once, so a ratio compares runs from the same minutes of a shared machine. The cold baseline (--cold: every turn with
cache_prompt false; --cold-last: the last turn only, its whole conversation on a fresh server) is nextn with
speculation. Same -c, -np, KV types, threads and chat template (nextn's GLM-4.5-style
one: the fixtures carry none) for both; llama-server with --jinja, speculation as `--spec-type draft-mtp`.

    python bench/agentic.py [MODEL.gguf] [--turns 20] [--turn-words 40] [--max-tokens 32] [-c 4096] [--rounds 1]
        [-o out/agentic] [--llama-server PATH] [--no-llama] [--cold | --cold-last] [--configs 'llama spec,...']

Writes OUT/agentic.json, OUT/agentic.md (the tables) and OUT/agentic.png (time to first token and decode tok/s per
turn), again after every configuration (a run cut short keeps what it measured). llama-server: --llama-server, else
bench/peer_llamacpp.sh's build ($NEXTN_PEER_DIR/bin/llama-server).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(ROOT, "runtime", "server", "templates", "glm4.jinja")
WORDS = ("value", "index", "result", "items", "config", "path", "name", "count", "data", "node", "key", "line")


# -- the conversation -----------------------------------------------------------------------------------------------
def conversation(turns: int, turn_words: int, session: int = 0, seed: int = 0) -> list[dict]:
    """A deterministic session: system prompt, then `turns` (user, assistant) pairs of Python-like text (the fixtures
    were trained on Python sources). Session k differs from the first system prompt on, as separate agents do."""
    rng = random.Random(seed * 1000 + session)
    msgs = [{"role": "system", "content": f"You are a coding agent (session {session}). Answer with code."}]

    def code(n):
        out, words = [], 0
        while words < n:
            a, b, c = rng.choice(WORDS), rng.choice(WORDS), rng.choice(WORDS)
            out.append(f"    {a}_{words} = {b}.get({c!r}, {rng.randint(0, 99)})")
            words += 6
        return "\n".join(out)

    for t in range(turns):
        msgs.append({"role": "user", "content": f"Turn {t}: extend this function.\ndef step_{t}({rng.choice(WORDS)}):\n"
                                                f"{code(turn_words)}\n"})
        msgs.append({"role": "assistant", "content": f"def step_{t}_done():\n{code(turn_words // 4)}\n    return None"})
    return msgs


# -- one streamed request ------------------------------------------------------------------------------------------
def parse_stream(lines, t_sent: float, clock=time.perf_counter) -> dict:
    """Read an OpenAI chat SSE stream (an iterable of byte lines) as it arrives: time to first token (the first
    chunk with a non-empty content / reasoning delta) in ms from `t_sent`, decode tok/s over the later deltas, the
    number of token deltas, and the last chunk's llama-server `timings`. `clock` gives arrival times."""
    t_first = t_last = None
    n, timings = 0, {}
    for raw in lines:
        line = raw.decode("utf-8").strip() if isinstance(raw, bytes) else raw.strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        obj = json.loads(line[len("data: "):])
        now = clock()
        if obj.get("timings"):
            timings = obj["timings"]
        for ch in obj.get("choices") or []:
            d = ch.get("delta") or {}
            if d.get("content") or d.get("reasoning_content"):
                n += 1
                t_first = now if t_first is None else t_first
                t_last = now
    ttft = (t_first - t_sent) * 1e3 if t_first is not None else None
    decode = (n - 1) / (t_last - t_first) if n > 1 and t_last > t_first else None
    if timings.get("predicted_per_second") and (decode is None or n < timings.get("predicted_n", 0) / 2):
        # the reply's text came in one delta or few (a chat parser may hold text until it knows it is content;
        # tokens that detokenize to nothing send no delta): the server's own decode rate, which both servers
        # report the same way
        decode = timings["predicted_per_second"]
    return {"ttft_ms": ttft, "decode_tps": decode, "n_deltas": n, "timings": timings}


def chat(url: str, messages: list, max_tokens: int, cache: bool = True, ignore_eos: bool = False) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "cache_prompt": cache}
    if ignore_eos:      # every reply max_tokens long (a decode-bound measurement; both servers take it)
        body["ignore_eos"] = True
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return parse_stream(r, t0)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: HTTP {e.code}: {e.read()[:300]!r}") from None


def replay(url: str, msgs: list, max_tokens: int, cache: bool = True, last_only: bool = False,
           ignore_eos: bool = False) -> list[dict]:
    """Every turn: the conversation up to its user message; returns one parse_stream result per turn. `cache`
    False sends `cache_prompt: false` (every turn prefills the whole conversation: nextn before its prompt cache).
    `last_only`: the last turn only (its whole conversation, on a fresh server)."""
    out = []
    for t in range(1, len(msgs), 2):
        if last_only and t + 2 < len(msgs):
            continue
        res = chat(url, msgs[:t + 1], max_tokens, cache, ignore_eos)
        res["turn"] = t // 2 + 1
        out.append(res)
    return out


# -- servers -------------------------------------------------------------------------------------------------------
def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def server_cmd(kind: str, a, spec: bool, n_parallel: int, ctx: int, port: int) -> list[str]:
    common = ["--port", str(port), "-c", str(ctx), "-np", str(n_parallel), "-t", str(a.threads),
              "-ctk", a.cache_type, "-ctv", a.cache_type, "--chat-template-file", TEMPLATE]
    if kind == "nextn":
        return [sys.executable, "-m", "nextn.runtime.cli", "serve", a.nextn_model or a.model, *common,
                "--spec-type", "draft-mtp" if spec else "none", "--spec-draft-n-max", str(a.n_max)]
    sp = ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(a.n_max)] if spec else []
    return [a.llama_server, "-m", a.model, *common, "--jinja", *sp]


def start(kind, a, spec, n_parallel, ctx, log_path):
    port = free_port()
    log = open(log_path, "ab")
    p = subprocess.Popen(server_cmd(kind, a, spec, n_parallel, ctx, port), stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while time.time() - t0 < 600:
        if p.poll() is not None:
            raise RuntimeError(f"{kind} exited with {p.returncode} (see {log_path})")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return p, url
        except OSError:
            pass
        time.sleep(0.3)
    p.kill()
    raise RuntimeError(f"{kind} not ready in 600 s")


def stop(p) -> None:
    p.terminate()
    try:
        p.wait(15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def run_single(kind, a, spec, log_path, cache: bool = True, last_only: bool = False) -> list[dict]:
    p, url = start(kind, a, spec, 1, a.ctx, log_path)
    try:
        chat(url, [{"role": "user", "content": "warm up"}], 4)
        return replay(url, conversation(a.turns, a.turn_words), a.max_tokens, cache, last_only, a.ignore_eos)
    finally:
        stop(p)


def run_concurrent(kind, a, spec, log_path, clients: int = 4) -> dict:
    p, url = start(kind, a, spec, clients, a.ctx * clients, log_path)
    try:
        chat(url, [{"role": "user", "content": "warm up"}], 4)
        results = [None] * clients
        t0 = time.perf_counter()

        def one(k):
            results[k] = replay(url, conversation(a.turns, a.turn_words, session=k + 1), a.max_tokens,
                                ignore_eos=a.ignore_eos)

        th = [threading.Thread(target=one, args=(k,)) for k in range(clients)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        n = sum(r["timings"].get("predicted_n", r["n_deltas"]) for rs in results for r in rs)
        # each client's own decode rate while it decodes (its deltas), summed: with the clients decoding at the same
        # time, this is the servers' aggregate decode rate without the prompts' prefill in the wall time
        per_client = [_med([r["decode_tps"] for r in rs]) for rs in results]
        return {"clients": clients, "wall_s": wall, "tokens": n, "aggregate_tps": n / wall,
                "sum_client_decode_tps": sum(x for x in per_client if x is not None)}
    finally:
        stop(p)


# -- tables --------------------------------------------------------------------------------------------------------
def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _f(x, fmt="{:.0f}"):
    return "-" if x is None else fmt.format(x)


def turn_table(runs: dict) -> str:
    """Markdown: one row per turn; per configuration (e.g. "nextn spec") the median over rounds of time to first
    token (ms), decode tok/s and the server's cache_n / prompt_n. `runs`: {config: [round: [turn results]]}."""
    configs = list(runs)
    head = "| turn | " + " | ".join(f"{c} TTFT ms | {c} decode tok/s | {c} cache_n/prompt_n" for c in configs) + " |"
    sep = "|---:|" + "---:|---:|---:|" * len(configs)
    rows = [head, sep]
    n_turns = max(x["turn"] for rs in runs.values() for r in rs for x in r)
    for t in range(n_turns):
        cells = []
        for c in configs:
            per = [x for r in runs[c] for x in r if x["turn"] == t + 1]
            tim = per[0]["timings"] if per else {}
            cells += [_f(_med([x["ttft_ms"] for x in per])), _f(_med([x["decode_tps"] for x in per]), "{:.1f}"),
                      f"{tim.get('cache_n', '-')}/{tim.get('prompt_n', '-')}"]
        rows.append(f"| {t + 1} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def ratio_line(runs: dict, a: str, b: str, last: int = 5) -> str:
    """Median over the last `last` turns of a's TTFT / b's TTFT and a's decode tok/s / b's."""
    def med(c, key):
        return _med([x[key] for r in runs[c] for x in r[-last:]])

    tt = (med(a, "ttft_ms") / med(b, "ttft_ms")) if med(a, "ttft_ms") and med(b, "ttft_ms") else None
    dd = (med(a, "decode_tps") / med(b, "decode_tps")) if med(a, "decode_tps") and med(b, "decode_tps") else None
    return f"{a} / {b}, last {last} turns: TTFT {_f(tt, '{:.2f}')}x, decode tok/s {_f(dd, '{:.2f}')}x"


def plot(runs: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for c, rs in runs.items():
        turns = sorted({x["turn"] for r in rs for x in r})
        ax1.plot(turns, [_med([x["ttft_ms"] for r in rs for x in r if x["turn"] == t]) for t in turns], marker="o",
                 label=c)
        ax2.plot(turns, [_med([x["decode_tps"] for r in rs for x in r if x["turn"] == t]) for t in turns],
                 marker="o", label=c)
    ax1.set(xlabel="turn", ylabel="time to first token (ms)", title="TTFT per turn")
    ax2.set(xlabel="turn", ylabel="decode tok/s (client side)", title="decode per turn")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=os.path.join(ROOT, "artifacts", "tiny-glm4moe-Q8_0.gguf"))
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--turn-words", type=int, default=40,
                    help="code words per user turn (40: ~3.5K tokens at turn 20 with the fixtures' tokenizer, for -c "
                         "4096; ~200 with -c 20000 reaches the issue's ~16K)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("-c", "--ctx", type=int, default=4096, help="cells per slot (the -np 4 run gets 4x)")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--cache-type", default="f16", help="-ctk and -ctv of both servers")
    ap.add_argument("--n-max", type=int, default=3, help="--spec-draft-n-max of both servers")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--clients", type=int, default=4, help="concurrent sessions at -np CLIENTS (0: skip)")
    ap.add_argument("-o", "--out", default=os.path.join(ROOT, "out", "agentic"))
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--nextn-model", default=None,
                    help="what `nextn serve` loads (a compiled artifact directory of MODEL); default MODEL itself")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="replies always --max-tokens long (ignore_eos: a decode-bound -np comparison)")
    ap.add_argument("--no-llama", action="store_true", help="nextn only (spec on vs off)")
    ap.add_argument("--cold", action="store_true",
                    help="also nextn with speculation and cache_prompt false (every turn re-prefills: the baseline of "
                         "the issue's 'TTFT >= 5x better than nextn today at turn 20')")
    ap.add_argument("--cold-last", action="store_true",
                    help="as --cold, but only the last turn (its whole conversation with cache_prompt false on a fresh "
                         "server): the same turn-20 baseline, one prefill instead of a whole cold replay")
    ap.add_argument("--configs", default=None,
                    help="only these configurations, comma-separated (e.g. 'llama spec,llama plain'; default: all of "
                         "nextn spec, llama spec, [nextn spec cold], nextn plain, llama plain)")
    a = ap.parse_args(argv)
    only = {c.strip() for c in a.configs.split(",")} if a.configs else None
    a.model = os.path.abspath(a.model)
    if not os.path.isfile(a.model):
        sys.exit(f"agentic: no model file {a.model}")
    kinds = ["nextn"]
    if not a.no_llama:
        a.llama_server = a.llama_server or os.path.join(
            os.environ.get("NEXTN_PEER_DIR", os.path.expanduser("~/.cache/nextn-peer")), "bin", "llama-server")
        if not os.access(a.llama_server, os.X_OK):
            sys.exit(f"agentic: no llama-server at {a.llama_server} (build it with bench/peer_llamacpp.sh, or give "
                     f"--llama-server, or --no-llama)")
        kinds.append("llama")
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "servers.log")
    runs, conc = {}, {}
    for rnd in range(a.rounds):
        for spec in (True, False):
            for kind in kinds:            # interleaved: nextn, llama, nextn, llama, ...
                name = f"{kind} {'spec' if spec else 'plain'}"
                if only is not None and name not in only:
                    continue
                print(f"agentic: round {rnd + 1}: {name} ...", file=sys.stderr, flush=True)
                runs.setdefault(name, []).append(run_single(kind, a, spec, log))
                if a.clients:
                    conc.setdefault(name, []).append(run_concurrent(kind, a, spec, log, a.clients))
                report(a, runs, conc)     # after every configuration: a run cut short keeps what it measured
            if spec and (a.cold or a.cold_last) and (only is None or "nextn spec cold" in only):
                print(f"agentic: round {rnd + 1}: nextn spec cold ...", file=sys.stderr, flush=True)
                runs.setdefault("nextn spec cold", []).append(run_single("nextn", a, True, log, cache=False,
                                                                         last_only=a.cold_last))
                report(a, runs, conc)
    print(report(a, runs, conc))


def report(a, runs: dict, conc: dict) -> str:
    """Write OUT/agentic.md, .json and .png from the runs so far; returns the markdown."""
    md = [f"model `{os.path.basename(a.model)}`, {a.turns} turns, {a.turn_words} code words per user turn, replies "
          f"capped at {a.max_tokens} tokens, -c {a.ctx} per slot, KV {a.cache_type}, -t {a.threads}, n_max {a.n_max}, "
          f"{a.rounds} round(s) interleaved", "", turn_table(runs), ""]
    for x, y, last in (("nextn spec", "llama spec", 5), ("nextn plain", "llama plain", 5),
                       ("nextn spec", "nextn plain", 5), ("nextn spec", "nextn spec cold", 1)):
        if x in runs and y in runs:
            md += ["- " + ratio_line(runs, x, y, last=last)]
    if conc:
        # one client's decode tok/s (median over its turns, -np 1 run): an aggregate near it means the slots'
        # decodes run one after another, not together
        one = {c: _med([t["decode_tps"] for r in runs.get(c, []) for t in r]) for c in conc}
        md += ["", f"| -np {a.clients}, {a.clients} concurrent sessions | aggregate tok/s (median) | wall s "
               f"| Σ clients' decode tok/s | one client's decode tok/s | Σ decode / one client |",
               "|---|---:|---:|---:|---:|---:|"]
        for c, xs in conc.items():
            sd = _med([x.get("sum_client_decode_tps") for x in xs])
            md += [f"| {c} | {_med([x['aggregate_tps'] for x in xs]):.1f} | {_med([x['wall_s'] for x in xs]):.1f} "
                   f"| {_f(sd, '{:.1f}')} | {_f(one[c], '{:.1f}')} | "
                   f"{_f(sd / one[c] if sd and one[c] else None, '{:.2f}')} |"]
    text = "\n".join(md) + "\n"
    with open(os.path.join(a.out, "agentic.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "agentic.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(a).items()}, "turns": runs, "concurrent": conc}, f, indent=1)
    plot(runs, os.path.join(a.out, "agentic.png"))
    return text


if __name__ == "__main__":
    main()
