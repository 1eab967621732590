"""Request fields, read as llama-server reads them (tools/server/server-schema.cpp `make_llama_cmpl_schema`).

Each field has a name, aliases (the first one present wins), a default from the server's command line, and limits:
*soft* limits clamp the value (`top_k`, `top_p`, `min_p`, `temperature`), *hard* limits refuse it with 400 and
"Field 'NAME': Value must be between LO <= value <= HI, but got X" (`n_predict`, the speculative fields). A null
value counts as absent. A value of the wrong JSON type is refused with 400 naming the field. Unknown fields are
ignored. Beyond llama-server (which compiles its per-request speculative fields out): `speculative.n_max`,
`speculative.n_min`, `speculative.p_min` are honoured per request, lowering only: each may lower the server's value
(`speculative.n_max` 0 turns drafting off), never raise it, and n_min never exceeds the effective n_max; the
effective values are reported in every final response (`speculative`) and in `generation_settings`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..params import SPEC_OFF, SamplingParams, SpecParams
from .errors import ApiError

INT32_MAX = 2**31 - 1


@dataclass
class Settings:
    """Sampling and speculation settings: the server's defaults, then each request's effective values."""

    n_predict: int = -1
    temperature: float = 0.8             # llama.cpp common/common.h defaults
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = -1
    spec_type: str = "none"              # none | draft-mtp
    n_max: int | str = 3                 # int, or "auto" (nextn's adaptive depth)
    n_min: int = 0
    p_min: float = 0.0
    draft_sampling: str = "greedy"       # greedy | sample


@dataclass
class ServerDefaults(Settings):
    """What the command line sets."""

    n_parallel: int = 1
    reasoning_format: str = "auto"       # --reasoning-format: none | deepseek | auto (chat_output.py)
    reasoning_budget: int = -1           # --reasoning-budget: -1 unlimited, 0 thinking off (enable_thinking false)
    verbose: bool = False                # -v/--verbose: every answer carries `__verbose` (a request's verbose wins)


@dataclass
class GenParams(Settings):
    """One request's parameters."""

    stop: list = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    return_tokens: bool = False
    timings_per_token: bool = False
    cache_prompt: bool = True            # llama-server: reuse the slot's KV for the common prefix
    logprobs: bool = False               # report each emitted token's log-probability (target model)
    n_probs: int = 0                     # ... and the n most probable tokens of its row
    logit_bias: object = None            # float32 [n_vocab] added to the target logits (-inf: banned), or None
    logit_bias_list: list = field(default_factory=list)   # the same as llama-server lists it: [(token, bias)]
    post_sampling_probs: bool = False    # probabilities after the sampler chain (prob / top_probs), llama-server's
    constraint: object = None            # grammar.Constraint (grammar, json_schema, response_format, forced tools)
    id_slot: int = -1                    # the slot to run on (-1: any)
    return_progress: bool = False        # streaming: prompt_progress events (llama-server `return_progress`)
    n_cmpl: int = 1                      # completions of each prompt (llama-server `n_cmpl`, OpenAI `n`)
    verbose: bool = False                # add `__verbose` (the /completion object, its `prompt` included)

    def sampling(self, n_predict: int) -> SamplingParams:
        """The request's sampling for `speculative.decode`, generating at most `n_predict` tokens (the slot's
        budget for n_predict -1); a seed < 0 is drawn from the OS, others wrap to 32 bits."""
        return SamplingParams(n_predict, self.temperature, self.top_k, self.top_p, self.min_p,
                              None if self.seed < 0 else self.seed & 0xFFFFFFFF, tuple(self.stop), self.ignore_eos)

    def spec(self) -> SpecParams:
        """The request's effective speculation for `speculative.decode` (SPEC_OFF when it is off)."""
        if self.spec_type != "draft-mtp":
            return SPEC_OFF
        return SpecParams(self.spec_type, self.n_max, self.n_min, self.p_min, self.draft_sampling)

    def settings_json(self) -> dict:
        """llama-server's `generation_settings` subset that applies here, plus the effective speculative values."""
        return {"n_predict": self.n_predict, "max_tokens": self.n_predict, "seed": self.seed,
                "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
                "stop": self.stop, "stream": self.stream, "ignore_eos": self.ignore_eos,
                # JSON has no -inf: a ban is null, as llama-server's JSON library writes it
                "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in self.logit_bias_list],
                "post_sampling_probs": self.post_sampling_probs,
                "speculative.type": self.spec_type, "speculative.n_max": self.n_max, "speculative.n_min": self.n_min,
                "speculative.p_min": self.p_min}


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _get(body: dict, names):
    for n in names:
        if body.get(n) is not None:
            return n, body[n]
    return None, None


def _num(body, names, default, cast, lo=None, hi=None, hard=False):
    name, v = _get(body, names)
    if name is None:
        return default
    if _kind(v) != "number" or (isinstance(v, float) and not math.isfinite(v) and cast is int):
        raise ApiError(f"Field '{name}': type must be number, but is {_kind(v)}")
    v = cast(v)
    if hard and not lo <= v <= hi:
        raise ApiError(f"Field '{name}': Value must be between {lo} <= value <= {hi}, but got {v}")
    if lo is not None:
        v = max(lo, v)
    if hi is not None:
        v = min(hi, v)
    return v


def _bool(body, names, default):
    name, v = _get(body, names)
    if name is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(f"Field '{name}': type must be boolean, but is {_kind(v)}")
    return v


def _stop(body) -> list:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return [s for s in v if s]
    raise ApiError(f"Field 'stop': expected a string or an array of strings, but is {_kind(v)}")


