"""llama-server behaviours that llama.cpp's own server tests check (bench/peer_server_tests.sh), through `nextn serve`
over real HTTP on 127.0.0.1 (tiny glm4moe Q8_0): the template engine's `+` with undefined values, `ignore_eos`
(the EOG tokens banned and listed in `generation_settings.logit_bias`), `post_sampling_probs`.

Expected values come from the GGUF's own fields (its EOG token ids), from the same server's pre-sampling
log-probabilities put through the sampler chain's arithmetic by hand (numpy), or from the request's arithmetic."""
from __future__ import annotations

import math

import httpx
import numpy as np
import pytest

from conftest import G4
from test_server import q8_exact, start_server

# `functions` is never defined (firefunction-v2's template adds it to a string); `nothing` is null
TEMPLATE = ("{%- set s = 'Available:' + functions -%}{%- set s = s + nothing + '|' -%}"
            "{{ s }}{% for m in messages %}{{ m.content }}{% endfor %}")


@pytest.fixture(scope="module")
def client(compiled, tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "undefined.jinja"
    path.write_text(TEMPLATE)
    run = start_server(q8_exact(compiled), ctx_size=512, n_parallel=1, chat_template_file=str(path))
    with httpx.Client(base_url=run.url, timeout=120) as c:
        yield c
    run.stop()


def post(c, route, body):
    r = c.post(route, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def gguf_eog_ids() -> list:
    """The vocabulary's end-of-generation ids as the GGUF names them (eos, eot, eom), read with gguf-py."""
    import gguf

    fields = gguf.GGUFReader(str(G4 / "tiny-glm4moe-Q8_0.gguf")).fields
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    return sorted({int(fields[k].parts[-1][0]) for k in keys if k in fields})


def test_undefined_or_null_plus_string_is_the_string(client):
    r = post(client, "/apply-template", {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs":
                                         {"nothing": None}})
    assert r["prompt"] == "Available:|hi"


def test_undefined_in_other_arithmetic_is_still_an_error():
    from nextn.runtime.server.chat_template import ChatTemplate
    from nextn.runtime.server.errors import ApiError

    msgs = [{"role": "user", "content": "x"}]
    assert ChatTemplate("{{ 1 + 2 }}|{{ [1] + [2] }}|{{ 'a' + 'b' }}", "t").render(msgs) == "3|[1, 2]|ab"
    for src in ("{{ 1 + functions }}", "{{ functions - 'a' }}", "{{ none_value + 1 }}"):
        with pytest.raises(ApiError):
            ChatTemplate(src, "t").render(msgs, none_value=None)


def test_ignore_eos_bans_and_lists_the_eog_tokens(client):
    eog = gguf_eog_ids()
    assert eog and 0 in eog                      # the fixture's eos is 0: every test below would see a ban of it
    prompt = 'import sys\n\nif __name__ == "__main__":\n    sys.exit(main())\n'   # greedy continues with EOS (0)
    free = post(client, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "n_probs": 2,
                                        "return_tokens": True})
    assert free["tokens"] == [0] and free["stop_type"] == "eos"
    assert free["generation_settings"]["logit_bias"] == []
    runner_up = free["completion_probabilities"][0]["top_logprobs"][1]["id"]
    for n_max in (0, 3):                         # with and without drafting
        r = post(client, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "ignore_eos": True,
                                         "return_tokens": True, "speculative.n_max": n_max})
        assert r["tokens"][0] == runner_up and not set(r["tokens"]) & set(eog)
        assert r["stop_type"] == "limit" and r["tokens_predicted"] == 8
        assert r["generation_settings"]["logit_bias"] == [{"bias": None, "token": t} for t in eog]
    # the request's own biases first, in its order (a text: each of its tokens), then the bans; a ban survives any
    # bias the request adds to an EOG token
    toks = post(client, "/tokenize", {"content": " return"})["tokens"]
    r = post(client, "/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0, "ignore_eos": True,
                                     "return_tokens": True, "logit_bias": [[5, 1.5], [" return", False], [0, 100]]})
    assert r["generation_settings"]["logit_bias"] == (
        [{"bias": 1.5, "token": 5}] + [{"bias": None, "token": t} for t in toks] + [{"bias": 100.0, "token": 0}]
        + [{"bias": None, "token": t} for t in eog])
    assert 0 not in r["tokens"] and r["tokens_predicted"] == 4
    plain = post(client, "/completion", {"prompt": prompt, "n_predict": 2, "temperature": 0, "ignore_eos": False})
    assert plain["generation_settings"]["logit_bias"] == []


