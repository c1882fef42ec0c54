"""The published OpenAPI (`/openapi.json`), told the truth: FastAPI's schema of the routes,
whose own `responses=` (`wire.contract.declared`) list what each route answers, plus what
every route answers because of the middlewares around it, each status with the envelope of
the path's protocol (`wire.errors`' choice by path). FastAPI's 422 goes: validation errors
are 400 in the envelope (`api/errors.py`). With API keys configured, the key-guarded routes
declare the keys as their security, so a client (and schemathesis) knows a 401 is coming.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from modelpool.server.auth import KeyRing, needed_scope
from modelpool.wire.contract import ENVELOPES, ContractShape, NotReady, error_response, mcp_operation
from modelpool.wire.errors import MCP_PATH, error_shape_for

_BODY_METHODS = {"post", "put", "patch"}
_METHODS = {"get", "post", "put", "patch", "delete"}
_SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <key>"},
    "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": "Anthropic's header"},
}


def publish_contract(app: FastAPI, keys: KeyRing) -> None:
    """Replace the app's schema builder with one that adds the middlewares' statuses."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            if any(getattr(route, "path", None) == MCP_PATH for route in app.routes):  # mounted, not FastAPI's
                schema["paths"][MCP_PATH] = {"post": mcp_operation()}
            told_true(schema, keys_enabled=keys.enabled)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise the schema


def told_true(schema: dict[str, Any], *, keys_enabled: bool) -> None:
    """Add, to every operation of `schema`, the statuses the middlewares answer; drop 422."""
    components = schema.setdefault("components", {})
    models: list[type[BaseModel]] = [*ENVELOPES.values(), NotReady]
    for model in models:
        _add_component(model, components)
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            had_422 = responses.pop("422", None) is not None
            guarded = needed_scope(path) is not None  # behind a key when keys exist, and rate-limited
            scoped = keys_enabled and guarded
            statuses = _middleware_statuses(method, had_422 or bool(operation.get("parameters")), scoped)
            if guarded:
                statuses.append(429)  # rate limits apply per key, or per address without keys
            for status in statuses:
                responses.setdefault(str(status), error_response(status, _shape(path)))
            if scoped:
                operation["security"] = [{"bearer": []}, {"x-api-key": []}]
    if keys_enabled:
        components.setdefault("securitySchemes", {}).update(_SECURITY_SCHEMES)
    schemas = components.get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        if not _referenced(schema, name):
            schemas.pop(name, None)


def _middleware_statuses(method: str, validates: bool, scoped: bool) -> list[int]:
    statuses = [421, 500]  # the host guard refuses foreign Host names; a bug is a 500 with the request id
    if validates:
        statuses.append(400)
    if method in _BODY_METHODS:
        statuses += [400, 408, 413]  # an unreadable body, one that stopped coming, one over server.max_body_bytes
    if scoped:
        statuses += [401, 403]  # the key, its scope
    return statuses


def _shape(path: str) -> ContractShape:
    return "jsonrpc" if path == MCP_PATH else error_shape_for(path)


def _add_component(model: type[BaseModel], components: dict[str, Any]) -> None:
    schemas = components.setdefault("schemas", {})
    if model.__name__ in schemas:
        return
    generated = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in generated.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas[model.__name__] = generated


def _referenced(schema: dict[str, Any], name: str) -> bool:
    return f'"#/components/schemas/{name}"' in json.dumps(schema.get("paths", {}))
