"""Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) through `nextn serve` over real HTTP on
127.0.0.1 (tiny glm4moe Q8_0), with the scripted replies of test_server_chat (the real scheduler, parser and writers;
`slots.decode` emits a given text). Expected shapes: Anthropic's Messages API reference; expected values: the
script, and the chat route's answer / rendering of the equivalent OpenAI request."""
from __future__ import annotations

import json
import re

import pytest

from test_server_chat import (CALL2, LIST_DIR, SCRIPT, THOUGHT, TOOL_TURN, chat,  # noqa: F401 (chat: a fixture)
                              named_events, rendered_ids)

TOOLS = [{"name": "list_dir", "description": LIST_DIR["description"], "input_schema": LIST_DIR["parameters"]}]


def messages(c, text, status=200, **body):
    SCRIPT["text"] = text
    body = {"model": "tiny", "max_tokens": 64, "messages": [{"role": "user", "content": "list /tmp"}], **body}
    r = c.post("/v1/messages", json=body)
    assert r.status_code == status, r.text
    return r.json()


def events(c, text, **body):
    """The stream as (event name, data) pairs."""
    SCRIPT["text"] = text
    body = {"model": "tiny", "max_tokens": 64, "messages": [{"role": "user", "content": "list /tmp"}],
            "stream": True, **body}
    return [(d["type"], d) for d in named_events(c.post("/v1/messages", json=body))]


def test_text_reply(chat):  # noqa: F811
    r = messages(chat, "It is sunny.")
    assert re.fullmatch(r"msg_[0-9A-Za-z]{24}", r["id"])
    name = chat.get("/v1/models").json()["data"][0]["id"]
    assert (r["type"], r["role"], r["model"]) == ("message", "assistant", name)
    assert r["content"] == [{"type": "text", "text": "It is sunny."}]
    assert (r["stop_reason"], r["stop_sequence"]) == ("end_turn", None)
    u = r["usage"]
    assert u["output_tokens"] > 0 and u["input_tokens"] + u["cache_read_input_tokens"] > 0


def test_thinking_and_tool_use(chat):  # noqa: F811
    r = messages(chat, "<think>Need the listing.</think>" + CALL2, tools=TOOLS)
    assert r["stop_reason"] == "tool_use"
    think, use = r["content"]
    assert think == {"type": "thinking", "thinking": "Need the listing.", "signature": ""}
    assert use["type"] == "tool_use" and use["name"] == "list_dir" and use["input"] == {"path": "/tmp"}
    assert re.fullmatch(r"[0-9A-Za-z]{32}", use["id"])


def test_stream_event_sequence_equals_the_whole_answer(chat):  # noqa: F811
    text = THOUGHT + "\n" + CALL2
    whole = messages(chat, text, tools=TOOLS)
    ev = events(chat, text, tools=TOOLS)
    names = [n for n, _ in ev]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = ev[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    blocks, open_ = [], None
    for n, d in ev[1:-2]:
        if n == "content_block_start":
            assert open_ is None and d["index"] == len(blocks)
            open_ = dict(d["content_block"])
        elif n == "content_block_delta":
            assert d["index"] == len(blocks)
            delta = d["delta"]
            key = {"text_delta": "text", "thinking_delta": "thinking",
                   "input_json_delta": "partial_json"}[delta["type"]]
            open_[key] = open_.get(key, "") + delta[key]
        else:
            assert n == "content_block_stop" and d["index"] == len(blocks)
            if open_["type"] == "tool_use":
                open_["input"] = json.loads(open_.pop("partial_json"))
            blocks.append(open_)
            open_ = None
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    want = [{k: v for k, v in b.items() if k not in ("signature", "id")} for b in whole["content"]]
    assert [{k: v for k, v in b.items() if k != "id"} for b in blocks] == want
    delta = ev[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_max_tokens_and_stop_sequences(chat):  # noqa: F811
    long = " ".join(["word"] * 40)
    r = messages(chat, long, max_tokens=5)
    assert r["stop_reason"] == "max_tokens" and r["usage"]["output_tokens"] == 5
    r = messages(chat, "alpha beta STOP gamma", stop_sequences=["STOP"])
    assert (r["stop_reason"], r["stop_sequence"]) == ("stop_sequence", "STOP")
    assert r["content"] == [{"type": "text", "text": "alpha beta "}]


def test_a_tool_result_turn_renders_as_the_equivalent_chat_request(chat):  # noqa: F811
    """count_tokens of an Anthropic conversation (system blocks, tool_use, tool_result) equals the token count of the
    OpenAI chat request written by hand for it, rendered by /apply-template."""
    anth = {"model": "tiny", "system": [{"type": "text", "text": "Be brief."}], "tools": TOOLS, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "list /tmp"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it", "signature": "x"},
                                          {"type": "tool_use", "id": "t1", "name": "list_dir",
                                           "input": {"path": "/tmp"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"},
                                     {"type": "text", "text": "and now?"}]}]}
    ids = rendered_ids(chat, TOOL_TURN)
    r = chat.post("/v1/messages/count_tokens", json=anth)
    assert r.status_code == 200 and r.json() == {"input_tokens": len(ids)}
    SCRIPT["text"] = "Two files."
    assert chat.post("/v1/messages", json={**anth, "max_tokens": 8}).json()["content"][0]["text"] == "Two files."
    assert SCRIPT["prompt_ids"] == ids           # the prompt the slot got


BAD = [
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "no media"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, "max_tokens"),
]


@pytest.mark.parametrize("body,msg", BAD, ids=[b[1] for b in BAD])
def test_errors_are_anthropic_shaped_and_the_server_keeps_serving(chat, body, msg):  # noqa: F811
    r = chat.post("/v1/messages", json=body)
    assert r.status_code == 400
    e = r.json()
    assert e["type"] == "error" and e["error"]["type"] == "invalid_request_error" and msg in e["error"]["message"]
    assert messages(chat, "fine")["content"] == [{"type": "text", "text": "fine"}]


def test_exceeding_the_context_is_an_anthropic_error(chat):  # noqa: F811
    r = chat.post("/v1/messages", json={"max_tokens": 4, "messages": [{"role": "user", "content": "x " * 3000}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "exceeds the available context size" in r.json()["error"]["message"]
