"""Anthropic's error body {"type": "error", "error": {type, message}, "request_id"}."""

from __future__ import annotations

from typing import Any

from modelpool.logs import current_request_id

# Anthropic's error types by HTTP status (docs.anthropic.com "Errors"); 503 is how the pool
# says "come back later" (loading, shutting down), which Anthropic calls overloaded.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body; the type follows the status, as Anthropic's own do."""
    type_ = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": type_, "message": message}, "request_id": current_request_id.get()}
