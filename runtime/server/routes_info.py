"""Routes that describe the server or the vocabulary: /health, /props, /models, /slots, /metrics, /tokenize,
/detokenize, /apply-template. Field names: llama.cpp tools/server/server-context.cpp (`get_res_props`,
`get_res_model_info`, `post_tokenize`, …)."""
from __future__ import annotations

import time

from starlette.requests import Request

from .errors import ApiError
from .http import json_response, read_json
from .prompts import chat_prompt, tokens_of


def valid_filename(name) -> bool:
    """A plain file name inside --slot-save-path (llama-server `fs_validate_filename`): no folders, no leading dot,
    printable, at most 255 bytes."""
    return (isinstance(name, str) and 0 < len(name.encode("utf-8")) <= 255 and name.isprintable()
            and "/" not in name and "\\" not in name and not name.startswith("."))


def model_info(state) -> dict:
    loaded = state.model.loaded
    h = loaded.hparams
    return {"id": state.model_name, "aliases": state.aliases, "tags": state.tags, "object": "model", "created": int(time.time()),
            "owned_by": "nextn",
            "meta": {"vocab_type": 2, "n_vocab": state.model.tokenizer.n_vocab, "n_ctx": state.scheduler.n_ctx,
                     "n_ctx_train": int(h.get("n_ctx_train", 0)), "n_embd": int(h.get("n_embd", 0)),
                     "size": int(loaded.weight_bytes), "arch": loaded.artifact.manifest.get("arch", "")}}


def props_json(state, sleeping: bool) -> dict:
    """GET /props (llama-server `get_res_props`)."""
    d = state.defaults
    tok = state.model.tokenizer
    params = {"seed": d.seed, "temperature": d.temperature, "top_k": d.top_k, "top_p": d.top_p,
              "min_p": d.min_p, "n_predict": d.n_predict, "max_tokens": d.n_predict,
              "speculative.type": d.spec_type, "speculative.n_max": d.n_max, "speculative.n_min": d.n_min,
              "speculative.p_min": d.p_min}
    return {
        "default_generation_settings": {"params": params, "n_ctx": state.scheduler.n_ctx},
        "total_slots": len(state.scheduler.slots), "model_alias": state.model_name,
        "model_path": state.model_path, "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": state.slots_enabled, "endpoint_props": False, "endpoint_metrics": state.metrics_enabled,
        "chat_template": state.template.source, "chat_template_origin": state.template.origin,
        "bos_token": tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
        "eos_token": tok.token_text(tok.eos_id), "build_info": state.fingerprint, "is_sleeping": sleeping,
        "speculative": speculative_info(state)}


def models_json(state) -> dict:
    """GET /models, /v1/models (llama-server `get_res_models`)."""
    return {"object": "list", "data": [model_info(state)],
            "models": [{"name": state.model_name, "model": state.model_name, "type": "model",
                        "capabilities": ["completion"]}]}


def speculative_info(state) -> dict:
    d = state.defaults
    return {"type": d.spec_type, "n_max": d.n_max, "n_min": d.n_min, "p_min": d.p_min,
            "draft_sampling": d.draft_sampling, "max_draft": state.model.max_draft}