def test_post_sampling_probs_are_the_sampler_chains(client):
    """top_k 5, temperature 0.7, top_p 1, min_p 0: the chain keeps the 5 most probable tokens and gives them
    softmax(logprob / 0.7) renormalised; the same request without post_sampling_probs gives the log-probs."""
    body = {"prompt": "Today was the day. Today I would finally become a", "n_predict": 6, "n_probs": 10,
            "temperature": 0.7, "top_k": 5, "top_p": 1.0, "min_p": 0.0, "seed": 42}
    pre = post(client, "/completion", body)["completion_probabilities"]
    r = post(client, "/completion", {**body, "post_sampling_probs": True})
    assert r["generation_settings"]["post_sampling_probs"] is True
    post_ = r["completion_probabilities"]
    assert len(post_) == len(pre) == 6
    for a, b in zip(pre, post_):
        assert a["id"] == b["id"] and a["token"] == b["token"] and a["bytes"] == b["bytes"]   # same seed, same tokens
        assert "logprob" not in b and "top_logprobs" not in b
        top = a["top_logprobs"][:5]
        lp = np.array([x["logprob"] for x in top]) / 0.7
        want = np.exp(lp - lp.max())
        want /= want.sum()
        assert [x["id"] for x in b["top_probs"]] == [x["id"] for x in top]
        np.testing.assert_allclose([x["prob"] for x in b["top_probs"]], want, rtol=1e-5, atol=1e-7)
        assert math.isclose(sum(x["prob"] for x in b["top_probs"]), 1.0, rel_tol=1e-9)
        assert b["prob"] == next(x["prob"] for x in b["top_probs"] if x["id"] == b["id"])
        assert all(set(x) == {"id", "token", "bytes", "prob"} for x in b["top_probs"])


@pytest.fixture(scope="module")
def unified(compiled):
    run = start_server(q8_exact(compiled), ctx_size=256, n_parallel=4, kv_unified=True)
    with httpx.Client(base_url=run.url, timeout=120) as c:
        yield c
    run.stop()


def test_kv_unified_slots_share_one_pool(unified):
    c = unified
    assert [s["n_ctx"] for s in c.get("/slots").json()] == [256] * 4      # each slot may fill the pool
    a = post(c, "/completion", {"prompt": "def main():", "n_predict": 200, "temperature": 0, "ignore_eos": True,
                                "id_slot": 1})
    assert a["timings"]["predicted_n"] == 200 and a["stop_type"] == "limit"       # more than 256 / 4 cells
    held = {s["id"]: s["n_past"] for s in c.get("/slots").json()}
    assert held[1] == a["tokens_evaluated"] + 200 - 1 and sum(held.values()) == held[1]
    # another slot needs more than the pool has left: the idle slot's cache is dropped, the request runs
    b = post(c, "/completion", {"prompt": "import os", "n_predict": 100, "temperature": 0, "ignore_eos": True,
                                "id_slot": 2})
    assert b["timings"]["predicted_n"] == 100
    held = {s["id"]: s["n_past"] for s in c.get("/slots").json()}
    assert held[1] == 0 and held[2] == b["tokens_evaluated"] + 100 - 1


