"""One renderer for every error: the OpenAI envelope {"error": {message, type, param, code}}.

Validation problems are 400 (never 422) with the offending `param` named the way
OpenAI's API names it (`messages[0].content`). Unexpected exceptions become a 500 that
names the request id and leaks no traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from modelpool.errors import ModelpoolError

log = logging.getLogger("modelpool.api")

_HTTP_CODES = {
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
}
# Pydantic puts union-member and validator tags into `loc`; they are not field names.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "bytes"}


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_payload(exc: ModelpoolError) -> dict[str, Any]:
    return error_body(exc.message, exc.type, exc.code, exc.param)


def render_error(exc: ModelpoolError) -> JSONResponse:
    return JSONResponse(error_payload(exc), status_code=exc.status_code, headers=exc.headers)


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
    first = max(errors, key=lambda e: len(e.get("loc", ())))
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


async def _on_modelpool_error(_: Request, exc: ModelpoolError) -> JSONResponse:
    return render_error(exc)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    if isinstance(exc.body, dict) and isinstance(exc.body.get("model"), str):
        request.state.model_id = exc.body["model"]  # so metrics and the access log name the model
    message, param = validation_message(exc.errors())
    return JSONResponse(error_body(message, "invalid_request_error", "invalid_value", param), status_code=400)


async def _on_http_exception(request: Request, exc: HTTPException) -> JSONResponse:
    type_, code = _HTTP_CODES.get(exc.status_code, ("invalid_request_error", None))
    message = f"Unknown route: {request.method} {request.url.path}" if exc.status_code == 404 else str(exc.detail)
    return JSONResponse(error_body(message, type_, code), status_code=exc.status_code, headers=exc.headers)


def internal_error_body(request_id: str) -> dict[str, Any]:
    """What a client sees of a bug: the request id to report, never a traceback."""
    message = f"The server had an error while processing your request (request id {request_id})."
    return error_body(message, "server_error", "internal_error")


def _is_type_tag(part: str) -> bool:
    return part in _TYPE_TAGS or "[" in part or part.startswith(("function-", "tagged-union", "json-or-python"))
