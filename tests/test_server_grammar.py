"""Constrained output through `nextn serve` (llguidance): `grammar` (GBNF), `json_schema` / `response_format`, and
tool calls forced by `tool_choice`, over real HTTP on 127.0.0.1 with the tiny glm4moe Q8_0 model itself (no script):
the tiny model never writes JSON or a tool call unprompted, so what comes back shows the constraint. Greedy output
with speculation on is byte-identical to off (drafts are cut to what the grammar accepts, every verify row masked).
Expected values: the grammar's own language (checked by parsing the reply), and the same request with n_max 0."""
from __future__ import annotations

import json

import pytest

from test_server import PROMPTS, serving

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
         {"type": "function", "function": {"name": "set_light", "parameters": {"type": "object", "properties": {
             "on": {"type": "boolean"}, "room": {"enum": ["kitchen", "hall"]}}}}}]


@pytest.fixture(scope="module")
def c(compiled):
    yield from serving(compiled, ctx_size=2048, n_parallel=1)


def both(c, path, body):
    """The request with drafting (n_max 3) and without: (drafted, plain) answers."""
    out = []
    for n in (3, 0):
        r = c.post(path, json={**body, "temperature": 0, "speculative.n_max": n})
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def chat_text(r):
    return r["choices"][0]["message"]["content"]


def test_gbnf_grammar(c):
    body = {"messages": [{"role": "user", "content": "Is it raining?"}], "max_tokens": 8,
            "grammar": 'root ::= ("yes" | "no") " because " [a-z]+'}
    on, off = both(c, "/v1/chat/completions", body)
    assert chat_text(on) == chat_text(off)
    head, _, word = chat_text(on).partition(" because ")
    assert head in ("yes", "no") and (word.isalpha() and word.islower() or word == "")
    r = both(c, "/completion", {"prompt": PROMPTS["code-short"]["prompt_ids"], "n_predict": 6, "return_tokens": True,
                                "grammar": 'root ::= [0-9]+'})
    assert r[0]["tokens"] == r[1]["tokens"] and r[0]["content"].isdigit()


def test_json_schema_and_response_format(c):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
              "required": ["answer", "sure"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "Answer in JSON."}]
    for body in ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}},
                 {"json_schema": schema}):
        on, off = both(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 40, **body})
        assert chat_text(on) == chat_text(off) and on["choices"][0]["finish_reason"] == "stop"
        v = json.loads(chat_text(on))
        assert set(v) == {"answer", "sure"} and v["answer"] in ("yes", "no") and isinstance(v["sure"], bool)
    on, off = both(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 24,
                                                "response_format": {"type": "json_object"}})
    assert chat_text(on) == chat_text(off) and chat_text(on).startswith("{")
    assert on["timings"]["draft_n"] > 0          # drafting still runs, its drafts checked against the grammar


def test_forced_tool_calls(c):
    msgs = [{"role": "user", "content": "Hello"}]
    on, off = both(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 60, "tools": TOOLS,
                                                "tool_choice": {"type": "function", "function": {"name": "set_light"}}})
    assert [x["function"] for x in on["choices"][0]["message"]["tool_calls"]] == \
        [x["function"] for x in off["choices"][0]["message"]["tool_calls"]]      # the ids are random
    ch = on["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
    (call,) = ch["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "set_light" and set(args) <= {"on", "room"}
    assert all(isinstance(args[k], bool) for k in args if k == "on") and args.get("room", "hall") in ("kitchen", "hall")
    r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 60, "tools": TOOLS, "temperature": 0,
                                             "tool_choice": "required"}).json()
    names = [x["function"]["name"] for x in r["choices"][0]["message"]["tool_calls"]]
    assert len(names) == 1 and names[0] in ("get_time", "set_light")


BAD = [({"grammar": "root ::= ("}, "Field 'grammar'"),
       ({"json_schema": "object"}, "Field 'json_schema'"),
       ({"response_format": {"type": "xml"}}, "Field 'response_format'"),
       ({"response_format": {"type": "json_schema", "json_schema": {}}}, "Field 'response_format'")]


@pytest.mark.parametrize("body,msg", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_grammars_are_400_and_the_server_keeps_serving(c, body, msg):
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **body})
    assert r.status_code == 400 and msg in r.json()["error"]["message"], r.text
    assert c.post("/completion", json={"prompt": "x", "n_predict": 2}).status_code == 200