def test_kv_unified_full_pool_fails_the_busy_requests(unified):
    import concurrent.futures

    c = unified
    body = {"n_predict": 120, "temperature": 0, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        rs = list(ex.map(lambda i: c.post("/completion", json={**body, "prompt": f"x = {i}", "id_slot": i}),
                         range(4)))
    # 4 x 120 tokens cannot fit in 256 cells: the requests still running when the pool fills fail together
    failed = [r for r in rs if r.status_code != 200]
    assert failed
    for r in failed:
        e = r.json()["error"]
        assert r.status_code == 500 and e["code"] == 500 and e["message"] == "Context size has been exceeded."
    for r in rs:
        if r.status_code == 200:
            assert r.json()["timings"]["predicted_n"] == 120
    assert sum(s["n_past"] for s in c.get("/slots").json()) <= 256
    ok = post(c, "/completion", {"prompt": "x = 0", "n_predict": 8, "temperature": 0, "ignore_eos": True})
    assert ok["timings"]["predicted_n"] == 8                                       # still serving


def metric(text: str, name: str) -> float:
    values = [ln.split(" ", 1)[1] for ln in text.splitlines() if ln.startswith(f"llamacpp:{name} ")]
    assert len(values) == 1, name
    return float(values[0])


def wait_until(c, sleeping: bool, timeout: float = 20.0) -> None:
    import time

    t0 = time.time()
    while time.time() - t0 < timeout:
        if c.get("/props").json()["is_sleeping"] is sleeping:
            return
        time.sleep(0.05)
    raise AssertionError(f"is_sleeping did not become {sleeping}")


@pytest.fixture(scope="module")
def sleepy(compiled):
    run = start_server(q8_exact(compiled), ctx_size=512, n_parallel=1, sleep_idle_seconds=1, metrics=True)
    with httpx.Client(base_url=run.url, timeout=120) as c:
        yield run, c
    run.stop()


def test_sleep_unloads_the_model_and_a_request_reloads_it(sleepy):
    run, c = sleepy
    awake = post(c, "/completion", {"prompt": "def main():", "n_predict": 6, "temperature": 0, "ignore_eos": True,
                                    "return_tokens": True})
    assert c.get("/props").json()["is_sleeping"] is False
    wait_until(c, True)
    import time

    t0 = time.time()                # is_sleeping turns true as the unload starts (llama-server's order too)
    while run.state.model is not None and time.time() - t0 < 10:
        time.sleep(0.05)
    assert run.state.model is None and run.state.scheduler is None        # unloaded, not only flagged
    for _ in range(3):                                                   # these answer without waking it
        assert c.get("/health").json() == {"status": "ok"}
        models = c.get("/v1/models").json()
        assert models["data"][0]["id"] == run.state.model_name
        assert c.get("/metrics").status_code == 200
    props = c.get("/props").json()
    assert props["is_sleeping"] is True and props["total_slots"] == 1
    again = post(c, "/completion", {"prompt": "def main():", "n_predict": 6, "temperature": 0, "ignore_eos": True,
                                    "return_tokens": True})
    assert again["tokens"] == awake["tokens"] and again["timings"]["cache_n"] == 0   # the KV went with the model
    assert c.get("/props").json()["is_sleeping"] is False and run.state.model is not None
    for route, body in (("/tokenize", {"content": "x"}), ("/chat/completions/input_tokens",
                        {"messages": [{"role": "user", "content": "hi"}]}),
                        ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]})):
        wait_until(c, True)
        assert c.post(route, json=body).status_code == 200
        assert c.get("/props").json()["is_sleeping"] is False


def test_metrics_buckets_across_sleep(sleepy):
    _, c = sleepy
    r = post(c, "/completion", {"prompt": "import os", "n_predict": 8, "temperature": 0, "ignore_eos": True})
    first = c.get("/metrics").text                      # reports this generation's throughput, then resets it
    second = c.get("/metrics").text
    assert metric(first, "predicted_tokens_seconds") > 0 and metric(second, "predicted_tokens_seconds") == 0
    total = metric(second, "tokens_predicted_total")
    assert total >= r["timings"]["predicted_n"]
    wait_until(c, True)
    assert c.get("/metrics").text == second             # the snapshot on entering sleep
    # a generation, then sleep before any scrape: the sleeping server reports it once
    wait_until(c, True)
    post(c, "/completion", {"prompt": "import os", "n_predict": 8, "temperature": 0, "ignore_eos": True})
    wait_until(c, True)
    asleep = c.get("/metrics").text
    assert metric(asleep, "predicted_tokens_seconds") > 0 and metric(asleep, "tokens_predicted_total") == total + 8
    assert metric(c.get("/metrics").text, "predicted_tokens_seconds") == 0
    assert c.post("/tokenize", json={"content": "x"}).status_code == 200     # wakes it
    assert c.get("/props").json()["is_sleeping"] is False
    woke = c.get("/metrics").text
    assert metric(woke, "predicted_tokens_seconds") == 0 and metric(woke, "tokens_predicted_total") == total + 8


def test_a_failed_reload_is_a_503_and_the_next_request_retries(sleepy):
    run, c = sleepy
    sl = run.state.sleeper
    real = sl._load

    def broken():
        raise OSError("the artifact is gone")

    wait_until(c, True)
    sl._load = broken
    try:
        r = c.post("/tokenize", json={"content": "x"})
        assert r.status_code == 503 and r.json()["error"] == {
            "code": 503, "type": "unavailable_error",
            "message": "reloading the model after sleep failed: OSError: the artifact is gone"}
        assert c.get("/health").status_code == 200 and c.get("/props").json()["is_sleeping"] is True
    finally:
        sl._load = real
    assert c.post("/tokenize", json={"content": "x"}).status_code == 200
    assert c.get("/props").json()["is_sleeping"] is False


