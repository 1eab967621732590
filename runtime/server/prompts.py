"""Request prompts → token ids / prompt text (llama-server `tokenize_mixed`, `oaicompat_chat_params_parse`)."""
from __future__ import annotations

from .chat_output import THINK_CLOSE, THINK_OPEN
from .messages import normalize_messages
from .errors import ApiError


def prompts_of(state, content) -> list[list[int]]:
    """The prompts of a request as llama-server's `tokenize_input_prompts` reads them: a string, an array of token
    ids, an array mixing strings and token ids, or a JSON prompt object is one prompt; an array whose items are all
    strings, arrays or JSON prompt objects is one prompt per item."""
    if isinstance(content, list) and content and all(isinstance(x, (str, list, dict)) for x in content):
        return [tokens_of(state, x) for x in content]
    return [tokens_of(state, content)]


def tokens_of(state, content) -> list[int]:
    """One prompt: a string, an array of token ids, an array mixing strings and token ids (a one-item array of
    strings or arrays is that item), or llama-server's JSON prompt object {"prompt_string": ...}."""
    tok = state.model.tokenizer
    if isinstance(content, dict):       # llama-server's JSON prompt: {"prompt_string", "multimodal_data"}
        if content.get("multimodal_data"):
            raise ApiError("multimodal_data: this server has no media input")
        if not isinstance(content.get("prompt_string"), str):
            raise ApiError("a JSON prompt object needs 'prompt_string' (a string)")
        return tok.encode(content["prompt_string"])
    if isinstance(content, str):
        return tok.encode(content)
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], (str, list)):
        return tokens_of(state, content[0])
    if isinstance(content, list) and content and all(isinstance(x, (str, list)) for x in content):
        raise ApiError("expected one prompt here (a string or an array of token ids), got several")
    if isinstance(content, list):
        ids = []
        for x in content:
            if isinstance(x, str):
                ids += tok.encode(x)
            elif isinstance(x, int) and not isinstance(x, bool):
                if not 0 <= x < tok.n_vocab:
                    raise ApiError(f"token id {x} is out of range [0, {tok.n_vocab})")
                ids.append(x)
            else:
                raise ApiError("a prompt array holds strings and token ids only")
        return ids
    raise ApiError("'prompt' must be a string or an array of strings and token ids")


CONTINUATIONS = {True: "auto", "content": "content", "reasoning_content": "reasoning_content"}


def continuation(body: dict) -> str | None:
    """`continue_final_message` as llama-server reads it (common/chat.cpp `common_chat_continuation_parse`): true →
    "auto", "content" or "reasoning_content"; anything else → None (no continuation)."""
    v = body.get("continue_final_message")
    return CONTINUATIONS.get(v) if isinstance(v, (bool, str)) else None


def continues_reasoning(body: dict) -> bool:
    """The prompt ends inside the last assistant message's open reasoning (`_prefill`)."""
    mode, msgs = continuation(body), body.get("messages")
    if mode is None or not isinstance(msgs, list) or not msgs or not isinstance(msgs[-1], dict):
        return False
    return _prefill(msgs[-1], mode).startswith(THINK_OPEN) and THINK_CLOSE not in _prefill(msgs[-1], mode)


def _prefill(message: dict, mode: str) -> str:
    """The text that continues the last assistant message: its reasoning left open ("reasoning_content", or "auto"
    with reasoning and no content), else its content after its closed reasoning (llama.cpp
    common/chat-auto-parser-generator.cpp: the continued message's text parts are joined by a blank line)."""
    c = message.get("content")
    if isinstance(c, list):      # text parts joined by a blank line (llama.cpp common_chat_msg::render_content)
        normalize_messages([message])                  # refuses what is not a text part
        message = {**message, "content": "\n\n".join(part["text"] for part in c)}
    m = normalize_messages([message])[0]
    content, reasoning = m.get("content") or "", m.get("reasoning_content") or ""
    if mode == "reasoning_content" or (mode == "auto" and reasoning and not content):
        return THINK_OPEN + reasoning
    return (THINK_OPEN + reasoning + THINK_CLOSE if reasoning else "") + content


def chat_prompt(state, body: dict) -> str:
    """The chat template applied to the request's `messages` (llama-server `oaicompat_chat_params_parse`).
    An assistant message last is continued (llama-server's assistant prefill, or `continue_final_message` with
    `add_generation_prompt: false`: both true is a 400, as there)."""
    if "messages" not in body:
        raise ApiError("'messages' is required")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ApiError("Field 'chat_template_kwargs': expected an object")
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise ApiError('invalid type for "enable_thinking" (expected boolean, got string)')
    if state.defaults.reasoning_budget == 0 and "enable_thinking" not in kwargs:   # llama-server --reasoning-budget 0
        kwargs = {**kwargs, "enable_thinking": False}
    agp = body.get("add_generation_prompt", True)
    tools = body.get("tools") or None
    if getattr(state.template, "legacy", False) and body.get("tool_choice") not in (None, "auto"):
        raise ApiError("tool_choice param requires --jinja flag")      # llama-server oaicompat_chat_params_parse
    messages = body["messages"]
    prefill = None
    mode = continuation(body)
    if mode is not None and agp is not False:
        raise ApiError("Cannot set both add_generation_prompt and continue_final_message to true.")
    last_assistant = isinstance(messages, list) and messages and isinstance(messages[-1], dict) \
        and messages[-1].get("role") == "assistant"
    if mode is not None and not last_assistant:
        raise ApiError("continue_final_message: the last message must be an assistant message")
    if last_assistant:
        # llama-server's assistant prefill: the reply continues the last assistant message (rendered after the
        # generation prompt); two of them at the end are refused as there
        if mode is None and len(messages) > 1 and isinstance(messages[-2], dict) \
                and messages[-2].get("role") == "assistant":
            raise ApiError("Cannot have 2 or more assistant messages at the end of the list.")
        if mode is not None and messages[-1].get("tool_calls"):
            raise ApiError("Cannot continue an assistant message that contains tool calls.")
        prefill = _prefill(messages[-1], mode or "content")
        messages, agp = messages[:-1], True
    text = state.template.render(messages, tools=tools, add_generation_prompt=agp is not False, **kwargs)
    return text + prefill if prefill is not None else text