def parse_gen_params(body: dict, d: ServerDefaults) -> GenParams:
    """Read a request body (a JSON object) into GenParams. Raises ApiError (400) naming the field."""
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {_kind(body)}")
    p = GenParams()
    p.n_predict = _num(body, ("n_predict", "max_completion_tokens", "max_tokens"), d.n_predict, int, -1, INT32_MAX,
                       hard=True)
    p.temperature = _num(body, ("temperature",), d.temperature, float, 0.0, math.inf)
    p.top_k = _num(body, ("top_k",), d.top_k, int, 0, INT32_MAX)
    p.top_p = _num(body, ("top_p",), d.top_p, float, 0.0, 1.0)
    p.min_p = _num(body, ("min_p",), d.min_p, float, 0.0, 1.0)
    p.seed = _num(body, ("seed",), d.seed, int)
    p.stop = _stop(body)
    p.stream = _bool(body, ("stream",), False)
    so = body.get("stream_options")
    p.include_usage = _bool(so, ("include_usage",), False) if isinstance(so, dict) else False
    p.ignore_eos = _bool(body, ("ignore_eos",), False)
    p.return_tokens = _bool(body, ("return_tokens",), False)
    p.timings_per_token = _bool(body, ("timings_per_token",), False)
    p.cache_prompt = _bool(body, ("cache_prompt",), True)
    p.return_progress = _bool(body, ("return_progress",), False) and p.stream    # llama-server: streams only
    p.id_slot = _num(body, ("id_slot",), -1, int, -1, max(0, d.n_parallel - 1), hard=True)
    # probabilities: /completion n_probs; chat logprobs (bool) + top_logprobs; /v1/completions logprobs (int)
    p.n_probs = _num(body, ("n_probs",), 0, int, 0, 1024, hard=True)
    lp = body.get("logprobs")
    if isinstance(lp, bool):
        p.logprobs = lp
        if lp:
            p.n_probs = _num(body, ("top_logprobs",), 0, int, 0, 20, hard=True)
    elif lp is not None:
        p.n_probs = _num(body, ("logprobs",), 0, int, 0, 20, hard=True)
        p.logprobs = True
    p.logprobs = p.logprobs or p.n_probs > 0
    p.post_sampling_probs = _bool(body, ("post_sampling_probs",), False)
    p.n_cmpl = _num(body, ("n_cmpl", "n"), 1, int, 1, max(1, d.n_parallel), hard=True)
    p.verbose = _bool(body, ("verbose",), d.verbose)
    # speculation: the server's settings, lowered per request
    p.spec_type, p.draft_sampling = d.spec_type, d.draft_sampling
    p.n_max, p.n_min, p.p_min = d.n_max, d.n_min, d.p_min
    if d.spec_type != "none":
        req_max = _num(body, ("speculative.n_max",), None, int, 0, INT32_MAX, hard=True)
        if req_max is not None:
            if req_max == 0:
                p.spec_type = "none"
            elif d.n_max == "auto" or req_max < d.n_max:
                p.n_max = req_max
        p.n_min = min(d.n_min, _num(body, ("speculative.n_min",), d.n_min, int, 0, INT32_MAX, hard=True))
        p.p_min = min(d.p_min, _num(body, ("speculative.p_min",), d.p_min, float, 0.0, 1.0, hard=True))
        if p.n_max != "auto":
            p.n_min = min(p.n_min, p.n_max)
    if p.spec_type == "none":
        p.n_max, p.n_min, p.p_min = 0, 0, 0.0
    return p


def parse_logit_bias(body: dict, tokenizer, n_vocab: int):
    """`logit_bias` as llama-server reads it (tools/server/server-task.cpp `params_from_json_cmpl`): an object
    {"token id" or "text": bias} or an array of [token id or text, bias] pairs; a text applies to each of its tokens;
    a bias of false bans the token (-inf). Returns (float32 [n_vocab] or None, [(token, bias)] in the request's
    order, as llama-server's `generation_settings.logit_bias` lists them). Raises ApiError (400) naming the field."""
    import numpy as np

    v = body.get("logit_bias")
    if v is None or v == {} or v == []:
        return None, []
    if isinstance(v, dict):
        pairs = list(v.items())
    elif isinstance(v, list) and all(isinstance(x, list) and len(x) == 2 for x in v):
        pairs = v
    else:
        raise ApiError("Field 'logit_bias': expected an object {token: bias} or an array of [token, bias] pairs")
    bias, listed = np.zeros(n_vocab, np.float32), []
    for key, b in pairs:
        if b is False:
            b = -math.inf
        elif _kind(b) != "number":
            raise ApiError(f"Field 'logit_bias': the bias of {key!r} must be a number or false, got {_kind(b)}")
        if isinstance(key, str) and key.lstrip("-").isdigit():
            key = int(key)
        ids = [key] if isinstance(key, int) and not isinstance(key, bool) else \
            tokenizer.encode(key) if isinstance(key, str) else None
        if ids is None or not all(0 <= t < n_vocab for t in ids):
            raise ApiError(f"Field 'logit_bias': {key!r} is not a token id in [0, {n_vocab}) or a text")
        for t in ids:
            bias[t] += b
            listed.append((int(t), float(b)))
    return bias, listed


def ban_eog(p: GenParams, eog_ids, n_vocab: int) -> None:
    """`ignore_eos` as llama-server applies it (common/common.cpp `common_init_from_params`, server-schema.cpp
    `logit_bias`): every end-of-generation token of the vocabulary gets bias -inf, appended to the request's
    logit_bias in token order, so none is sampled (and none ends the generation)."""
    import numpy as np

    if p.logit_bias is None:
        p.logit_bias = np.zeros(n_vocab, np.float32)
    for t in sorted(eog_ids):
        p.logit_bias[t] = -math.inf
        p.logit_bias_list.append((int(t), -math.inf))
