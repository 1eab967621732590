"""The server's error object, as llama-server sends it (tools/server/server-common.cpp `format_error_response`):
`{"error": {"code": HTTP status, "message": ..., "type": ...}}` with the HTTP status equal to `code`."""
from __future__ import annotations

# llama-server's error types and their HTTP status
TYPES = {
    "invalid_request_error": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
}


class ApiError(Exception):
    """An error answered to the client; `extra` fields go into the error object (e.g. n_prompt_tokens, n_ctx)."""

    def __init__(self, message: str, type: str = "invalid_request_error", **extra):
        super().__init__(message)
        self.message, self.type, self.extra = message, type, extra

    @property
    def status(self) -> int:
        return TYPES[self.type]

    def to_json(self) -> dict:
        return {"code": self.status, "message": self.message, "type": self.type, **self.extra}


def exceed_context(n_prompt: int, n_ctx: int) -> ApiError:
    return ApiError(f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it",
                    "exceed_context_size_error", n_prompt_tokens=n_prompt, n_ctx=n_ctx)
