"""The assistant's generated text → OpenAI chat message parts: GLM reasoning (`<think>…</think>` →
`reasoning_content`) and GLM-4.5-style tool calls (`<tool_call>NAME` then `<arg_key>K</arg_key>` `<arg_value>V
</arg_value>` pairs, `</tool_call>` → `tool_calls`), as llama-server's GLM 4.5 chat format parses them
(llama.cpp common/chat.cpp `common_chat_parse_glm_4_5`, `common_chat_msg_diff`).

One incremental parser serves both answers: `push(text)` returns the deltas the new text completes, `finish()` the
rest; a non-streamed answer pushes its whole text once. Deltas are dicts in OpenAI's `delta` shape, in generation
order: {"reasoning_content": s}, {"content": s}, {"tool_calls": [call]}. Text that may be the start of a tag is held
until it is known not to be one. A tool call is sent whole, once its `</tool_call>` arrives (id, `type: function`,
name, `arguments` a JSON string): argument values are typed by the tool's JSON schema (a property of type string
keeps the raw text; other types are read as JSON, else kept as text). A call that does not parse (no name, a name
no tool has, text outside the arg pairs, or no `</tool_call>` by the end) is returned as content, never an error.

Reasoning formats (llama-server `--reasoning-format`, per-request `reasoning_format`): `none` leaves `<think>` in
the content; `deepseek` and `auto` (the default) return it as `reasoning_content`. `<think>` opens reasoning only at
the start of the reply (leading whitespace aside); when the prompt itself ends inside `<think>` (a template that
opens it), the reply starts in reasoning.
"""
from __future__ import annotations

import json
import re
import secrets
import string

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
REASONING_FORMATS = ("none", "auto", "deepseek")
_ALNUM = string.digits + string.ascii_letters
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def tool_call_id() -> str:
    """llama-server's `gen_tool_call_id` form: 32 alphanumerics."""
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


