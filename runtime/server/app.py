"""The ASGI app (FastAPI/Starlette, served by uvicorn): shared state, the llama-server middlewares and error mapping.

Middlewares, in llama-server's order (tools/server/server-http.cpp): while the model loads every route answers 503
`unavailable_error` "Loading model"; with `--api-key` every route except /health and /v1/health needs
`Authorization: Bearer KEY` (or `X-Api-Key: KEY`), else 401 `authentication_error` "Invalid API Key".
With `--sleep-idle-seconds`, a request that needs the model first wakes a sleeping server (sleep.py; a reload that
fails is a 503 and the next request tries again).
CORS as llama-server (tools/server/server-http.cpp): a request whose `Origin` is allowed (`--cors-origins`, a
comma-separated list, default `*`: every origin; `localhost`: any origin on this machine) gets
`Access-Control-Allow-Origin: <its origin>` and `Access-Control-Allow-Credentials: true`; an OPTIONS request is a
preflight, answered 200 before the loading and API key checks (browsers send no credentials in it) with
llama-server's allowed methods (GET, POST, DELETE, OPTIONS) and headers (*).
Errors are llama-server's objects (`errors.ApiError`); an unknown route (or method) is 404 `not_found_error`
"File Not Found"; a body that is not JSON is 500 `server_error` as llama-server answers it (its JSON parse error
is not an invalid-argument error). An unexpected exception in a route is a 500 and the server keeps serving.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from .errors import ApiError
from .http import error_response, json_response
from .sleep import wakes

PUBLIC = ("/health", "/v1/health")


@dataclass
class ServerState:
    """Everything the routes read. `model`, `scheduler`, `template` are set once loading is done (`ready`)."""

    defaults: object                         # params.ServerDefaults
    api_keys: list = field(default_factory=list)
    metrics_enabled: bool = False
    slots_enabled: bool = True
    model_name: str = ""
    aliases: list = field(default_factory=list)     # -a names (sorted), shown by /v1/models
    tags: list = field(default_factory=list)        # --tags
    model_path: str = ""
    fingerprint: str = ""
    ready: bool = False
    model: object = None                     # api.Model (tokenizer, engine)
    scheduler: object = None                 # slots.Scheduler
    template: object = None                  # chat_template.ChatTemplate
    eog: frozenset = frozenset()             # plain completion: EOS/EOG of the vocabulary
    chat_eog: frozenset = frozenset()        # chat: also the GLM end-of-turn tokens
    log: object = None
    cors_origins: tuple = ("*",)            # --cors-origins
    slot_save_path: str | None = None        # --slot-save-path: the folder of slot save / restore files
    sleeper: object = None                   # sleep.Sleeper with --sleep-idle-seconds


def is_localhost(origin: str) -> bool:
    """An Origin on this machine (llama-server `origin_is_localhost`: localhost, 127.0.0.1 or [::1], any port)."""
    from urllib.parse import urlsplit

    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1")


class Gate:
    """Pure ASGI middleware: 503 while loading, then the API key check."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        h = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = h.get("origin")
        allowed = self.state.cors_origins
        if origin is not None and ("*" in allowed or origin in allowed
                                   or ("localhost" in allowed and is_localhost(origin))):
            # header names spelled as llama-server sends them (clients that read them as a plain dict need that)
            cors = [(b"Access-Control-Allow-Origin", origin.encode("latin-1")),
                    (b"Access-Control-Allow-Credentials", b"true")]
            inner = send

            async def send(message):
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), *cors]}
                await inner(message)
        if scope["method"] == "OPTIONS":
            from starlette.responses import Response

            r = Response(b"", 200, media_type="text/html")
            # llama-server's defaults (common/common.h cors_methods, cors_headers)
            r.raw_headers += [(b"Access-Control-Allow-Methods", b"GET, POST, DELETE, OPTIONS"),
                              (b"Access-Control-Allow-Headers", b"*")]
            return await r(scope, receive, send)
        err = None
        if not self.state.ready:
            err = ApiError("Loading model", "unavailable_error")
        elif self.state.api_keys and scope["path"] not in PUBLIC:
            key = h.get("authorization") or h.get("x-api-key") or ""
            if key.startswith("Bearer "):
                key = key[len("Bearer "):]
            if key not in self.state.api_keys:
                err = ApiError("Invalid API Key", "authentication_error")
        if err is None:
            sl = self.state.sleeper
            if sl is None or not wakes(scope["method"], scope["path"]):
                return await self.app(scope, receive, send)
            try:                                  # --sleep-idle-seconds: this request needs the model
                if sl.enter():
                    import asyncio

                    try:
                        await asyncio.to_thread(sl.wake)
                    except Exception as e:        # noqa: BLE001 - one line to the client; the next request retries
                        err = ApiError(f"reloading the model after sleep failed: {type(e).__name__}: {e}",
                                       "unavailable_error")
                        return await error_response(err)(scope, receive, send)
                return await self.app(scope, receive, send)
            finally:
                sl.leave()
        if scope["path"].startswith("/v1/messages"):     # Anthropic's clients read Anthropic's error object
            from .anthropic import error_response as anthropic_error

            return await anthropic_error(err)(scope, receive, send)
        await error_response(err)(scope, receive, send)


def create_app(state: ServerState):
    from fastapi import FastAPI
    from starlette.exceptions import HTTPException

    from . import routes_generate, routes_info

    app = FastAPI(title="nextn", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.nextn = state

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return error_response(e)

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):
        if e.status_code in (404, 405):
            return json_response({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}, 404)
        return error_response(ApiError(str(e.detail), "server_error"))

    @app.exception_handler(Exception)
    async def _unexpected(request, e: Exception):
        print(f"nextn serve: {request.url.path}: {type(e).__name__}: {e}", file=sys.stderr)
        return error_response(ApiError(f"{type(e).__name__}: {e}", "server_error"))

    routes_info.register(app, state)
    routes_generate.register(app, state)
    app.add_middleware(Gate, state=state)
    return app
