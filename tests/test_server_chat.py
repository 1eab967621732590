"""GLM tool calls and reasoning through `nextn serve`'s chat route, over real HTTP on 127.0.0.1 (tiny glm4moe Q8_0).

The tiny fixture never writes a tool call by itself, so most tests give the slot a scripted reply: `slots.decode` is
replaced by a generator that emits the tokens of a given text (the real tokenizer's, then an end-of-generation
token) under decode's finish rules, through the real scheduler, text stream, parser and response writers.
Expected values are written from GLM-4.5's documented call format and OpenAI's message shapes, independently of the
parser."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from test_server import q8_exact, sse_events, start_server

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "code": {"type": "string"}, "opts": {"type": "object"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "list_dir", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}}}}}]
CALL = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n"
        "<arg_key>code</arg_key>\n<arg_value>007</arg_value>\n<arg_key>opts</arg_key>\n"
        "<arg_value>{\"hourly\": [1, 2]}</arg_value>\n</tool_call>")
CALL_ARGS = {"city": "Paris", "days": 3, "metric": True, "code": "007", "opts": {"hourly": [1, 2]}}
CALL2 = "<tool_call>list_dir\n<arg_key>path</arg_key>\n<arg_value>/tmp</arg_value>\n</tool_call>"
SCRIPT = {"text": ""}
# One tool turn as an OpenAI chat request: the other APIs' tests send the same conversation in their own shapes
LIST_DIR = {"name": "list_dir", "description": "List a folder",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}
TOOL_TURN = {"tools": [{"type": "function", "function": LIST_DIR}],
             "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "list /tmp"},
                          {"role": "assistant", "content": "", "reasoning_content": "call it", "tool_calls": [
                              {"id": "t1", "type": "function",
                               "function": {"name": "list_dir", "arguments": "{\"path\": \"/tmp\"}"}}]},
                          {"role": "tool", "tool_call_id": "t1", "content": "a.txt"},
                          {"role": "user", "content": "and now?"}]}


def named_events(r) -> list:
    """A stream of named events (Anthropic's, OpenAI Responses') as their data objects; every event must be
    `event: NAME\ndata: JSON\n\n` with the data's `type` equal to NAME."""
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    out = []
    for e in r.text[:-2].split("\n\n"):
        m = re.fullmatch(r"event: ([\w.]+)\ndata: (.*)", e)
        assert m, e
        data = json.loads(m.group(2))
        assert data["type"] == m.group(1)
        out.append(data)
    return out


def rendered_ids(c, chat_request) -> list:
    """The token ids of a chat request's prompt, as /apply-template renders it."""
    prompt = c.post("/apply-template", json=chat_request).json()["prompt"]
    assert "<tool_response>\na.txt\n</tool_response>" in prompt and "<think>call it</think>" not in prompt
    return c.post("/tokenize", json={"content": prompt}).json()["tokens"]


@pytest.fixture(scope="module")
def chat(compiled):
    import nextn.runtime.server.slots as slots
    from nextn.runtime.speculative import FinishRules, Generation, SpecStats

    run = start_server(q8_exact(compiled), ctx_size=2048, n_parallel=1)
    tok = run.state.model.tokenizer
    real = slots.decode

    def scripted(seq, prompt_ids, sampling, spec, *, eog_ids=frozenset(), token_bytes=None, **kw):
        SCRIPT["prompt_ids"] = list(prompt_ids)
        ids = tok.encode(SCRIPT["text"])
        assert tok.decode(ids) == SCRIPT["text"]          # the script survives the tokenizer
        rules, out, finish = FinishRules(eog_ids, sampling.stop, token_bytes, sampling.n_predict), [], None
        for t in ids + ([min(eog_ids)] if eog_ids else []):   # decode's finish rules, one token per step
            finish = rules.push(out, t)
            yield [t]
            if finish:
                break
        return Generation(out, SpecStats(), 0.0, 0.0, finish or "length")

    slots.decode = scripted
    with httpx.Client(base_url=run.url, timeout=60) as c:
        yield c
    slots.decode = real
    run.stop()


def ask(c, text, status=200, **body):
    SCRIPT["text"] = text
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "weather?"}], **body})
    assert r.status_code == status, r.text
    return r.json()


def stream(c, text, **body):
    SCRIPT["text"] = text
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "weather?"}], "stream": True,
                                              **body})
    assert r.status_code == 200, r.text
    raw = sse_events(r.text)
    assert raw[-1] == "[DONE]"
    return [json.loads(e) for e in raw[:-1]]


def deltas(chunks, field):
    return [ch["choices"][0]["delta"][field] for ch in chunks if ch["choices"] and ch["choices"][0]["delta"].get(field)]


