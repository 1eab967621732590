"""Generation routes: POST /completion (+ /completions), /v1/completions, /v1/chat/completions (+ /chat/completions),
Anthropic's /v1/messages (+ /v1/messages/count_tokens; `anthropic.py`) and OpenAI's /v1/responses
(`oai_responses.py`), both translated into a chat request.

A request is parsed (`params.parse_gen_params`), its prompt tokenized (for chat: rendered with the chat template
first), checked against the slot context, and queued on the scheduler. Non-streaming, the answer is one JSON
object when the request finishes. Streaming (`"stream": true`), one SSE event per generated token as each
verify round's accepted block arrives (llama-server sends one per token too), with its text from a
`TextStream`: a token that ends inside a UTF-8 character sends nothing until the character is whole, text that may
be the start of a stop string is held (sent as ""), and nothing past a finish rule is ever sent. An error before the
first token is an ordinary error response (llama-server: "the first error must be treated as non-stream"); a
later one is a `data: {"error": …}` event. A client that disconnects cancels its request and frees its slot.
"""
from __future__ import annotations

import asyncio

from starlette.requests import Request

from ..text_stream import TextStream
from . import anthropic, oai_responses
from . import responses as R
from . import sse
from .chat_output import REASONING_FORMATS, THINK_OPEN, ChatOutput, tools_of
from .errors import ApiError, exceed_context
from .grammar import Constraint, grammar_of, tokenizer_of
from .http import error_response, json_response, read_json
from .params import ban_eog, parse_gen_params, parse_logit_bias
from .prompts import chat_prompt, continues_reasoning, prompts_of
from .slots import Task

COMPLETION, TEXT, CHAT, MESSAGES, RESPONSES = "completion", "text_completion", "chat", "messages", "responses"
CHATS = (CHAT, MESSAGES, RESPONSES)      # rendered with the chat template, replies parsed by ChatOutput


def register(app, state) -> None:
    async def completion(request: Request):
        return await _generate(request, state, COMPLETION)

    async def v1_completions(request: Request):
        return await _generate(request, state, TEXT)

    async def chat(request: Request):
        return await _generate(request, state, CHAT)

    for path in ("/completion", "/completions"):
        app.post(path)(completion)
    app.post("/v1/completions")(v1_completions)
    for path in ("/chat/completions", "/v1/chat/completions"):
        app.post(path)(chat)

    @app.post("/v1/messages")
    async def messages(request: Request):
        try:
            return await _generate(request, state, MESSAGES)
        except ApiError as e:        # Anthropic's error object on this route
            return anthropic.error_response(e)

    async def responses(request: Request):
        return await _generate(request, state, RESPONSES)

    for path in ("/responses", "/v1/responses"):      # both, as llama-server
        app.post(path)(responses)

    async def input_tokens(request: Request):
        """llama-server's `post_chat_completions_tok`: the chat request's prompt length in tokens, nothing run."""
        body = await read_json(request)
        if request.url.path.endswith("/responses/input_tokens"):
            n = len(state.model.tokenizer.encode(chat_prompt(state, oai_responses.to_chat(body))))
            return json_response({"input_tokens": n, "object": "response.input_tokens"})
        return json_response({"input_tokens": len(state.model.tokenizer.encode(chat_prompt(state, body)))})

    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens", "/responses/input_tokens",
                 "/v1/responses/input_tokens"):
        app.post(path)(input_tokens)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        try:
            body = anthropic.to_chat(await read_json(request))
            return json_response({"input_tokens": len(state.model.tokenizer.encode(chat_prompt(state, body)))})
        except ApiError as e:
            return anthropic.error_response(e)


