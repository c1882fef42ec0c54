"""The MCP server at `/mcp`: streamable HTTP, stateless, one JSON response per request.

Stateless because every call stands alone (the tools keep no per-session state, the
transcript store is shared) and the API-key middleware then sees each request whole; no
session ids to route, expire or tie to a key.

Errors, as the MCP spec splits them: bad input (an unknown tool, arguments that fail the
tool's schema, an unknown model, bad base64, a path outside the allowed directories: the
4xx of the HTTP API) is a JSON-RPC error, -32602 with the pool's message and its
status/type/code/param as `data`. A failure of the work itself (a model that did not load,
a full queue: the 5xx and 429) is a tool result with `isError` and the message, which a
model can read and retry on. Neither ever carries a traceback.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, InputRequiredResult
from pydantic import ValidationError
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from modelpool import __version__
from modelpool.config.schema import Config
from modelpool.errors import ModelpoolError
from modelpool.mcp_server.pool_tools import add_pool_tools
from modelpool.mcp_server.transcript_tools import add_transcript_tools
from modelpool.wire.errors import MCP_PATH, jsonrpc_error
from modelpool.wire.openai.errors import error_body, validation_message

_CALLER_ERRORS = frozenset({400, 403, 404, 413})
"""Statuses that mean the request was wrong (as opposed to: the server could not do it now)."""
INSTRUCTIONS = (
    "Tools over modelpool's models (list_models first: it names each model and what it does) "
    "and a transcript store keyed by source id (add_transcript, query_transcripts, list_sources, "
    "get_transcript_stats)."
)


class PoolMCPServer(MCPServer[Any]):
    """MCPServer with the error split above applied in one place, around every tool call."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        tool = next((tool for tool in await self.list_tools() if tool.name == name), None)
        if tool is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: '{name}'", {"param": "name"})
        # The SDK drops arguments a tool does not take; a misspelt one must not pass unseen.
        unknown = sorted(set(arguments) - set(tool.input_schema.get("properties", {})))
        if unknown:
            raise _invalid(f"{name}: Unrecognized argument: '{unknown[0]}'", unknown[0])
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            raise _translated(name, exc) from exc


def _translated(tool: str, exc: ToolError) -> Exception:
    """The SDK wraps what a tool raised in a ToolError whose cause is the original."""
    cause = exc.__cause__
    if isinstance(cause, ValidationError):  # the tool's arguments, or the wire body built from them
        message, param = validation_message(cause.errors())
        return _invalid(f"{tool}: {message}", param)
    if isinstance(cause, ModelpoolError):
        if cause.status_code in _CALLER_ERRORS:
            data = {"status": cause.status_code, "type": cause.type, "code": cause.code, "param": cause.param}
            return MCPError(INVALID_PARAMS, cause.message, data)
        return ToolError(cause.message)  # rendered as an isError result with this text alone
    return exc


def _invalid(message: str, param: str | None) -> MCPError:
    """Invalid params, with the `data` the HTTP API's 400 for a bad field would carry."""
    return MCPError(INVALID_PARAMS, message, {"status": 400, "type": "invalid_request_error",
                                              "code": "invalid_value", "param": param})  # fmt: skip


def mount_mcp(app: FastAPI, config: Config) -> StreamableHTTPSessionManager:
    """Add `/mcp` to `app` (its pool and transcript store from `app.state`); the returned
    manager must run for as long as the app serves (the app's lifespan runs `manager.run()`)."""
    server = PoolMCPServer("modelpool", version=__version__, instructions=INSTRUCTIONS)
    add_pool_tools(server, app.state.pool, app.state.transcripts, config.server)
    add_transcript_tools(server, app.state.transcripts)
    server.streamable_http_app(  # builds the session manager; its routes are ours to mount
        stateless_http=True,
        json_response=True,
        max_request_body_size=config.server.max_body_bytes,
        # The server's own guard checks Host and Origin for every route, /mcp included
        # (server/host_guard.py); the SDK's copy of the rule is off, so there is one rule.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    manager = server.session_manager
    # POST only: with no sessions there is no stream to GET (the SDK would hold one open for
    # ever) and nothing to DELETE; both get 405, as the spec allows.
    app.router.routes.append(Route(MCP_PATH, _JsonOnly(StreamableHTTPASGIApp(manager)), methods=["POST"]))
    return manager


class _JsonOnly:
    """A body that is not JSON is a 415 in the JSON-RPC shape `/mcp` clients read (the SDK
    answers it with a bare-text 400 and no content type). A class: Starlette's `Route`
    treats a plain function as a request handler, an object as an ASGI app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = dict(scope.get("headers", [])).get(b"content-type", b"").decode("latin-1")
        if kind.split(";")[0].strip().lower() != "application/json":
            body = error_body(f"Content-Type must be application/json, not '{kind[:60]}'", "invalid_request_error",
                              "unsupported_media_type")  # fmt: skip
            payload = json.dumps(jsonrpc_error(415, body)).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            await send({"type": "http.response.start", "status": 415, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return
        await self.app(scope, receive, send)
