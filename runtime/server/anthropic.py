"""Anthropic Messages API over the same slots, prompt cache and speculation: POST /v1/messages and
/v1/messages/count_tokens (Anthropic's Messages API reference: request and response shapes, the streaming event
sequence, error objects; llama-server serves the same routes).

A request is translated into the OpenAI chat request the chat route takes (`to_chat`): `system` (a string or text
blocks) → a system message; content blocks → messages (`text` joined; `thinking` → `reasoning_content`; `tool_use`
→ `tool_calls`; `tool_result` → `role: tool` messages before the user's text); `tools` (`name`, `description`,
`input_schema`) → functions; `tool_choice` auto | any | tool | none → auto | required | a named function | none;
`thinking.type` → `chat_template_kwargs.enable_thinking`; `stop_sequences` → `stop`; `max_tokens`, `temperature`,
`top_p`, `top_k` as they are. The reply, parsed by `chat_output.ChatOutput`, comes back as content blocks
(`thinking`, `text`, `tool_use` with `input` an object) and `stop_reason` end_turn | tool_use | max_tokens |
stop_sequence; `usage` counts `input_tokens` (evaluated), `cache_read_input_tokens` (reused from the slot's cache)
and `output_tokens`. Streaming sends named events: message_start, then per block content_block_start,
content_block_delta (text_delta, thinking_delta, input_json_delta) and content_block_stop, then message_delta
(stop_reason, usage) and message_stop. Errors are `{"type": "error", "error": {"type", "message"}}` with the same
HTTP status as the llama-server error they replace.
"""
from __future__ import annotations

import json
import secrets
import string

from .chat_output import EventWriter
from .errors import ApiError
from .sse import dumps

_ALNUM = string.digits + string.ascii_letters
ERROR_TYPES = {"invalid_request_error": "invalid_request_error", "exceed_context_size_error": "invalid_request_error",
               "authentication_error": "authentication_error", "permission_error": "permission_error",
               "not_found_error": "not_found_error", "server_error": "api_error", "not_supported_error": "api_error",
               "unavailable_error": "overloaded_error"}


def error_json(e: ApiError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES[e.type], "message": e.message}}


def error_response(e: ApiError):
    from .http import json_response

    return json_response(error_json(e), e.status)


def event(name: str, obj: dict) -> bytes:
    return f"event: {name}\ndata: {dumps(obj)}\n\n".encode("utf-8")


# -- request ----------------------------------------------------------------------------------------------------
def _blocks(content, where: str) -> list:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise ApiError(f"{where}: expected a string or an array of content blocks")
    return content


def _text(blocks, where: str) -> str:
    parts = []
    for b in blocks:
        if b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise ApiError(f"{where}: expected text blocks (this server has no media input), got {b.get('type')!r}")
        parts.append(b["text"])
    return "\n".join(parts)


def _message(m, i: int) -> list:
    where = f"messages.{i}"
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise ApiError(f"{where}: expected {{\"role\": \"user\" | \"assistant\", \"content\": ...}}")
    blocks = _blocks(m.get("content"), f"{where}.content")
    if m["role"] == "assistant":
        out = {"role": "assistant", "content": ""}
        text, calls = [], []
        for b in blocks:
            t = b.get("type")
            if t == "text" and isinstance(b.get("text"), str):
                text.append(b["text"])
            elif t == "thinking" and isinstance(b.get("thinking"), str):
                out["reasoning_content"] = b["thinking"]
            elif t == "redacted_thinking":
                continue
            elif t == "tool_use" and isinstance(b.get("name"), str):
                calls.append({"id": str(b.get("id", "")), "type": "function",
                              "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {},
                                                                                      ensure_ascii=False)}})
            else:
                raise ApiError(f"{where}.content: unsupported block of type {t!r} in an assistant message")
        out["content"] = "\n".join(text)
        if calls:
            out["tool_calls"] = calls
        return [out]
    tools, text = [], []
    for b in blocks:
        if b.get("type") == "tool_result":
            c = b.get("content", "")
            result = c if isinstance(c, str) else _text(_blocks(c, f"{where}.content.tool_result"), where)
            tools.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")), "content": result})
        else:
            text.append(b)
    return tools + ([{"role": "user", "content": _text(text, f"{where}.content")}] if text or not tools else [])


