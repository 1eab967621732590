"""OpenAI Responses API, POST /v1/responses (stateless), over the same slots, prompt cache and speculation (OpenAI's
Responses API reference: request items, response object, streaming events; llama-server serves the same route).

The request is translated into the chat request the chat route takes (`to_chat`): `instructions` → a system
message; `input` (a string, or items) → messages: `message` items (roles user, assistant, system, developer;
content a string or `input_text` / `output_text` parts), `function_call` items → the preceding assistant message's
`tool_calls`, `function_call_output` → `role: tool`, `reasoning` items → the next assistant message's
`reasoning_content`; function `tools` (`name`, `description`, `parameters`) → chat tools; `tool_choice`,
`max_output_tokens`, `temperature`, `top_p` as they are. `previous_response_id` is refused (nothing is stored).
The reply, parsed by `chat_output.ChatOutput`, comes back as output items in generation order: `reasoning`
(`content: [{"type": "reasoning_text"}]`), `message` (`output_text`), `function_call` (`call_id`, `name`,
`arguments`); `status` completed, or incomplete with `incomplete_details.reason` max_output_tokens. Streaming
sends the named events response.created, response.in_progress, per item response.output_item.added / .done with
its deltas (response.reasoning_text.delta / .done, response.content_part.added / .done and
response.output_text.delta / .done, response.function_call_arguments.delta / .done), then response.completed, each
with a `sequence_number`. The stream always ends with response.completed, as llama-server's does (OpenAI sends
response.incomplete at max_output_tokens), its `response.status` incomplete with `incomplete_details` when the reply
stopped at max_output_tokens.
"""
from __future__ import annotations

import secrets
import string
import time

from . import responses as R
from .anthropic import event
from .chat_output import EventWriter
from .errors import ApiError

_ALNUM = string.digits + string.ascii_letters


def _id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(24))


def _content_text(c, where: str) -> str:
    if isinstance(c, str):
        return c
    if not isinstance(c, list):
        raise ApiError(f"{where}: expected a string or an array of content parts")
    parts = []
    for p in c:
        if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text", "text") \
                or not isinstance(p.get("text"), str):
            raise ApiError(f"{where}: expected input_text / output_text parts (this server has no media input)")
        parts.append(p["text"])
    return "\n".join(parts)


