"""Tracing as the runtime sees it: spans started by name, no-ops unless a tracer is set.

The runtime marks its steps (the queue, the backend's work) without knowing OpenTelemetry:
`span(...)` and `start_span(...)` ask the tracer of the current context, which the API's
tracing middleware sets for each request (`traced_by`) when `server.otel_endpoint` is set.
Without one — tracing off, or the pool used as a library — every span is `NO_SPAN`, and
nothing here imports OpenTelemetry. The tracer lives in a context variable, as the request
id does: asyncio copies it into the tasks a request starts, and requests never share it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Protocol

AttributeValue = str | bool | int | float

MODEL = "gen_ai.request.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
REPLICA = "modelpool.replica"


class Span(Protocol):
    def set_attribute(self, key: str, value: AttributeValue) -> None: ...

    def record_error(self, error: BaseException) -> None:
        """Mark the span failed by `error` (its type and message)."""

    def end(self) -> None:
        """Finish the span (later calls do nothing)."""


class Tracer(Protocol):
    def start_span(self, name: str, attributes: Mapping[str, AttributeValue]) -> Span:
        """A span, child of the current context's span, not made current itself."""


class _NoSpan:
    def set_attribute(self, key: str, value: AttributeValue) -> None:
        return None

    def record_error(self, error: BaseException) -> None:
        return None

    def end(self) -> None:
        return None


NO_SPAN: Span = _NoSpan()
_tracer: ContextVar[Tracer | None] = ContextVar("modelpool_tracer", default=None)


def start_span(name: str, attributes: Mapping[str, AttributeValue]) -> Span:
    """A span the caller ends (one that outlives a block: a stream's backend work)."""
    tracer = _tracer.get()
    return NO_SPAN if tracer is None else tracer.start_span(name, attributes)


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, AttributeValue]) -> Iterator[Span]:
    """A span over the block; an exception leaving it marks the span failed. Cancellation
    is not a failure (a client that left), so it only ends the span."""
    started = start_span(name, attributes)
    try:
        yield started
    except Exception as exc:
        started.record_error(exc)
        raise
    finally:
        started.end()


@contextlib.contextmanager
def traced_by(tracer: Tracer) -> Iterator[None]:
    """Spans started in this block (and in the tasks it starts) go to `tracer`."""
    token = _tracer.set(tracer)
    try:
        yield
    finally:
        _tracer.reset(token)
