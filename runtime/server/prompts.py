"""Request prompts → token ids / prompt text (llama-server `tokenize_mixed`, `oaicompat_chat_params_parse`)."""
from __future__ import annotations

from .chat_template import normalize_messages
from .errors import ApiError


def tokens_of(state, content) -> list[int]:
    """A prompt as llama-server's `tokenize_input_prompts` reads it: a string, an array of token ids, or an array
    mixing strings and token ids (one prompt); an array of several strings or arrays is several prompts, which this
    server refuses (one prompt per request), except a one-element one."""
    tok = state.model.tokenizer
    if isinstance(content, str):
        return tok.encode(content)
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], (str, list)):
        return tokens_of(state, content[0])
    if isinstance(content, list) and content and all(isinstance(x, (str, list)) for x in content):
        raise ApiError("several prompts in one request are not supported; send one request per prompt")
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
                raise ApiError("a prompt array holds strings and token ids only (one prompt per request)")
        return ids
    raise ApiError("'prompt' must be a string or an array of strings and token ids")


def chat_prompt(state, body: dict) -> str:
    """The chat template applied to the request's `messages` (llama-server `oaicompat_chat_params_parse`)."""
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
    messages = body["messages"]
    prefill = None
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict) \
            and messages[-1].get("role") == "assistant":
        # llama-server's assistant prefill: the reply continues the last assistant message (rendered after the
        # generation prompt); two of them at the end are refused as there
        if len(messages) > 1 and isinstance(messages[-2], dict) and messages[-2].get("role") == "assistant":
            raise ApiError("Cannot have 2 or more assistant messages at the end of the list.")
        prefill = normalize_messages(messages[-1:])[0].get("content") or ""
        messages, agp = messages[:-1], True
    text = state.template.render(messages, tools=tools, add_generation_prompt=agp is not False, **kwargs)
    return text + prefill if prefill is not None else text