def to_chat(body: dict) -> dict:
    """An Anthropic Messages request → the equivalent OpenAI chat request. Raises ApiError (400) naming the field."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise ApiError("messages: Field required (an array of messages)")
    out = {k: body[k] for k in ("temperature", "top_p", "top_k", "stream", "cache_prompt", "seed", "ignore_eos",
                                "chat_template_kwargs", "reasoning_format") if k in body}
    if "max_tokens" in body:
        out["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences") is not None:
        out["stop"] = body["stop_sequences"]
    chat = []
    system = body.get("system")
    if system is not None:
        chat.append({"role": "system", "content": _text(_blocks(system, "system"), "system")})
    for i, m in enumerate(msgs):
        chat += _message(m, i)
    out["messages"] = chat
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                  for t in tools):
            raise ApiError("tools: expected an array of {\"name\", \"description\", \"input_schema\"}")
        out["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                          "parameters": t.get("input_schema") or {}}} for t in tools]
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind in ("auto", "any", "none"):
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
        else:
            raise ApiError("tool_choice: expected {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        out["chat_template_kwargs"] = {**(out.get("chat_template_kwargs") or {}),
                                       "enable_thinking": thinking["type"] == "enabled"}
    return out


# -- response ---------------------------------------------------------------------------------------------------
def message_id() -> str:
    return "msg_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


class MessagesWriter(EventWriter):
    """One Messages request's answer from the scheduler's token events (the route's `_Writer` counterpart)."""

    kind = "messages"

    def __init__(self, state, task, parser, model: str):
        super().__init__(state, task, parser)
        self.model = model
        self.id = message_id()
        self.started = False
        self.block, self.index = None, -1         # the open content block's type and index

    def _usage(self, o, n_gen: int) -> dict:
        return {"input_tokens": o.n_prompt - o.n_cached, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": o.n_cached, "output_tokens": n_gen}

    def _stop(self, o):
        if o.finish == "stop":
            return "stop_sequence", self.text.stopped_by
        if o.finish == "length":
            return "max_tokens", None
        return ("tool_use" if self.parser.tool_calls else "end_turn"), None

    # -- streaming ------------------------------------------------------------------------------------------------
    def _begin(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        o = self.task.outcome
        msg = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": self._usage(o, 0)}
        return event("message_start", {"type": "message_start", "message": msg})

    def _close(self) -> bytes:
        if self.block is None:
            return b""
        self.block = None
        return event("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _open(self, kind: str, block: dict) -> bytes:
        out = self._close()
        self.block, self.index = kind, self.index + 1
        return out + event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                   "content_block": block})

    def _delta(self, delta: dict) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _events(self, deltas) -> bytes:
        out = b""
        for d in deltas:
            if d.get("reasoning_content"):
                if self.block != "thinking":
                    out += self._open("thinking", {"type": "thinking", "thinking": ""})
                out += self._delta({"type": "thinking_delta", "thinking": d["reasoning_content"]})
            elif d.get("content"):
                if self.block != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": d["content"]})
            for call in d.get("tool_calls") or []:
                fn = call["function"]
                out += self._open("tool_use", {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": {}})
                out += self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}) + self._close()
        return out

    def _end(self, o) -> bytes:
        reason, seq = self._stop(o)
        out = event("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                                      "usage": self._usage(o, len(o.tokens))})
        return out + event("message_stop", {"type": "message_stop"})

    @staticmethod
    def error_event(e: ApiError) -> bytes:
        return event("error", error_json(e))

    @staticmethod
    def error_response(e: ApiError):
        return error_response(e)

    # -- one object -----------------------------------------------------------------------------------------------
    def final(self, o) -> dict:
        self.whole(o)
        p = self.parser
        content = []
        if p.reasoning:
            content.append({"type": "thinking", "thinking": p.reasoning, "signature": ""})
        if p.content:
            content.append({"type": "text", "text": p.content})
        for call in p.tool_calls:
            content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                            "input": json.loads(call["function"]["arguments"])})
        reason, seq = self._stop(o)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": seq, "usage": self._usage(o, len(o.tokens))}
