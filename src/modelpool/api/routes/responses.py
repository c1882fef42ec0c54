"""POST /v1/responses: OpenAI's Responses API (text) on every chat-capable model."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.responses_wire import ResponseDraft, status_of
from modelpool.api.schemas.responses import ResponsesBody
from modelpool.api.sse import EventStreamResponse
from modelpool.errors import InvalidRequest
from modelpool.inference import ChatMessage, ChatRequest, GenerationChunk, Usage
from modelpool.runtime.generation import collect
from modelpool.runtime.lease import LeasedStream
from modelpool.runtime.response_store import ResponseStore, StoredResponse

router = APIRouter()


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesBody, request: Request) -> Response:
    note_model(request, body.model)
    pool, store = pool_of(request), store_of(request)
    history = _history(store, body)
    said = [*history, *body.new_messages()]
    system = [ChatMessage("system", body.instructions)] if body.instructions else []
    sampling = body.sampling(pool.sampling_defaults(body.model))
    chat = ChatRequest(tuple(system + said), sampling, body.template_kwargs(), streamed=body.stream)
    stream = await unless_disconnected(request, pool.chat(body.model, chat, body.call_options()))
    draft = ResponseDraft(body, stream.model_id, int(time.time()))

    def finish(usage: Usage, finish_reason: str | None) -> dict[str, Any]:
        if body.store:
            store.put(draft.id, StoredResponse(draft.model, (*said, ChatMessage("assistant", draft.text))))
        metrics = metrics_field(request, True, stream.timing)
        return draft.response(status_of(finish_reason), usage, finish_reason, **metrics)

    if body.stream:
        return EventStreamResponse(_events(stream, draft, finish), on_close=stream.aclose, on_error=_error_event)
    async with stream:
        generation = await unless_disconnected(request, collect(stream))
    draft.text, draft.reasoning = generation.text, generation.reasoning
    return JSONResponse(finish(generation.usage, generation.finish_reason))


async def _events(
    stream: LeasedStream[GenerationChunk], draft: ResponseDraft, finish: Callable[[Usage, str | None], dict[str, Any]]
) -> AsyncIterator[bytes]:
    where = {"item_id": draft.message_id, "output_index": 0, "content_index": 0}
    yield _sse(draft.event("response.created", response=draft.response("in_progress")))
    yield _sse(draft.event("response.in_progress", response=draft.response("in_progress")))
    yield _sse(draft.event("response.output_item.added", output_index=0, item=draft.message("in_progress")))
    yield _sse(draft.event("response.content_part.added", **where, part=draft.part()))
    usage, finish_reason = Usage(0, 0), None
    async for chunk in stream:
        draft.reasoning += chunk.reasoning  # reported in the final response's output
        if chunk.text:
            draft.text += chunk.text
            yield _sse(draft.event("response.output_text.delta", **where, delta=chunk.text, logprobs=[]))
        usage, finish_reason = chunk.usage or usage, chunk.finish_reason or finish_reason
    await stream.aclose()  # the turn goes back before the last event, so its timing is final
    yield _sse(draft.event("response.output_text.done", **where, text=draft.text, logprobs=[]))
    yield _sse(draft.event("response.content_part.done", **where, part=draft.part()))
    status = status_of(finish_reason)
    done_item = draft.message("incomplete" if status == "incomplete" else "completed")
    yield _sse(draft.event("response.output_item.done", output_index=0, item=done_item))
    final = finish(usage, finish_reason)
    kind = "response.completed" if status == "completed" else "response.incomplete"
    yield _sse(draft.event(kind, response=final))


def _history(store: ResponseStore, body: ResponsesBody) -> list[ChatMessage]:
    if body.previous_response_id is None:
        return []
    previous = store.get(body.previous_response_id)
    if previous is None:
        raise InvalidRequest(
            f"no stored response '{body.previous_response_id}' (it was never stored, or it was dropped: "
            f"the store keeps the last {store.size})",
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
