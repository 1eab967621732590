"""`nextn serve` request features of issue 37 item 7, over real HTTP on 127.0.0.1 (tiny glm4moe Q8_0, --exact-matmul,
two slots, speculation on): several prompts per request and `n_cmpl` / `n`, `return_progress`,
`continue_final_message`, `/chat/completions/input_tokens`, `verbose` (`__verbose`). Expected values: the fixture's
reference continuations, the same server's single-prompt answers, its /tokenize and /apply-template answers, and the
request's own arithmetic (llama-server's semantics: tools/server/server-context.cpp, server-common.cpp)."""
from __future__ import annotations

import json
from unittest.mock import ANY

import pytest

from test_server import PROMPTS, post, serving, sse_events


@pytest.fixture(scope="module")
def c(compiled):
    yield from serving(compiled, ctx_size=4096, n_parallel=2)


def greedy(prompt, n, **kw):
    return {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "return_tokens": True, **kw}


CHAT = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


def test_several_prompts_are_answered_in_order_each_as_if_alone(c):
    a, b = PROMPTS["code-short"], PROMPTS["docs-heading"]
    r = post(c, "/completion", greedy([a["prompt_ids"], b["prompt_ids"]], 6))
    assert isinstance(r, list) and [x["index"] for x in r] == [0, 1]
    assert r[0]["tokens"] == a["greedy_ids"][:6] and r[1]["tokens"] == b["greedy_ids"][:6]
    # llama-server's JSON prompt object, alone or among others
    j = post(c, "/completion", greedy({"prompt_string": "def main():"}, 4))
    mixed = post(c, "/completion", greedy([{"prompt_string": "def main():"}, "def main():"], 4))
    assert j["tokens"] == mixed[0]["tokens"] == mixed[1]["tokens"]
    e = c.post("/completion", json=greedy({"prompt_string": "x", "multimodal_data": "iVBO"}, 2))
    assert e.status_code == 400 and "multimodal_data" in e.json()["error"]["message"]
    texts = ["def main():", "import os\n"]
    alone = [post(c, "/v1/completions", {"prompt": t, "max_tokens": 5, "temperature": 0})["choices"][0]["text"]
             for t in texts]
    both = post(c, "/v1/completions", {"prompt": texts, "max_tokens": 5, "temperature": 0})
    assert [(ch["index"], ch["text"]) for ch in both["choices"]] == [(0, alone[0]), (1, alone[1])]


def test_n_cmpl_gives_that_many_completions_of_the_prompt(c):
    one = post(c, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "temperature": 0})
    for extra in ({}, {"id_slot": 0}):      # forced onto one slot: the two run one after the other
        r = post(c, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "temperature": 0, "n": 2, **extra})
        assert [ch["index"] for ch in r["choices"]] == [0, 1]
        assert all(ch["message"] == one["choices"][0]["message"] for ch in r["choices"])
        assert all(ch["finish_reason"] == "length" for ch in r["choices"])
    p = PROMPTS["code-short"]
    r = post(c, "/completion", greedy(p["prompt_ids"], 4, n_cmpl=2))
    assert [(x["index"], x["tokens"]) for x in r] == [(0, p["greedy_ids"][:4]), (1, p["greedy_ids"][:4])]
    err = c.post("/completion", json=greedy(p["prompt_ids"], 4, n_cmpl=3))     # hard limit: the slots (2)
    assert err.status_code == 400 and "n_cmpl" in err.json()["error"]["message"]