# -- tool calls ------------------------------------------------------------------------------------------------------
def test_tool_calls_are_parsed_typed_by_the_schema(chat):
    r = ask(chat, "Let me check.\n" + CALL + "\n" + CALL2, tools=TOOLS)
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    m = ch["message"]
    assert m["role"] == "assistant" and m["content"] == "Let me check."
    calls = m["tool_calls"]
    assert [c["type"] for c in calls] == ["function", "function"]
    assert all(re.fullmatch(r"[0-9A-Za-z]{32}", c["id"]) for c in calls) and calls[0]["id"] != calls[1]["id"]
    assert calls[0]["function"]["name"] == "get_weather" and calls[1]["function"]["name"] == "list_dir"
    assert isinstance(calls[0]["function"]["arguments"], str)
    assert json.loads(calls[0]["function"]["arguments"]) == CALL_ARGS
    assert json.loads(calls[1]["function"]["arguments"]) == {"path": "/tmp"}
    only = ask(chat, CALL, tools=TOOLS)["choices"][0]["message"]
    assert only["content"] is None and len(only["tool_calls"]) == 1


def test_streamed_tool_calls_arrive_as_delta_tool_calls(chat):
    whole = ask(chat, "Let me check.\n" + CALL + "\n" + CALL2, tools=TOOLS)["choices"][0]["message"]
    chunks = stream(chat, "Let me check.\n" + CALL + "\n" + CALL2, tools=TOOLS)
    assert "".join(deltas(chunks, "content")) == whole["content"]
    calls = [tc for d in deltas(chunks, "tool_calls") for tc in d]
    assert [tc["index"] for tc in calls] == [0, 1]
    assert [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in calls] == \
        [(w["function"]["name"], json.loads(w["function"]["arguments"])) for w in whole["tool_calls"]]
    assert all(tc["type"] == "function" and len(tc["id"]) == 32 for tc in calls)
    fin = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
    assert fin[-1] == "tool_calls" and set(fin[:-1]) == {None}
    # no chunk ever showed the call's text as content
    assert not any("<tool_call>" in d or "arg_key" in d for d in deltas(chunks, "content"))


BROKEN = [
    ("unknown function", "<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>"),
    ("text between pairs",
     "<tool_call>list_dir\nplease <arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>"),
    ("no name", "<tool_call>\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>"),
    ("never closed", "<tool_call>list_dir\n<arg_key>path</arg_key>\n<arg_value>/"),
    ("unclosed value", "<tool_call>list_dir\n<arg_key>path</arg_key>\n<arg_value>/\n</tool_call>"),
]


@pytest.mark.parametrize("what,text", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_malformed_call_is_content(chat, what, text):
    r = ask(chat, "Sure. " + text, tools=TOOLS)["choices"][0]
    assert r["finish_reason"] == "stop" and "tool_calls" not in r["message"]
    assert r["message"]["content"] == "Sure. " + text
    chunks = stream(chat, "Sure. " + text, tools=TOOLS)
    assert "".join(deltas(chunks, "content")) == "Sure. " + text and not deltas(chunks, "tool_calls")


def test_without_tools_or_with_tool_choice_none_calls_stay_content(chat):
    for body in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        m = ask(chat, CALL, **body)["choices"][0]["message"]
        assert m["content"] == CALL and "tool_calls" not in m


BAD_TOOLS = [
    ({"tools": {"name": "x"}}, "Field 'tools'"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "Field 'tools'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]}, "'parameters'"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "Field 'tool_choice'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "Field 'tool_choice'"),
    ({"reasoning_format": "loud"}, "Field 'reasoning_format'"),
]


@pytest.mark.parametrize("body,msg", BAD_TOOLS, ids=[b[1] + str(i) for i, b in enumerate(BAD_TOOLS)])
def test_malformed_tools_are_400_and_the_server_keeps_serving(chat, body, msg):
    e = ask(chat, "x", status=400, **body)["error"]
    assert e["type"] == "invalid_request_error" and msg in e["message"]
    assert ask(chat, "fine")["choices"][0]["message"]["content"] == "fine"


def test_tool_results_round_trip_through_the_template(chat):
    """The parsed reply, sent back with the tool's result, renders as GLM's call and observation blocks."""
    m = ask(chat, CALL2, tools=TOOLS)["choices"][0]["message"]
    msgs = [{"role": "user", "content": "list /tmp"}, m,
            {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "a.txt\nb.txt"}]
    prompt = chat.post("/apply-template", json={"messages": msgs, "tools": TOOLS}).json()["prompt"]
    assert prompt.endswith("<|user|>\nlist /tmp<|assistant|>\n<think></think>\n" + CALL2 +
                           "<|observation|>\n<tool_response>\na.txt\nb.txt\n</tool_response><|assistant|>")
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt
    r = chat.post("/v1/chat/completions", json={"messages": msgs, "tools": TOOLS})
    assert r.status_code == 200


# -- reasoning -------------------------------------------------------------------------------------------------------
THOUGHT = "\n<think>The user wants weather. I call the tool.</think>\nIt is sunny."


def test_reasoning_content_by_default_and_per_request_format(chat):
    m = ask(chat, THOUGHT)["choices"][0]["message"]
    assert m["reasoning_content"] == "The user wants weather. I call the tool." and m["content"] == "It is sunny."
    for fmt in ("deepseek", "auto"):
        assert ask(chat, THOUGHT, reasoning_format=fmt)["choices"][0]["message"] == m
    raw = ask(chat, THOUGHT, reasoning_format="none")["choices"][0]["message"]
    assert raw == {"role": "assistant", "content": THOUGHT}
    chunks = stream(chat, THOUGHT)
    assert "".join(deltas(chunks, "reasoning_content")) == m["reasoning_content"]
    assert "".join(deltas(chunks, "content")) == m["content"]
    first_content = next(i for i, ch in enumerate(chunks) if ch["choices"] and ch["choices"][0]["delta"].get("content"))
    assert all(not ch["choices"][0]["delta"].get("reasoning_content") for ch in chunks[first_content:] if ch["choices"])


def test_reasoning_then_a_tool_call(chat):
    m = ask(chat, "<think>Need data.</think>" + CALL2, tools=TOOLS)
    msg = m["choices"][0]["message"]
    assert m["choices"][0]["finish_reason"] == "tool_calls"
    assert msg["reasoning_content"] == "Need data." and msg["content"] is None
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"path": "/tmp"}