async def _generate(request: Request, state, kind: str):
    body = await read_json(request)
    request_body = body
    if kind == MESSAGES:
        body = anthropic.to_chat(body)
    elif kind == RESPONSES:
        body = oai_responses.to_chat(body)
    p = parse_gen_params(body, state.defaults)
    tok = state.model.tokenizer
    n_vocab = int(state.model.loaded.hparams.get("n_vocab") or tok.n_vocab)
    p.logit_bias, p.logit_bias_list = parse_logit_bias(body, tok, n_vocab)
    if p.ignore_eos:
        ban_eog(p, state.eog, n_vocab)
    new_parser, tools = lambda: None, None
    if kind in CHATS:
        tools = tools_of(body)
        reasoning = _reasoning_format(body, state.defaults)
        text = chat_prompt(state, body)
        in_think = text.rstrip().endswith(THINK_OPEN) or continues_reasoning(body)
        new_parser = lambda: ChatOutput(tools, reasoning, in_think=in_think)   # noqa: E731 - one per completion
        prompts = [state.model.tokenizer.encode(text)]
    else:
        if body.get("prompt") is None:
            raise ApiError("'prompt' is required")
        prompts = prompts_of(state, body["prompt"])
    n_ctx = state.scheduler.n_ctx
    for ids in prompts:
        if not ids:
            raise ApiError("the prompt is empty")
        if len(ids) >= n_ctx:
            raise exceed_context(len(ids), n_ctx)
    g = grammar_of(body, tools)
    eog = frozenset() if p.ignore_eos else (state.chat_eog if kind in CHATS else state.eog)
    # several prompts and / or n_cmpl > 1: one task per (prompt, completion), index = prompt * n_cmpl + completion
    jobs = [ids for ids in prompts for _ in range(p.n_cmpl)]
    meta = R.Meta(state.model_name, state.fingerprint)
    spec = {"type": p.spec_type, "n_max": p.n_max, "n_min": p.n_min, "p_min": p.p_min}
    if len(jobs) > 1:      # never /v1/messages: Anthropic has no `n` (anthropic.to_chat drops it, as llama-server)
        return await _generate_many(request, state, kind, jobs, p, g, eog, meta, spec, new_parser, n_vocab,
                                    request_body)
    ids = jobs[0]
    if g is not None:
        p.constraint = Constraint(tokenizer_of(state), g, n_vocab)
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    def post(kind, value):       # called from the scheduler thread
        try:
            loop.call_soon_threadsafe(q.put_nowait, (kind, value))
        except RuntimeError:     # the event loop is closed: the server is shutting down
            pass

    task = Task(ids, p, eog, post)
    state.scheduler.submit(task)
    out = _writer(state, kind, task, meta, spec, new_parser(), request_body)
    watch = asyncio.ensure_future(_watch_disconnect(request, state, task))
    try:
        if not p.stream:
            while True:
                k, v = await _next(q, watch, state, task)
                if k is None:
                    return json_response({})      # the client is gone; nobody reads this
                if k == "error":
                    return out.error_response(v)
                if k == "done":
                    return json_response(out.final(v))
        k, v = await _next(q, watch, state, task)   # the first event decides: error response, or a stream
        if k is None:
            return json_response({})
        if k == "error":
            return out.error_response(v)
    except BaseException:
        state.scheduler.cancel(task)
        raise
    finally:
        watch.cancel()     # a stream is watched by Starlette's StreamingResponse (it closes `_stream`)
    from starlette.responses import StreamingResponse

    return StreamingResponse(_stream(out, q, state, task, (k, v)), media_type=sse.MEDIA_TYPE)


def _writer(state, kind, task, meta, spec, parser, request_body, index: int = 0):
    """The object that turns one task's events into its route's answer."""
    if kind == MESSAGES:
        return anthropic.MessagesWriter(state, task, parser, state.model_name)
    if kind == RESPONSES:
        return oai_responses.ResponsesWriter(state, task, parser, state.model_name, request_body)
    return _Writer(state, kind, task, meta, spec, parser, index=index)


