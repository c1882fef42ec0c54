"""Which error shape a path's clients read: OpenAI's envelope everywhere, except on
Anthropic's paths (`/v1/messages...`), whose clients read Anthropic's shape, and on `/mcp`
(401s, 413s before the MCP SDK sees the request), whose clients read JSON-RPC errors.
`shaped_error` is the one place that picks the shape by path; whoever renders an error
builds the OpenAI envelope (`wire.openai.errors`) and passes it through it."""

from __future__ import annotations

from typing import Any, Literal

from modelpool.wire.anthropic.errors import anthropic_error

ErrorShape = Literal["openai", "anthropic"]
ANTHROPIC_ROOT = "/v1/messages"
MCP_PATH = "/mcp"


def error_shape_for(path: str) -> ErrorShape:
    return "anthropic" if path == ANTHROPIC_ROOT or path.startswith(f"{ANTHROPIC_ROOT}/") else "openai"


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
