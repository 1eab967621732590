"""Chat messages as the OpenAI / llama-server routes send them, checked and normalised once for every template
(chat_template.py's Jinja ones, builtin_templates.py's named formats) and the prompt helpers (prompts.py); the
error texts are llama-server's (llama.cpp common/chat.cpp, its OpenAI-compatible message parsing)."""
from __future__ import annotations

import json

from .errors import ApiError


def normalize_messages(messages) -> list[dict]:
    if not isinstance(messages, list):
        raise ApiError("Expected 'messages' to be an array")
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise ApiError("Expected each message to be an object")
        m = dict(m)
        role = m.get("role")
        if not isinstance(role, str):
            raise ApiError("Each message needs a 'role' string")
        if role != "assistant" and "content" not in m:
            raise ApiError("All non-assistant messages must contain 'content'")
        if role == "assistant" and "content" not in m and "tool_calls" not in m:
            raise ApiError("Assistant message must contain either 'content' or 'tool_calls'!")
        c = m.get("content")
        if isinstance(c, list):
            parts = []
            for part in c:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError("Expected 'content' parts of type 'text' (this server has no media input)")
                parts.append(part["text"])
            m["content"] = "\n".join(parts)
        elif c is not None and not isinstance(c, str):
            raise ApiError("Expected 'content' to be a string or an array")
        for tc in m.get("tool_calls") or []:   # OpenAI sends arguments as a JSON string; templates want an object
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
        out.append(m)
    return out
