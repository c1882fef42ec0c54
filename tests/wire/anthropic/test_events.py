"""Anthropic's shapes without a model: error bodies by path and status, stop reasons, the
content-block events of a stream, and a failure mid-stream as an `error` event."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from modelpool.errors import ModelUnloaded, Overloaded
from modelpool.inference import ToolCallDelta
from modelpool.wire.anthropic.events import BlockStream, stop_reason, tool_input, with_error_events
from modelpool.wire.errors import error_shape_for, shaped_error
from modelpool.wire.openai.errors import error_body


def decoded(events: list[bytes]) -> list[dict[str, Any]]:
    parsed = []
    for item in events:
        name, data = item.decode().strip().split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"
        parsed.append(payload)
    return parsed


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/messages", "anthropic"),
        ("/v1/messages/count_tokens", "anthropic"),
        ("/v1/messagesx", "openai"),
        ("/v1/chat/completions", "openai"),
        ("/v1/responses", "openai"),
    ],
)
def test_the_error_shape_follows_the_path(path: str, shape: str) -> None:
    assert error_shape_for(path) == shape


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (409, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
    ],
)
def test_anthropic_error_types_follow_the_status(status: int, error_type: str) -> None:
    body = error_body("it went wrong", "whatever", "code", param="messages[0].content")
    shaped = shaped_error("/v1/messages", status, body)
    assert shaped["type"] == "error" and shaped["error"]["type"] == error_type
    assert shaped["error"]["message"] == "messages[0].content: it went wrong"  # the field named, as theirs do
    assert shaped_error("/v1/chat/completions", status, body) is body


@pytest.mark.parametrize(
    ("finish", "stop", "reason"),
    [
        ("stop", None, "end_turn"),
        ("stop", "###", "stop_sequence"),
        ("length", None, "max_tokens"),
        ("tool_calls", None, "tool_use"),
        ("context_full", None, "model_context_window_exceeded"),
        ("content_filter", None, "refusal"),
    ],
)
def test_stop_reasons(finish: str, stop: str | None, reason: str) -> None:
    assert stop_reason(finish, stop) == reason


def test_blocks_open_and_close_in_the_order_the_model_writes_them() -> None:
    blocks = BlockStream(show_thinking=True)
    events = decoded(
        blocks.thinking("hm")
        + blocks.thinking("m")
        + blocks.text("Let me look.")
        + blocks.call_piece(ToolCallDelta(0, "toolu_a", "find", '{"q": '))
        + blocks.call_piece(ToolCallDelta(0, arguments='"x"}'))
        + blocks.call_piece(ToolCallDelta(1, "toolu_b", "find", "{}"))
        + blocks.close()
    )
    kinds = [(e["type"], e["index"], (e.get("delta") or e.get("content_block") or {}).get("type")) for e in events]
    assert kinds == [
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"),
        ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
    ]
    assert events[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[7]["content_block"] == {"type": "tool_use", "id": "toolu_a", "name": "find", "input": {}}
    assert blocks.close() == []


def test_omitted_thinking_keeps_its_block_without_the_text() -> None:
    events = decoded(BlockStream(show_thinking=False).thinking("secret"))
    assert [e["type"] for e in events] == ["content_block_start"] and "secret" not in json.dumps(events)


def test_tool_input_is_the_arguments_object_or_keeps_their_text() -> None:
    assert tool_input('{"city": "Madrid"}') == {"city": "Madrid"}
    assert tool_input("") == {}
    assert tool_input("not json") == {"raw_arguments": "not json"}


@pytest.mark.parametrize(
    ("failure", "error_type"),
    [
        (ModelUnloaded("the model was unloaded"), "overloaded_error"),
        (Overloaded("the queue is full"), "rate_limit_error"),
        (RuntimeError("a bug"), "api_error"),
    ],
)
async def test_a_failure_mid_stream_is_an_error_event(failure: Exception, error_type: str) -> None:
    async def events() -> AsyncIterator[bytes]:
        yield b"event: ping\ndata: {}\n\n"
        raise failure

    items = [item async for item in with_error_events(events())]
    assert items[0] == b"event: ping\ndata: {}\n\n"
    [error] = decoded(items[1:])
    assert error["type"] == "error" and error["error"]["type"] == error_type
    assert "a bug" not in error["error"]["message"]  # no internals leak