def to_chat(body: dict) -> dict:
    """A Responses request → the equivalent chat request. Raises ApiError (400) naming the field."""
    if body.get("previous_response_id") is not None:
        raise ApiError("previous_response_id: this server stores no responses; send the whole conversation in input")
    out = {k: body[k] for k in ("temperature", "top_p", "top_k", "stream", "cache_prompt", "seed",
                                "parallel_tool_calls", "chat_template_kwargs", "reasoning_format", "timings_per_token",
                                "return_progress", "id_slot", "n", "n_cmpl") if k in body}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    msgs = []
    if body.get("instructions") is not None:
        msgs.append({"role": "system", "content": _content_text(body["instructions"], "instructions")})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ApiError("input: expected a string or an array of items")
    reasoning = None
    for i, it in enumerate(items):
        where = f"input[{i}]"
        kind = it.get("type", "message") if isinstance(it, dict) else None
        if kind == "message":
            role = it.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ApiError(f"{where}.role: expected user, assistant, system or developer")
            m = {"role": "system" if role == "developer" else role,
                 "content": _content_text(it.get("content"), f"{where}.content")}
            if role == "assistant" and reasoning is not None:
                m["reasoning_content"], reasoning = reasoning, None
            msgs.append(m)
        elif kind == "function_call":
            if not isinstance(it.get("name"), str) or not isinstance(it.get("arguments", ""), str):
                raise ApiError(f"{where}: a function_call needs a name and arguments (a JSON string)")
            call = {"id": str(it.get("call_id", "")), "type": "function",
                    "function": {"name": it["name"], "arguments": it.get("arguments") or "{}"}}
            if msgs and msgs[-1]["role"] == "assistant":      # one assistant turn: its text, then its calls
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                m = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning is not None:
                    m["reasoning_content"], reasoning = reasoning, None
                msgs.append(m)
        elif kind == "function_call_output":
            out_ = it.get("output", "")
            msgs.append({"role": "tool", "tool_call_id": str(it.get("call_id", "")),
                         "content": out_ if isinstance(out_, str) else _content_text(out_, f"{where}.output")})
        elif kind == "reasoning":
            parts = (it.get("content") or []) + (it.get("summary") or [])
            reasoning = "\n".join(p.get("text", "") for p in parts if isinstance(p, dict))
        else:
            raise ApiError(f"{where}.type: unsupported item type {kind!r}")
    out["messages"] = msgs
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                                  and isinstance(t.get("name"), str) for t in tools):
            raise ApiError("tools: expected function tools {\"type\": \"function\", \"name\", \"parameters\"}")
        out["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                          "parameters": t.get("parameters") or {}}} for t in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        out["tool_choice"] = choice
    return out


class ResponsesWriter(EventWriter):
    """One Responses request's answer from the scheduler's token events (the route's `_Writer` counterpart)."""

    kind = "responses"

    def __init__(self, state, task, parser, model: str, body: dict):
        super().__init__(state, task, parser)
        self.model = model
        self.id, self.created = _id("resp_"), int(time.time())
        self.echo = {k: body.get(k) for k in ("instructions", "max_output_tokens", "temperature", "top_p",
                                              "tool_choice", "tools", "parallel_tool_calls")}
        self.seq = 0
        self.n_seen = 0                       # tokens streamed so far (timings_per_token)
        self.started = False
        self.items: list = []                 # output items so far (the open one last)
        self.open = None                      # the open item's kind: reasoning | message

    def _response(self, status: str, o=None) -> dict:
        r = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
             "output": self.items if o is not None else [], "error": None, "incomplete_details": None,
             **{k: v for k, v in self.echo.items()}}
        if o is not None:
            n_gen = len(o.tokens)
            r["usage"] = {"input_tokens": o.n_prompt, "input_tokens_details": {"cached_tokens": o.n_cached},
                          "output_tokens": n_gen, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": o.n_prompt + n_gen}
            if status == "incomplete":
                r["incomplete_details"] = {"reason": "max_output_tokens"}
        return r

    @staticmethod
    def _status(o) -> str:
        return "incomplete" if o.finish == "length" else "completed"

    # -- streaming ------------------------------------------------------------------------------------------------
    def _ev(self, name: str, **fields) -> bytes:
        self.seq += 1
        if name == "response.output_text.delta" and self.task.params.timings_per_token:
            fields["timings"] = R.timings(self.task.outcome, self.n_seen)   # llama-server: asked per token
        return event(name, {"type": name, "sequence_number": self.seq - 1, **fields})

    def tokens(self, toks) -> bytes:
        self.n_seen += len(toks)
        return super().tokens(toks)

    def progress(self, processed: int) -> bytes:
        """`return_progress`: a response.in_progress event carrying llama-server's `prompt_progress`."""
        return self._begin() + self._ev("response.in_progress", response=self._response("in_progress"),
                                        prompt_progress=R.prompt_progress(self.task.outcome, processed))

    def _begin(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        r = self._response("in_progress")
        return self._ev("response.created", response=r) + self._ev("response.in_progress", response=r)

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        kind, self.open = self.open, None
        i, item = len(self.items) - 1, self.items[-1]
        base = {"item_id": item["id"], "output_index": i, "content_index": 0}
        if kind == "reasoning":
            out = self._ev("response.reasoning_text.done", **base, text=item["content"][0]["text"])
        else:
            part = item["content"][0]
            out = self._ev("response.output_text.done", **base, text=part["text"])
            out += self._ev("response.content_part.done", **base, part=part)
        item["status"] = "completed"
        return out + self._ev("response.output_item.done", output_index=i, item=item)

    def _add(self, item: dict) -> bytes:
        self.items.append(item)
        return self._ev("response.output_item.added", output_index=len(self.items) - 1,
                        item={**item, "content": []} if "content" in item else item)

    def _events(self, deltas) -> bytes:
        out = b""
        for d in deltas:
            for kind, field, part_type, ev in (("reasoning", "reasoning_content", "reasoning_text",
                                                "response.reasoning_text.delta"),
                                               ("message", "content", "output_text", "response.output_text.delta")):
                if not d.get(field):
                    continue
                if self.open != kind:
                    out += self._close()
                    part = {"type": part_type, "text": ""}
                    if kind == "message":
                        part["annotations"] = []
                        item = {"id": _id("msg_"), "type": "message", "status": "in_progress", "role": "assistant",
                                "content": [part]}
                    else:
                        item = {"id": _id("rs_"), "type": "reasoning", "summary": [], "content": [part]}
                    out += self._add(item)
                    if kind == "message":
                        out += self._ev("response.content_part.added", item_id=item["id"],
                                        output_index=len(self.items) - 1, content_index=0, part=dict(part))
                    self.open = kind
                item = self.items[-1]
                item["content"][0]["text"] += d[field]
                out += self._ev(ev, item_id=item["id"], output_index=len(self.items) - 1, content_index=0,
                                delta=d[field])
            for call in d.get("tool_calls") or []:
                out += self._close()
                fn = call["function"]
                item = {"id": _id("fc_"), "type": "function_call", "status": "in_progress", "call_id": call["id"],
                        "name": fn["name"], "arguments": ""}
                out += self._add(dict(item))
                i = len(self.items) - 1
                out += self._ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                                delta=fn["arguments"])
                out += self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                arguments=fn["arguments"])
                self.items[-1] = {**item, "arguments": fn["arguments"], "status": "completed"}
                out += self._ev("response.output_item.done", output_index=i, item=self.items[-1])
        return out

    def _end(self, o) -> bytes:
        # llama-server ends every stream with response.completed (server-task.cpp), and its clients wait for that
        # event; the response object inside still says incomplete at max_output_tokens (OpenAI's field and reason)
        return self._ev("response.completed", response=self._response(self._status(o), o),
                        timings=R.timings(o, len(o.tokens)))

    def error_event(self, e: ApiError) -> bytes:
        return self._ev("error", code=e.type, message=e.message, param=None)

    @staticmethod
    def error_response(e: ApiError):
        from .http import error_response

        return error_response(e)

    # -- one object -----------------------------------------------------------------------------------------------
    def final(self, o) -> dict:
        self._events(self.whole(o))   # builds the items; the events are not sent
        self._close()
        return self._response(self._status(o), o)