def register(app, state) -> None:
    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        return json_response({"status": "ok"})

    @app.get("/props")
    async def props():
        sl = state.sleeper
        if sl is not None and sl.sleeping:      # llama-server: answered during sleep from what it was before
            return json_response(sl.props)
        return json_response(props_json(state, False))

    @app.get("/models")
    @app.get("/v1/models")
    async def models():
        sl = state.sleeper
        if sl is not None and sl.sleeping:
            return json_response(sl.models)
        return json_response(models_json(state))

    @app.get("/slots")
    async def slots():
        if not state.slots_enabled:
            raise ApiError("This server does not support slots endpoint. Start it without `--no-slots`",
                           "not_supported_error")
        return json_response(state.scheduler.slots_json())

    @app.post("/slots/{id_slot}")
    async def slot_action(id_slot: str, request: Request):
        """llama-server's slot actions: save / restore the slot's prompt cache to / from a file in --slot-save-path,
        erase it. Run on the scheduler thread, between decode steps; a busy slot is refused."""
        import asyncio
        import os

        if not state.slots_enabled:
            raise ApiError("This server does not support slots endpoint. Start it without `--no-slots`",
                           "not_supported_error")
        action = request.query_params.get("action", "")
        try:
            slot = state.scheduler.slots[int(id_slot)]
        except (ValueError, IndexError):
            raise ApiError(f"Invalid slot ID: {id_slot}") from None
        if action not in ("save", "restore", "erase"):
            raise ApiError(f"Invalid action: {action!r} (expected save, restore or erase)")
        if action == "erase":
            body, path = {}, None
        else:
            if not state.slot_save_path:
                raise ApiError("This server does not support slots action. Start it with `--slot-save-path`",
                               "not_supported_error")
            body = await read_json(request)
            name = body.get("filename")
            if not valid_filename(name):
                raise ApiError("Invalid filename")
            path = os.path.join(state.slot_save_path, name)

        def run():
            if slot.task is not None:
                raise ApiError(f"slot {slot.id} is busy; retry when its request is done")
            t0 = time.perf_counter()
            if action == "erase":
                return {"id_slot": slot.id, "n_erased": slot.erase()}
            n_bytes = slot.save(path) if action == "save" else slot.restore(path)
            ms = (time.perf_counter() - t0) * 1e3
            if action == "save":
                return {"id_slot": slot.id, "filename": body["filename"], "n_saved": len(slot.cache),
                        "n_written": n_bytes, "timings": {"save_ms": ms}}
            return {"id_slot": slot.id, "filename": body["filename"], "n_restored": len(slot.cache), "n_read": n_bytes,
                    "timings": {"restore_ms": ms}}

        return json_response(await asyncio.wrap_future(state.scheduler.call(run)))

    @app.get("/metrics")
    async def metrics():
        from starlette.responses import Response

        if not state.metrics_enabled:
            raise ApiError("This server does not support metrics endpoint. Start it with `--metrics`",
                           "not_supported_error")
        sl = state.sleeper
        if sl is not None and sl.sleeping:      # the snapshot taken on entering sleep; scraping it does not wake
            m, text = sl.metrics, sl.metrics.render(0, 0)
            sl.scraped_while_asleep = True
        else:
            m = state.scheduler.metrics
            text = m.render(*state.scheduler.counts())
        m.reset_bucket()                        # llama-server: the gauges are averaged between two scrapes
        r = Response(text, media_type="text/plain; version=0.0.4")
        # spelled as llama-server sends it: Starlette lower-cases the headers it is given, the raw list is sent as is
        r.raw_headers.append((b"Process-Start-Time-Unix", str(int(m.t_start)).encode()))
        return r

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await read_json(request)
        if "content" not in body:
            return json_response({"tokens": []})
        ids = tokens_of(state, body["content"])
        if body.get("with_pieces") is True:
            tok = state.model.tokenizer
            out = []
            for t in ids:
                b = tok.token_to_bytes(t)
                try:
                    piece = b.decode("utf-8")
                except UnicodeDecodeError:
                    piece = list(b)
                out.append({"id": t, "piece": piece})
            return json_response({"tokens": out})
        return json_response({"tokens": ids})

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await read_json(request)
        ids = body.get("tokens", [])
        n = state.model.tokenizer.n_vocab
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n
                                                for t in ids):
            raise ApiError(f"Field 'tokens': expected an array of token ids in [0, {n})")
        return json_response({"content": state.model.tokenizer.decode(ids)})

    @app.post("/apply-template")
    async def apply_template(request: Request):
        body = await read_json(request)
        return json_response({"prompt": chat_prompt(state, body)})
