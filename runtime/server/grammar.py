"""Constrained sampling through llguidance (guidance-ai/llguidance; the library llama.cpp offers for `%llguidance`
grammars and JSON schemas, chosen over xgrammar here because its Python matcher answers `validate_tokens` — how many
drafted tokens the grammar accepts — and rolls back, which is what checking drafts before verification needs, on the
CPU, without torch).

Sources of a grammar, as llama-server reads them (tools/server/server-common.cpp, server-task.cpp): `grammar` (GBNF,
or Lark), `json_schema` (an object), `response_format` {"type": "json_object"} or {"type": "json_schema",
"json_schema": {"schema": ...}}; and, for chat, `tool_choice` "required" or a named function with `tools`: the reply
must be GLM-4.5 tool calls (`<tool_call>NAME` + `<arg_key>`/`<arg_value>` pairs of that tool's properties) — one, or
several with `parallel_tool_calls`. A grammar that does not parse, or a schema the library rejects, is a 400.

`Constraint` is what `speculative.decode(constraint=...)` drives: `allowed()` the mask of the next token, `validate`,
`consume`, `rollback`. The vocabulary goes to llguidance as each token's bytes (control tokens as 0xFF + their text,
so no text matches them); the end-of-generation tokens end a complete grammar.
"""
from __future__ import annotations

import json
import re

import numpy as np

from nextn.common.errors import NextnError

from .errors import ApiError


class _Vocabulary:
    """The duck-typed tokenizer llguidance.TokenizerWrapper reads (eos/bos ids, token bytes, special ids, encode)."""

    def __init__(self, tok, eog):
        self._tok = tok
        self.eos_token_id = tok.eos_id
        self.bos_token_id = tok.bos_id
        self.tokens, self.special_token_ids = [], []
        for i in range(tok.n_vocab):
            b = tok.token_to_bytes(i)
            if not b:
                b = b"\xff" + tok.token_text(i).encode("utf-8")
                self.special_token_ids.append(i)
            self.tokens.append(b)
        self.eog = sorted(eog)

    def __call__(self, s) -> list:
        return self._tok.encode(s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s)


def tokenizer_of(state):
    """The server's llguidance tokenizer, built once (the vocabulary's bytes; the chat end-of-turn tokens end it)."""
    if getattr(state, "_ll_tokenizer", None) is None:
        import llguidance

        v = _Vocabulary(state.model.tokenizer, state.chat_eog)
        state._ll_tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(v), n_vocab=len(v.tokens),
                                                     eos_token=v.eog)
    return state._ll_tokenizer


def _lark_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)     # a Lark string literal (JSON's escapes are Lark's)


def _value(schema) -> str:
    """A Lark expression for one argument value, by the property's schema: enum → its values, boolean, integer,
    number; anything else free text without '<' (the text a GLM call carries; objects and arrays as JSON text)."""
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "(" + " | ".join(_lark_string(v if isinstance(v, str) else json.dumps(v)) for v in schema["enum"]) + ")"
    t = schema.get("type")
    if t == "boolean":
        return '("true" | "false")'
    if t == "integer":
        return "/-?[0-9]+/"
    if t == "number":
        return "/-?[0-9]+(\\.[0-9]+)?/"
    return "/[^<]+/"


def tool_call_lark(tools: dict, only: str | None, several: bool) -> str:
    """A Lark grammar of GLM-4.5 tool calls: for each tool (or `only` that one), `<tool_call>NAME\\n` then
    `<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n` pairs of its properties (each optional, in the schema's
    order, V by `_value`), `</tool_call>`; one call, or several separated by newlines."""
    rules, alts = [], []
    for n, (name, schema) in enumerate(tools.items()):
        if only is not None and name != only:
            continue
        props = ((schema or {}).get("properties") or {})
        pairs = []
        for j, (key, sub) in enumerate(props.items()):
            pairs.append(f"p{n}_{j}")
            rules.append(f"p{n}_{j}: {_lark_string('<arg_key>' + key + '</arg_key>' + chr(10) + '<arg_value>')} "
                         f"{_value(sub)} {_lark_string('</arg_value>' + chr(10))}")
        rules.append(f"c{n}: {_lark_string(name + chr(10))} " + " ".join(f"{p}?" for p in pairs))
        alts.append(f"c{n}")
    call = 'call: "<tool_call>" (' + " | ".join(alts) + ') "</tool_call>"'
    start = 'start: call ("\\n" call)*' if several else "start: call"
    return "\n".join([start, call, *rules])


