"""POST /v1/responses: OpenAI's Responses API on every chat-capable model: text, function
tools (`function_call` items out, `function_call_output` items in) and `text.format`."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.responses_wire import CallItem, ResponseDraft, status_of
from modelpool.api.schemas.responses import ResponsesBody
from modelpool.api.schemas.sizes import limits_of, translated
from modelpool.api.schemas.tools import check_tool_results
from modelpool.api.sse import EventStreamResponse
from modelpool.errors import ResponseNotFound
from modelpool.inference import ChatMessage, ChatRequest, GenerationChunk, Usage
from modelpool.owner import Owner, owner_of
from modelpool.runtime.generation import collect
from modelpool.runtime.lease import ResultStream
from modelpool.runtime.response_store import ResponseStore, StoredResponse

router = APIRouter()


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesBody, request: Request) -> Response:
    note_model(request, body.model)
    pool, store, owner = pool_of(request), store_of(request), owner_of(request.scope)
    history = _history(store, body, owner)
    said = [*history, *body.new_messages()]
    check_tool_results(said, lambda index: f"input[{index - len(history)}].call_id")
    system = [ChatMessage("system", body.instructions)] if body.instructions else []
    sampling = body.sampling(pool.sampling_defaults(body.model))
    tool_fields = await translated(limits_of(request), body.tool_fields)
    chat = ChatRequest(tuple(system + said), sampling, body.template_kwargs(), streamed=body.stream, **tool_fields)
    stream = await unless_disconnected(request, pool.chat(body.model, chat, body.call_options()))
    draft = ResponseDraft(body, chat, stream.model_id, int(time.time()))

    def finish(usage: Usage, finish_reason: str | None) -> dict[str, Any]:
        if body.store:
            answer = ChatMessage("assistant", draft.text, tool_calls=tuple(c.call() for c in draft.calls))
            store.put(draft.id, StoredResponse(draft.model, (*said, answer), owner.name))
        metrics = metrics_field(request, True, stream.timing)
        return draft.response(status_of(finish_reason), usage, finish_reason, **metrics)

    if body.stream:
        return EventStreamResponse(_events(stream, draft, finish), on_close=stream.aclose, on_error=_error_event)
    async with stream:
        generation = await unless_disconnected(request, collect(stream))
    draft.text, draft.reasoning = generation.text, generation.reasoning
    for call in generation.tool_calls:
        draft.add_call(call.id, call.name).arguments = call.arguments
    return JSONResponse(finish(generation.usage, generation.finish_reason))


async def _events(
    stream: ResultStream[GenerationChunk], draft: ResponseDraft, finish: Callable[[Usage, str | None], dict[str, Any]]
) -> AsyncIterator[bytes]:
    """Output items open as their first piece arrives: the message when text comes, a
    `function_call` item when a call is named. Each is closed before the next opens."""
    yield _sse(draft.event("response.created", response=draft.response("in_progress")))
    yield _sse(draft.event("response.in_progress", response=draft.response("in_progress")))
    items = _ItemStream(draft)
    usage, finish_reason = Usage(0, 0), None
    async for chunk in stream:
        draft.reasoning += chunk.reasoning  # reported in the final response's output
        if chunk.text:
            for event in items.text(chunk.text):
                yield _sse(event)
        for piece in chunk.tool_calls:
            for event in items.call_piece(piece.index, piece.id, piece.name, piece.arguments):
                yield _sse(event)
        usage, finish_reason = chunk.usage or usage, chunk.finish_reason or finish_reason
    await stream.aclose()  # the turn goes back before the last event, so its timing is final
    status = status_of(finish_reason)
    if not draft.calls and not items.message_open:  # an empty answer still has its message
        for event in items.text(""):
            yield _sse(event)
    for event in items.close(status):
        yield _sse(event)
    final = finish(usage, finish_reason)
    kind = "response.completed" if status == "completed" else "response.incomplete"
    yield _sse(draft.event(kind, response=final))


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


def _history(store: ResponseStore, body: ResponsesBody, owner: Owner) -> list[ChatMessage]:
    if body.previous_response_id is None:
        return []
    previous = store.get(body.previous_response_id, owner)
    if previous is None:  # one answer whether it never existed, was dropped or is another key's
        raise ResponseNotFound(
            f"Previous response with id '{body.previous_response_id}' not found (never stored with this key, "
            f"or dropped: the store keeps the last {store.size} responses within its byte budget).",
            param="previous_response_id",
        )
    return list(previous.conversation)


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def _error_event(payload: dict[str, Any]) -> list[bytes]:
    error = payload["error"]
    event = {"type": "error", "code": error["code"], "message": error["message"], "param": error["param"]}
    return [_sse(event)]


def store_of(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.responses
    return store
