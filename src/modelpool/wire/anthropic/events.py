"""Anthropic Messages API responses: the whole message, and its stream of events
(`message_start`, `ping`, `content_block_start/delta/stop`, `message_delta`,
`message_stop`; a failure mid-stream is an `error` event).

Content blocks come in the order the model wrote them: thinking (the reasoning parser's
text), text, then one `tool_use` block per call. Thinking blocks carry an empty
`signature`: nothing here can sign, and signatures sent back are not checked.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from modelpool.errors import ModelpoolError
from modelpool.inference import GenerationChunk, ToolCall, ToolCallDelta, Usage
from modelpool.logs import current_request_id
from modelpool.pool_api.generation import Generation
from modelpool.wire.anthropic.errors import anthropic_error
from modelpool.wire.errors import ANTHROPIC_ROOT, shaped_error
from modelpool.wire.openai.errors import error_payload
from modelpool.wire.sse import named_event

log = logging.getLogger("modelpool.api")

_STOP_REASONS = {
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
    "context_full": "model_context_window_exceeded",  # the route's: max_tokens was capped to the context
}


@dataclass(frozen=True)
class MessageMeta:
    model: str
    id: str = field(default_factory=lambda: f"msg_{secrets.token_hex(12)}")


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    """The pool's finish reason → Anthropic's: a stop sequence the engine names is
    `stop_sequence`; end-of-sequence (or a stop the engine could not name) is `end_turn`."""
    if finish_reason == "stop" and stop_sequence is not None:
        return "stop_sequence"
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn")


def usage_json(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def message_json(meta: MessageMeta, generation: Generation, show_thinking: bool, **extra: Any) -> dict[str, Any]:
    """The whole message (`POST /v1/messages` without `stream`)."""
    content: list[dict[str, Any]] = []
    if generation.reasoning:
        content.append(_thinking_block(generation.reasoning if show_thinking else ""))
    if generation.text:
        content.append({"type": "text", "text": generation.text})
    content += [_tool_use_block(call) for call in generation.tool_calls]
    return {
        **_envelope(meta, content),
        "stop_reason": stop_reason(generation.finish_reason, generation.stop_sequence),
        "stop_sequence": generation.stop_sequence,
        "usage": usage_json(generation.usage),
        **extra,
    }


def message_start(meta: MessageMeta, input_tokens: int) -> bytes:
    """`input_tokens`: the prompt's count as the engine admitted it (0 where an upstream says
    it only at the end); message_delta carries the final counts, which Anthropic's SDKs take
    over message_start's."""
    usage = usage_json(Usage(input_tokens, 0))
    message = {**_envelope(meta, []), "stop_reason": None, "stop_sequence": None, "usage": usage}
    return named_event({"type": "message_start", "message": message})


def message_end(finish_reason: str | None, stop: str | None, usage: Usage, **extra: Any) -> list[bytes]:
    delta = {"stop_reason": stop_reason(finish_reason, stop), "stop_sequence": stop}
    return [
        named_event({"type": "message_delta", "delta": delta, "usage": usage_json(usage), **extra}),
        named_event({"type": "message_stop"}),
    ]


PING = named_event({"type": "ping"})


class BlockStream:
    """The content-block events of one streamed message: a block opens when its first
    piece arrives and closes when a piece of another kind (or the end) comes."""

    def __init__(self, show_thinking: bool) -> None:
        self.show_thinking = show_thinking
        self._count = 0
        self._open: str | None = None
        """"thinking", "text", or "tool:<the call's index>"."""
        self._call_blocks: dict[int, int] = {}

    def thinking(self, text: str) -> list[bytes]:
        events = self._switch("thinking", _thinking_block(""))
        if self.show_thinking:
            events.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return events

    def text(self, text: str) -> list[bytes]:
        events = self._switch("text", {"type": "text", "text": ""})
        return [*events, self._delta({"type": "text_delta", "text": text})]

    def call_piece(self, piece: ToolCallDelta) -> list[bytes]:
        events: list[bytes] = []
        if piece.index not in self._call_blocks:
            call_id = piece.id or f"toolu_{piece.index}"
            block = {"type": "tool_use", "id": call_id, "name": piece.name or "", "input": {}}
            events = self._switch(f"tool:{piece.index}", block)
            self._call_blocks[piece.index] = self._count - 1
        if piece.arguments:
            delta = {"type": "input_json_delta", "partial_json": piece.arguments}
            events.append(_block_event("content_block_delta", self._call_blocks[piece.index], delta=delta))
        return events

    def chunk(self, chunk: GenerationChunk) -> list[bytes]:
        """The events of one chunk: its reasoning, its text, its tool-call pieces."""
        events = self.thinking(chunk.reasoning) if chunk.reasoning else []
        if chunk.text:
            events += self.text(chunk.text)
        for piece in chunk.tool_calls:
            events += self.call_piece(piece)
        return events

    def close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [_block_event("content_block_stop", self._count - 1)]

    def _switch(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        if self._open == kind:
            return []
        events = self.close()
        self._open, self._count = kind, self._count + 1
        return [*events, _block_event("content_block_start", self._count - 1, content_block=block)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _block_event("content_block_delta", self._count - 1, delta=delta)


async def with_error_events(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A failure mid-stream becomes Anthropic's `error` event, typed by its status."""
    try:
        async for item in events:
            yield item
    except ModelpoolError as exc:
        yield named_event(shaped_error(ANTHROPIC_ROOT, exc.status_code, error_payload(exc)))
    except Exception:
        log.exception("error while streaming")
        message = f"The server had an error while processing your request (request id {current_request_id.get()})."
        yield named_event(anthropic_error(500, message))


async def message_chunks(
    chunks: AsyncIterator[GenerationChunk],
    meta: MessageMeta,
    show_thinking: bool,
    capped: bool,
    end: Callable[[], Awaitable[dict[str, Any]]],
) -> AsyncIterator[bytes]:
    """A streamed message's events. `capped`: max_tokens was lowered to the room the context
    had left, so running out of it is `model_context_window_exceeded`. `end` runs after the
    last chunk (it gives the model's turn back) and returns message_delta's extra fields."""
    blocks = BlockStream(show_thinking)
    usage, finish_reason, stop = Usage(0, 0), None, None
    started = False
    async for chunk in chunks:
        if not started:  # the engine's first chunk comes at admission, with the prompt's count
            started = True
            yield message_start(meta, chunk.prompt_tokens or 0)
            yield PING
        for item in blocks.chunk(chunk):
            yield item
        usage, finish_reason = chunk.usage or usage, chunk.finish_reason or finish_reason
        stop = chunk.stop_sequence or stop
    extra = await end()
    if not started:
        yield message_start(meta, usage.prompt_tokens)
        yield PING
    for item in blocks.close():
        yield item
    if capped and finish_reason == "length":
        finish_reason = "context_full"
    for item in message_end(finish_reason, stop, usage, **extra):
        yield item


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object. Local engines' grammars make them an
    object; an upstream that wrote something else keeps its text, under `raw_arguments`."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"raw_arguments": arguments}


def _envelope(meta: MessageMeta, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": meta.id, "type": "message", "role": "assistant", "model": meta.model, "content": content}


def _thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}


def _tool_use_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call.arguments)}


def _block_event(kind: str, index: int, **fields: Any) -> bytes:
    return named_event({"type": kind, "index": index, **fields})
