"""The Responses API's stream: `response.created`, the output items' events as the model
writes them, then `response.metrics` (llm-pool's event: the request's timing, which also
stays inside the final response) and `response.completed` (or `.incomplete`); a failure
mid-stream is an `error` event."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from modelpool.inference import GenerationChunk, Usage
from modelpool.wire.openai.response_draft import CallItem, ResponseDraft, status_of
from modelpool.wire.sse import named_event

Finish = Callable[[Usage, str | None], dict[str, Any]]
"""(usage, finish reason) → the final response."""


async def response_events(
    chunks: AsyncIterator[GenerationChunk], draft: ResponseDraft, release: Callable[[], Awaitable[None]], finish: Finish
) -> AsyncIterator[bytes]:
    """The stream's events. Output items open as their first piece arrives: the message when
    text comes, a `function_call` item when a call is named. Each is closed before the next
    opens. `release` runs after the last chunk: it gives the model's turn back before the
    last events, so the timing `finish` reports is final."""
    yield named_event(draft.event("response.created", response=draft.response("in_progress")))
    yield named_event(draft.event("response.in_progress", response=draft.response("in_progress")))
    items = _ItemStream(draft)
    usage, finish_reason = Usage(0, 0), None
    async for chunk in chunks:
        draft.reasoning += chunk.reasoning  # reported in the final response's output
        if chunk.text:
            for event in items.text(chunk.text):
                yield named_event(event)
        for piece in chunk.tool_calls:
            for event in items.call_piece(piece.index, piece.id, piece.name, piece.arguments):
                yield named_event(event)
        usage, finish_reason = chunk.usage or usage, chunk.finish_reason or finish_reason
    await release()
    status = status_of(finish_reason)
    if not draft.calls and not items.message_open:  # an empty answer still has its message
        for event in items.text(""):
            yield named_event(event)
    for event in items.close(status):
        yield named_event(event)
    final = finish(usage, finish_reason)
    if final.get("metrics") is not None:  # llm-pool sends it right before the final event
        yield named_event(draft.event("response.metrics", response_id=draft.id, metrics=final["metrics"]))
    kind = "response.completed" if status == "completed" else "response.incomplete"
    # `output_text` beside `response`: llm-pool's clients read it at the final event's top level
    yield named_event(draft.event(kind, response=final, output_text=final["output_text"]))


class _ItemStream:
    """The stream events of the output items, in order."""

    def __init__(self, draft: ResponseDraft) -> None:
        self.draft = draft
        self.message_open = False
        self._message_done = False
        self._open_call: CallItem | None = None
        self._calls_by_index: dict[int, CallItem] = {}
        self._next_index = 0
        self._message_index = 0
        self._call_index = 0

    def text(self, text: str) -> list[dict[str, Any]]:
        draft, events = self.draft, []
        if not self.message_open and not self._message_done:
            events += self._close_call("completed")
            self.message_open, self._message_index = True, self._take_index()
            item = draft.message("in_progress")
            events.append(draft.event("response.output_item.added", output_index=self._message_index, item=item))
            events.append(draft.event("response.content_part.added", **self._where(), part=draft.part()))
        draft.text += text  # text after the message closed (after a call) is kept, not streamed
        if text and self.message_open:
            events.append(draft.event("response.output_text.delta", **self._where(), delta=text, logprobs=[]))
        return events

    def call_piece(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[dict[str, Any]]:
        draft, events = self.draft, []
        call = self._calls_by_index.get(index)
        if call is None:
            events += self._close_message("completed") + self._close_call("completed")
            call = draft.add_call(call_id or f"call_{index}", name or "")
            self._calls_by_index[index], self._open_call = call, call
            self._call_index = self._take_index()
            events.append(draft.event("response.output_item.added", output_index=self._call_index,
                                      item=call.json("in_progress")))  # fmt: skip
        if arguments:
            call.arguments += arguments
            events.append(draft.event("response.function_call_arguments.delta", item_id=call.id,
                                      output_index=self._call_index, delta=arguments))  # fmt: skip
        return events

    def close(self, status: str) -> list[dict[str, Any]]:
        item_status = "incomplete" if status == "incomplete" else "completed"
        return self._close_message(item_status) + self._close_call(item_status)

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        if not self.message_open:
            return []
        draft = self.draft
        self.message_open, self._message_done = False, True
        return [
            draft.event("response.output_text.done", **self._where(), text=draft.text, logprobs=[]),
            draft.event("response.content_part.done", **self._where(), part=draft.part()),
            draft.event("response.output_item.done", output_index=self._message_index, item=draft.message(status)),
        ]

    def _close_call(self, status: str) -> list[dict[str, Any]]:
        call, self._open_call = self._open_call, None
        if call is None:
            return []
        draft = self.draft
        return [
            draft.event("response.function_call_arguments.done", item_id=call.id, output_index=self._call_index,
                        name=call.name, arguments=call.arguments),
            draft.event("response.output_item.done", output_index=self._call_index, item=call.json(status)),
        ]

    def _take_index(self) -> int:
        index, self._next_index = self._next_index, self._next_index + 1
        return index

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.draft.message_id, "output_index": self._message_index, "content_index": 0}


def error_events(payload: dict[str, Any]) -> list[bytes]:
    error = payload["error"]
    event = {"type": "error", "code": error["code"], "message": error["message"], "param": error["param"]}
    return [named_event(event)]
