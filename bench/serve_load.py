"""Bounded loopback load test of `nextn serve`: R requests from C concurrent clients, all to 127.0.0.1.

Starts `nextn serve MODEL -np SLOTS` itself (so it knows the server's PID), warms it up, reads the server's RSS,
sends the requests (a fixed mix of /completion, /v1/completions and /v1/chat/completions, half of them streaming),
reads the RSS again after a second identical wave, and stops the server. Reports errors, latency p50/p99 (seconds
per request, client side), aggregate tok/s (generated tokens of all requests / wall time of the wave) and the RSS
before/after. Exit status 1 when any request failed or a greedy request's text differed from the first wave's.

    python bench/serve_load.py [MODEL] [--requests 200] [--clients 8] [--slots 4] [--max-tokens 32]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

PROMPTS = ["def main():", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self):",
           "The os.path module", ".. function:: open(file, mode='r')\n\n   ", "for i in range(10):"]


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def request(url: str, i: int, max_tokens: int):
    """One request of the mix; returns (seconds, generated tokens, text)."""
    kind, stream = i % 3, (i // 3) % 2 == 1
    p = PROMPTS[i % len(PROMPTS)]
    if kind == 0:
        path, body = "/completion", {"prompt": p, "n_predict": max_tokens}
    elif kind == 1:
        path, body = "/v1/completions", {"prompt": p, "max_tokens": max_tokens}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": p}], "max_tokens": max_tokens}
    body.update(temperature=0, stream=stream)
    t0 = time.perf_counter()
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read().decode()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")
    dt = time.perf_counter() - t0
    if not stream:
        obj = json.loads(raw)
        n = obj["tokens_predicted"] if kind == 0 else obj["usage"]["completion_tokens"]
        text = obj["content"] if kind == 0 else (obj["choices"][0].get("text") or obj["choices"][0]["message"]["content"])
        return dt, n, text
    events = [e[len("data: "):] for e in raw.split("\n\n") if e.startswith("data: ")]
    objs = [json.loads(e) for e in events if e != "[DONE]"]
    if kind == 0:
        return dt, objs[-1]["tokens_predicted"], "".join(o["content"] for o in objs)
    n = next(o["usage"]["completion_tokens"] for o in reversed(objs) if "usage" in o) if kind == 1 else \
        objs[-1]["timings"]["predicted_n"]
    text = "".join((o["choices"][0].get("text") or o["choices"][0].get("delta", {}).get("content") or "")
                   for o in objs if o["choices"])
    return dt, n, text


def wave(url: str, n_requests: int, clients: int, max_tokens: int):
    results, errors, lock, nxt = {}, [], threading.Lock(), iter(range(n_requests))

    def worker():
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            try:
                results[i] = request(url, i, max_tokens)
            except Exception as e:   # noqa: BLE001 - counted and reported
                errors.append(f"request {i}: {type(e).__name__}: {e}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors, time.perf_counter() - t0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="artifacts/tiny-glm4moe-Q8_0.gguf")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    a = ap.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    srv = subprocess.Popen([sys.executable, "-m", "nextn.runtime.cli", "serve", a.model, "--port", str(port),
                            "-np", str(a.slots), "-c", str(a.ctx_size), "--metrics"], stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except Exception:
                if srv.poll() is not None:
                    print(srv.stderr.read(), file=sys.stderr)
                    return 1
                time.sleep(0.5)
        wave(url, 2 * a.clients, a.clients, a.max_tokens)            # warm-up
        rss0 = rss_kb(srv.pid)
        first, err1, wall1 = wave(url, a.requests, a.clients, a.max_tokens)
        rss1 = rss_kb(srv.pid)
        second, err2, wall2 = wave(url, a.requests, a.clients, a.max_tokens)
        rss2 = rss_kb(srv.pid)
    finally:
        srv.terminate()
        srv.wait(30)
    errors = err1 + err2
    mismatched = [i for i in first if i in second and first[i][2] != second[i][2]]
    lat = [r[0] for r in first.values()]
    toks = sum(r[1] for r in first.values())
    rep = {"requests": a.requests, "clients": a.clients, "slots": a.slots, "max_tokens": a.max_tokens,
           "errors": len(errors), "text_mismatches_between_waves": len(mismatched),
           "latency_p50_s": pct(lat, 0.5), "latency_p99_s": pct(lat, 0.99), "wall_s": wall1,
           "tokens": toks, "aggregate_tok_s": toks / wall1 if wall1 else 0.0,
           "second_wave_tok_s": sum(r[1] for r in second.values()) / wall2 if wall2 else 0.0,
           "rss_mb_before": rss0 / 1024, "rss_mb_after_wave1": rss1 / 1024, "rss_mb_after_wave2": rss2 / 1024}
    print(json.dumps(rep))
    for e in errors[:10]:
        print(e, file=sys.stderr)
    return 1 if errors or mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
