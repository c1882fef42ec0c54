"""The app's error handlers: every error is rendered as OpenAI's envelope
(`wire.openai.errors`), in the shape the path's clients read (`wire.errors.shaped_error`).
Validation problems are 400 (never 422) with the offending `param` named; unexpected
exceptions become a 500 that names the request id and leaks no traceback."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute

from modelpool.errors import ModelpoolError
from modelpool.wire.errors import shaped_error
from modelpool.wire.openai.errors import error_body, error_payload, validation_message

_HTTP_CODES = {
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
}


def render_error(exc: ModelpoolError, path: str = "") -> JSONResponse:
    body = shaped_error(path, exc.status_code, error_payload(exc))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


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
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # Starlette names only the first route of the path (/v1/files has GET and POST)
        headers["Allow"] = ", ".join(_methods_of(request.app.routes, request.url.path)) or headers.get("Allow", "")
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


def _methods_of(routes: list[BaseRoute], path: str) -> list[str]:
    """Every method some route answers at `path` (inside included routers too)."""
    methods: set[str] = set()
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            methods.update(_methods_of(inner.routes, path))
        elif isinstance(route, APIRoute) and route.path_regex.match(path):
            methods.update(route.methods or ())
    return sorted(methods)