def test_sleep_idle_seconds_zero_is_refused(capsys):
    from nextn.runtime.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "no-such.gguf", "--sleep-idle-seconds", "0"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.strip() == "nextn: error: --sleep-idle-seconds 0: expected -1 (never) or > 0"


def test_several_listen_addresses(compiled):
    """--host 127.0.0.1,::1: both addresses serve the same server (one slot, one API key)."""
    import socket

    with socket.socket(socket.AF_INET6) as probe:        # the machine has IPv6 loopback (else the test cannot run)
        probe.bind(("::1", 0))
    run = start_server(q8_exact(compiled), host="127.0.0.1,::1", ctx_size=256, n_parallel=1, api_keys=["k"])
    try:
        port = run.opt.port
        outs = []
        for base in (f"http://127.0.0.1:{port}", f"http://[::1]:{port}"):
            with httpx.Client(base_url=base, timeout=60) as c:
                assert c.get("/health").status_code == 200
                assert c.post("/v1/completions", json={}).status_code == 401
                r = c.post("/completion", headers={"Authorization": "Bearer k"},
                           json={"prompt": "def main():", "n_predict": 4, "temperature": 0, "ignore_eos": True})
                assert r.status_code == 200
                outs.append(r.json())
        assert outs[1]["content"] == outs[0]["content"] and outs[1]["timings"]["cache_n"] > 0   # one slot's cache
    finally:
        run.stop()


def test_a_listen_address_that_is_not_there_is_one_line(compiled):
    from nextn.common.errors import NextnError
    from nextn.runtime.server import Running, ServeOptions

    from test_server import _free_port

    run = Running(ServeOptions(model=q8_exact(compiled), host="127.0.0.1,192.0.2.1", port=_free_port()),
                  log=lambda s: None)
    with pytest.raises(NextnError, match=r"^--host 192\.0\.2\.1: cannot listen on port \d+ \(.+\)$"):
        run.run()


@pytest.fixture(scope="module")
def named(compiled):
    run = start_server(q8_exact(compiled), ctx_size=256, n_parallel=1, chat_template="llama3")
    with httpx.Client(base_url=run.url, timeout=120) as c:
        yield c
    run.stop()


def test_a_built_in_template_name(named):
    """llama3's format (llama.cpp src/llama-chat.cpp): role header, the trimmed text, <|eot_id|>."""
    msgs = [{"role": "system", "content": " Book\n"}, {"role": "user", "content": "What is the best book"}]
    r = post(named, "/apply-template", {"messages": msgs})
    assert r["prompt"] == ("<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert named.get("/props").json()["chat_template"] == "llama3"
    chat = post(named, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "temperature": 0})
    assert chat["usage"]["prompt_tokens"] == len(post(named, "/tokenize", {"content": r["prompt"]})["tokens"])
    bad = named.post("/v1/chat/completions", json={"messages": msgs, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}]})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "tools param requires --jinja flag"
    bad = named.post("/v1/chat/completions", json={"messages": msgs, "tool_choice": "required"})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "tool_choice param requires --jinja flag"
    assert post(named, "/apply-template", {"messages": msgs, "tool_choice": "auto"})["prompt"] == r["prompt"]


def test_other_built_in_formats_and_an_unknown_name():
    from nextn.common.errors import NextnError
    from nextn.runtime.server.chat_template import ChatTemplate

    msgs = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]
    want = {"command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                         "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                         "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
            "chatml": "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                      "<|im_start|>assistant\n",
            "chatglm4": "[gMASK]<sop><|system|>\nYou are a test.<|user|>\nHi there<|assistant|>\n"}
    for name, prompt in want.items():
        assert ChatTemplate.load({}, None, inline=name).render(msgs) == prompt
    assert ChatTemplate.load({}, None, inline="{{ messages[1].content }}!").render(msgs) == "Hi there!"
    with pytest.raises(NextnError, match=r"^--chat-template gemma: not a built-in template here \(expected one of "):
        ChatTemplate.load({}, None, inline="gemma")


@pytest.fixture(scope="module")
def two(compiled):
    run = start_server(q8_exact(compiled), ctx_size=1024, n_parallel=2)
    with httpx.Client(base_url=run.url, timeout=120) as c:
        yield c
    run.stop()


