"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on every
chat model of the pool, so Anthropic's SDKs and the agents built on them (pointed here by
ANTHROPIC_BASE_URL) work unchanged. Errors on these paths are in Anthropic's shape
(`wire.errors.shaped_error`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import charged, meter_of, metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.limits import limits_of
from modelpool.api.sse import EventStreamResponse
from modelpool.errors import ContextLengthExceeded, InvalidRequest
from modelpool.inference import ChatRequest, GenerationChunk, SamplingParams
from modelpool.pool_api import PoolApi, PoolRequests
from modelpool.pool_api.call import CallOptions
from modelpool.pool_api.generation import collect
from modelpool.pool_api.results import TokenizeJob, charge
from modelpool.pool_api.streams import ResultStream
from modelpool.pool_api.usage import UsageMeter
from modelpool.tasks import Task
from modelpool.wire.anthropic.events import MessageMeta, message_chunks, message_json, with_error_events
from modelpool.wire.anthropic.messages import ConversationBody, MessagesBody
from modelpool.wire.contract import MODEL_LIMITS, POOL_ERRORS, SSE, declared, sse_events
from modelpool.wire.sizes import translated

router = APIRouter(responses=declared(POOL_ERRORS, shape="anthropic", rules=(
    MODEL_LIMITS, "user and system turns have non-empty content", "no last assistant turn (a prefill)",
    "a tool_result answers a tool_use made before it")))


@router.post("/v1/messages", response_model=None, responses=declared(media={SSE: sse_events()}))
async def create_message(body: MessagesBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    sampling = body.sampling()
    chat = await translated(limits_of(request), body.to_request, sampling, streamed=body.stream)
    stream, capped = await unless_disconnected(request, _open(pool, body.model, chat, body.call_options()))
    charged(request, stream)
    meta = MessageMeta(stream.model_id)
    if body.stream:

        async def end() -> dict[str, Any]:
            await stream.aclose()  # the turn goes back before the last event, so its timing is final
            return metrics_field(request, body.return_metrics, stream.timing)

        events = message_chunks(stream, meta, body.shows_thinking(), capped, end)
        # Errors are Anthropic `error` events already, so the OpenAI fallback never runs.
        return EventStreamResponse(with_error_events(events), on_close=stream.aclose)
    async with stream:
        generation = await unless_disconnected(request, collect(stream))
    if capped and generation.finish_reason == "length":
        generation = replace(generation, finish_reason="context_full")
    extra = metrics_field(request, body.return_metrics, stream.timing)
    return JSONResponse(message_json(meta, generation, body.shows_thinking(), **extra))


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: ConversationBody, request: Request) -> dict[str, int]:
    note_model(request, body.model)
    sampling = SamplingParams(max_tokens=1, temperature=0.0)
    chat = await translated(limits_of(request), body.to_request, sampling, streamed=False)
    counting = _prompt_tokens(pool_of(request), body.model, chat, body.call_options(), meter_of(request))
    count = await unless_disconnected(request, counting)
    return {"input_tokens": count}


async def _prompt_tokens(
    pool: PoolApi, model: str, chat: ChatRequest, options: CallOptions, meter: UsageMeter | None
) -> int:
    """The tokens of the prompt a real call would feed the model (its `usage.input_tokens`).
    By the model's tokenizer, which renders the chat template with the tools and template
    variables as generation does, when it has one; else (images, whose tokens the projector
    makes at generation time; upstreams, whose tokenizer is not here) by running the prompt
    with max_tokens=1 and reading the usage the engine reports: dearer, but exact."""
    capabilities = pool.status(model).capabilities
    text_only = not any(message.images for message in chat.messages)
    if Task.CHAT in capabilities.tasks and capabilities.declared.tokenizer and text_only:
        tokenized = await pool.tokenize(model, TokenizeJob(chat=chat), options)
        charge(meter, tokenized)
        return len(tokenized.value.ids)
    async with await pool.chat(model, chat, options) as stream:
        charge(meter, stream)
        generation = await collect(stream)
    if generation.usage.prompt_tokens <= 0:  # an upstream that reports no usage
        raise InvalidRequest(f"model '{model}' does not report its prompt's token count", param="model")
    return generation.usage.prompt_tokens


async def _open(
    pool: PoolRequests, model: str, chat: ChatRequest, options: CallOptions
) -> tuple[ResultStream[GenerationChunk], bool]:
    """The generation, and whether `max_tokens` was capped to the room the context has left.
    Anthropic's clients treat max_tokens as a ceiling and set it high (agents send 32000);
    where the pool refuses one past the model's context, ask for "until the context is
    full" instead, which is less than that ceiling."""
    try:
        return await pool.chat(model, chat, options), False
    except ContextLengthExceeded as exc:
        if exc.param != "max_tokens":
            raise  # the prompt itself does not fit
    uncapped = replace(chat, sampling=replace(chat.sampling, max_tokens=None))
    return await pool.chat(model, uncapped, options), True
