"""JSON responses and request bodies, as llama-server writes and reads them (the routes and the middleware use these)."""
from __future__ import annotations

import json

from .errors import ApiError
from .sse import dumps


def json_response(obj, status: int = 200, headers=None):
    from starlette.responses import Response

    return Response(dumps(obj).encode("utf-8"), status_code=status, media_type="application/json; charset=utf-8",
                    headers=headers)


def error_response(e: ApiError):
    return json_response({"error": e.to_json()}, e.status)


async def read_json(request) -> dict:
    """The request body as a JSON object; a non-object is refused with 400, a non-JSON body with 500 (as
    llama-server)."""
    raw = await request.body()
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(f"[json.exception.parse_error] {e}", "server_error") from None
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body