async def _generate_many(request, state, kind, jobs, p, g, eog, meta, spec, new_parser, n_vocab, request_body):
    """Several completions of one request, run as separate tasks (on any slots) and answered together as
    llama-server does (server-context.cpp `handle_completions_impl`): `/completion` and `/v1/responses` an array of
    their objects (each /completion object with its `index`, each response its own id); the OpenAI chat and text
    routes one object whose `choices` hold every completion (`index` i), with the first completion's usage and
    timings. An error of any of them is the answer. Streamed: every completion's chunks as they come, interleaved,
    each with its `index` (the /completion objects' `index`, the OpenAI chunks' `choices[0].index`; a response's
    events by its own response id), and one `[DONE]` after the last (OpenAI chat and text routes); an error before
    the first chunk is the answer, a later one the stream's last event."""
    import copy

    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    tasks, writers = [], []
    for i, ids in enumerate(jobs):
        pi = copy.copy(p)
        if g is not None:
            pi.constraint = Constraint(tokenizer_of(state), g, n_vocab)

        def post(k, v, i=i):
            try:
                loop.call_soon_threadsafe(q.put_nowait, (i, k, v))
            except RuntimeError:
                pass

        tasks.append(Task(ids, pi, eog, post))
        writers.append(_writer(state, kind, tasks[-1], meta, spec, new_parser(), request_body, index=i))
    for t in tasks:
        state.scheduler.submit(t)
    watch = asyncio.ensure_future(_watch_disconnect_all(request, state, tasks))
    results, first = {}, None
    try:
        while len(results) < len(tasks):
            get = asyncio.ensure_future(q.get())
            done, _ = await asyncio.wait({get, watch}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                return json_response({})      # the client is gone; every task is cancelled
            i, k, v = get.result()
            if k == "error":
                for t in tasks:
                    state.scheduler.cancel(t)
                return writers[i].error_response(v)
            if p.stream:                      # the first event decides: error response, or a stream
                first = (i, k, v)
                break
            if k == "done":
                results[i] = writers[i].final(v)
    except BaseException:
        for t in tasks:
            state.scheduler.cancel(t)
        raise
    finally:
        watch.cancel()
    if first is not None:
        from starlette.responses import StreamingResponse

        return StreamingResponse(_stream_many(writers, q, state, tasks, first), media_type=sse.MEDIA_TYPE)
    objs = [results[i] for i in range(len(tasks))]
    if kind in (COMPLETION, RESPONSES):
        return json_response(objs)
    first = objs[0]
    first["choices"] = [o["choices"][0] for o in objs]
    return json_response(first)


async def _stream_many(writers, q, state, tasks, first):
    ended = set()
    try:
        i, k, v = first
        while True:
            out = writers[i]
            if k == "tokens":
                chunk = out.tokens(v)
                if chunk:
                    yield chunk
            elif k == "progress":
                if hasattr(out, "progress"):
                    yield out.progress(v)
            elif k == "error":
                yield out.error_event(v)
                return
            else:
                ended.add(i)
                yield out.final_stream(v)
                if len(ended) == len(writers):
                    if out.kind in (TEXT, CHAT):
                        yield sse.DONE
                    return
            i, k, v = await q.get()
    finally:
        for t in tasks:      # the rest of them, once one failed or the client went away (no-op for finished ones)
            state.scheduler.cancel(t)


async def _watch_disconnect_all(request, state, tasks) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            for t in tasks:
                state.scheduler.cancel(t)
            return


def _reasoning_format(body, d) -> str:
    v = body.get("reasoning_format")
    if v is None:
        return d.reasoning_format
    if v not in REASONING_FORMATS:
        raise ApiError(f"Field 'reasoning_format': expected one of {', '.join(REASONING_FORMATS)}, got {v!r}")
    return v


async def _watch_disconnect(request, state, task) -> None:
    """Wait for the client's http.disconnect (the body is read, so the next ASGI message is that one) and cancel the
    request at once: its slot is freed at the scheduler's next turn, before another decode round of it."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            state.scheduler.cancel(task)
            return


async def _next(q, watch, state, task):
    """The next scheduler event; (None, None) once the client has disconnected (the request is then cancelled)."""
    get = asyncio.ensure_future(q.get())
    done, _ = await asyncio.wait({get, watch}, return_when=asyncio.FIRST_COMPLETED)
    if get in done:
        return get.result()
    get.cancel()
    if watch.exception() is not None:     # the connection failed some other way: nobody will read the answer
        state.scheduler.cancel(task)
    return None, None


async def _stream(out, q, state, task, first):
    done = False
    try:
        k, v = first
        while True:
            if k == "tokens":
                chunk = out.tokens(v)
                if chunk:
                    yield chunk
            elif k == "progress":
                if hasattr(out, "progress"):
                    yield out.progress(v)
            elif k == "error":
                done = True
                yield out.error_event(v)
                return
            else:
                done = True
                yield out.final_stream(v)
                if out.kind in (TEXT, CHAT):
                    yield sse.DONE
                return
            k, v = await q.get()
    finally:
        if not done:     # the client went away (the generator was closed): free the slot
            state.scheduler.cancel(task)


class _Writer:
    """Builds one request's response objects of its route family from the token events."""

    def __init__(self, state, kind, task, meta, spec, parser, index: int = 0):
        self.state, self.kind, self.task, self.meta, self.spec = state, kind, task, meta, spec
        self.index = index           # the completion's place among a request's several (its `index` field)
        self.parser = parser         # chat: the reply's reasoning / content / tool calls (chat_output.ChatOutput)
        tok = state.model.tokenizer
        self.text = TextStream(tok.token_to_bytes, task.params.stop)
        self.n_gen = 0
        self.role_sent = False
        self.n_probs_sent = 0        # tokens whose probabilities went out in a chunk already

    # -- streaming ------------------------------------------------------------------------------------------------
    def _event(self, objs) -> bytes:
        """SSE data of streamed objects, each carrying this completion's `index` (llama-server: the chunks of a
        request's several completions are interleaved, told apart by it)."""
        for obj in objs if isinstance(objs, list) else [objs]:
            if self.kind == COMPLETION:
                obj["index"] = self.index
            for ch in obj.get("choices") or []:
                ch["index"] = self.index
        return sse.event(objs)

    @staticmethod
    def error_event(e: ApiError) -> bytes:
        return sse.event({"error": e.to_json()})

    @staticmethod
    def error_response(e: ApiError):
        return error_response(e)

    def progress(self, processed: int) -> bytes:
        """A `prompt_progress` event (llama-server `send_partial_response(slot, {}, true)`; `R.prompt_progress`)."""
        o = self.task.outcome
        prog = R.prompt_progress(o, processed)
        done = processed >= o.n_prompt
        if self.kind == COMPLETION:
            obj = R.completion_partial(o, "", None, 0)
            obj["tokens"] = []
        elif self.kind == TEXT:
            obj = R.text_chunk(self.meta, "")
        else:
            obj = R.chat_chunk(self.meta, {"role": "assistant", "content": None})
            self.role_sent = True
        obj["prompt_progress"] = prog
        if self.task.params.timings_per_token:    # llama-server: the first update before any prompt token is decoded
            t = R.timings(o, 0)
            obj["timings"] = t if done else {k: (0 if isinstance(v, int) else 0.0) for k, v in t.items()}
        return self._event(obj)

    def tokens(self, toks) -> bytes:
        objs = []
        for t in toks:
            self.n_gen += 1
            piece = self.text.push(t)
            if piece is None:            # inside a UTF-8 character: nothing to send yet
                continue
            objs += self._piece(piece, t)
        return self._event(objs) if objs else b""

    def _piece(self, piece: str, tok: int | None) -> list:
        o = self.task.outcome
        if self.kind == COMPLETION:
            objs = [R.completion_partial(o, piece, tok, self.n_gen)] if tok is not None or piece else []
        elif self.kind == TEXT:
            objs = [R.text_chunk(self.meta, piece)] if tok is not None or piece else []
        else:
            objs = []
            if not self.role_sent:
                objs.append(R.chat_chunk(self.meta, {"role": "assistant", "content": None}))
                self.role_sent = True
            deltas = self.parser.push(piece) if piece else []
            if tok is None:
                deltas += self.parser.finish()
            objs += [R.chat_chunk(self.meta, d) for d in deltas]
        if objs and self.task.params.timings_per_token:   # llama-server: timings on every partial when asked
            objs[-1]["timings"] = R.timings(o, self.n_gen)
        if objs and self.task.params.logprobs:            # the tokens since the last chunk that carried theirs
            self._attach_probs(objs[-1], self.n_gen if tok is not None else len(o.probs))
        return objs

    def _probs(self, start: int, stop: int) -> list:
        return R.prob_entries(self.task.outcome, start, stop, self.state.model.tokenizer.token_to_bytes)

    def _attach_probs(self, obj: dict, upto: int) -> None:
        entries, self.n_probs_sent = self._probs(self.n_probs_sent, upto), max(self.n_probs_sent, upto)
        if self.kind == COMPLETION:
            obj["completion_probabilities"] = entries
        elif obj.get("choices"):
            obj["choices"][0]["logprobs"] = {"content": entries}

    def final_stream(self, o) -> bytes:
        rest = self.text.finish()
        n_gen = len(o.tokens)
        if self.kind == COMPLETION:
            return self._event(self._completion(o, rest, [], n_gen))
        if self.kind == TEXT:
            last = R.text_final(o, self.meta, rest, n_gen, self.spec)
            if self.task.params.logprobs:
                self._attach_probs(last, len(o.probs))
            return self._event(last)
        objs = self._piece(rest, None)
        fin = R.chat_final_chunks(o, self.meta, n_gen, self.task.params.include_usage, self.spec,
                                  bool(self.parser.tool_calls))
        if self.task.params.logprobs and self.n_probs_sent < len(o.probs):
            self._attach_probs(fin[0], len(o.probs))
        return self._event(objs + fin)

    # -- one object -----------------------------------------------------------------------------------------------
    def final(self, o) -> dict:
        for t in o.tokens:
            self.text.push(t)
        self.text.finish()
        content = self.text.text
        n_gen = len(o.tokens)
        if self.kind == COMPLETION:
            return self._completion(o, content, o.tokens if self.task.params.return_tokens else [], n_gen)
        if self.kind == TEXT:
            r = R.text_final(o, self.meta, content, n_gen, self.spec)
        else:
            self.parser.push(content)
            self.parser.finish()
            r = R.chat_final(o, self.meta, self.parser.message(), n_gen, self.spec)
        if self.task.params.logprobs:
            self._attach_probs(r, len(o.probs))
        r["choices"][0]["index"] = self.index
        if self.task.params.verbose:
            r["__verbose"] = self._completion(o, content, o.tokens, n_gen)
        return r

    def _completion(self, o, content, tokens, n_gen) -> dict:
        tok = self.state.model.tokenizer
        r = R.completion_final(o, self.meta, content=content, tokens=tokens, n_gen=n_gen,
                               stopping_word=self.text.stopped_by or "", prompt=_prompt_text(tok, self.task.prompt_ids),
                               settings=self.task.params.settings_json(), spec=self.spec)
        if self.task.params.logprobs and not self.task.params.stream:
            self._attach_probs(r, len(o.probs))
        r["index"] = self.index
        return r



def _prompt_text(tok, ids) -> str:
    """The prompt as llama-server's `prompt` field shows it (detokenized with special tokens: `<|user|>` etc.)."""
    return b"".join(tok.token_to_bytes(t) or tok.token_text(t).encode("utf-8") for t in ids).decode(
        "utf-8", errors="replace")
