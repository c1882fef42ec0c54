"""POST /loglikelihood, POST /generate and POST /generate_stream: the batch endpoints
evaluation harnesses want.
A body without `model` (the HRM serving contract's v1 bodies) goes to the server's default
model for the task, or the only one that does it (`PoolLookup.model_for`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import note_model, pool_of, unless_disconnected
from modelpool.api.limits import limits_of
from modelpool.api.sse import EventStreamResponse
from modelpool.tasks import Task
from modelpool.wire.contract import MODEL_LIMITS, MODEL_OPTIONAL, POOL_ERRORS, SSE, declared, sse_events
from modelpool.wire.openai.scoring import (
    GenerateBody,
    GenerateStreamBody,
    LoglikelihoodBody,
    generate_json,
    generate_stream_events,
    loglikelihood_json,
)
from modelpool.wire.sizes import translated

router = APIRouter(responses=declared(POOL_ERRORS))
# Each route lists its own rules: a router's would be listed on every route it holds.
GENERATE_RULES = (MODEL_LIMITS, MODEL_OPTIONAL)


@router.post("/loglikelihood", responses=declared(rules=(
    *GENERATE_RULES, "as many continuations as prompts")))
async def loglikelihood(body: LoglikelihoodBody, request: Request) -> JSONResponse:
    pool = pool_of(request)
    model = pool.model_for(body.model, Task.SCORING)
    note_model(request, model)
    pairs = list(zip(body.prompts, body.continuations, strict=True))
    results = (await unless_disconnected(request, pool.loglikelihood(model, pairs, body.call_options()))).value
    return JSONResponse(loglikelihood_json(pool.model_id(model), results))


@router.post("/generate", responses=declared(rules=GENERATE_RULES))
async def generate(body: GenerateBody, request: Request) -> JSONResponse:
    pool = pool_of(request)
    model = pool.model_for(body.model, Task.COMPLETION)
    note_model(request, model)
    requests = await translated(limits_of(request), body.to_requests)
    results = (await unless_disconnected(request, pool.generate_all(model, requests, body.call_options()))).value
    return JSONResponse(generate_json(pool.model_id(model), results))


@router.post("/generate_stream", response_model=None, response_class=Response,  # SSE only, never JSON
             responses=declared(media={SSE: sse_events()}, rules=GENERATE_RULES))  # fmt: skip
async def generate_stream(body: GenerateStreamBody, request: Request) -> EventStreamResponse:
    """`/generate`'s body, streamed as server-sent events (`wire.openai.scoring`); a client
    that leaves stops the generation within a token, as on every stream."""
    pool = pool_of(request)
    model = pool.model_for(body.model, Task.COMPLETION)
    note_model(request, model)
    requests = await translated(limits_of(request), body.to_requests)
    stream = await unless_disconnected(request, pool.complete(model, requests, body.call_options()))
    events = generate_stream_events(stream, stream.model_id, stream.aclose)
    return EventStreamResponse(events, on_close=stream.aclose)