def test_input_tokens_is_the_rendered_prompts_length(c):
    prompt = post(c, "/apply-template", {"messages": CHAT})["prompt"]
    n = len(post(c, "/tokenize", {"content": prompt})["tokens"])
    assert post(c, "/chat/completions/input_tokens", {"messages": CHAT}) == {"input_tokens": n}
    assert post(c, "/v1/chat/completions/input_tokens", {"messages": CHAT}) == {"input_tokens": n}
    r = post(c, "/v1/responses/input_tokens", {"input": "What is the best book", "instructions": "Book"})
    assert r == {"input_tokens": n, "object": "response.input_tokens"}
    r = c.post("/chat/completions/input_tokens", json={"messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_verbose_carries_the_prompt(c):
    prompt = post(c, "/apply-template", {"messages": CHAT})["prompt"]
    r = post(c, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "verbose": True})
    assert r["__verbose"]["prompt"] == prompt
    assert r["__verbose"]["tokens_predicted"] == r["usage"]["completion_tokens"]
    assert "__verbose" not in post(c, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "verbose": False})


def test_continue_final_message(c):
    msgs = CHAT + [{"role": "assistant", "content": "Whill"}]
    base = post(c, "/apply-template", {"messages": CHAT})["prompt"]
    r = post(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0, "verbose": True,
                                         "add_generation_prompt": False, "continue_final_message": True})
    assert r["__verbose"]["prompt"] == base + "Whill"
    parts = CHAT + [{"role": "assistant", "content": [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]}]
    r2 = post(c, "/v1/chat/completions", {"messages": parts, "max_tokens": 1, "verbose": True})
    assert r2["__verbose"]["prompt"] == base + "Wh\n\nill"
    heuristic = post(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0})
    assert heuristic["choices"][0]["message"] == r["choices"][0]["message"]     # llama-server's prefill: the same
    for body, words in (({"add_generation_prompt": True, "continue_final_message": True}, "add_generation_prompt"),
                        ({"continue_final_message": True}, "add_generation_prompt"),     # its default is true
                        ({"add_generation_prompt": False, "continue_final_message": "content",
                          "messages": CHAT + [{"role": "assistant", "content": "",
                                               "tool_calls": [{"type": "function", "id": "x", "function": {
                                                   "name": "f", "arguments": "{}"}}]}]}, "tool calls")):
        e = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, **body})
        assert e.status_code == 400 and words in e.json()["error"]["message"], e.text
    # continuing the reasoning: the prompt ends inside <think>, the reply is reasoning until </think>
    think = CHAT + [{"role": "assistant", "content": "", "reasoning_content": "Let me"}]
    req = {"messages": think, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "add_generation_prompt": False,
           "continue_final_message": "reasoning_content"}
    raw = post(c, "/v1/chat/completions", {**req, "reasoning_format": "none", "verbose": True})
    assert raw["__verbose"]["prompt"] == base + "<think>Let me"
    text = raw["choices"][0]["message"]["content"] or ""
    msg = post(c, "/v1/chat/completions", req)["choices"][0]["message"]
    reasoning, closed, content = text.partition("</think>")
    assert msg.get("reasoning_content") == reasoning
    assert (msg.get("content") or "") == (content.strip() if closed else "")


def test_return_progress_reports_the_prompt_then_streams(c):
    body = {"messages": [{"role": "user", "content": "This is a test" * 10}], "max_tokens": 4, "temperature": 0,
            "stream": True, "return_progress": True}
    for turn in range(2):     # a cold start, then the same prompt again
        r = c.post("/v1/chat/completions", json={**body, "cache_prompt": turn == 1})
        assert r.status_code == 200
        objs = [json.loads(e) for e in sse_events(r.text) if e != "[DONE]"]
        prog = [o["prompt_progress"] for o in objs if "prompt_progress" in o]
        final = objs[-1]["timings"]
        total = final["cache_n"] + final["prompt_n"]
        assert len(prog) == 2 and objs[0].get("prompt_progress") == prog[0]
        assert prog[0]["cache"] == prog[0]["processed"] == final["cache_n"] and prog[0]["total"] == total
        assert prog[1]["processed"] == prog[1]["total"] == total and prog[1]["cache"] == final["cache_n"]
        assert prog[1]["time_ms"] >= prog[0]["time_ms"]
        assert (final["cache_n"] > 0) == (turn == 1)     # the second turn reuses the first one's prompt
        text = "".join(o["choices"][0]["delta"].get("content") or "" for o in objs if o.get("choices"))
        timed = [json.loads(e) for e in sse_events(c.post("/completion", json={
            "prompt": body["messages"][0]["content"], "n_predict": 2, "stream": True, "return_progress": True,
            "timings_per_token": True, "cache_prompt": False}).text)]
        pt = [o["timings"] for o in timed if "prompt_progress" in o]
        assert pt[0]["prompt_n"] == 0 and pt[0]["prompt_ms"] == 0.0 and pt[0]["predicted_n"] == 0
        assert pt[1]["prompt_n"] == timed[-1]["timings"]["prompt_n"] and pt[1]["prompt_ms"] > 0
        plain = post(c, "/v1/chat/completions", {**body, "stream": False, "return_progress": False})
        assert text == (plain["choices"][0]["message"]["content"] or "")


