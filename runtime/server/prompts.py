"""Request prompts → token ids / prompt text (llama-server `tokenize_mixed`, `oaicompat_chat_params_parse`)."""
from __future__ import annotations

from .errors import ApiError


def tokens_of(state, content) -> list[int]:
    """A prompt as llama-server's `tokenize_mixed` reads it: a string, or an array of strings and token ids."""
    tok = state.model.tokenizer
    if isinstance(content, str):
        return tok.encode(content)
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
    agp = body.get("add_generation_prompt", True)
    tools = body.get("tools") or None
    return state.template.render(body["messages"], tools=tools, add_generation_prompt=agp is not False, **kwargs)
