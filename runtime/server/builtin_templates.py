"""llama-server's built-in chat template names (`--chat-template NAME`): the formats llama.cpp writes in C++ rather
than Jinja (src/llama-chat.cpp `llm_chat_apply_template`), used by its non-Jinja ("legacy") path
(common/chat.cpp `common_chat_templates_apply_legacy`): each message is its role and its text only, so `tools`,
`tool_choice` other than "auto" and the template kwargs do not apply (tools and such a tool_choice are a 400, as
there: "tools param requires --jinja flag"). The names kept here: chatml, llama3, command-r, and the GLM family's
chatglm3, chatglm4, glmedge; another of llama.cpp's names is refused with this list.
"""
from __future__ import annotations

from .errors import ApiError
from .messages import normalize_messages


def _trim(s: str) -> str:
    return s.strip(" \t\n\v\f\r")      # llama-chat.cpp `trim`: C isspace


def _chatml(msgs, add):
    out = "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in msgs)
    return out + ("<|im_start|>assistant\n" if add else "")


def _llama3(msgs, add):
    out = "".join(f"<|start_header_id|>{r}<|end_header_id|>\n\n{_trim(c)}<|eot_id|>" for r, c in msgs)
    return out + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if add else "")


def _command_r(msgs, add):
    tag = {"system": "<|SYSTEM_TOKEN|>", "user": "<|USER_TOKEN|>", "assistant": "<|CHATBOT_TOKEN|>"}
    out = "".join(f"<|START_OF_TURN_TOKEN|>{tag[r]}{_trim(c)}<|END_OF_TURN_TOKEN|>" for r, c in msgs if r in tag)
    return out + ("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>" if add else "")


def _chatglm3(msgs, add):
    return "[gMASK]sop" + "".join(f"<|{r}|>\n {c}" for r, c in msgs) + ("<|assistant|>" if add else "")


def _chatglm4(msgs, add):
    return "[gMASK]<sop>" + "".join(f"<|{r}|>\n{c}" for r, c in msgs) + ("<|assistant|>\n" if add else "")


def _glmedge(msgs, add):
    return "".join(f"<|{r}|>\n{c}" for r, c in msgs) + ("<|assistant|>" if add else "")


FORMATS = {"chatml": _chatml, "llama3": _llama3, "command-r": _command_r, "chatglm3": _chatglm3,
           "chatglm4": _chatglm4, "glmedge": _glmedge}


def looks_like_a_name(value: str) -> bool:
    """A --chat-template value that names a template (llama.cpp's names: letters, digits, '-', '_', '.')."""
    return bool(value) and all(ch.isalnum() or ch in "-_." for ch in value)


class BuiltinTemplate:
    """A named format with ChatTemplate's interface (`source`, `origin`, `render`)."""

    def __init__(self, name: str):
        from nextn.common.errors import NextnError

        if name not in FORMATS:
            raise NextnError(f"--chat-template {name}: not a built-in template here (expected one of "
                             f"{', '.join(sorted(FORMATS))}, or a Jinja template)")
        self.source, self.origin, self._format = name, f"built-in template {name!r}", FORMATS[name]

    legacy = True        # llama-server's non-Jinja path: chat_prompt refuses tools / a tool_choice other than auto

    def render(self, messages, tools=None, add_generation_prompt: bool = True, **kwargs) -> str:
        if tools:
            raise ApiError("tools param requires --jinja flag")
        msgs = [(m["role"], m.get("content") or "") for m in normalize_messages(messages)]
        return self._format(msgs, add_generation_prompt)
