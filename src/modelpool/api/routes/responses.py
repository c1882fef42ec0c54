"""POST /v1/responses: OpenAI's Responses API on every chat-capable model: text, function
tools (`function_call` items out, `function_call_output` items in) and `text.format`."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import StringConstraints

from modelpool.api.deps import metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.limits import limits_of
from modelpool.api.sse import EventStreamResponse
from modelpool.errors import ObjectNotFound, ResponseNotFound
from modelpool.inference import ChatMessage, Usage
from modelpool.owner import Owner, owner_of
from modelpool.pool_api.generation import collect
from modelpool.pool_api.responses import ResponseStorage, StoredResponse
from modelpool.wire.contract import MODEL_LIMITS, POOL_ERRORS, SSE, declared, sse_events
from modelpool.wire.openai.response_draft import ResponseDraft, status_of
from modelpool.wire.openai.response_events import error_events, response_events
from modelpool.wire.openai.responses import ResponsesBody
from modelpool.wire.sizes import translated
from modelpool.wire.tools import check_tool_results

ResponseId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
"""A response id as ours look (`resp_…`): anything else is no id of ours."""
router = APIRouter(responses=declared(POOL_ERRORS, media={SSE: sse_events()}, rules=(  # JSON, or SSE with `stream`
    MODEL_LIMITS, "exactly one of input or messages", "messages end with a user message",
    "a function_call_output answers a call made before it")))


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesBody, request: Request) -> Response:
    note_model(request, body.model)
    pool, store, owner = pool_of(request), store_of(request), owner_of(request.scope)
    history = _history(store, body, owner)
    said = [*history, *body.new_messages()]
    check_tool_results(said, lambda index: f"input[{index - len(history)}].call_id")
    sampling = body.sampling()
    tool_fields = await translated(limits_of(request), body.tool_fields)
    chat = body.to_request(said, sampling, tool_fields)
    stream = await unless_disconnected(request, pool.chat(body.model, chat, body.call_options()))
    draft = ResponseDraft(body, chat, stream.model_id, int(time.time()))

    def finish(usage: Usage, finish_reason: str | None) -> dict[str, Any]:
        metrics = metrics_field(request, True, stream.timing)
        response = draft.response(status_of(finish_reason), usage, finish_reason, **metrics)
        if body.store:
            answer = ChatMessage("assistant", draft.text, tool_calls=tuple(c.call() for c in draft.calls))
            store.put(draft.id, StoredResponse(draft.model, (*said, answer), owner.name, response))
        return response

    if body.stream:
        events = response_events(stream, draft, stream.aclose, finish)
        return EventStreamResponse(events, on_close=stream.aclose, on_error=error_events)
    async with stream:
        generation = await unless_disconnected(request, collect(stream))
    draft.take(generation)
    return JSONResponse(finish(generation.usage, generation.finish_reason))


@router.get("/v1/responses/{response_id}", responses=declared((400, 404)))
async def retrieve_response(response_id: ResponseId, request: Request) -> JSONResponse:
    """A stored response as it was returned (the key's own; the admin scope reads all)."""
    found = store_of(request).get(response_id, owner_of(request.scope))
    if found is None or found.response is None:
        raise _not_stored(response_id)
    return JSONResponse(dict(found.response))


@router.delete("/v1/responses/{response_id}", responses=declared((400, 404)))
async def delete_response(response_id: ResponseId, request: Request) -> JSONResponse:
    """Forget a stored response (a conversation may hold what the user would not keep)."""
    if not store_of(request).delete(response_id, owner_of(request.scope)):
        raise _not_stored(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _not_stored(response_id: str) -> ObjectNotFound:
    """One answer whether it never existed, was dropped or is another key's."""
    return ObjectNotFound(f"Response with id '{response_id}' not found.", param="response_id")


def _history(store: ResponseStorage, body: ResponsesBody, owner: Owner) -> list[ChatMessage]:
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


def store_of(request: Request) -> ResponseStorage:
    store: ResponseStorage = request.app.state.responses
    return store
