"""`nextn serve` for long agentic sessions, over real HTTP on 127.0.0.1 (tiny glm4moe Q8_0, --exact-matmul):
the slot prompt cache (llama-server `cache_prompt`), long-session limits, and the llama-server behaviours of issue 37's
bug list. Expected values: the same server's answers with `cache_prompt: false` (a cold start of the same request),
the fixture's reference continuations, and the request's own arithmetic."""
from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from conftest import FIXTURES, reference
from test_server import PROMPTS, _metrics, post, q8_exact, sse_events, start_server

D = FIXTURES / "tiny-glm-dsa"


@pytest.fixture(scope="module")
def one(compiled):
    """One slot (so every request meets the previous one's cache), speculation on (n_max 3), metrics."""
    run = start_server(q8_exact(compiled), ctx_size=4096, n_parallel=1, metrics=True)
    with httpx.Client(base_url=run.url, timeout=120) as c:
        yield run, c
    run.stop()


def greedy(ids, n, **kw):
    return {"prompt": ids, "n_predict": n, "temperature": 0, "ignore_eos": True, "return_tokens": True, **kw}


def spec_counts(r):
    t = r["timings"]
    return t.get("draft_n", 0), t.get("draft_n_accepted", 0)


# -- issue 37's bugs ------------------------------------------------------------------------------------------------
def test_same_prompt_twice_reuses_all_but_the_last_token(one):
    run, c = one
    ids = PROMPTS["docs-heading"]["prompt_ids"]
    first = post(c, "/completion", greedy(ids, 8, cache_prompt=False))
    again = post(c, "/completion", greedy(ids, 8))
    assert first["timings"]["cache_n"] == 0 and first["timings"]["prompt_n"] == len(ids)
    # the slot holds prompt + 7 tokens (tokens_cached); the prompt's last token is evaluated again (its logits)
    assert first["tokens_cached"] == len(ids) + 7
    assert again["timings"]["cache_n"] == len(ids) - 1 and again["timings"]["prompt_n"] == 1
    assert again["tokens"] == first["tokens"] == PROMPTS["docs-heading"]["greedy_ids"][:8]
    assert spec_counts(again) == spec_counts(first)
    slot = c.get("/slots").json()[0]
    assert slot["n_past"] == len(ids) + 7 and slot["n_prompt_tokens_cache"] == 0     # idle: no task
    chat = post(c, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                            "temperature": 0})
    chat2 = post(c, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                             "temperature": 0})
    assert chat2["usage"]["prompt_tokens_details"]["cached_tokens"] == chat2["usage"]["prompt_tokens"] - 1
    assert chat2["timings"]["cache_n"] + chat2["timings"]["prompt_n"] == chat2["usage"]["prompt_tokens"]
    assert chat2["choices"][0]["message"] == chat["choices"][0]["message"]


def test_system_fingerprint_is_a_build_string(one):
    _, c = one
    r = post(c, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r["system_fingerprint"].startswith("b")
    assert c.get("/props").json()["build_info"] == r["system_fingerprint"]


def test_idle_slot_is_speculative_and_has_no_decoded_tokens(one):
    _, c = one
    post(c, "/completion", greedy(PROMPTS["code-short"]["prompt_ids"], 12))
    slot = c.get("/slots").json()[0]
    assert slot["speculative"] is True and slot["is_processing"] is False
    assert slot["next_token"][0]["n_decoded"] == 0


def test_metrics_header_keeps_llama_server_casing(one):
    _, c = one
    r = c.get("/metrics")
    assert (b"Process-Start-Time-Unix", r.headers["process-start-time-unix"].encode()) in r.headers.raw
    assert abs(int(r.headers["process-start-time-unix"]) - time.time()) < 3600


def test_two_assistant_messages_at_the_end_are_refused_and_one_is_a_prefill(one):
    _, c = one
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "assistant", "content": "again"}]
    r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2})
    assert r.status_code == 400
    assert r.json()["error"] == {"code": 400, "type": "invalid_request_error",
                                 "message": "Cannot have 2 or more assistant messages at the end of the list."}
    prompt = post(c, "/apply-template", {"messages": msgs[:2]})["prompt"]
    assert prompt == post(c, "/apply-template", {"messages": msgs[:1]})["prompt"] + "Hello"


