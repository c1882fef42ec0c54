"""The runtime's spans through the tracing facade, with fake backends and a recording
tracer (no OpenTelemetry): what the queue and backend spans carry, when they end, and
how failures show."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field

import pytest

from modelpool import tracing
from modelpool.errors import Overloaded
from modelpool.inference import ChatMessage, ChatRequest, EmbeddingRequest, GenerationChunk
from modelpool.pool_api.generation import collect
from modelpool.tasks import Task
from tests.fakes import FakeBackend, fake_slot, pool_of

REQUEST = ChatRequest((ChatMessage("user", "one two three"),))


@dataclass
class Recorded:
    name: str
    attributes: dict[str, tracing.AttributeValue]
    errors: list[BaseException] = field(default_factory=list)
    ends: int = 0

    def set_attribute(self, key: str, value: tracing.AttributeValue) -> None:
        self.attributes[key] = value

    def record_error(self, error: BaseException) -> None:
        self.errors.append(error)

    def end(self) -> None:
        self.ends += 1


class Recorder:
    def __init__(self) -> None:
        self.spans: list[Recorded] = []

    def start_span(self, name: str, attributes: Mapping[str, tracing.AttributeValue]) -> tracing.Span:
        self.spans.append(Recorded(name, dict(attributes)))
        return self.spans[-1]

    def named(self, name: str) -> list[Recorded]:
        return [span for span in self.spans if span.name == name]


class FailingMidStream(FakeBackend):
    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        yield GenerationChunk()
        yield GenerationChunk("one ")
        raise RuntimeError("the engine fell over")


def test_without_a_tracer_spans_are_no_ops() -> None:
    recorder = Recorder()
    with tracing.traced_by(recorder), tracing.span("inside", {}) as inside:
        inside.set_attribute("k", 0)
    with tracing.span("outside", {}) as span:  # the tracer is gone once its block ends
        span.set_attribute("k", 1)
    assert span is tracing.NO_SPAN
    assert [(s.name, s.attributes, s.ends) for s in recorder.spans] == [("inside", {"k": 0}, 1)]


async def test_a_chat_has_a_queue_span_then_a_backend_span_ended_with_its_tokens() -> None:
    recorder = Recorder()
    pool = pool_of(fake_slot(FakeBackend(), "m1"))
    with tracing.traced_by(recorder):
        stream = await pool.chat("m1", REQUEST)
        [backend] = recorder.named("modelpool.backend")
        assert backend.ends == 0, "the turn is still held by the open stream"
        await collect(stream)
    [queue] = recorder.named("modelpool.queue")
    assert [s.name for s in recorder.spans] == ["modelpool.queue", "modelpool.backend"]
    assert queue.ends == backend.ends == 1 and not queue.errors and not backend.errors
    assert queue.attributes == {tracing.MODEL: "m1", tracing.REPLICA: 0, "modelpool.load_wait_s": 0.0}
    usage = {tracing.INPUT_TOKENS: 3, tracing.OUTPUT_TOKENS: 3}  # the fake's Usage(words, words)
    assert backend.attributes == {tracing.MODEL: "m1", tracing.REPLICA: 0, **usage}


async def test_embeddings_count_their_input_tokens_on_the_backend_span() -> None:
    recorder = Recorder()
    pool = pool_of(fake_slot(FakeBackend(), "e1", tasks=frozenset({Task.EMBEDDING})))
    with tracing.traced_by(recorder):
        result = (await pool.embed("e1", EmbeddingRequest(("a", "bb", "ccc")))).value
    [backend] = recorder.named("modelpool.backend")
    assert backend.attributes[tracing.INPUT_TOKENS] == result.prompt_tokens == 3
    assert backend.attributes[tracing.OUTPUT_TOKENS] == 0 and backend.ends == 1


async def test_a_full_queue_fails_the_queue_span_and_starts_no_backend_span() -> None:
    recorder = Recorder()
    pool = pool_of(fake_slot(FakeBackend(), "m1", max_concurrency=1, max_queue=0))
    holder = await pool.chat("m1", REQUEST)  # untraced: takes the only turn
    with tracing.traced_by(recorder), pytest.raises(Overloaded):
        await pool.chat("m1", REQUEST)
    await holder.aclose()
    [queue] = recorder.spans
    assert queue.name == "modelpool.queue" and queue.ends == 1
    assert [type(e) for e in queue.errors] == [Overloaded]


async def test_a_failure_mid_stream_fails_the_backend_span() -> None:
    recorder = Recorder()
    pool = pool_of(fake_slot(FailingMidStream(), "m1"))
    with tracing.traced_by(recorder), pytest.raises(RuntimeError, match="fell over"):
        await collect(await pool.chat("m1", REQUEST))
    [backend] = recorder.named("modelpool.backend")
    assert [str(e) for e in backend.errors] == ["the engine fell over"] and backend.ends == 1


async def test_a_cancelled_stream_ends_its_backend_span_without_an_error() -> None:
    recorder = Recorder()
    step = asyncio.Event()  # never set: the generation waits before its first word
    pool = pool_of(fake_slot(FakeBackend(step=step), "m1"))
    with tracing.traced_by(recorder):
        stream = await pool.chat("m1", REQUEST)
        reading = asyncio.create_task(collect(stream))
        await asyncio.sleep(0)  # the reader starts, and waits on the step
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
    [backend] = recorder.named("modelpool.backend")
    assert backend.ends == 1 and backend.errors == []