def _held(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (it may become the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _typed(value: str, schema) -> object:
    t = schema.get("type") if isinstance(schema, dict) else None
    if t is None or t == "string" or (isinstance(t, list) and "string" in t):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_tool_call(body: str, tools: dict):
    """`body` (between <tool_call> and </tool_call>) → (name, arguments dict), or None when it does not parse.
    `tools`: name → the function's JSON schema `parameters`."""
    i = body.find("<arg_key>")
    name = (body if i < 0 else body[:i]).strip()
    if not name or "\n" in name or "<" in name or name not in tools:
        return None
    rest, args, props = body[len(body) if i < 0 else i:], {}, (tools[name] or {}).get("properties") or {}
    pos = 0
    for m in _PAIR.finditer(rest):
        if m.start() != pos:
            return None
        args[m.group(1).strip()] = _typed(m.group(2), props.get(m.group(1).strip()))
        pos = m.end()
    if rest[pos:].strip():
        return None
    return name, args


class ChatOutput:
    """Incremental parser of one reply. `tools`: the request's tools (name → parameters schema) when tool calls are
    parsed, else None; `reasoning`: a reasoning format; `in_think`: the prompt ends inside <think>."""

    def __init__(self, tools: dict | None, reasoning: str = "auto", in_think: bool = False):
        self.tools = tools
        self.think = reasoning != "none"
        self.mode = "reasoning" if (self.think and in_think) else "start"
        self.buf = ""
        self.ws = ""                   # with tools: whitespace held in content, dropped before a call and at the end
        self.lead = False
        self.tool_calls: list = []
        self.content = ""
        self.reasoning = ""

    # -- deltas -------------------------------------------------------------------------------------------------
    def _content(self, out: list, s: str) -> None:
        if self.lead:                      # the content after </think> starts at its first non-space
            s = s.lstrip()
            self.lead = not s
        if not s:
            return
        if self.tools is not None:         # whitespace before a tool call (and at the end) is not content
            body = s.rstrip()
            if not body:
                self.ws += s
                return
            s, self.ws = self.ws + body, s[len(body):]
        self.content += s
        out.append({"content": s})

    def _reasoning(self, out: list, s: str) -> None:
        if s:
            self.reasoning += s
            out.append({"reasoning_content": s})

    def _call(self, out: list, body: str) -> None:
        parsed = parse_tool_call(body, self.tools)
        if parsed is None:
            self._content(out, CALL_OPEN + body + CALL_CLOSE)
            return
        name, args = parsed
        call = {"index": len(self.tool_calls), "id": tool_call_id(), "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False, separators=(",", ":"))}}
        self.tool_calls.append(call)
        self.ws = ""
        out.append({"tool_calls": [call]})

    def _upto(self, out: list, tag: str, emit) -> bool:
        """Emit the buffer up to `tag` and drop the tag (True); without it, emit all but a tail that may begin it
        (False)."""
        i = self.buf.find(tag)
        if i < 0:
            n = len(self.buf) - _held(self.buf, tag)
            emit(out, self.buf[:n])
            self.buf = self.buf[n:]
            return False
        emit(out, self.buf[:i])
        self.buf = self.buf[i + len(tag):]
        return True

    # -- the state machine ---------------------------------------------------------------------------------------
    def push(self, text: str) -> list:
        self.buf += text
        out: list = []
        while self.buf:
            if self.mode == "start":            # before anything but whitespace: <think> may open reasoning
                s = self.buf.lstrip()
                if not s:
                    return out
                if self.think and s.startswith(THINK_OPEN):
                    self.buf, self.mode = s[len(THINK_OPEN):], "reasoning"
                    continue
                if self.think and THINK_OPEN.startswith(s):
                    return out
                self.mode = "content"
            elif self.mode == "reasoning":
                if not self._upto(out, THINK_CLOSE, self._reasoning):
                    return out
                self.mode, self.lead = "content", True
            elif self.mode == "content":
                if self.tools is None:
                    self._content(out, self.buf)
                    self.buf = ""
                    return out
                if not self._upto(out, CALL_OPEN, self._content):
                    return out
                self.mode = "call"
            else:                                # inside <tool_call>: wait for its end
                i = self.buf.find(CALL_CLOSE)
                if i < 0:
                    return out
                self._call(out, self.buf[:i])
                self.buf, self.mode = self.buf[i + len(CALL_CLOSE):], "content"
        return out

    def finish(self) -> list:
        """The held text: an unclosed reasoning block stays reasoning, an unclosed tool call becomes content."""
        out: list = []
        rest, self.buf = self.buf, ""
        if self.mode == "reasoning":
            self._reasoning(out, rest)
        elif self.mode == "call":
            self._content(out, CALL_OPEN + rest)
        elif rest.strip():
            self._content(out, rest)
        return out

    def message(self) -> dict:
        """The whole reply as an OpenAI assistant message (after `finish`)."""
        m = {"role": "assistant", "content": self.content if self.content or not self.tool_calls else None}
        if self.reasoning:
            m["reasoning_content"] = self.reasoning
        if self.tool_calls:
            m["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in self.tool_calls]
        return m


class EventWriter:
    """Base of the Anthropic Messages and OpenAI Responses writers: the reply's tokens → text (`TextStream`: whole
    UTF-8 characters, stop strings held) → this parser's deltas → the subclass's events. Subclasses give `_begin()`
    (the opening events, once), `_events(deltas)`, `_close()` (the open block's end) and `_end(o)` (the closing
    events, from the scheduler's Outcome)."""

    def __init__(self, state, task, parser: ChatOutput):
        from ..text_stream import TextStream

        self.state, self.task, self.parser = state, task, parser
        self.text = TextStream(state.model.tokenizer.token_to_bytes, task.params.stop)

    def tokens(self, toks) -> bytes:
        out = self._begin()
        for t in toks:
            piece = self.text.push(t)
            if piece:
                out += self._events(self.parser.push(piece))
        return out

    def final_stream(self, o) -> bytes:
        rest = self.text.finish()
        out = self._begin() + self._events(self.parser.push(rest) + self.parser.finish()) + self._close()
        return out + self._end(o)

    def whole(self, o) -> list:
        """A non-streamed answer: every token through the text stream and the parser; returns the deltas."""
        for t in o.tokens:
            self.text.push(t)
        self.text.finish()
        return self.parser.push(self.text.text) + self.parser.finish()


def tools_of(body: dict):
    """The request's `tools` as name → parameters schema when tool calls are to be parsed (tools given and
    `tool_choice` not "none"), else None. Raises ApiError (400) for a malformed `tools` or `tool_choice`."""
    from .errors import ApiError

    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ApiError("Field 'tools': expected an array of {\"type\": \"function\", \"function\": {...}}")
    out = {}
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError("Field 'tools': each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ApiError(f"Field 'tools': function '{fn['name']}': 'parameters' must be a JSON schema object")
        out[fn["name"]] = params or {}
    choice = body.get("tool_choice") or "auto"      # null counts as absent (llama-server json_value)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if choice.get("type") != "function" or name not in out:
            raise ApiError("Field 'tool_choice': expected \"auto\", \"none\", \"required\" or "
                           "{\"type\": \"function\", \"function\": {\"name\": <one of the tools>}}")
    elif choice not in ("auto", "none", "required"):
        raise ApiError(f"Field 'tool_choice': unknown value {choice!r} (expected auto, none or required)")
    return None if choice == "none" else out
