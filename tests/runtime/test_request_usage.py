"""What a request used is counted as it goes and returned with its results: a generation cut
off midway (a client that hung up on a stream, a cancelled whole reply) is charged its
prompt and the output it produced, and the pool's long-lived tasks (a batcher's worker, a
load started by a request) never carry the request that happened to start them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from modelpool import tracing
from modelpool.inference import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    GenerationChunk,
    Usage,
)
from modelpool.logs import current_request_id
from modelpool.pool_api.generation import collect
from modelpool.pool_api.results import charge
from modelpool.pool_api.results import charged as charged_call
from modelpool.pool_api.usage import RequestUsage, UsageMeter
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.tasks import Task
from tests.fakes import FakeBackend, fake_slot, pool_of
from tests.polling import until

T = TypeVar("T")
REQUEST = ChatRequest((ChatMessage("user", "hi"),))
PROMPT_TOKENS = 7


class Stalling(FakeBackend):
    """Says its prompt's size at admission, generates three chunks of two tokens each, then
    hangs (until its consumer leaves). Completions: two tokens a chunk, the usage at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = asyncio.Event()

    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        yield GenerationChunk(prompt_tokens=PROMPT_TOKENS)
        for word in ("one ", "two ", "three "):
            yield GenerationChunk(word, token_count=2)
        self.stalled.set()
        await asyncio.Event().wait()  # never set: only cancellation ends it
        yield GenerationChunk(finish_reason="stop", usage=Usage(PROMPT_TOKENS, 6))

    async def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        yield GenerationChunk(prompt_tokens=PROMPT_TOKENS)
        yield GenerationChunk("a b", token_count=2)
        yield GenerationChunk(" c", token_count=1, finish_reason="length", usage=Usage(PROMPT_TOKENS, 3))


class Caller:
    """A caller that charges what each of its pool calls returns to its meter, as the API's
    routes do; `usage` is the meter's total so far."""

    def __init__(self) -> None:
        self.meter = UsageMeter()

    async def call(self, work: Awaitable[T]) -> T:
        return charged(self.meter, await work)

    @property
    def usage(self) -> RequestUsage:
        return self.meter.total()


def charged(meter: UsageMeter, result: T) -> T:
    charge(meter, result)
    return result


def as_caller(caller: Caller, work: Callable[[], Coroutine[Any, Any, T]]) -> asyncio.Task[T]:
    """`work` in a task of its own."""
    return asyncio.create_task(work())


def counted(metrics: Metrics, model: str = "fake") -> tuple[float, float]:
    text = metrics.render().decode()

    def value(name: str) -> float:
        line = next((line for line in text.splitlines() if line.startswith(f'{name}{{model="{model}"}}')), None)
        return float(line.rsplit(" ", 1)[1]) if line else 0.0

    return value("modelpool_input_tokens_total"), value("modelpool_output_tokens_total")


async def test_a_cancelled_whole_reply_counts_its_prompt_and_the_output_so_far() -> None:
    backend, metrics = Stalling(), Metrics()
    pool = pool_of(fake_slot(backend, metrics=metrics))
    caller = Caller()

    async def whole_reply() -> object:
        stream = await caller.call(pool.chat("fake", REQUEST))
        async with stream:
            return await collect(stream)

    task = as_caller(caller, whole_reply)
    await until(backend.stalled.is_set, "the generation to stall")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    usage = caller.usage
    assert (usage.input_tokens, usage.output_tokens) == (PROMPT_TOKENS, 6)
    assert counted(metrics) == (PROMPT_TOKENS, 6)


