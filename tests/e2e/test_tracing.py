"""OpenTelemetry traces of real requests (SmolLM2 chat, MiniLM embeddings), caught by the
SDK's in-memory exporter through the app's `tracer_provider` hook."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, cast

import httpx
import openai
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util.types import AnyValue

from modelpool.config import load_config
from modelpool.server.app import create_app
from tests.conftest import BASE_URL, CHAT_MODEL, EMBED_MODEL, sdk
from tests.live_server import live_server
from tests.polling import until

SAY_OK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say OK."}]
Attrs = Mapping[str, AnyValue]
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


def traced_app(exporter: InMemorySpanExporter, models: list[str]) -> tuple[FastAPI, TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # exported as each span ends
    config = load_config(None, cli={"enabled_models": models}, environ={})
    return create_app(config, tracer_provider=provider), provider


@pytest.fixture(scope="module")
async def http(exporter: InMemorySpanExporter) -> AsyncIterator[httpx.AsyncClient]:
    app, provider = traced_app(exporter, [CHAT_MODEL, EMBED_MODEL])
    async with LifespanManager(app, startup_timeout=60, shutdown_timeout=60):
        for slot in app.state.pool.slots():
            await slot.ensure_ready(None)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=120) as client:
            yield client
    provider.shutdown()


@pytest.fixture
def oai(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return sdk(http)


def spans_of(exporter: InMemorySpanExporter, request_id: str) -> dict[str, ReadableSpan]:
    """The spans of the trace whose server span carries `request_id`, by name ('server' for it)."""
    finished = exporter.get_finished_spans()
    servers = [s for s in finished if s.kind is SpanKind.SERVER]
    # cast: the SDK's spans always carry attributes (empty at worst); its type says "or None".
    server = next(s for s in servers if cast(Attrs, s.attributes)["modelpool.request_id"] == request_id)
    trace_id = server.context.trace_id
    found = {s.name: s for s in finished if s.context.trace_id == trace_id and s is not server}
    assert len(found) == len([s for s in finished if s.context.trace_id == trace_id]) - 1, "one span of each kind"
    return {"server": server, **found}


async def traced(exporter: InMemorySpanExporter, request_id: str) -> dict[str, ReadableSpan]:
    """Wait for the request's server span (it ends once the response is sent), then its trace."""

    def ended() -> bool:
        spans = exporter.get_finished_spans()
        return any(cast(Attrs, s.attributes).get("modelpool.request_id") == request_id for s in spans)

    await until(ended, f"the server span of request {request_id}", timeout_s=30)
    return spans_of(exporter, request_id)


def assert_tree(spans: dict[str, ReadableSpan]) -> tuple[ReadableSpan, ReadableSpan, ReadableSpan]:
    """server → (queue, then backend): one trace, both children of the server span, each
    inside it in time, the turn taken (queue ended) before the backend's work starts."""
    server, queue, backend = spans["server"], spans["modelpool.queue"], spans["modelpool.backend"]
    assert set(spans) == {"server", "modelpool.queue", "modelpool.backend"}
    assert queue.context.trace_id == backend.context.trace_id == server.context.trace_id
    assert queue.parent is not None and queue.parent.span_id == server.context.span_id
    assert backend.parent is not None and backend.parent.span_id == server.context.span_id
    assert server.start_time is not None and server.end_time is not None
    assert queue.start_time is not None and queue.end_time is not None
    assert backend.start_time is not None and backend.end_time is not None
    assert server.start_time <= queue.start_time <= queue.end_time <= backend.start_time
    assert backend.end_time <= server.end_time
    assert queue.kind is backend.kind is SpanKind.INTERNAL
    return server, queue, backend


async def test_chat_is_one_trace_server_queue_backend_with_tokens_and_request_id(
    oai: openai.AsyncOpenAI, exporter: InMemorySpanExporter
) -> None:
    raw = await oai.chat.completions.with_raw_response.create(
        model=CHAT_MODEL, messages=SAY_OK, max_tokens=8, extra_body={"return_metrics": True}
    )
    reply = raw.parse()
    server, queue, backend = assert_tree(await traced(exporter, raw.headers["x-request-id"]))
    assert server.name == "POST /v1/chat/completions"
    assert server.parent is None  # no traceparent sent: a new trace
    assert server.attributes is not None
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.route"] == "/v1/chat/completions"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gen_ai.request.model"] == CHAT_MODEL
    assert server.status.status_code is StatusCode.UNSET
    assert queue.attributes is not None and backend.attributes is not None
    assert queue.attributes["gen_ai.request.model"] == backend.attributes["gen_ai.request.model"] == CHAT_MODEL
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    assert backend.attributes["gen_ai.usage.input_tokens"] == reply.usage.prompt_tokens
    assert backend.attributes["gen_ai.usage.output_tokens"] == reply.usage.completion_tokens
    replica = json.loads(raw.text)["metrics"]["replica"]
    assert backend.attributes["modelpool.replica"] == queue.attributes["modelpool.replica"] == replica


