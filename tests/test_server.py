"""`nextn serve` over real HTTP (httpx → uvicorn on 127.0.0.1, a free port), on the tiny glm4moe Q8_0 fixture.

Expected tokens come from the fixture's reference.json (greedy continuations and speculative counts); the other
expectations come from the same server's own non-streaming answers or from the request's arithmetic. Restates
llama.cpp's tools/server/tests/unit/test_speculative.py for GLM + MTP (same tokens with and without drafting at
temperature > 0 with a seed, same greedy content for several n_min/n_max, a slot whose context nearly fills,
ignore_eos → stop_type limit, parallel requests), plus the streaming framing of both route families, /metrics
against the responses, the bad-input cases of issue 14 and the slot lifecycle (queueing, disconnects)."""
from __future__ import annotations

import json
import os
import re
import socket
import threading
import time

import httpx
import pytest

from conftest import G4, reference

PROMPTS = {p["kind"]: p for p in reference()["prompts"]}
KEY = "test-key"
EOS_PROMPT = 'import sys\n\nif __name__ == "__main__":\n    sys.exit(main())\n'   # greedy continues with EOS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(artifact, **kw):
    from nextn.runtime.server import Running, ServeOptions
    from nextn.runtime.server.params import ServerDefaults

    defaults = ServerDefaults(**kw.pop("defaults", {}))
    opt = ServeOptions(model=artifact, port=_free_port(), defaults=defaults, **kw)
    run = Running(opt, log=lambda s: None).start_background()
    assert run.loaded.wait(120) and run.error is None, run.error
    return run



def q8_exact(compiled):
    return compiled("q8-exact", G4 / "tiny-glm4moe-Q8_0.gguf", exact_matmul=True)


def serving(compiled, **kw):
    """A module fixture's body: a server on the exact-matmul Q8_0 artifact (ServeOptions `kw`), yielding a client."""
    run = start_server(q8_exact(compiled), **kw)
    with httpx.Client(base_url=run.url, timeout=120) as client:
        yield client
    run.stop()

@pytest.fixture(scope="module")
def server(compiled):
    # --exact-matmul: float activation rows, so greedy outputs are the fixture references' (the default q8_0 rows
    # may flip a near tie)
    run = start_server(q8_exact(compiled), ctx_size=4096, n_parallel=2, metrics=True, api_keys=[KEY])
    yield run
    run.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c


def post(client, path, body, status=200):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


def greedy(p, n=None, **extra):
    return {"prompt": p["prompt_ids"], "n_predict": n or p["n_predict"], "temperature": 0, "ignore_eos": True,
            "return_tokens": True, **extra}


def sse_events(text: str) -> list:
    """Split an SSE body into its `data:` payloads; every event must be exactly `data: X\\n\\n`."""
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), text[:400]
    return [e[len("data: "):] for e in events]


# -- greedy and speculative correctness -------------------------------------------------------------------------
def test_greedy_tokens_and_speculation_counts_equal_the_reference(client):
    for kind in ("code-short", "docs-heading"):
        p = PROMPTS[kind]
        r = post(client, "/completion", greedy(p))
        assert r["tokens"] == p["greedy_ids"]
        assert r["content"] == p["greedy_text"]
        want = p["spec"]["3"]      # the server's default n_max is llama.cpp's 3
        assert (r["timings"]["draft_n"], r["timings"]["draft_n_accepted"]) == (want["drafted"], want["accepted"])
        assert r["tokens_predicted"] == p["n_predict"] and r["tokens_evaluated"] == len(p["prompt_ids"])
        assert r["stop_type"] == "limit" and r["stop"] is True and r["truncated"] is False