def grammar_of(body: dict, tools: dict | None) -> str | None:
    """The llguidance grammar a request asks for, or None. Raises ApiError (400) naming the field."""
    import llguidance

    choice = body.get("tool_choice")
    if tools and (choice == "required" or isinstance(choice, dict)):
        only = choice["function"]["name"] if isinstance(choice, dict) else None
        g = llguidance.LLMatcher.grammar_from_lark(tool_call_lark(tools, only, body.get("parallel_tool_calls") is True))
        return _checked(g, "tool_choice")
    rf = body.get("response_format")
    schema, field = body.get("json_schema"), "json_schema"
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_object":     # llama-server: its `schema` when given (server-common.cpp), else an object
            schema, field = rf.get("schema", {"type": "object"}), "response_format"
        elif kind == "json_schema":
            js = rf.get("json_schema") or {}
            schema, field = (js.get("schema") if isinstance(js, dict) else None), "response_format"
            if not isinstance(schema, dict):
                raise ApiError("Field 'response_format': json_schema needs {\"schema\": {...}}")
        elif kind != "text":
            raise ApiError("Field 'response_format': expected type text, json_object or json_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise ApiError(f"Field '{field}': expected a JSON schema object")
        try:
            # JSON without free whitespace (as llama-server's schema grammars, which allow at most one space): a
            # model cannot pad it forever
            opts = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
            g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({**schema, "x-guidance": opts}))
        except (ValueError, RuntimeError) as e:
            raise ApiError(f"Field '{field}': the JSON schema is not supported: {e}") from None
        return _checked(g, field)
    grammar = body.get("grammar")
    if grammar is None or grammar == "":
        return None
    if not isinstance(grammar, str):
        raise ApiError("Field 'grammar': expected a GBNF (or Lark) grammar string")
    try:
        return _checked(llguidance.grammar_from("gbnf", grammar), "grammar")
    except ValueError as e:
        raise ApiError(f"Field 'grammar': {e}") from None


def _checked(g: str, field: str) -> str:
    import llguidance

    err = llguidance.LLMatcher.validate_grammar(g)
    if err:
        err = re.sub(r"\s+", " ", err)[:300]
        raise ApiError(f"Field '{field}': the grammar does not parse: {err}")
    return g


class Constraint:
    """One request's grammar state (an llguidance matcher), as `speculative.decode` drives it."""

    def __init__(self, ll_tokenizer, grammar: str, n_vocab: int):
        import llguidance

        self.m = llguidance.LLMatcher(ll_tokenizer, grammar)
        self.n_vocab = n_vocab
        self._check()

    def _check(self) -> None:
        if self.m.is_error():
            raise NextnError(f"grammar: {self.m.get_error()}")

    def allowed(self) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar allows next (end-of-generation ones once it is complete)."""
        mask = np.frombuffer(self.m.compute_logit_bias(), np.uint8)[:self.n_vocab] > 0
        self._check()
        if not mask.any():
            raise NextnError("grammar: no token is allowed here")
        return mask

    def validate(self, tokens) -> int:
        return int(self.m.validate_tokens([int(t) for t in tokens])) if tokens else 0

    def consume(self, tokens) -> None:
        for t in tokens:
            self.m.consume_token(int(t))
        self._check()

    def rollback(self, n: int) -> None:
        if n:
            self.m.rollback(n)