def test_an_unclosed_think_is_reasoning_and_a_late_think_is_content(chat):
    m = ask(chat, "<think>still thinking")["choices"][0]["message"]
    assert m == {"role": "assistant", "content": "", "reasoning_content": "still thinking"}
    late = "Answer first. <think>not reasoning</think>"
    assert ask(chat, late)["choices"][0]["message"] == {"role": "assistant", "content": late}


def test_enable_thinking_false_closes_the_think_block(chat):
    msgs = [{"role": "user", "content": "hi"}]
    on = chat.post("/apply-template", json={"messages": msgs}).json()["prompt"]
    off = chat.post("/apply-template", json={"messages": msgs,
                                             "chat_template_kwargs": {"enable_thinking": False}}).json()["prompt"]
    assert on == "[gMASK]<sop><|user|>\nhi<|assistant|>"
    assert off == "[gMASK]<sop><|user|>\nhi/nothink<|assistant|>\n<think></think>"


def test_reasoning_budget_zero_and_server_reasoning_format(chat, compiled):
    """--reasoning-budget 0 and --reasoning-format none (the scripted reply of `chat` is still in place)."""
    run = start_server(q8_exact(compiled), ctx_size=1024, defaults={"reasoning_budget": 0, "reasoning_format": "none"})
    try:
        with httpx.Client(base_url=run.url, timeout=60) as c:
            msgs = [{"role": "user", "content": "hi"}]
            p = c.post("/apply-template", json={"messages": msgs}).json()["prompt"]
            assert p.endswith("<|assistant|>\n<think></think>")
            p = c.post("/apply-template", json={"messages": msgs,
                                                "chat_template_kwargs": {"enable_thinking": True}}).json()["prompt"]
            assert p.endswith("<|assistant|>")
            SCRIPT["text"] = THOUGHT
            r = c.post("/v1/chat/completions", json={"messages": msgs})
            assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": THOUGHT}
            r = c.post("/v1/chat/completions", json={"messages": msgs, "reasoning_format": "auto"})
            assert r.json()["choices"][0]["message"]["content"] == "It is sunny."
    finally:
        run.stop()


def test_template_context_has_llama_servers_date_string():
    from datetime import datetime

    from nextn.runtime.server.chat_template import ChatTemplate

    t = ChatTemplate("{{ date_string }}|{{ strftime_now('%Y-%m-%d') }}|{{ messages[0].content }}", "test")
    before = datetime.now()
    got = t.render([{"role": "user", "content": "hi"}])
    days = {d.strftime("%d %b %Y") + "|" + d.strftime("%Y-%m-%d") for d in (before, datetime.now())}
    assert got.rsplit("|", 1)[0] in days and got.endswith("|hi")
    assert t.render([{"role": "user", "content": "x"}], date_string="01 Jan 2026").startswith("01 Jan 2026|")
    # llama-server defines enable_thinking (true unless turned off): templates that test `not enable_thinking`
    # (DeepSeek-R1's) must not read it as undefined
    et = ChatTemplate("{% if not enable_thinking %}off{% else %}on{% endif %}", "test")
    assert et.render([{"role": "user", "content": "x"}]) == "on"
    assert et.render([{"role": "user", "content": "x"}], enable_thinking=False) == "off"
    d = ChatTemplate("{{ datetime }}", "test").render([{"role": "user", "content": "x"}])    # llama-server's too
    assert d in {x.strftime("%b %d %Y") for x in (before, datetime.now())}