def test_same_tokens_with_and_without_drafting_at_temperature(client):
    p = PROMPTS["code-short"]
    req = {"prompt": p["prompt_ids"], "n_predict": 24, "temperature": 0.9, "top_k": 5, "seed": 4242,
           "ignore_eos": True, "return_tokens": True}
    drafted = post(client, "/completion", req)
    plain = post(client, "/completion", {**req, "speculative.n_max": 0})
    assert drafted["timings"]["draft_n"] > 0
    assert "draft_n" not in plain["timings"] and plain["speculative"]["type"] == "none"
    assert drafted["tokens"] == plain["tokens"]
    other_seed = post(client, "/completion", {**req, "seed": 4243})
    assert other_seed["tokens"] != drafted["tokens"]      # the seed is honoured (else the check above is empty)


@pytest.fixture(scope="module")
def strict(compiled):
    """A server whose operator set n_min 3 and p_min 0.95: requests may only lower them."""
    run = start_server(q8_exact(compiled), ctx_size=2048,
                       defaults={"n_min": 3, "p_min": 0.95})
    with httpx.Client(base_url=run.url, timeout=120) as c:
        yield c
    run.stop()


def test_same_greedy_content_for_several_n_min_n_max(strict):
    p = PROMPTS["docs-heading"]
    for n_min, n_max in ((0, 1), (0, 2), (1, 2), (2, 3), (3, 3), (5, 8)):
        r = post(strict, "/completion", greedy(p, **{"speculative.n_min": n_min, "speculative.n_max": n_max,
                                                     "speculative.p_min": 0.0}))
        eff = r["speculative"]
        assert eff["n_max"] == min(n_max, 3) and eff["n_min"] == min(n_min, 3, eff["n_max"]) and eff["p_min"] == 0.0
        assert r["generation_settings"]["speculative.n_min"] == eff["n_min"]
        assert r["tokens"] == p["greedy_ids"] and r["content"] == p["greedy_text"]
        if n_min == 0:
            want = p["spec"][str(eff["n_max"])]
            assert (r["timings"]["draft_n"], r["timings"]["draft_n_accepted"]) == (want["drafted"], want["accepted"])


def test_per_request_speculation_only_lowers_the_server_settings(strict, client):
    p = PROMPTS["code-short"]
    loose = post(strict, "/completion", greedy(p, **{"speculative.n_min": 0, "speculative.p_min": 0.0}))
    tight = post(strict, "/completion", greedy(p))                           # the operator's n_min 3, p_min 0.95
    raised = post(strict, "/completion", greedy(p, **{"speculative.p_min": 1.0, "speculative.n_max": 9}))
    assert tight["speculative"] == raised["speculative"] == {"type": "draft-mtp", "n_max": 3, "n_min": 3, "p_min": 0.95}
    assert tight["tokens"] == loose["tokens"] == raised["tokens"] == p["greedy_ids"]
    assert tight["timings"].get("draft_n", 0) < loose["timings"]["draft_n"] == p["spec"]["3"]["drafted"]
    r = post(client, "/completion", greedy(p, 16, **{"speculative.p_min": 1.0, "speculative.n_min": 2}))
    assert r["speculative"]["p_min"] == 0.0 and r["speculative"]["n_min"] == 0 and r["timings"]["draft_n"] > 0
    off = post(client, "/completion", greedy(p, 16, **{"speculative.n_max": 0}))
    assert off["speculative"]["type"] == "none" and "draft_n" not in off["timings"]
    assert off["tokens"] == r["tokens"] == p["greedy_ids"][:16]


def test_ignore_eos_gives_stop_type_limit(client):
    stop_at_eos = post(client, "/completion", {"prompt": EOS_PROMPT, "n_predict": 8, "temperature": 0,
                                               "return_tokens": True})
    assert stop_at_eos["stop_type"] == "eos" and stop_at_eos["tokens"] == [0] and stop_at_eos["content"] == ""
    r = post(client, "/completion", {"prompt": EOS_PROMPT, "n_predict": 8, "temperature": 0, "ignore_eos": True,
                                     "return_tokens": True})
    # llama-server bans the end-of-generation tokens (logit bias -inf), so eos (0) is never sampled
    assert r["stop_type"] == "limit" and r["tokens_predicted"] == 8 and 0 not in r["tokens"]
    chat = post(client, "/v1/completions", {"prompt": EOS_PROMPT, "max_tokens": 8, "temperature": 0})
    assert chat["choices"][0]["finish_reason"] == "stop" and chat["usage"]["completion_tokens"] == 1


