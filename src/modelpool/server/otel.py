"""OpenTelemetry for the API: one SERVER span per HTTP request, the runtime's `Tracer` on
an OpenTelemetry tracer, and the OTLP/HTTP exporter `server.otel_endpoint` names.

Imported only when tracing is on (`server.tracing.install_tracing`), so a server without it
never loads OpenTelemetry. The provider is passed in, never set globally: two apps in one
process (tests) each keep their own spans.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelpool import __version__, tracing
from modelpool.server.asgi import route_template
from modelpool.server.ratelimit import REFUSED_LIMIT

REQUEST_ID = "modelpool.request_id"
RATE_LIMITED = "modelpool.rate_limited"
"""On a request the rate limit refused: the limit, `requests` or `tokens`."""
_W3C = TraceContextTextMapPropagator()


def otlp_provider(endpoint: str, service_name: str) -> TracerProvider:
    """A provider that batches spans to the collector at `endpoint` (OTLP/HTTP protobuf).
    The exporter connects only when it sends; `shutdown()` sends what is left."""
    resource = Resource.create({"service.name": service_name, "service.version": __version__})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


class TraceRequests:
    """Pure ASGI middleware: a SERVER span over each HTTP request, child of the caller's
    `traceparent` when it sends one, current while the app runs (streamed bodies included),
    so the runtime's queue and backend spans become its children."""

    def __init__(self, app: ASGIApp, provider: trace.TracerProvider) -> None:
        self.app = app
        self.tracer = provider.get_tracer("modelpool", __version__)
        self.runtime_tracer = RuntimeTracer(self.tracer)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        parent = _W3C.extract(_headers(scope))
        span = self.tracer.start_span(
            scope["method"], context=parent, kind=SpanKind.SERVER, attributes=_request_attributes(scope)
        )
        answered: dict[str, int] = {}

        async def send_traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                answered["status"] = message["status"]
            await send(message)

        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            with tracing.traced_by(self.runtime_tracer):
                await self.app(scope, receive, send_traced)
        except Exception as exc:
            span.record_exception(exc)
            answered.setdefault("status", 500)  # the request context middleware answers 500 for it
            raise
        finally:
            otel_context.detach(token)
            _finish(span, scope, answered.get("status"))


def _request_attributes(scope: Scope) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "http.request.method": scope["method"],
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
    }
    request_id = scope.get("state", {}).get("request_id")  # set by RequestContext, outside this one
    if isinstance(request_id, str):
        attributes[REQUEST_ID] = request_id
    client = scope.get("client")
    if client:
        attributes["client.address"] = client[0]
    return attributes


def _finish(span: trace.Span, scope: Scope, status: int | None) -> None:
    """Name the span by its route template (known only once routing ran), then end it."""
    route = route_template(scope)
    if route is not None:
        span.update_name(f"{scope['method']} {route}")
        span.set_attribute("http.route", route)
    state = scope.get("state", {})
    model = state.get("model_id")
    if isinstance(model, str):
        span.set_attribute(tracing.MODEL, model)
    refused_by = state.get(REFUSED_LIMIT)  # set by the rate limiter: it answered 429
    if isinstance(refused_by, str):
        span.set_attribute(RATE_LIMITED, refused_by)
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    if status is None or status >= 500:  # a 4xx is the client's error, not the server span's
        span.set_status(Status(StatusCode.ERROR))
        span.set_attribute("error.type", str(status or "no response"))
    span.end()


def _headers(scope: Scope) -> dict[str, str]:
    return {key.decode("latin-1"): value.decode("latin-1") for key, value in scope.get("headers", [])}


class RuntimeTracer:
    """The runtime's `tracing.Tracer` on an OpenTelemetry tracer."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def start_span(self, name: str, attributes: Mapping[str, tracing.AttributeValue]) -> tracing.Span:
        return _Span(self.tracer.start_span(name, attributes=dict(attributes)))


class _Span:
    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def set_attribute(self, key: str, value: tracing.AttributeValue) -> None:
        self.span.set_attribute(key, value)

    def record_error(self, error: BaseException) -> None:
        self.span.record_exception(error)
        self.span.set_status(Status(StatusCode.ERROR, str(error)))
        self.span.set_attribute("error.type", type(error).__name__)

    def end(self) -> None:
        self.span.end()