def test_non_streamed_request_of_a_gone_client_stops_and_frees_its_slot(one):
    run, c = one
    done = _metrics(c)["requests_total"]
    body = {"prompt": "def main():", "n_predict": -1, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(run.url + "/completion", json=body, timeout=0.5)
    t0 = time.time()
    while c.get("/slots").json()[0]["is_processing"]:
        assert time.time() - t0 < 10, "the slot of a disconnected non-streamed request kept decoding"
        time.sleep(0.05)
    assert _metrics(c)["requests_total"] == done                       # cancelled, never finished
    r = post(c, "/completion", greedy(PROMPTS["code-short"]["prompt_ids"], 8))
    assert r["tokens"] == PROMPTS["code-short"]["greedy_ids"][:8]


# -- prompt cache: reuse gives what a cold start gives ---------------------------------------------------------------
def _turns(c, ids, n, **kw):
    """(cold, warm): the same request without, then with the slot's cache (the cold one leaves it primed)."""
    cold = post(c, "/completion", greedy(ids, n, cache_prompt=False, **kw))
    warm = post(c, "/completion", greedy(ids, n, **kw))
    return cold, warm


@pytest.mark.parametrize("n_max", [3, 1, 0])
def test_a_growing_conversation_reuses_its_prefix_with_cold_start_output(one, n_max):
    """Turn after turn the prompt is the previous prompt + its reply + new text: each turn prefills only the new
    suffix, and the tokens and the speculation counts (NextN rows of the reused prefix: the drafts) equal a cold
    start of the same prompt."""
    _, c = one
    spec = {"speculative.n_max": n_max}
    ids = list(PROMPTS["code-short"]["prompt_ids"])
    more = PROMPTS["docs-api"]["prompt_ids"]
    prev = post(c, "/completion", greedy(ids, 16, **spec))
    for turn in range(3):
        ids = ids + prev["tokens"] + more[turn * 20:(turn + 1) * 20]
        warm = post(c, "/completion", greedy(ids, 16, **spec))
        cold = post(c, "/completion", greedy(ids, 16, cache_prompt=False, **spec))
        # the cache held the previous prompt + 15 of its 16 tokens; with drafting the last reused token is evaluated
        # again (the NextN row after it pairs with its trunk hidden)
        held = len(ids) - 20 - 1
        if n_max:    # drafts still waiting for their NextN rows at the end (at most n_max) are evaluated again too
            assert held - 1 - n_max <= warm["timings"]["cache_n"] <= held - 1, turn
        else:
            assert warm["timings"]["cache_n"] == held, turn
        assert warm["timings"]["prompt_n"] == len(ids) - warm["timings"]["cache_n"]
        assert warm["tokens"] == cold["tokens"] and warm["content"] == cold["content"], turn
        assert spec_counts(warm) == spec_counts(cold), turn
        assert (spec_counts(warm)[0] > 0) == (n_max > 0)
        # the cold request re-filled the slot from 0; the next turn starts from that
        prev = cold


def test_a_diverging_prompt_reuses_only_the_common_prefix(one):
    _, c = one
    a = PROMPTS["docs-prose"]["prompt_ids"]
    post(c, "/completion", greedy(a, 4))
    b = a[:150] + PROMPTS["code-short"]["prompt_ids"]
    warm = post(c, "/completion", greedy(b, 24))
    cold = post(c, "/completion", greedy(b, 24, cache_prompt=False))
    assert warm["timings"]["cache_n"] == 149            # the common 150, less the one evaluated again for drafting
    assert warm["tokens"] == cold["tokens"] and spec_counts(warm) == spec_counts(cold)


def test_a_cancelled_stream_keeps_its_prefix(one):
    """A client that disconnects mid-stream frees the slot within one round, and what the slot decoded stays
    usable: the next turn reuses the prompt it had prefilled."""
    run, c = one
    ids = PROMPTS["code-module"]["prompt_ids"]
    with httpx.Client(base_url=run.url, timeout=60) as s:
        with s.stream("POST", "/completion", json=greedy(ids, 2000, stream=True)) as r:
            it = r.iter_lines()
            next(it)
    t0 = time.time()
    while c.get("/slots").json()[0]["is_processing"]:
        assert time.time() - t0 < 10
        time.sleep(0.05)
    held = c.get("/slots").json()[0]["n_past"]
    assert held >= len(ids)
    warm = post(c, "/completion", greedy(ids, 16))
    assert warm["timings"]["cache_n"] == len(ids) - 1
    assert warm["tokens"] == PROMPTS["code-module"]["greedy_ids"][:16]


def test_sampled_output_with_reuse_equals_cold(one):
    _, c = one
    ids = PROMPTS["repetitive"]["prompt_ids"]
    kw = {"temperature": 0.9, "top_k": 5, "seed": 77}
    cold, warm = _turns(c, ids, 20, **kw)
    assert warm["timings"]["cache_n"] > 0 and warm["tokens"] == cold["tokens"]


def test_slot_choice_by_prompt_similarity(compiled):
    """Two conversations alternate over two slots: each turn goes to the slot holding its prefix."""
    run = start_server(q8_exact(compiled), ctx_size=4096, n_parallel=2)
    try:
        with httpx.Client(base_url=run.url, timeout=120) as c:
            a, b = PROMPTS["docs-api"]["prompt_ids"], PROMPTS["code-class"]["prompt_ids"]
            ra, rb = post(c, "/completion", greedy(a, 4)), post(c, "/completion", greedy(b, 4))
            assert ra["id_slot"] != rb["id_slot"]                 # the second one went to the least recently used
            for _ in range(2):
                a, b = a + [11, 12, 13], b + [14, 15]
                ra2, rb2 = post(c, "/completion", greedy(a, 4)), post(c, "/completion", greedy(b, 4))
                assert (ra2["id_slot"], rb2["id_slot"]) == (ra["id_slot"], rb["id_slot"])
                assert ra2["timings"]["cache_n"] > len(a) - 8 and rb2["timings"]["cache_n"] > len(b) - 8
            slots = c.get("/slots").json()
            assert sorted(s["n_past"] for s in slots) == sorted([len(a) + 3, len(b) + 3])
    finally:
        run.stop()


# -- long sessions ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(compiled):
    run = start_server(q8_exact(compiled), ctx_size=256, n_parallel=1, api_keys=["k"],
                       cors_origins=("http://ok.test",))
    with httpx.Client(base_url=run.url, timeout=120, headers={"Authorization": "Bearer k"}) as c:
        yield run, c
    run.stop()


def test_prompt_longer_than_the_context_is_exceed_context_size_error(small):
    _, c = small
    ids = PROMPTS["code-class"]["prompt_ids"]          # 292 tokens > 256 cells
    for path, body in (("/completion", {"prompt": ids}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 400}]})):
        r = c.post(path, json=body)
        assert r.status_code == 400, r.text
        e = r.json()["error"]
        assert e["type"] == "exceed_context_size_error" and e["code"] == 400 and e["n_ctx"] == 256
        assert e["n_prompt_tokens"] > 256 and str(e["n_prompt_tokens"]) in e["message"]
    assert c.get("/health").json() == {"status": "ok"}