def test_n_predict_zero_generates_nothing(client):
    r = post(client, "/completion", {"prompt": "def f():", "n_predict": 0})
    assert (r["content"], r["tokens_predicted"], r["stop_type"]) == ("", 0, "limit")


def test_parallel_requests_give_the_sequential_greedy_content(server):
    kinds = ["code-short", "docs-heading", "repetitive", "one-token", "code-short"]   # 5 requests, 2 slots: 3 queue
    results: dict[int, dict] = {}

    def one(i, kind):
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
            results[i] = c.post("/completion", json=greedy(PROMPTS[kind], 32)).json()

    threads = [threading.Thread(target=one, args=(i, k)) for i, k in enumerate(kinds)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, kind in enumerate(kinds):
        assert results[i]["tokens"] == PROMPTS[kind]["greedy_ids"][:32], kind


# -- a slot whose context nearly fills ---------------------------------------------------------------------------
def test_slot_context_nearly_full_stops_with_truncated(compiled):
    p = PROMPTS["code-short"]
    P = len(p["prompt_ids"])
    run = start_server(q8_exact(compiled), ctx_size=2 * (P + 10), n_parallel=2)
    try:
        with httpx.Client(base_url=run.url, timeout=60) as c:
            r = post(c, "/completion", {"prompt": p["prompt_ids"], "temperature": 0, "ignore_eos": True,
                                        "return_tokens": True})
            n = P + 10 - P + 1            # every cell is used; the last token needs no cell
            assert r["tokens"] == p["greedy_ids"][:n]
            assert r["stop_type"] == "limit" and r["truncated"] is True and r["tokens_cached"] == P + 10
            assert r["timings"]["draft_n"] > 0
            assert c.get("/props").json()["default_generation_settings"]["n_ctx"] == P + 10
            e = c.post("/completion", json={"prompt": p["prompt_ids"] * 2}).json()["error"]
            assert (e["type"], e["n_prompt_tokens"], e["n_ctx"]) == ("exceed_context_size_error", 2 * P, P + 10)
    finally:
        run.stop()


# -- streaming framing -------------------------------------------------------------------------------------------
def test_completion_stream_framing(client):
    p = PROMPTS["code-short"]
    whole = post(client, "/completion", greedy(p, 20))
    r = client.post("/completion", json=greedy(p, 20, stream=True))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(e) for e in sse_events(r.text)]
    assert "[DONE]" not in r.text
    *parts, last = events
    assert all(e["stop"] is False for e in parts) and last["stop"] is True
    assert [t for e in parts for t in e["tokens"]] == p["greedy_ids"][:20]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert [e["tokens_predicted"] for e in parts] == list(range(1, 21))
    assert last["tokens_predicted"] == 20 and last["timings"]["predicted_n"] == 20 and last["content"] == ""


