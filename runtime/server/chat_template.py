"""Chat templates: the GGUF's `tokenizer.chat_template` (or `--chat-template-file`, or the GLM-4.5-style template
shipped in `templates/glm4.jinja` for GGUFs that carry none), rendered as transformers' `apply_chat_template`
renders them (transformers `utils/chat_template_utils.py`): jinja2's ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls; `tojson` is json.dumps (ensure_ascii False unless asked, no HTML
escaping); globals `raise_exception(msg)` and `strftime_now(fmt)`; the context carries `messages`, `tools`,
`date_string` (today as "%d %b %Y") and `datetime` ("%b %d %Y"), as llama-server gives them,
`add_generation_prompt`, `bos_token`, `eos_token`, the
request's `chat_template_kwargs` (e.g. `enable_thinking`, true unless given, as llama-server defines it).

Messages are normalised first as llama-server does (tools/server/server-common.cpp `oaicompat_chat_params_parse`):
`messages` must be an array; a non-assistant message needs `content`; content is a string, null, or an array of
`{"type": "text", "text": ...}` parts (joined here); other part types are refused.
"""
from __future__ import annotations

import json
import os
from datetime import datetime

from .errors import ApiError
from .messages import normalize_messages

SHIPPED = os.path.join(os.path.dirname(__file__), "templates", "glm4.jinja")

# Tokens that end an assistant turn in GLM vocabularies: the next turn's role marker (the chat templates put them
# after every reply); llama.cpp's converter stores them as tokenizer.ggml.eot_token_id / eom_token_id.
GLM_END_OF_TURN = ("<|user|>", "<|observation|>")


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Environment(ImmutableSandboxedEnvironment):
        """`+` of a string and an undefined or none value gives the string, as llama.cpp's template engine does
        (common/jinja/runtime.cpp, binary expressions: "treating null/undefined as empty string for string
        concatenation"); firefunction-v2's template adds the `functions` it never defines. Other operands: jinja2's."""
        intercepted_binops = frozenset(["+"])

        def call_binop(self, context, operator, left, right):
            if operator == "+":
                def empty(v):
                    return v is None or isinstance(v, jinja2.Undefined)

                if empty(left) and isinstance(right, str) or empty(right) and isinstance(left, str):
                    return (left if isinstance(left, str) else "") + (right if isinstance(right, str) else "")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = Environment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class ChatTemplate:
    """`source`: the template text; `origin`: where it came from (shown in /props and errors)."""

    def __init__(self, source: str, origin: str, bos_token: str = "", eos_token: str = ""):
        import jinja2

        self.source, self.origin = source, origin
        self.bos_token, self.eos_token = bos_token, eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            from nextn.common.errors import NextnError

            raise NextnError(f"{origin}: chat template does not parse (line {e.lineno}: {e.message})") from None

    @classmethod
    def load(cls, gguf_fields: dict, path: str | None, bos_token: str = "", eos_token: str = "",
             inline: str | None = None):
        """`--chat-template` (a built-in name: builtin_templates.py, or Jinja text) if given, else
        `--chat-template-file`, else the GGUF's `tokenizer.chat_template`, else the shipped GLM-4.5 one."""
        if inline:
            from .builtin_templates import BuiltinTemplate, looks_like_a_name

            if looks_like_a_name(inline):
                return BuiltinTemplate(inline)
            return cls(inline, "--chat-template", bos_token, eos_token)
        if path:
            from nextn.common.errors import NextnError

            try:
                with open(path, encoding="utf-8") as f:
                    return cls(f.read(), path, bos_token, eos_token)
            except OSError as e:
                raise NextnError(f"{path}: cannot read the chat template file ({e.strerror})") from None
        src = gguf_fields.get("tokenizer.chat_template")
        if src:
            src = src.decode("utf-8") if isinstance(src, (bytes, bytearray)) else str(src)
            return cls(src, "GGUF tokenizer.chat_template", bos_token, eos_token)
        with open(SHIPPED, encoding="utf-8") as f:
            return cls(f.read(), "nextn glm4.jinja (the GGUF has no tokenizer.chat_template)", bos_token, eos_token)

    def render(self, messages, tools=None, add_generation_prompt: bool = True, **kwargs) -> str:
        """The prompt text. Raises ApiError (400) for malformed messages or a template's raise_exception."""
        import jinja2

        msgs = normalize_messages(messages)
        # date_string, datetime: what llama-server gives templates that print today's date (llama.cpp
        # common/chat.cpp `common_chat_extra_context`)
        now = datetime.now()
        ctx = {"bos_token": self.bos_token, "eos_token": self.eos_token,
               "date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y"),
               "enable_thinking": True, **kwargs,     # llama.cpp common_chat_templates_inputs: true unless turned off
               "messages": msgs, "tools": tools, "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(**ctx)
        except jinja2.exceptions.TemplateError as e:
            raise ApiError(f"chat template: {e}") from None
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ApiError(f"chat template failed on these messages: {e}") from None