def test_generation_reaching_the_context_finishes_with_length(small):
    _, c = small
    msgs = [{"role": "user", "content": "Write a long story."}]
    r = post(c, "/v1/chat/completions", {"messages": msgs, "temperature": 0, "ignore_eos": True})
    n_prompt = r["usage"]["prompt_tokens"]
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 256 - n_prompt + 1     # every cell used; the last token needs none
    s = c.post("/v1/chat/completions", json={"messages": msgs, "temperature": 0, "ignore_eos": True, "stream": True})
    chunks = [json.loads(e) for e in sse_events(s.text)[:-1]]
    assert [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]][-1] == "length"
    again = post(c, "/v1/chat/completions", {"messages": msgs, "temperature": 0, "ignore_eos": True})
    assert again["timings"]["cache_n"] == n_prompt - 1 and again["choices"] == r["choices"]


# -- probabilities --------------------------------------------------------------------------------------------------
def _log_softmax(z):
    z = z.astype(np.float64)
    return z - (z.max() + np.log(np.exp(z - z.max()).sum()))


def test_n_probs_are_the_target_models_with_and_without_drafting(one, compiled):
    """Each emitted token's logprob and its row's best 3, against the whole sequence's logits computed apart
    (Sequence.logits, teacher-forced, another model of the same artifact), the same with drafting on and off."""
    import nextn.runtime as rt

    _, c = one
    ids = PROMPTS["code-short"]["prompt_ids"]
    on = post(c, "/completion", greedy(ids, 12, n_probs=3))
    off = post(c, "/completion", greedy(ids, 12, n_probs=3, **{"speculative.n_max": 0}))
    assert on["timings"]["draft_n"] > 0 and on["tokens"] == off["tokens"]
    ref = rt.load(q8_exact(compiled), ctx_size=512).sequence.logits(ids + on["tokens"])
    for r in (on, off):
        probs = r["completion_probabilities"]
        assert [p["id"] for p in probs] == r["tokens"]
        for i, p in enumerate(probs):
            want = _log_softmax(ref[len(ids) - 1 + i])
            best = np.argsort(-want, kind="stable")[:3]
            assert abs(p["logprob"] - want[p["id"]]) < 1e-4
            assert [t["id"] for t in p["top_logprobs"]] == list(best) and p["top_logprobs"][0]["id"] == p["id"]
            assert all(abs(t["logprob"] - want[t["id"]]) < 1e-4 for t in p["top_logprobs"])
            assert bytes(p["bytes"]).decode("utf-8", "replace") == p["token"]
    stream = [json.loads(e) for e in sse_events(c.post("/completion", json=greedy(ids, 12, n_probs=3,
                                                                                   stream=True)).text)]
    got = [p for e in stream for p in e.get("completion_probabilities", [])]
    assert [p["id"] for p in got] == on["tokens"]
    assert all(abs(a["logprob"] - b["logprob"]) < 1e-4 for a, b in zip(got, on["completion_probabilities"]))