def test_several_completions_stream_with_their_index(two):
    import json

    from test_server import sse_events

    prompts = ["def main():", "import os\n"]
    body = {"prompt": prompts, "n_predict": 12, "temperature": 0, "ignore_eos": True}
    alone = [post(two, "/completion", {**body, "prompt": x}) for x in prompts]
    events = [json.loads(e) for e in sse_events(two.post("/completion", json={**body, "stream": True}).text)]
    assert {e["index"] for e in events} == {0, 1}
    for i, want in enumerate(alone):
        mine = [e for e in events if e["index"] == i]
        assert "".join(e["content"] for e in mine) == want["content"]
        assert [e["stop"] for e in mine] == [False] * (len(mine) - 1) + [True]
        assert mine[-1]["tokens_predicted"] == 12
    # OpenAI chat, n = 2: chunks of both choices, one [DONE] after both finished
    chat = {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True}
    whole = post(two, "/v1/chat/completions", chat)
    raw = sse_events(two.post("/v1/chat/completions", json={**chat, "stream": True}).text)
    assert raw[-1] == "[DONE]" and "[DONE]" not in raw[:-1]
    chunks = [json.loads(e) for e in raw[:-1]]
    for ch in whole["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == ch["index"]]
        text = "".join((m["delta"].get("content") or "") + (m["delta"].get("reasoning_content") or "")
                       for m in mine)
        assert text == (ch["message"].get("content") or "") + (ch["message"].get("reasoning_content") or "")
        assert mine[-1]["finish_reason"] == ch["finish_reason"] == "length"
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1}


@pytest.fixture(scope="module")
def batched(compiled):
    run = start_server(q8_exact(compiled), ctx_size=512, n_parallel=1, n_batch=16)
    with httpx.Client(base_url=run.url, timeout=120) as c:
        yield c
    run.stop()


def test_prompt_progress_per_batch(batched):
    import json

    from conftest import reference
    from test_server import sse_events

    p = next(x for x in reference()["prompts"] if x["kind"] == "docs-heading")
    ids = p["prompt_ids"]
    n = len(ids)
    assert n % 16 and n + 22 < 256
    # greedy with speculation on, the prompt evaluated 16 tokens at a time: the fixture's reference continuation
    r = post(batched, "/completion", {"prompt": ids, "n_predict": 16, "temperature": 0, "ignore_eos": True,
                                      "return_tokens": True, "cache_prompt": False})
    assert r["tokens"] == p["greedy_ids"][:16] and r["timings"]["draft_n"] > 0

    def progress(body):
        text = batched.post("/completion", json={**body, "stream": True, "return_progress": True}).text
        return [e["prompt_progress"] for e in map(json.loads, sse_events(text)) if "prompt_progress" in e]

    ev = progress({"prompt": ids, "n_predict": 2, "temperature": 0, "cache_prompt": False})
    want = [0] + list(range(16, n, 16)) + [n]                 # the start, each batch, the whole prompt
    assert [e["processed"] for e in ev] == want
    assert all(e["total"] == n and e["cache"] == 0 for e in ev)
    # the cached prefix is not evaluated again: the batches start after it
    more = ids + p["greedy_ids"][:2] + ids[:20]
    ev = progress({"prompt": more, "n_predict": 2, "temperature": 0})
    c0 = ev[0]["cache"]
    assert 0 < c0 < n + 2 and [e["processed"] for e in ev] == [c0] + list(range(c0 + 16, len(more), 16)) + [len(more)]


# -- --cache-ram: the host-memory prompt cache (llama-server server_prompt_cache) ------------------------------------
@pytest.fixture(scope="module")
def ram(compiled):
    from nextn.runtime.server import Running, ServeOptions
    from nextn.runtime.server.params import ServerDefaults
    from test_server import _free_port

    lines = []
    opt = ServeOptions(model=q8_exact(compiled), port=_free_port(), ctx_size=1024, n_parallel=2, cache_ram=100,
                       defaults=ServerDefaults(verbose=True))
    run = Running(opt, log=lines.append).start_background()
    assert run.loaded.wait(120) and run.error is None, run.error
    with httpx.Client(base_url=run.url, timeout=120) as c:
        yield c, lines
    run.stop()


