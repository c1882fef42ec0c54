"""Server-sent events as bytes: OpenAI's streams send bare `data:` lines ending with
`data: [DONE]`; Anthropic's and the Responses API's name each event (`event: <type>`).
How a stream is sent (closing, send timeouts) is the HTTP layer's (`api.sse`)."""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def named_event(payload: dict[str, Any]) -> bytes:
    """An event named by its payload's `type`."""
    return f"event: {payload['type']}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def chat_error_events(payload: dict[str, Any]) -> list[bytes]:
    """Chat and completions streams: the error envelope as an event, then [DONE]."""
    return [sse(payload), DONE]