def test_chat_and_text_logprobs(one):
    _, c = one
    body = {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 10, "temperature": 0,
            "logprobs": True, "top_logprobs": 2}
    whole = post(c, "/v1/chat/completions", body)
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"] == 10
    assert all(len(p["top_logprobs"]) == 2 and p["top_logprobs"][0]["logprob"] >= p["top_logprobs"][1]["logprob"]
               for p in content)
    chunks = [json.loads(e) for e in sse_events(c.post("/v1/chat/completions", json={**body, "stream": True}).text)
              if e != "[DONE]"]
    streamed = [p for ch in chunks if ch["choices"] and ch["choices"][0].get("logprobs")
                for p in ch["choices"][0]["logprobs"]["content"]]
    assert [p["id"] for p in streamed] == [p["id"] for p in content]
    no = post(c, "/v1/chat/completions", {**body, "logprobs": False})
    assert "logprobs" not in no["choices"][0]
    text = post(c, "/v1/completions", {"prompt": "def main():", "max_tokens": 6, "temperature": 0, "logprobs": 1})
    lp = text["choices"][0]["logprobs"]["content"]
    assert len(lp) == 6 and all(p["top_logprobs"][0]["id"] == p["id"] for p in lp)
    for bad in ({**body, "top_logprobs": 21}, {**body, "logprobs": "yes"}):
        r = c.post("/v1/chat/completions", json=bad)
        assert r.status_code == 400, r.text


def test_logit_bias_bans_and_forces_with_and_without_drafting(one):
    _, c = one
    ids = PROMPTS["code-short"]["prompt_ids"]
    plain = post(c, "/completion", greedy(ids, 12, n_probs=2))
    first, second = (t["id"] for t in plain["completion_probabilities"][0]["top_logprobs"])
    assert first == plain["tokens"][0]
    for form in ({str(first): False}, [[first, False]]):
        for n_max in (3, 0):
            r = post(c, "/completion", greedy(ids, 12, logit_bias=form, **{"speculative.n_max": n_max}))
            assert r["tokens"][0] == second and first not in r["tokens"]
            if n_max:
                banned = r
            else:
                assert r["tokens"] == banned["tokens"]
    assert banned["timings"]["draft_n"] > 0
    forced = post(c, "/completion", greedy(ids, 10, logit_bias=[[second, 100]]))
    assert forced["tokens"] == [second] * 10 and forced["timings"]["draft_n"] > 0
    text = c.post("/tokenize", json={"content": " return"}).json()["tokens"]
    by_text = post(c, "/completion", greedy(ids, 8, logit_bias=[[" return", False]]))
    by_ids = post(c, "/completion", greedy(ids, 8, logit_bias={str(t): False for t in text}))
    assert by_text["tokens"] == by_ids["tokens"] and not set(text) & set(by_text["tokens"])
    for bad in ({"5": "big"}, [[10**9, 1.0]], "x"):
        assert c.post("/completion", json=greedy(ids, 2, logit_bias=bad)).status_code == 400