def test_oai_streams_end_with_done(client):
    body = {"messages": [{"role": "user", "content": "What does os.path.join do?"}], "max_tokens": 12,
            "temperature": 0, "cache_prompt": False}   # the same usage twice: no prompt tokens cached
    whole = post(client, "/v1/chat/completions", body)
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    r = client.post("/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}})
    raw = sse_events(r.text)
    assert raw[-1] == "[DONE]"
    chunks = [json.loads(e) for e in raw[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    fin, use = chunks[-2], chunks[-1]
    assert fin["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] and fin["choices"][0]["delta"] == {}
    assert use["choices"] == [] and use["usage"] == whole["usage"] and "timings" in use
    r = client.post("/v1/completions", json={"prompt": "def main():", "max_tokens": 8, "temperature": 0,
                                             "stream": True})
    raw = sse_events(r.text)
    assert raw[-1] == "[DONE]"
    chunks = [json.loads(e) for e in raw[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 8
    whole = post(client, "/v1/completions", {"prompt": "def main():", "max_tokens": 8, "temperature": 0})
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]


def test_stream_never_passes_a_stop_string(client):
    p = PROMPTS["code-short"]
    text = p["greedy_text"]
    stop = text[5:9]                    # a stop string inside the greedy continuation
    cut = text[:text.find(stop)]
    whole = post(client, "/completion", greedy(p, 48, stop=[stop, "never-there"]))
    assert (whole["content"], whole["stop_type"], whole["stopping_word"]) == (cut, "word", stop)
    events = [json.loads(e) for e in sse_events(client.post("/completion", json=greedy(p, 48, stop=[stop],
                                                                                      stream=True)).text)]
    sent = ""
    for e in events:
        sent += e["content"]
        assert cut.startswith(sent), "streamed text went past the stop string"
    assert sent == cut and events[-1]["stop_type"] == "word"


# -- /metrics against the responses ------------------------------------------------------------------------------
def _metrics(client) -> dict:
    text = client.get("/metrics").text
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r'llamacpp:(\w+)(?:\{position="(\d+)"\})? (\S+)', line)
        if m:
            out[m.group(1) + (f"[{m.group(2)}]" if m.group(2) else "")] = float(m.group(3))
    return out


def test_metrics_counters_equal_the_sum_of_the_responses(client):
    before = _metrics(client)
    rs = [post(client, "/completion", greedy(PROMPTS[k], 24)) for k in ("code-short", "repetitive", "docs-api")]
    rs.append(post(client, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 10, "temperature": 0}))
    after = _metrics(client)
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    t = [r["timings"] for r in rs]
    assert d["spec_decode_num_draft_tokens_total"] == sum(x.get("draft_n", 0) for x in t) > 0
    assert d["spec_decode_num_accepted_tokens_total"] == sum(x.get("draft_n_accepted", 0) for x in t)
    assert d["tokens_predicted_total"] == sum(x["predicted_n"] for x in t)
    assert d["prompt_tokens_total"] == sum(x["prompt_n"] for x in t)
    assert d["requests_total"] == 4
    # per position: position 0 counts the rounds that accepted at least one draft, so the positions sum to accepted
    per_pos = sum(v for k, v in d.items() if k.startswith("spec_decode_num_accepted_tokens_per_pos_total["))
    assert per_pos == d["spec_decode_num_accepted_tokens_total"]
    assert d["spec_decode_num_drafts_total"] >= d["spec_decode_num_accepted_tokens_per_pos_total[0]"]
    assert after["n_busy_slots_per_decode"] == 1.0      # one slot per trunk pass (llama-server batches slots)
    assert "# TYPE llamacpp:n_busy_slots_per_decode gauge" in client.get("/metrics").text


# -- info routes -------------------------------------------------------------------------------------------------
def test_info_routes(client, server):
    assert client.get("/health").json() == {"status": "ok"}
    props = client.get("/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 2048
    assert props["chat_template"].startswith("{#- nextn's GLM-4.5-style chat template")
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [os.path.basename(server.opt.model)]
    slots = client.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and all(s["n_ctx"] == 2048 for s in slots)
    toks = post(client, "/tokenize", {"content": "def main():"})["tokens"]
    assert post(client, "/detokenize", {"tokens": toks})["content"] == "def main():"
    pieces = post(client, "/tokenize", {"content": "é<|user|>", "with_pieces": True})["tokens"]
    assert pieces[-1] == {"id": 7, "piece": ""}
    assert b"".join(bytes(x["piece"]) if isinstance(x["piece"], list) else x["piece"].encode() for x in pieces) == \
        "é".encode()
    prompt = post(client, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]})["prompt"]
    assert prompt == "[gMASK]<sop><|user|>\nhi<|assistant|>"


# -- bad input keeps the server serving --------------------------------------------------------------------------
BAD = [
    ("malformed JSON", "/completion", b'{"prompt": "x", ', 500, "server_error"),
    ("not an object", "/completion", b'[1, 2]', 400, "invalid_request_error"),
    ("wrong type", "/completion", b'{"prompt": "x", "temperature": "hot"}', 400, "invalid_request_error"),
    ("wrong type bool", "/completion", b'{"prompt": "x", "stream": 1}', 400, "invalid_request_error"),
    ("negative n_predict", "/completion", b'{"prompt": "x", "n_predict": -2}', 400, "invalid_request_error"),
    ("huge n_predict", "/v1/completions", b'{"prompt": "x", "max_tokens": 4294967296}', 400, "invalid_request_error"),
    ("speculative out of range", "/completion", b'{"prompt": "x", "speculative.p_min": 2}', 400,
     "invalid_request_error"),
    ("no prompt", "/completion", b'{"n_predict": 4}', 400, "invalid_request_error"),
    ("bad token id", "/completion", b'{"prompt": [1, 99999999]}', 400, "invalid_request_error"),
    ("several prompts streamed, one bad", "/completion", b'{"prompt": ["a", [99999999]], "stream": true}', 400,
     "invalid_request_error"),
    ("n_cmpl above the slots", "/completion", b'{"prompt": "a", "n_cmpl": 3}', 400, "invalid_request_error"),
    ("no messages", "/v1/chat/completions", b'{"max_tokens": 4}', 400, "invalid_request_error"),
    ("bad messages", "/v1/chat/completions", b'{"messages": "hi"}', 400, "invalid_request_error"),
    ("unknown role", "/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}', 400,
     "invalid_request_error"),
    ("too long", "/completion", json.dumps({"prompt": "x " * 3000}).encode(), 400, "exceed_context_size_error"),
]


@pytest.mark.parametrize("what,path,body,status,type_", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_the_error_object_and_the_server_keeps_serving(client, what, path, body, status, type_):
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["code"], err["type"]) == (status, type_) and err["message"]
    ok = post(client, "/completion", greedy(PROMPTS["code-short"], 4))
    assert ok["tokens"] == PROMPTS["code-short"]["greedy_ids"][:4]


def test_unknown_route_and_api_key(server, client):
    r = client.get("/no/such/route")
    assert r.status_code == 404 and r.json() == {"error": {"message": "File Not Found", "type": "not_found_error",
                                                           "code": 404}}
    assert client.get("/completion").status_code == 404          # wrong method: no such route
    with httpx.Client(base_url=server.url, timeout=30) as anon:
        assert anon.get("/health").status_code == 200            # public, as llama-server
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"}):
            r = anon.post("/completion", json={"prompt": "x", "n_predict": 1}, headers=headers)
            assert r.status_code == 401
            assert r.json()["error"] == {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
        assert anon.post("/completion", json={"prompt": "x", "n_predict": 1}, headers={"X-Api-Key": KEY}).status_code == 200


def test_unknown_fields_are_ignored_and_prompt_forms(client, server):
    p = PROMPTS["code-short"]
    r = post(client, "/completion", greedy(p, 4, cache_prompt=True, mirostat=0, foo={"bar": 1}))
    assert r["tokens"] == p["greedy_ids"][:4]
    text = server.state.model.tokenizer.decode(p["prompt_ids"])
    for prompt in (text, [text], [p["prompt_ids"]], [text[:5], *server.state.model.tokenizer.encode(text[5:])]):
        r = post(client, "/completion", {**greedy(p, 4), "prompt": prompt})
        assert r["tokens_evaluated"] > 0 and r["prompt"].endswith(text[-8:])


def test_a_disconnected_stream_frees_its_slot(server, client):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        with c.stream("POST", "/completion", json={"prompt": "def main():", "n_predict": 1500, "temperature": 0,
                                                   "ignore_eos": True, "stream": True}) as r:
            next(r.iter_lines())
    t0 = time.time()
    while any(s["is_processing"] for s in client.get("/slots").json()):
        assert time.time() - t0 < 20, "the slot of a disconnected request stayed busy"
        time.sleep(0.1)
    done = _metrics(client)["requests_total"]
    r = post(client, "/completion", greedy(PROMPTS["code-short"], 8))
    assert r["tokens"] == PROMPTS["code-short"]["greedy_ids"][:8]
    assert _metrics(client)["requests_total"] == done + 1       # the cancelled request never finished


def test_health_is_503_while_the_model_loads(monkeypatch):
    import nextn.runtime.server as srv
    from nextn.common.errors import NextnError

    gate = threading.Event()

    def slow_load(state, opt, log):
        gate.wait(30)
        raise NextnError("no model here")

    monkeypatch.setattr(srv, "load_state", slow_load)
    run = srv.Running(srv.ServeOptions(model="nowhere.gguf", port=_free_port()), log=lambda s: None)
    run.start_background()
    try:
        r = httpx.get(run.url + "/health", timeout=10)
        assert r.status_code == 503
        assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        assert httpx.post(run.url + "/completion", json={"prompt": "x"}, timeout=10).status_code == 503
    finally:
        gate.set()
        run._thread.join(20)
    assert str(run.error) == "no model here" and not run._thread.is_alive()


def test_bounded_load_mixed_routes(server, client):
    """24 requests from 6 concurrent clients over 2 slots, all route families, half streaming: no errors, and each
    text equals the same request's text when it ran alone (bench/serve_load.py is the long version)."""
    prompts = ["def main():", "import os\n", "class A:", "The os module"]

    def body(i):
        p = prompts[i % 4]
        kind = ("/completion", "/v1/completions", "/v1/chat/completions")[i % 3]
        b = {"prompt": p} if kind != "/v1/chat/completions" else {"messages": [{"role": "user", "content": p}]}
        return kind, {**b, "max_tokens": 12, "temperature": 0, "stream": i % 2 == 1}

    def text_of(kind, r):
        if not r.headers["content-type"].startswith("text/event-stream"):
            o = r.json()
            return o["content"] if kind == "/completion" else (o["choices"][0].get("text") or
                                                               o["choices"][0]["message"]["content"])
        objs = [json.loads(e) for e in sse_events(r.text) if e != "[DONE]"]
        if kind == "/completion":
            return "".join(o["content"] for o in objs)
        return "".join(c.get("text") or c.get("delta", {}).get("content") or "" for o in objs for c in o["choices"])

    alone = {}
    for i in range(12):      # the text of each (route, prompt, stream) combination, one request at a time
        kind, b = body(i)
        alone[i] = text_of(kind, client.post(kind, json=b))
    got, errors, lock = {}, [], threading.Lock()
    todo = iter(range(24))

    def worker():
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                kind, b = body(i)
                r = c.post(kind, json=b)
                if r.status_code != 200:
                    errors.append((i, r.status_code, r.text))
                else:
                    got[i] = text_of(kind, r)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and len(got) == 24
    for i, text in got.items():
        assert text == alone[i % 12], i


def test_timings_per_token(client):
    p = PROMPTS["code-short"]
    events = [json.loads(e) for e in sse_events(client.post("/completion", json=greedy(
        p, 6, stream=True, timings_per_token=True)).text)]
    assert all(e["timings"]["predicted_n"] == e["tokens_predicted"] for e in events)
    assert [e["timings"]["predicted_n"] for e in events] == [1, 2, 3, 4, 5, 6, 6]