def test_json_object_with_a_schema_follows_it_and_a_bad_schema_is_a_400(c):
    msgs = [{"role": "user", "content": "Write an example"}]
    r = post(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "temperature": 0,
                                         "response_format": {"type": "json_object", "schema": {"const": "42"}}})
    assert r["choices"][0]["message"]["content"] == '"42"'
    for bad in (123, {"type": 123}, {"type": "hiccup"}):
        e = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2,
                                                 "response_format": {"type": "json_object", "schema": bad}})
        assert e.status_code == 400 and "response_format" in e.json()["error"]["message"], e.text


def test_aliases_and_tags_as_llama_server():
    from nextn.runtime.server import ServeOptions, make_state

    st = make_state(ServeOptions(model="dir/m.gguf", alias="tinyllama-2, fim,code", tags="chat,fim,small"))
    assert st.model_name == "code"                        # the first of the sorted set, as llama-server's std::set
    assert st.aliases == ["code", "fim", "tinyllama-2"] and st.tags == ["chat", "fim", "small"]
    st = make_state(ServeOptions(model="dir/m.gguf"))
    assert (st.model_name, st.aliases, st.tags) == ("m.gguf", [], [])


def test_responses_route_without_v1_streams_progress_and_timings(c):
    body = {"input": "This is a test" * 10, "max_output_tokens": 6, "temperature": 0, "stream": True,
            "timings_per_token": True, "return_progress": True}
    r = c.post("/responses", json=body)
    assert r.status_code == 200
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]
    prog = [e for e in events if "prompt_progress" in e]
    done = events[-1]
    assert done["type"] in ("response.completed", "response.incomplete") and "timings" in done
    n_in = done["response"]["usage"]["input_tokens"]
    assert [e["type"] for e in prog] == ["response.in_progress"] * 2
    assert prog[0]["prompt_progress"]["processed"] == prog[0]["prompt_progress"]["cache"]
    assert prog[-1]["prompt_progress"]["processed"] == prog[-1]["prompt_progress"]["total"] == n_in
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("prompt_per_second" in e["timings"] for e in deltas)
    assert done["timings"]["predicted_n"] == done["response"]["usage"]["output_tokens"]


def test_a_null_tool_choice_counts_as_absent(c):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    body = {"messages": CHAT, "max_tokens": 4, "temperature": 0, "tools": tools}
    a, b = post(c, "/v1/chat/completions", {**body, "tool_choice": None}), post(c, "/v1/chat/completions", body)
    assert a == {**b, "id": ANY, "created": ANY, "timings": ANY, "usage": ANY}
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]


def test_localhost_origins_as_llama_servers_origin_is_localhost():
    from nextn.runtime.server.app import is_localhost

    for o in ("http://localhost", "http://localhost:8080", "http://127.0.0.1", "http://127.0.0.1:3000",
              "http://[::1]", "http://[::1]:3000"):
        assert is_localhost(o), o
    for o in ("http://web.mydomain.fr", "http://evil.com", "http://notlocalhost", "http://localhost.evil.com",
              "http://[::1"):
        assert not is_localhost(o), o