# -- CORS ------------------------------------------------------------------------------------------------------------
def test_cors_allows_every_origin_by_default(one):
    _, c = one
    r = c.get("/health", headers={"Origin": "http://any.test"})
    assert r.headers["access-control-allow-origin"] == "http://any.test"
    assert r.headers["access-control-allow-credentials"] == "true"
    assert "access-control-allow-origin" not in c.get("/health").headers          # no Origin, no CORS headers
    pre = c.options("/v1/chat/completions", headers={"Origin": "http://any.test", "Access-Control-Request-Method":
                                                     "POST", "Access-Control-Request-Headers": "authorization"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert pre.headers["access-control-allow-headers"] == "*"              # llama-server's defaults
    assert pre.headers["access-control-allow-origin"] == "http://any.test"
    # spelled as llama-server sends them: clients that copy the headers into a plain dict look them up so
    assert (b"Access-Control-Allow-Origin", b"http://any.test") in pre.headers.raw


def test_cors_listed_origins_and_a_preflight_needs_no_api_key(small):
    run, c = small
    ok = c.post("/tokenize", json={"content": "hi"}, headers={"Origin": "http://ok.test"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://ok.test"
    other = c.post("/tokenize", json={"content": "hi"}, headers={"Origin": "http://evil.test"})
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
    with httpx.Client(base_url=run.url, timeout=30) as anon:
        pre = anon.options("/completion", headers={"Origin": "http://ok.test", "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://ok.test"
        denied = anon.post("/completion", json={"prompt": "x"}, headers={"Origin": "http://ok.test"})
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "http://ok.test"
        anth = anon.post("/v1/messages", json={"max_tokens": 1, "messages": []})     # Anthropic's error object there
        assert anth.status_code == 401
        assert anth.json() == {"type": "error", "error": {"type": "authentication_error", "message": "Invalid API Key"}}


# -- glm-dsa: the DSA indexer keys are position-indexed like the KV, so the prefix is reused the same way -----------
def test_glm_dsa_reuse_equals_cold_start(compiled):
    run = start_server(compiled("dsa-q8", D / "tiny-glm-dsa-Q8_0.gguf"), ctx_size=2048, n_parallel=1)
    try:
        with httpx.Client(base_url=run.url, timeout=120) as c:
            prompts = {p["kind"]: p for p in reference(D)["prompts"]}
            ids = list(prompts["docs-api"]["prompt_ids"])
            prev = post(c, "/completion", greedy(ids, 12))
            for turn in range(2):
                ids = ids + prev["tokens"] + prompts["code-short"]["prompt_ids"]
                warm = post(c, "/completion", greedy(ids, 12))
                cold = post(c, "/completion", greedy(ids, 12, cache_prompt=False))
                assert warm["timings"]["cache_n"] > 0
                assert warm["tokens"] == cold["tokens"] and spec_counts(warm) == spec_counts(cold)
                assert spec_counts(warm)[0] > 0
                prev = cold
    finally:
        run.stop()


# -- glm5next: the KDA recurrent state exists at one position only, so its slots never reuse a prefix ---------------
def test_glm5next_slots_do_not_reuse_and_stay_correct(compiled):
    g5 = FIXTURES / "tiny-glm5next"
    run = start_server(compiled("g5n-bf16", g5 / "tiny-glm5next-BF16.gguf"), ctx_size=2048, n_parallel=1)
    try:
        with httpx.Client(base_url=run.url, timeout=120) as c:
            p = {q["kind"]: q for q in reference(g5)["prompts"]}["code-short"]
            first = post(c, "/completion", greedy(p["prompt_ids"], 12))
            again = post(c, "/completion", greedy(p["prompt_ids"], 12))
            assert again["timings"]["cache_n"] == 0 and again["timings"]["prompt_n"] == len(p["prompt_ids"])
            assert again["tokens"] == first["tokens"] and spec_counts(again) == spec_counts(first)
            assert spec_counts(first)[0] > 0
    finally:
        run.stop()


@pytest.mark.slow
def test_an_18k_token_prompt_with_speculation_decodes_and_the_server_stays_healthy(compiled):
    """The crash reported for llama.cpp's MTP path on an ~18K-token prompt (issue 37 item 2): here the prompt is
    prefilled in chunks, drafts are made and verified, and the next turn reuses the whole prefix."""
    run = start_server(q8_exact(compiled), ctx_size=18600, n_parallel=1)
    try:
        with httpx.Client(base_url=run.url, timeout=600) as c:
            base = [t for p in PROMPTS.values() for t in p["prompt_ids"]]
            ids = (base * (18000 // len(base) + 1))[:18000]
            r = post(c, "/completion", greedy(ids, 24))
            assert r["tokens_predicted"] == 24 and r["timings"]["draft_n"] > 0
            assert r["timings"]["prompt_n"] == 18000
            again = post(c, "/completion", greedy(ids + r["tokens"], 8))
            assert again["timings"]["cache_n"] >= 18000 - 1 and again["timings"]["prompt_n"] <= 24 + 1 + 3
            assert again["tokens"][:1] and c.get("/health").json() == {"status": "ok"}
    finally:
        run.stop()


# -- slot actions and id_slot ----------------------------------------------------------------------------------------
def test_slot_save_restore_erase_and_id_slot(compiled, tmp_path):
    """A prefix prefilled on slot 1 is saved, restored into slot 0, and reused there: output equals a cold start
    (with drafting: the NextN rows came back too); erase empties a slot; bad names and actions are 400."""
    run = start_server(q8_exact(compiled), ctx_size=4096, n_parallel=2, slot_save_path=str(tmp_path))
    try:
        with httpx.Client(base_url=run.url, timeout=120) as c:
            ids = PROMPTS["docs-api"]["prompt_ids"]
            first = post(c, "/completion", greedy(ids, 8, id_slot=1))
            assert first["id_slot"] == 1
            saved = post(c, "/slots/1?action=save", {"filename": "s1.npz"})
            assert saved["n_saved"] == len(ids) + 7 and saved["n_written"] == (tmp_path / "s1.npz").stat().st_size
            restored = post(c, "/slots/0?action=restore", {"filename": "s1.npz"})
            assert restored["n_restored"] == len(ids) + 7 and restored["n_read"] == saved["n_written"]
            longer = ids + first["tokens"] + PROMPTS["code-short"]["prompt_ids"]
            warm = post(c, "/completion", greedy(longer, 16, id_slot=0))
            cold = post(c, "/completion", greedy(longer, 16, id_slot=1, cache_prompt=False))
            assert warm["id_slot"] == 0 and warm["timings"]["cache_n"] >= len(ids) - 1
            assert warm["tokens"] == cold["tokens"] and spec_counts(warm) == spec_counts(cold)
            n = c.get("/slots").json()[0]["n_past"]
            assert post(c, "/slots/0?action=erase", {}) == {"id_slot": 0, "n_erased": n}
            assert c.get("/slots").json()[0]["n_past"] == 0
            again = post(c, "/completion", greedy(longer, 4, id_slot=0))
            assert again["timings"]["cache_n"] == 0 and again["tokens"] == cold["tokens"][:4]
            for path, body, status in (("/slots/0?action=save", {"filename": "../x"}, 400),
                                       ("/slots/0?action=save", {"filename": ".hidden"}, 400),
                                       ("/slots/0?action=restore", {"filename": "missing.npz"}, 404),
                                       ("/slots/0?action=fly", {}, 400), ("/slots/7?action=erase", {}, 400)):
                assert c.post(path, json=body).status_code == status, path
            assert c.post("/completion", json=greedy(ids, 2, id_slot=5)).status_code == 400
            assert not (tmp_path.parent / "x").exists()
    finally:
        run.stop()


def test_slot_save_holds_the_cached_cells_only_and_restore_continues_as_never_saved(compiled, tmp_path):
    """A slot file holds the rows of the cells the slot's tokens use (trunk and NextN KV), not the slot's whole
    context: its arrays are n rows each and its bytes are n × the manifest's bytes per cell plus the .npz framing.
    Saved from a 4096-cell slot, then the slot is given another prompt (its cells overwritten), restored, and the
    conversation goes on: greedy output and draft counts (speculation on) equal a cold start, and equal the
    fixture's reference; the same file restores into a server with 1024 cells with the same output."""
    import json as _json

    from nextn.common.manifest import MANIFEST

    art = q8_exact(compiled)
    bpt = _json.loads((__import__("pathlib").Path(art) / MANIFEST).read_text())["kv_cache"]["bytes_per_token"]
    per_cell = int(bpt["trunk"]) + int(bpt["nextn"])
    ref = {p["kind"]: p for p in reference()["prompts"]}
    p = ref["code-module"]
    P, want = p["prompt_ids"], p["greedy_ids"]
    ext = P + want[:16]
    outs = []
    for ctx in (4096, 1024):
        run = start_server(art, ctx_size=ctx, n_parallel=1, slot_save_path=str(tmp_path))
        try:
            with httpx.Client(base_url=run.url, timeout=120) as c:
                if ctx == 4096:
                    first = post(c, "/completion", greedy(P, 16))
                    assert first["tokens"] == want[:16] and first["timings"]["draft_n"] > 0
                    saved = post(c, "/slots/0?action=save", {"filename": "conv.npz"})
                    n = saved["n_saved"]
                    assert n == len(P) + 15
                    with np.load(tmp_path / "conv.npz") as z:
                        arrays = {k: z[k] for k in z.files}
                    assert arrays["tokens"].tolist() == (P + want[:15])
                    n_cells = max(n, int(arrays["n_mtp"]))
                    assert n <= n_cells <= n + 3 + 1                   # NextN rows: at most n_max + 1 ahead
                    kv = [a for k, a in arrays.items() if k.startswith("state.")]
                    assert kv and all(a.shape[0] == n_cells for a in kv)
                    assert sum(a.nbytes for a in kv) == n_cells * per_cell
                    size = (tmp_path / "conv.npz").stat().st_size
                    assert saved["n_written"] == size
                    assert n_cells * per_cell < size < n_cells * per_cell + 512 * len(arrays)   # .npz framing
                    assert size < 4096 * per_cell / 10                    # not the slot's 4096 cells
                    # another prompt takes the slot's cells, then the saved conversation comes back
                    post(c, "/completion", greedy(ref["docs-prose"]["prompt_ids"], 4))
                restored = post(c, "/slots/0?action=restore", {"filename": "conv.npz"})
                assert restored["n_restored"] == len(P) + 15 and restored["n_read"] == size
                warm = post(c, "/completion", greedy(ext, 16))
                assert warm["timings"]["cache_n"] >= len(P) - 1 and warm["timings"]["prompt_n"] <= 16 + 1
                cold = post(c, "/completion", greedy(ext, 16, cache_prompt=False))
                assert cold["timings"]["cache_n"] == 0
                assert warm["tokens"] == cold["tokens"] == want[16:32]
                assert spec_counts(warm) == spec_counts(cold) and warm["timings"]["draft_n"] > 0
                outs.append((warm["tokens"], spec_counts(warm)))
                # a file holding more cells than the slot has is refused, the server goes on
                if ctx == 1024:
                    big = {k: a for k, a in arrays.items()}
                    big["tokens"] = np.zeros(2000, np.int32)
                    np.savez(tmp_path / "big.npz", **big)
                    r = c.post("/slots/0?action=restore", json={"filename": "big.npz"})
                    assert r.status_code == 400 and "1024" in r.json()["error"]["message"]
                    assert c.get("/health").json() == {"status": "ok"}
        finally:
            run.stop()
    assert outs[0] == outs[1]