class StallingCompletions(FakeBackend):
    """A completion that says its prompt, makes two tokens, then hangs until cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = asyncio.Event()

    async def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        yield GenerationChunk(prompt_tokens=PROMPT_TOKENS)
        yield GenerationChunk("a b", token_count=2)
        self.stalled.set()
        await asyncio.Event().wait()  # never set: only cancellation ends it
        yield GenerationChunk(finish_reason="stop", usage=Usage(PROMPT_TOKENS, 2))


async def test_a_cancelled_whole_batch_is_charged_what_it_used() -> None:
    """A whole result (an `Outcome`) whose caller leaves midway: the cancellation carries what
    the batch used back to the caller's meter, as a failure's error does."""
    backend, metrics = StallingCompletions(), Metrics()
    pool = pool_of(fake_slot(backend, metrics=metrics, tasks=frozenset({Task.COMPLETION})))
    meter = UsageMeter()
    task = asyncio.create_task(charged_call(meter, pool.generate_all("fake", [CompletionRequest("x")])))
    await until(backend.stalled.is_set, "the generation to stall")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    usage = meter.total()
    assert (usage.input_tokens, usage.output_tokens) == (PROMPT_TOKENS, 2)
    assert counted(metrics) == (PROMPT_TOKENS, 2)


async def test_a_stream_closed_early_counts_its_prompt_and_the_output_so_far() -> None:
    backend, metrics = Stalling(), Metrics()
    pool = pool_of(fake_slot(backend, metrics=metrics))
    caller = Caller()
    seen: list[tuple[int, int]] = []

    async def read_two_then_leave() -> None:
        stream = await caller.call(pool.chat("fake", REQUEST))
        seen.append((caller.usage.input_tokens, caller.usage.output_tokens))  # admitted: the prompt is known
        await anext(stream)
        await anext(stream)
        seen.append((caller.usage.input_tokens, caller.usage.output_tokens))  # as the chunks pass
        await stream.aclose()
        seen.append((stream.timing.prompt_tokens, stream.timing.output_tokens))

    await as_caller(caller, read_two_then_leave)
    usage = caller.usage
    assert seen == [(PROMPT_TOKENS, 0), (PROMPT_TOKENS, 2), (PROMPT_TOKENS, 2)]
    assert (usage.input_tokens, usage.output_tokens) == (PROMPT_TOKENS, 2)
    assert counted(metrics) == (PROMPT_TOKENS, 2)


async def test_finished_generations_count_their_usage_once() -> None:
    metrics = Metrics()
    pool = pool_of(fake_slot(Stalling(), metrics=metrics, tasks=frozenset({Task.COMPLETION})))
    caller = Caller()

    async def two_ways() -> None:
        stream = await caller.call(pool.complete("fake", [CompletionRequest("x"), CompletionRequest("y")]))
        async with stream:
            assert [chunk async for _, chunk in stream][-1].usage == Usage(PROMPT_TOKENS, 3)
        assert (stream.timing.prompt_tokens, stream.timing.output_tokens) == (2 * PROMPT_TOKENS, 6)
        await caller.call(
            pool.generate_all("fake", [CompletionRequest("x"), CompletionRequest("y"), CompletionRequest("z")])
        )

    await as_caller(caller, two_ways)
    usage = caller.usage
    assert (usage.input_tokens, usage.output_tokens) == (5 * PROMPT_TOKENS, 15)
    assert counted(metrics) == (5 * PROMPT_TOKENS, 15)


class Recorder:
    """A tracer whose spans record nothing: there only to be seen (or not) from other tasks."""

    def start_span(self, name: str, attributes: Mapping[str, tracing.AttributeValue]) -> tracing.Span:
        return Silent()


class Silent:
    def set_attribute(self, key: str, value: tracing.AttributeValue) -> None:
        return None

    def record_error(self, error: BaseException) -> None:
        return None

    def end(self) -> None:
        return None


class ContextSpy(FakeBackend):
    """Records the request usage and tracer seen by its loads and its batched engine calls."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_at_start: list[tuple[str | None, bool]] = []
        self.seen_in_batches: list[tuple[str | None, bool]] = []

    async def start(self) -> None:
        self.seen_at_start.append(_context())
        await super().start()

    async def embed_tokens(self, ids: list[list[int]]) -> npt.NDArray[np.float32]:
        self.seen_in_batches.append(_context())
        return await super().embed_tokens(ids)


def _context() -> tuple[str | None, bool]:
    """The request (its id) and the tracer a piece of work runs in (None: no request)."""
    request = current_request_id.get()
    return (None if request == "-" else request), tracing.start_span("probe", {}) is not tracing.NO_SPAN


def traced_as_caller(caller: Caller, work: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
    async def traced() -> T:
        current_request_id.set(f"request-{id(caller)}")  # the task's own copy of the context
        with tracing.traced_by(Recorder()):
            return await caller.call(work())

    return as_caller(caller, traced)


async def test_a_batched_embedding_is_charged_to_each_caller_not_the_first() -> None:
    backend = ContextSpy()
    slot = fake_slot(backend, tasks=frozenset({Task.EMBEDDING}), batch={"window_ms": 50})
    pool = pool_of(slot)
    await slot.ensure_ready(None)
    first, second = Caller(), Caller()
    inputs = {"first": ("a", "bb", "ccc"), "second": ("dddd",)}
    tasks = [
        traced_as_caller(first, lambda: pool.embed("fake", EmbeddingRequest(inputs["first"]))),
        traced_as_caller(second, lambda: pool.embed("fake", EmbeddingRequest(inputs["second"]))),
    ]
    await asyncio.gather(*tasks)
    assert backend.embed_calls == [4], "both requests in one engine call"
    assert backend.seen_in_batches == [(None, False)], "the batcher's worker runs outside any request"
    assert (first.usage.input_tokens, second.usage.input_tokens) == (3, 1)  # each caller its own inputs' tokens
    await pool.close()


async def test_a_load_a_request_starts_runs_outside_that_request() -> None:
    backend = ContextSpy()
    slot = fake_slot(backend, tasks=frozenset({Task.EMBEDDING}))
    pool = pool_of(slot)
    caller = Caller()
    await traced_as_caller(caller, lambda: pool.embed("fake", EmbeddingRequest(("abc",))))
    usage = caller.usage
    assert backend.seen_at_start == [(None, False)], "the load task does not carry the request that started it"
    assert usage.input_tokens == 1
    await pool.close()
