"""Server-sent events as llama-server frames them (tools/server/server-common.cpp `format_oai_sse`): each object is
one `data: <json>\\n\\n` event (JSON compact, UTF-8, like nlohmann's dump), an array is one event per item.
`/completion` ends with its `stop: true` object and no terminator; the OpenAI routes end with `data: [DONE]\\n\\n`.
An error after the stream started is one `data: {"error": {...}}` event, then the stream ends."""
from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def event(obj) -> bytes:
    items = obj if isinstance(obj, list) else [obj]
    return b"".join(b"data: " + dumps(o).encode("utf-8") + b"\n\n" for o in items)
