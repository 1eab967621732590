"""Response objects with llama-server's field names (tools/server/server-task.cpp `server_task_result_cmpl_final`,
`_partial`, `server_slot_stats::to_json`), for the three route families:
- `/completion`: `content`, `tokens`, `stop`, `stop_type` (eos | word | limit), `stopping_word`,
  `tokens_predicted`, `tokens_evaluated`, `truncated`, `timings`, …;
- `/v1/completions` (`text_completion`) and `/v1/chat/completions` (`chat.completion[.chunk]`): OpenAI's
  `choices`, `finish_reason` (stop | length | tool_calls), `usage`, plus llama-server's `timings`; a chat message
  or delta carries `content`, `reasoning_content` and `tool_calls` as `chat_output.ChatOutput` parses the reply.
`timings` = cache_n (prompt tokens reused from the slot's cache), prompt_n (prompt tokens evaluated), prompt_ms,
prompt_per_token_ms, prompt_per_second, predicted_n, predicted_ms,
predicted_per_token_ms, predicted_per_second (rates over n_gen - 1 decode steps: the first token comes from the
prompt pass), plus draft_n and draft_n_accepted only when drafts were made. nextn adds `speculative` (the effective
per-request type, n_max, n_min, p_min) to every final object.
"""
from __future__ import annotations

import secrets
import string
import time
from dataclasses import dataclass, field

STOP_TYPE = {"eos": "eos", "stop": "word", "length": "limit", None: "none"}
_ALNUM = string.digits + string.ascii_letters


def completion_id() -> str:
    """llama-server's `gen_chatcmplid` form: chatcmpl- + 32 alphanumerics (used for chat and text completions)."""
    return "chatcmpl-" + "".join(secrets.choice(_ALNUM) for _ in range(32))


@dataclass
class Outcome:
    """What the scheduler reports for one request: token ids, finish reason, counters and wall-clock marks."""

    tokens: list = field(default_factory=list)
    finish: str | None = None          # eos | stop | length
    n_prompt: int = 0
    n_cached: int = 0                  # prompt tokens reused from the slot's cache (not evaluated)
    n_past: int = 0                    # KV cells committed at the end
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0                    # verify passes with >= 1 draft
    plain_rounds: int = 0              # verify passes of one row
    accepted_at: list = field(default_factory=list)
    t_start: float = 0.0
    t_prompt: float = 0.0              # the first token is ready (prefill done)
    t_last: float = 0.0                # the last token is ready
    slot: int = -1
    n_predict: int = -1                # the request's budget, resolved (-1: until the context is full)
    probs: list = field(default_factory=list)   # per emitted token (logprobs asked): (id, logprob, [(id, logprob)])
    post_sampling: bool = False        # probs hold probabilities after the sampler chain, not log-probabilities


def timings(o: Outcome, n_gen: int) -> dict:
    prompt_ms = max(0.0, (o.t_prompt - o.t_start) * 1e3) if o.t_prompt else 0.0
    steps = max(0, n_gen - 1)
    gen_ms = max(1e-3, (o.t_last - o.t_prompt) * 1e3) if n_gen > 0 and o.t_last else 0.0
    n = o.n_prompt - o.n_cached
    t = {"cache_n": o.n_cached,
         "prompt_n": n, "prompt_ms": prompt_ms,
         "prompt_per_token_ms": prompt_ms / n if n else 0.0,
         "prompt_per_second": 1e3 * n / prompt_ms if prompt_ms > 0 else 0.0,
         "predicted_n": n_gen, "predicted_ms": gen_ms,
         "predicted_per_token_ms": gen_ms / steps if steps else 0.0,
         "predicted_per_second": 1e3 * steps / gen_ms if gen_ms > 0 else 0.0}
    if o.drafted > 0:
        t["draft_n"] = o.drafted
        t["draft_n_accepted"] = o.accepted
    return t


def prompt_progress(o: Outcome, processed: int) -> dict:
    """llama-server's `prompt_progress` (server-task.cpp `result_prompt_progress`): total prompt tokens, cache (reused),
    processed (cache + evaluated so far: the cache when the slot starts, then after each `-b` batch of the prompt),
    time_ms since the request started."""
    return {"total": o.n_prompt, "cache": o.n_cached, "processed": processed,
            "time_ms": int((time.perf_counter() - o.t_start) * 1e3)}


def usage(o: Outcome, n_gen: int) -> dict:
    return {"completion_tokens": n_gen, "prompt_tokens": o.n_prompt, "total_tokens": n_gen + o.n_prompt,
            "prompt_tokens_details": {"cached_tokens": o.n_cached}}