async def test_a_given_request_id_is_on_the_server_span(
    http: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    body = {"model": EMBED_MODEL, "input": ["a red fox", "a blue whale"]}
    reply = await http.post("/v1/embeddings", json=body, headers={"X-Request-ID": "trace-embed-1"})
    assert reply.status_code == 200, reply.text
    server, _, backend = assert_tree(await traced(exporter, "trace-embed-1"))
    assert server.name == "POST /v1/embeddings"
    assert backend.attributes is not None
    assert backend.attributes["gen_ai.request.model"] == EMBED_MODEL
    assert backend.attributes["gen_ai.usage.input_tokens"] == reply.json()["usage"]["prompt_tokens"]
    assert backend.attributes["gen_ai.usage.output_tokens"] == 0


async def test_streamed_chat_spans_end_with_the_stream(oai: openai.AsyncOpenAI, exporter: InMemorySpanExporter) -> None:
    async with oai.chat.completions.with_streaming_response.create(
        model=CHAT_MODEL, messages=SAY_OK, max_tokens=8, stream=True, stream_options={"include_usage": True}
    ) as raw:
        request_id = raw.headers["x-request-id"]
        chunks = [chunk async for chunk in await raw.parse()]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    server, _, backend = assert_tree(await traced(exporter, request_id))
    assert server.attributes is not None
    assert server.attributes["http.response.status_code"] == 200
    assert backend.attributes is not None
    assert backend.attributes["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert backend.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens


async def test_a_callers_traceparent_is_continued(oai: openai.AsyncOpenAI, exporter: InMemorySpanExporter) -> None:
    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    raw = await oai.chat.completions.with_raw_response.create(
        model=CHAT_MODEL, messages=SAY_OK, max_tokens=4, extra_headers=headers
    )
    server, _, _ = assert_tree(await traced(exporter, raw.headers["x-request-id"]))  # the tree: one trace id
    assert format(server.context.trace_id, "032x") == CALLER_TRACE
    assert server.parent is not None and format(server.parent.span_id, "016x") == CALLER_SPAN
    assert server.parent.is_remote


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "no-such-model", "messages": SAY_OK}, 404),
        ({"model": CHAT_MODEL, "messages": SAY_OK, "temperature": "hot"}, 400),
    ],
    ids=["unknown-model", "bad-field"],
)
async def test_a_refused_request_has_a_server_span_and_no_model_work(
    http: httpx.AsyncClient, exporter: InMemorySpanExporter, body: dict[str, Any], status: int
) -> None:
    reply = await http.post("/v1/chat/completions", json=body)
    assert reply.status_code == status, reply.text
    spans = await traced(exporter, reply.headers["x-request-id"])
    assert set(spans) == {"server"}, "no queue or backend span for a request the model never saw"
    server = spans["server"]
    assert server.name == "POST /v1/chat/completions"
    assert server.attributes is not None
    assert server.attributes["http.response.status_code"] == status
    assert server.status.status_code is StatusCode.UNSET  # a 4xx is the client's error


async def test_a_stream_cut_off_by_its_client_ends_its_spans() -> None:
    exporter = InMemorySpanExporter()  # its own: shutting its provider down stops the exporter too
    app, provider = traced_app(exporter, [CHAT_MODEL])
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 2000,
        "ignore_eos": True,  # it would run for seconds: only the client leaving ends it early
        "stream": True,
    }
    async with live_server(app) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
        await app.state.pool.slot(CHAT_MODEL).ensure_ready(None)
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            assert reply.status_code == 200
            request_id = reply.headers["x-request-id"]
            async for line in reply.aiter_lines():
                if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                    break  # the first generated text: now hang up
        spans = await traced(exporter, request_id)
    provider.shutdown()
    server, _, backend = assert_tree(spans)
    assert server.attributes is not None
    assert server.attributes["http.response.status_code"] == 200
    # Cut off before the usage came: counted as it went, the prompt at admission, the output chunk by chunk.
    assert backend.attributes is not None
    # cast: the server records token counts as ints (the attribute type allows any OTel value).
    assert cast(int, backend.attributes["gen_ai.usage.input_tokens"]) > 0
    assert 0 < cast(int, backend.attributes["gen_ai.usage.output_tokens"]) < 2000