def test_a_prompt_that_lost_its_slot_is_restored_from_host_memory(ram):
    from conftest import reference

    c, log = ram
    ref = {p["kind"]: p for p in reference()["prompts"]}
    p = ref["code-module"]
    P, greedy = p["prompt_ids"], p["greedy_ids"]
    assert any("__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__" in ln for ln in log)     # -v: llama-server's debug marker
    body = {"n_predict": 16, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    first = post(c, "/completion", {**body, "prompt": P, "id_slot": 0})
    assert first["tokens"] == greedy[:16] and first["timings"]["draft_n"] > 0     # speculation on
    # slot 1 starts: idle slot 0 goes to host memory; then slot 0 is given another prompt (its KV overwritten)
    post(c, "/completion", {**body, "n_predict": 4, "prompt": ref["docs-prose"]["prompt_ids"], "id_slot": 1})
    assert sum("slot 0: saved idle slot to prompt cache" in ln for ln in log) == 1
    post(c, "/completion", {**body, "n_predict": 4, "prompt": ref["code-class"]["prompt_ids"], "id_slot": 0})
    held = {s["id"]: s["n_past"] for s in c.get("/slots").json()}
    assert held[0] == len(ref["code-class"]["prompt_ids"]) + 3 and held[1] == len(ref["docs-prose"]["prompt_ids"]) + 3
    # the conversation goes on: neither slot shares its prefix, the least recently used one (1) takes it and gets
    # P's KV back (trunk and NextN rows), so only the new tokens are evaluated; the output is a cold start's
    ext = P + greedy[:16]
    n_log = len(log)
    warm = post(c, "/completion", {**body, "prompt": ext})
    assert any("slot 1: updating prompt cache" in ln for ln in log[n_log:])
    assert any("slot 1: restored" in ln for ln in log[n_log:])
    t = warm["timings"]
    assert len(P) <= t["cache_n"] < len(ext) and t["prompt_n"] == len(ext) - t["cache_n"]
    assert warm["tokens_cached"] >= len(P)
    cold = post(c, "/completion", {**body, "prompt": ext, "cache_prompt": False})
    assert cold["timings"]["cache_n"] == 0
    assert warm["tokens"] == cold["tokens"] == greedy[16:32]
    assert warm["timings"]["draft_n"] > 0 and cold["timings"]["draft_n"] > 0
    # the same prompt once more: slot 1 holds it now, picked by similarity, nothing goes through host memory
    n_log = len(log)
    again = post(c, "/completion", {**body, "prompt": ext})
    assert again["tokens"] == greedy[16:32] and again["timings"]["cache_n"] >= len(ext) - 2
    assert not any("updating prompt cache" in ln for ln in log[n_log:])


class _Buf:
    """A state buffer's stand-in (runtime/state.py: numpy(), copyfrom(), _create_view(), shape, dtype) over a numpy
    array; `moved[0]` counts the bytes its copies (and its views' copies) move."""

    def __init__(self, shape, a=None, moved=None):
        self.a = np.zeros(shape, np.float32) if a is None else a
        self.shape, self.dtype = tuple(shape), "float32"
        self.moved = [0] if moved is None else moved

    def numpy(self):
        self.moved[0] += self.a.nbytes
        return self.a.copy()

    def copyfrom(self, x):
        assert x.shape == self.a.shape
        self.moved[0] += self.a.nbytes
        self.a[...] = x

    def _create_view(self, shape, dtype):
        assert dtype == self.dtype
        return _Buf(shape, self.a.reshape(-1)[:int(np.prod(shape))].reshape(shape), self.moved)


class _Slot:
    def __init__(self, i, cells=4096):
        from types import SimpleNamespace

        states = {"k.0": _Buf((cells, 64)), "rs": _Buf((2, 8))}      # one position-indexed state, one other
        entries = {"decode": {"states": list(states), "state_shapes": {"k.0": ["C", 64], "rs": [2, 8]}}}
        self.seq = SimpleNamespace(states=states, model=SimpleNamespace(entries=entries))
        self.id, self.n_ctx, self.can_reuse, self.cache, self.n_mtp = i, cells, True, [], 0

    def fill(self, tokens):
        """Hold `tokens`: row i of the KV holds token i's value (what a prefill would write)."""
        self.cache, self.n_mtp = list(tokens), len(tokens)
        self.seq.states["k.0"].a[:len(tokens)] = np.asarray(tokens, np.float32)[:, None]
        self.seq.states["rs"].a[...] = tokens[0]
        return self


def test_prompt_cache_limit_supersede_and_choice():
    from nextn.runtime.server.prompt_cache import MIB, PromptCache

    pc = PromptCache(1)                                  # 1 MiB; an entry: 256 B per token + the 64 B other state
    a, b = list(range(1, 2049)), list(range(5001, 7049))
    assert pc.save(_Slot(0).fill(a)) and pc.save(_Slot(1).fill(b[:1024]))
    assert [len(e.tokens) for e in pc.states] == [2048, 1024] and pc.size() == 3072 * 256 + 2 * 64
    assert not pc.save(_Slot(0).fill(b[:1000]))          # an entry covers all of it already
    assert pc.save(_Slot(0).fill(b))                      # supersedes b[:1024]; with a, 1 MiB + 128 B: a (oldest) goes
    assert [e.tokens[0] for e in pc.states] == [5001] and pc.size() <= MIB
    assert not pc.save(_Slot(0).fill(list(range(9000, 9000 + 4096))))    # 1 MiB + 64 B alone: never kept
    assert [len(e.tokens) for e in pc.states] == [2048]
    # a prompt keeping < 25 % of the entry leaves it alone; one keeping more takes it (rows and tokens), once
    s = _Slot(2).fill([7, 8, 9])
    assert not pc.load(s, b[:500] + [1, 2]) and s.cache == [7, 8, 9]
    assert pc.load(s, b[:1500] + [1, 2])
    assert s.cache == b and s.n_mtp == 2048 and not pc.states
    k = s.seq.states["k.0"].a
    assert (k[:2048, 0] == np.asarray(b, np.float32)).all() and (k[2048:] == 0).all()
    assert (s.seq.states["rs"].a == 5001).all()
    # a save and a load move the rows the tokens hold (and the other state), not the 4096-cell buffer
    moved = [x.moved[0] for x in s.seq.states.values()]
    assert moved == [2048 * 256, 64]
    # a slot already holding a better prefix than any entry keeps it
    pc.save(_Slot(3).fill(b[:600]))
    assert not pc.load(s, b + [1])


def test_several_completions_on_responses_and_messages(two):
    """llama-server: /v1/responses passes `n` on (its converter copies the body): an array of responses, each with its
    own id; streamed, each response's events interleaved. /v1/messages drops it (Anthropic has no `n`): one
    message."""
    import json

    from test_server_chat import named_events

    def items(r):        # the output without its random ids
        return [{k: v for k, v in it.items() if k != "id"} for it in r["output"]]

    body = {"model": "tiny", "input": "def main():", "max_output_tokens": 6, "temperature": 0}
    one = post(two, "/v1/responses", body)
    assert isinstance(one, dict) and one["usage"]["output_tokens"] > 0
    many = post(two, "/v1/responses", {**body, "n": 2})
    assert isinstance(many, list) and len(many) == 2 and many[0]["id"] != many[1]["id"]
    for r in many + post(two, "/v1/responses", {**body, "n_cmpl": 2}):     # greedy: each is the single reply
        assert items(r) == items(one) and r["status"] == one["status"]
        assert [r["usage"][k] for k in ("input_tokens", "output_tokens")] == \
            [one["usage"][k] for k in ("input_tokens", "output_tokens")]          # cached_tokens: the slots' own
    ev = named_events(two.post("/v1/responses", json={**body, "n": 2, "stream": True}))
    created = [e["response"]["id"] for e in ev if e["type"] == "response.created"]
    completed = [e["response"] for e in ev if e["type"] == "response.completed"]
    assert len(set(created)) == 2 and {r["id"] for r in completed} == set(created)
    assert [items(r) for r in completed] == [items(one)] * 2
    r = two.post("/v1/responses", json={**body, "n": 3})       # more than the slots: llama-server's limit, a 400
    assert r.status_code == 400 and "n" in r.json()["error"]["message"]
    msg = {"model": "tiny", "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
    alone = post(two, "/v1/messages", msg)
    both = post(two, "/v1/messages", {**msg, "n": 2})
    assert both["type"] == "message" and both["content"] == alone["content"]
    assert both["usage"]["output_tokens"] == alone["usage"]["output_tokens"]


def test_slot_file_holds_the_cached_rows_and_refuses_other_models(tmp_path):
    """`Slot.save` / `Slot.restore` on stand-in buffers: the file's position-indexed array is the rows of the cells
    the slot holds (tokens, or NextN rows when further), the other state whole; save and restore move those bytes
    only; the file restores into a slot with fewer cells; a file with other row shapes, element sizes or more cells
    than the slot is a 400 and leaves the slot's cache as it was."""
    from nextn.runtime.server.errors import ApiError
    from nextn.runtime.server.slots import Slot

    def slot(i, cells):
        s = _Slot(i, cells)
        s.seq.recurrent, s.seq.n_ctx = set(), cells
        return s, Slot(i, s.seq)

    src, a = slot(0, 4096)
    toks = list(range(1, 101))
    src.fill(toks)
    a.cache, a.n_mtp = list(toks), 102                  # NextN rows two cells past the tokens
    src.seq.states["k.0"].a[100:102] = 7.0
    for b in src.seq.states.values():
        b.moved[0] = 0
    n = a.save(str(tmp_path / "s.npz"))
    assert n == (tmp_path / "s.npz").stat().st_size
    with np.load(tmp_path / "s.npz") as z:
        k, rs, saved = z["state.k.0"], z["state.rs"], z["tokens"].tolist()
    assert saved == toks and k.shape == (102, 64) and rs.shape == (2, 8)
    assert (k[:100, 0] == np.asarray(toks, np.float32)).all() and (k[100:] == 7.0).all() and (rs == 1).all()
    assert sum(b.moved[0] for b in src.seq.states.values()) == 102 * 256 + 64
    dst, b = slot(1, 1024)
    b.cache, b.n_mtp = [5, 6], 2
    assert b.restore(str(tmp_path / "s.npz")) == n
    assert b.cache == toks and b.n_mtp == 102
    assert (dst.seq.states["k.0"].a[:102] == k).all() and (dst.seq.states["k.0"].a[102:] == 0).all()
    assert sum(x.moved[0] for x in dst.seq.states.values()) == 102 * 256 + 64
    bad = {"tokens": np.asarray(toks, np.int32), "n_mtp": np.int64(102)}
    for name, arrays in (("cols", {**bad, "state.k.0": k[:, :63], "state.rs": rs}),
                         ("f64", {**bad, "state.k.0": k.astype(np.float64), "state.rs": rs}),
                         ("missing", {**bad, "state.k.0": k}),
                         ("whole", {**bad, "state.k.0": np.zeros((4096, 64), np.float32), "state.rs": rs}),
                         ("long", {**bad, "tokens": np.zeros(2000, np.int32), "state.k.0": k, "state.rs": rs})):
        np.savez(tmp_path / f"{name}.npz", **arrays)
        with pytest.raises(ApiError) as e:
            b.restore(str(tmp_path / f"{name}.npz"))
        assert e.value.status == 400, name
        assert b.cache == toks and b.n_mtp == 102, name
    # an empty slot's file holds no rows of the position-indexed state and restores to an empty cache
    _, e = slot(2, 4096)
    e.cache, e.n_mtp = [], 0
    m = e.save(str(tmp_path / "empty.npz"))
    with np.load(tmp_path / "empty.npz") as z:
        assert z["state.k.0"].shape == (0, 64) and z["tokens"].size == 0 and z["state.rs"].shape == (2, 8)
    assert b.restore(str(tmp_path / "empty.npz")) == m
    assert b.cache == [] and b.n_mtp == 0


def test_slot_file_moves_one_state_at_a_time(tmp_path):
    """Save and restore hold one state's rows in host memory at a time (tracemalloc sees numpy's buffers): with
    eight 1 MiB states held, the peak of either stays under three states' bytes (all eight at once before), and the
    restored rows are the saved ones."""
    import tracemalloc
    from types import SimpleNamespace

    from nextn.runtime.server.slots import Slot

    def stand_in(cells):
        states = {f"k.{i}": _Buf((cells, 256)) for i in range(8)}
        shapes = {k: ["C", 256] for k in states}
        seq = SimpleNamespace(states=states, model=SimpleNamespace(entries={"decode": {"states": list(states),
                                                                                         "state_shapes": shapes}}),
                              recurrent=set(), n_ctx=cells)
        return seq, Slot(0, seq)

    n, row = 1024, 256 * 4                             # 1024 cells held: 1 MiB per state
    src, a = stand_in(4096)
    for i, b in enumerate(src.states.values()):
        b.a[:n] = np.arange(n * 256, dtype=np.float32).reshape(n, 256) + i
    a.cache, a.n_mtp = list(range(n)), n
    dst, b = stand_in(2048)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        a.save(str(tmp_path / "s.npz"))
        peak_save = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        b.restore(str(tmp_path / "s.npz"))
        peak_restore = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    # one state's rows, plus numpy's copy of them as it writes a zip member (in chunks of at most 16 MiB)
    assert n * row <= peak_save < 3 * n * row and n * row <= peak_restore < 3 * n * row, (peak_save, peak_restore)
    assert b.cache == a.cache and b.n_mtp == n
    for k in src.states:
        assert (dst.states[k].a[:n] == src.states[k].a[:n]).all() and (dst.states[k].a[n:] == 0).all()