def finish_reason(o: Outcome, tool_calls: bool = False) -> str:
    """stop | length, or tool_calls when the reply ended (not cut by the budget or the context) with tool calls."""
    if o.finish not in ("eos", "stop"):
        return "length"
    return "tool_calls" if tool_calls else "stop"


def prob_entries(o: Outcome, start: int, stop: int, token_bytes) -> list:
    """llama-server's `completion_token_output::to_json` for emitted tokens start..stop-1: id, token, bytes, logprob
    (natural log of the target model's softmax of the row, before sampling), top_logprobs (the row's n_probs most
    probable tokens, most probable first); with `post_sampling_probs` prob and top_probs (after the sampler chain)."""
    key, top_key = ("prob", "top_probs") if o.post_sampling else ("logprob", "top_logprobs")

    def one(t, v):
        b = token_bytes(t)
        return {"id": t, "token": b.decode("utf-8", errors="replace"), "bytes": list(b), key: v}

    return [{**one(t, v), top_key: [one(i, x) for i, x in top]} for t, v, top in o.probs[start:stop]]


@dataclass
class Meta:
    """Per-request constants of every object: model name, completion id, creation time, fingerprint."""

    model: str
    fingerprint: str
    id: str = field(default_factory=completion_id)
    created: int = field(default_factory=lambda: int(time.time()))

    def oai(self, obj: str) -> dict:
        return {"created": self.created, "model": self.model, "system_fingerprint": self.fingerprint,
                "object": obj, "id": self.id}


# -- /completion ----------------------------------------------------------------------------------------------
def completion_partial(o: Outcome, text: str, tok: int, n_gen: int) -> dict:
    return {"index": 0, "content": text, "tokens": [tok], "stop": False, "id_slot": o.slot,
            "tokens_predicted": n_gen, "tokens_evaluated": o.n_prompt}


def completion_final(o: Outcome, meta: Meta, *, content: str, tokens: list, n_gen: int, stopping_word: str,
                     prompt: str, settings: dict, spec: dict) -> dict:
    return {"index": 0, "content": content, "tokens": tokens, "id_slot": o.slot, "stop": True,
            "model": meta.model, "tokens_predicted": n_gen, "tokens_evaluated": o.n_prompt,
            "generation_settings": settings, "prompt": prompt, "has_new_line": "\n" in content,
            "truncated": truncated(o, n_gen), "stop_type": STOP_TYPE[o.finish], "stopping_word": stopping_word,
            "tokens_cached": o.n_past, "timings": timings(o, n_gen), "speculative": spec}


def truncated(o: Outcome, n_gen: int) -> bool:
    """The context filled before the request's budget or another finish rule (llama-server's `truncated`)."""
    return o.finish == "length" and (o.n_predict < 0 or n_gen < o.n_predict)


# -- /v1/completions ------------------------------------------------------------------------------------------
def text_chunk(meta: Meta, text: str) -> dict:
    return {"choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}],
            **meta.oai("text_completion")}


def text_final(o: Outcome, meta: Meta, content: str, n_gen: int, spec: dict) -> dict:
    return {"choices": [{"text": content, "index": 0, "logprobs": None, "finish_reason": finish_reason(o)}],
            **meta.oai("text_completion"), "usage": usage(o, n_gen), "timings": timings(o, n_gen),
            "speculative": spec}


# -- /v1/chat/completions -------------------------------------------------------------------------------------
def chat_chunk(meta: Meta, delta: dict) -> dict:
    return {"choices": [{"finish_reason": None, "index": 0, "delta": delta}], **meta.oai("chat.completion.chunk")}


def chat_final(o: Outcome, meta: Meta, message: dict, n_gen: int, spec: dict) -> dict:
    return {"choices": [{"finish_reason": finish_reason(o, "tool_calls" in message), "index": 0,
                         "message": message}],
            **meta.oai("chat.completion"), "usage": usage(o, n_gen), "timings": timings(o, n_gen),
            "speculative": spec}


def chat_final_chunks(o: Outcome, meta: Meta, n_gen: int, include_usage: bool, spec: dict,
                      tool_calls: bool = False) -> list[dict]:
    """The closing chunks of a chat stream: `delta: {}` with the finish reason, then (stream_options.include_usage)
    a chunk with empty `choices` and `usage`; the last one carries `timings`."""
    out = [{"choices": [{"finish_reason": finish_reason(o, tool_calls), "index": 0, "delta": {}}],
            **meta.oai("chat.completion.chunk")}]
    if include_usage:
        out.append({"choices": [], **meta.oai("chat.completion.chunk"), "usage": usage(o, n_gen)})
    out[-1]["timings"] = timings(o, n_gen)
    out[-1]["speculative"] = spec
    return out
