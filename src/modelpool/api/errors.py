"""One renderer for every error: the OpenAI envelope {"error": {message, type, param, code}},
except on Anthropic's paths (`/v1/messages...`), whose clients read Anthropic's shape
{"type": "error", "error": {type, message}}, and on `/mcp` (401s, 413s before the MCP
SDK sees the request), whose clients read JSON-RPC errors. `shaped_error` is the one place
that picks the shape by path; handlers and middlewares build the OpenAI envelope and pass
it through it.

Validation problems are 400 (never 422) with the offending `param` named the way
OpenAI's API names it (`messages[0].content`). Unexpected exceptions become a 500 that
names the request id and leaks no traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from modelpool.errors import ModelpoolError
from modelpool.logs import current_request_id

log = logging.getLogger("modelpool.api")

_HTTP_CODES = {
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
}
# Pydantic puts union-member and validator tags into `loc`; they are not field names.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "bytes"}

ErrorShape = Literal["openai", "anthropic"]
ANTHROPIC_ROOT = "/v1/messages"
MCP_PATH = "/mcp"
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


def error_shape_for(path: str) -> ErrorShape:
    return "anthropic" if path == ANTHROPIC_ROOT or path.startswith(f"{ANTHROPIC_ROOT}/") else "openai"


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body; the type follows the status, as Anthropic's own do."""
    type_ = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": type_, "message": message}, "request_id": current_request_id.get()}


def jsonrpc_error(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC error with no request id (the MCP server's clients read only these):
    -32600 for the client's mistakes, -32603 for the server's; the envelope's fields as data."""
    error = body["error"]
    data = {"status": status, "type": error["type"], "code": error["code"], "param": error.get("param")}
    code = -32600 if status < 500 else -32603
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": error["message"], "data": data}}


def shaped_error(path: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI error envelope in the shape the clients of `path` read."""
    if path == MCP_PATH:
        return jsonrpc_error(status, body)
    if error_shape_for(path) == "openai":
        return body
    message, param = body["error"]["message"], body["error"].get("param")
    # Anthropic's envelope has no `param`: the message names the field, as theirs do.
    if param and param not in message:
        message = f"{param}: {message}"
    return anthropic_error(status, message)


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_payload(exc: ModelpoolError) -> dict[str, Any]:
    return error_body(exc.message, exc.type, exc.code, exc.param)


def render_error(exc: ModelpoolError, path: str = "") -> JSONResponse:
    body = shaped_error(path, exc.status_code, error_payload(exc))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def param_from_loc(loc: Sequence[Any]) -> str | None:
    """("body", "messages", 0, "content", "str") → "messages[0].content"."""
    param = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif _is_type_tag(str(part)):
            continue
        else:
            param += f".{part}" if param else str(part)
    return param or None


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    # A value that fits no member of a union yields one error per member; the deepest one
    # (["ok", "\ud800"] → input[1], not "input is not a string") says what is wrong.
    # A list over its cap says so, whatever the union's other members said about it.
    too_long = [e for e in errors if e.get("type") == "too_long"]
    first = too_long[0] if too_long else max(errors, key=lambda e: len(e.get("loc", ())))
    if first.get("type") == "json_invalid":
        return f"The request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}", None
    param = param_from_loc(first.get("loc", ()))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'." if param else "The request body is missing."
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return message, param


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ModelpoolError, _on_modelpool_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _on_http_exception)  # type: ignore[arg-type]


async def _on_modelpool_error(request: Request, exc: ModelpoolError) -> JSONResponse:
    return render_error(exc, request.url.path)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    if isinstance(exc.body, dict) and isinstance(exc.body.get("model"), str):
        request.state.model_id = exc.body["model"]  # so metrics and the access log name the model
    message, param = validation_message(exc.errors())
    body = error_body(message, "invalid_request_error", "invalid_value", param)
    return JSONResponse(shaped_error(request.url.path, 400, body), status_code=400)


async def _on_http_exception(request: Request, exc: HTTPException) -> JSONResponse:
    type_, code = _HTTP_CODES.get(exc.status_code, ("invalid_request_error", None))
    message = f"Unknown route: {request.method} {request.url.path}" if exc.status_code == 404 else str(exc.detail)
    body = shaped_error(request.url.path, exc.status_code, error_body(message, type_, code))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def internal_error_body(request_id: str) -> dict[str, Any]:
    """What a client sees of a bug: the request id to report, never a traceback."""
    message = f"The server had an error while processing your request (request id {request_id})."
    return error_body(message, "server_error", "internal_error")


def _is_type_tag(part: str) -> bool:
    # A model class of a union (`DocumentObject`) names the member, not a field: wire fields are lower case.
    return (
        part in _TYPE_TAGS
        or "[" in part
        or part[:1].isupper()
        or part.startswith(("function-", "tagged-union", "json-or-python"))
    )
