"""What the published OpenAPI says a route answers: the statuses it really returns, each
with the error envelope its protocol's clients read (OpenAI's, Anthropic's, JSON-RPC's),
and the content types its successes really carry (JSON, SSE, audio, text).

A route declares its own statuses and content types with `declared(...)`, passed as the
route decorator's `responses=`; what every route can answer because of the middlewares
(a bad key, a body over the limit, a rate limit, a bug) is added once, when the app's
schema is built (`server/openapi.py`), which also drops FastAPI's 422: the house answers
validation errors as 400 in the envelope (`api/errors.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel

from modelpool.wire.errors import ErrorShape

ContractShape = ErrorShape | Literal["jsonrpc"]


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """OpenAI's error envelope, on every path but Anthropic's and MCP's."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error body, on `/v1/messages...`."""

    type: Literal["error"]
    error: AnthropicErrorDetail
    request_id: str | None


class JsonRpcErrorDetail(BaseModel):
    code: int
    message: str
    data: dict[str, Any] | None = None


class JsonRpcError(BaseModel):
    """A JSON-RPC error with no request id: what `/mcp` answers before the MCP SDK sees a request."""

    jsonrpc: Literal["2.0"]
    id: str | int | None
    error: JsonRpcErrorDetail


class NotReady(BaseModel):
    """/readyz's 503: each model's state, and the envelope a request would get."""

    status: Literal["not_ready"]
    models: dict[str, str]
    error: OpenAIErrorDetail


ENVELOPES: dict[ContractShape, type[BaseModel]] = {
    "openai": OpenAIError,
    "anthropic": AnthropicError,
    "jsonrpc": JsonRpcError,
}

# Why each status is answered, for the schema's descriptions.
REASONS: dict[int, str] = {
    400: "Invalid request: a field fails validation, or a rule across fields or the model's limits",
    401: "Missing or wrong API key",
    403: "The key lacks the scope, or the request asks for what the server does not allow",
    404: "Unknown model or resource",
    408: "The request body stopped coming",
    409: "The model is not loaded and autoload is off",
    415: "The body is not JSON",
    413: "The body, or a size inside it, is over the server's limit",
    421: "The Host header names a host this server does not serve",
    429: "The model's queue is full or the key's rate limit is reached (Retry-After)",
    500: "A bug: the message names the request id",
    501: "The backend needs a pip extra that is not installed",
    502: "The engine process or remote upstream failed",
    503: "The model is loading, failed to load, or the server is shutting down (Retry-After)",
}

# What a route that hands a request to the pool can answer, besides its own validation:
# the `modelpool.errors` tree as a request meets it (unknown model, not loaded, overloaded,
# an upstream's failure, a load that failed, a missing extra, the model's own limits).
POOL_ERRORS = (400, 403, 404, 409, 413, 429, 501, 502, 503)
"""The statuses of a request a model serves."""
MODEL_LIMITS = "what the model cannot take (its context length, a task or an input kind it does not serve)"
"""The rule every route that hands a request to a model has, stated by the model, not the schema."""
MODEL_OPTIONAL = "`model` may be left out only when a default is configured or one served model can do the task"
"""The rule of a route whose body may leave out `model` (another server's shape that has none)."""
LISTING_ERRORS = (400, 404)
"""The statuses of a read of the pool's own state (listings, a model's status)."""

SSE = "text/event-stream"
JSON = "application/json"


def error_response(status: int, shape: ContractShape = "openai") -> dict[str, Any]:
    """One status's entry in an OpenAPI `responses` mapping: its reason and its protocol's
    envelope, always JSON (a route whose success is text or audio still fails in JSON).
    The envelopes' schemas are the components `server/openapi.py` adds."""
    ref = {"$ref": f"#/components/schemas/{ENVELOPES[shape].__name__}"}
    return {"description": REASONS.get(status, "Error"), "content": {JSON: {"schema": ref}}}


def declared(
    errors: Iterable[int] = (),
    *,
    shape: ContractShape = "openai",
    media: Mapping[str, dict[str, Any]] | None = None,
    rules: Iterable[str] = (),
) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=`: the error statuses it answers itself, in its protocol's
    envelope, and its success's content types besides the route's default (`media`, e.g.
    `{SSE: {}}` for a route that streams when asked, `{"audio/wav": binary()}`). Every
    route also gets the statuses of the middlewares when the schema is built.

    `rules`: what the route refuses with a 400 that no JSON Schema of its body can state
    (a rule across fields, one that depends on the served models); they are listed in the
    400's description and as its `x-unstated-rules`, which the schemathesis run reads: a
    body the schema admits may get a 400 only on such a route."""
    responses: dict[int | str, dict[str, Any]] = {status: error_response(status, shape) for status in errors}
    rules = list(rules)
    if rules:
        refused = responses.setdefault(400, error_response(400, shape))
        refused["description"] += ". Also: " + "; ".join(rules)
        refused["x-unstated-rules"] = rules
    if media:
        responses[200] = {"content": {kind: {"schema": schema} for kind, schema in media.items()}}
    return responses


def binary() -> dict[str, Any]:
    """The schema of a binary body (audio)."""
    return {"type": "string", "format": "binary"}


def text() -> dict[str, Any]:
    return {"type": "string"}


def sse_events() -> dict[str, Any]:
    """The schema of one event of a `text/event-stream` (OpenAPI 3.1 reads a streamed media
    type's `schema` as each event's): its `data` is a JSON object, or OpenAI's `[DONE]`."""
    fields = {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
              "retry": {"type": "integer", "minimum": 0}}  # fmt: skip
    return {"type": "object", "properties": fields, "required": ["data"]}



def not_ready_response() -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{NotReady.__name__}"}
    return {"description": REASONS[503], "content": {JSON: {"schema": ref}}}


def mcp_operation() -> dict[str, Any]:
    """`POST /mcp`, the MCP server (streamable HTTP, stateless, one JSON response per
    request): a JSON-RPC request in, its response out (a tool's failure is a JSON-RPC error
    or an `isError` result inside the 200); a notification is accepted with a 202 and no
    body. Its refusals are JSON-RPC errors (`wire.errors.jsonrpc_error`)."""
    message = {
        "type": "object",
        "required": ["jsonrpc", "method"],
        "properties": {
            "jsonrpc": {"const": "2.0"},
            # A string or an integer; any other id (or none) makes the message a notification (202).
            "id": {"description": "A string or an integer names a request; absent, a notification"},
            "method": {"type": "string", "description": "initialize, tools/list, tools/call, ..."},
            "params": {"type": ["object", "null"]},
        },
    }
    answer = {"type": "object", "required": ["jsonrpc"], "properties": {"jsonrpc": {"const": "2.0"}}}
    return {
        "summary": "The MCP server (JSON-RPC 2.0 over streamable HTTP)",
        "operationId": "mcp",
        "requestBody": {"required": True, "content": {JSON: {"schema": message}}},
        "responses": {
            "200": {"description": "The JSON-RPC response", "content": {JSON: {"schema": answer}}},
            "202": {"description": "A notification, accepted"},
            **{str(status): error_response(status, "jsonrpc") for status in (400, 415, 501)},
        },
    }
