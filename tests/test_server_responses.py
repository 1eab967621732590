"""OpenAI Responses API (/v1/responses, stateless) through `nextn serve` over real HTTP on 127.0.0.1 (tiny glm4moe
Q8_0), with the scripted replies of test_server_chat (the real scheduler, parser and writers). Expected shapes:
OpenAI's Responses API reference; expected values: the script, and the chat route's rendering of the equivalent
chat request."""
from __future__ import annotations

import json
import re

import pytest

from test_server_chat import (CALL2, LIST_DIR, SCRIPT, THOUGHT, TOOL_TURN, chat,  # noqa: F401 (chat: a fixture)
                              named_events, rendered_ids)

TOOLS = [{"type": "function", **LIST_DIR}]


def respond(c, text, status=200, **body):
    SCRIPT["text"] = text
    r = c.post("/v1/responses", json={"model": "tiny", "input": "list /tmp", **body})
    assert r.status_code == status, r.text
    return r.json()


def stream(c, text, **body):
    SCRIPT["text"] = text
    out = named_events(c.post("/v1/responses", json={"model": "tiny", "input": "list /tmp", "stream": True, **body}))
    assert [d["sequence_number"] for d in out] == list(range(len(out)))
    return out


def strip_ids(items):
    return [{k: v for k, v in it.items() if k not in ("id", "call_id")} for it in items]


def test_text_reply(chat):  # noqa: F811
    r = respond(chat, "It is sunny.", instructions="Be brief.")
    assert re.fullmatch(r"resp_[0-9A-Za-z]{24}", r["id"]) and r["object"] == "response"
    assert r["status"] == "completed" and r["incomplete_details"] is None and r["instructions"] == "Be brief."
    (msg,) = r["output"]
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["status"] == "completed"
    assert msg["content"] == [{"type": "output_text", "text": "It is sunny.", "annotations": []}]
    u = r["usage"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"] and u["output_tokens"] > 0


def test_reasoning_and_a_function_call(chat):  # noqa: F811
    r = respond(chat, "<think>Need the listing.</think>" + CALL2, tools=TOOLS)
    rs, fc = r["output"]
    assert rs["type"] == "reasoning" and rs["content"] == [{"type": "reasoning_text", "text": "Need the listing."}]
    assert fc["type"] == "function_call" and fc["name"] == "list_dir" and fc["status"] == "completed"
    assert json.loads(fc["arguments"]) == {"path": "/tmp"} and re.fullmatch(r"[0-9A-Za-z]{32}", fc["call_id"])


def test_stream_events_build_the_same_output(chat):  # noqa: F811
    text = THOUGHT + "\n" + CALL2
    whole = respond(chat, text, tools=TOOLS)
    ev = stream(chat, text, tools=TOOLS)
    names = [e["type"] for e in ev]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    done = [e["item"] for e in ev if e["type"] == "response.output_item.done"]
    assert strip_ids(done) == strip_ids(whole["output"])
    assert strip_ids(ev[-1]["response"]["output"]) == strip_ids(whole["output"])
    deltas = "".join(e["delta"] for e in ev if e["type"] == "response.output_text.delta")
    assert deltas == "It is sunny."
    assert "".join(e["delta"] for e in ev if e["type"] == "response.reasoning_text.delta") == \
        "The user wants weather. I call the tool."
    args = [e["arguments"] for e in ev if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(a) for a in args] == [{"path": "/tmp"}]


def test_max_output_tokens_is_incomplete(chat):  # noqa: F811
    r = respond(chat, " ".join(["word"] * 40), max_output_tokens=5)
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["usage"]["output_tokens"] == 5
    # streamed: llama-server's closing event (response.completed, never OpenAI's response.incomplete), its response
    # still incomplete
    last = stream(chat, " ".join(["word"] * 40), max_output_tokens=5)[-1]
    assert last["type"] == "response.completed" and last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["usage"]["output_tokens"] == 5


def test_input_items_render_as_the_equivalent_chat_request(chat):  # noqa: F811
    items = [{"role": "user", "content": [{"type": "input_text", "text": "list /tmp"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text",
                                                                             "text": "call it"}]},
             {"type": "function_call", "call_id": "t1", "name": "list_dir", "arguments": "{\"path\": \"/tmp\"}"},
             {"type": "function_call_output", "call_id": "t1", "output": "a.txt"},
             {"role": "user", "content": "and now?"}]
    want = rendered_ids(chat, TOOL_TURN)
    r = respond(chat, "Two files.", instructions="Be brief.", input=items, tools=TOOLS)
    assert r["output"][0]["content"][0]["text"] == "Two files."
    assert SCRIPT["prompt_ids"] == want


BAD = [({"previous_response_id": "resp_x"}, "previous_response_id"),
       ({"input": [{"type": "image_generation_call"}]}, "unsupported item"),
       ({"input": 3}, "input"),
       ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "no media"),
       ({"tools": [{"type": "web_search"}]}, "tools")]


@pytest.mark.parametrize("body,msg", BAD, ids=[b[1] for b in BAD])
def test_bad_requests_are_400_and_the_server_keeps_serving(chat, body, msg):  # noqa: F811
    r = chat.post("/v1/responses", json={"model": "tiny", "input": "x", **body})
    assert r.status_code == 400 and msg in r.json()["error"]["message"]
    assert respond(chat, "fine")["output"][0]["content"][0]["text"] == "fine"
