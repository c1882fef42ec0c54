"""Tracing on or off as the config says: off loads no OpenTelemetry SDK; on without the
`otel` extra fails at start naming it; on sends real OTLP/HTTP to the configured URL
(a local collector stand-in here), flushed when the app stops."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import httpx
import pytest
from asgi_lifespan import LifespanManager
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import AnyValue

from modelpool.config import load_config
from modelpool.errors import ConfigError
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing

ROOT = Path(__file__).resolve().parents[2]
Attrs = Mapping[str, AnyValue]

# FastAPI itself imports the OpenTelemetry *API* (its own optional telemetry), so "not
# imported" is about what tracing adds: the SDK, the exporter, and modelpool's otel module.
LOADED_BY_TRACING = """
import json, sys
from modelpool.server.app import create_app
from modelpool.config import load_config
create_app(load_config(None, cli=json.loads(sys.argv[1]), environ={}))
prefixes = ("opentelemetry.sdk", "opentelemetry.exporter", "modelpool.server.otel")
print(json.dumps(sorted(name for name in sys.modules if name.startswith(prefixes))))
"""

# The SDK and exporter made unimportable, as in an install without the `otel` extra.
WITHOUT_OTEL_EXTRA = """
import sys
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
from modelpool.cli.main import run
sys.argv = ["modelpool", "serve", "--config", sys.argv[1]]
run()
"""


def loaded_by_tracing(server: dict[str, object]) -> list[str]:
    # no usage file: this child process is outside the tests' per-app usage files (conftest)
    cli = json.dumps({"starter_models": False, "server": server, "usage_store": {"enabled": False}})
    done = subprocess.run([sys.executable, "-c", LOADED_BY_TRACING, cli], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=True)  # fmt: skip
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_with_tracing_off_create_app_loads_no_opentelemetry_sdk() -> None:
    assert loaded_by_tracing({}) == []


def test_with_an_endpoint_create_app_loads_the_sdk_and_exporter() -> None:
    loaded = loaded_by_tracing({"otel_endpoint": "http://127.0.0.1:4318/v1/traces"})  # not contacted
    assert {"opentelemetry.sdk.trace", "modelpool.server.otel"} <= set(loaded)
    assert "opentelemetry.exporter.otlp.proto.http.trace_exporter" in loaded


def test_an_endpoint_without_the_otel_extra_stops_serve_naming_the_extra(tmp_path: Path) -> None:
    config = tmp_path / "modelpool.yaml"
    config.write_text("starter_models: false\nserver: {port: 0, otel_endpoint: 'http://127.0.0.1:4318/v1/traces'}\n")
    done = subprocess.run([sys.executable, "-c", WITHOUT_OTEL_EXTRA, str(config)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "pip install 'modelpool[otel]'" in done.stderr
    assert "server.otel_endpoint is set, but OpenTelemetry is not installed" in done.stderr


def test_an_endpoint_that_is_not_an_http_url_is_refused() -> None:
    with pytest.raises(ConfigError, match="otel_endpoint"):
        load_config(None, cli={"server": {"otel_endpoint": "collector:4318"}}, environ={})


@dataclass
class Collector:
    url: str
    received: list[tuple[str, str, bytes]] = field(default_factory=list)
    """(path, content type, body) of each POST."""


@pytest.fixture
def collector() -> Iterator[Collector]:
    """An OTLP/HTTP collector stand-in on 127.0.0.1 that keeps what it is sent."""
    received: list[tuple[str, str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Collector(f"http://127.0.0.1:{server.server_port}/v1/traces", received)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_otel_endpoint_exports_each_request_over_otlp_http_flushed_at_shutdown(collector: Collector) -> None:
    server = {"otel_endpoint": collector.url, "otel_service_name": "pool-a"}
    app = create_app(load_config(None, cli={"starter_models": False, "server": server}, environ={}))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            reply = await client.get("/healthz", headers={"X-Request-ID": "otlp-1"})
            assert reply.status_code == 200
    assert collector.received, "the app's shutdown sends the spans still batched"
    path, content_type, body = collector.received[-1]
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    export = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = export.resource_spans
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert resource["service.name"] == "pool-a"
    [span] = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert span.name == "GET /healthz" and span.kind == SpanProto.SPAN_KIND_SERVER
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["modelpool.request_id"].string_value == "otlp-1"
    assert attributes["http.response.status_code"].int_value == 200


async def test_a_request_the_rate_limit_refuses_has_its_route_and_the_limit_on_its_span() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    auth = {"keys": [{"name": "app", "key_env": "LIMITED_KEY", "scopes": ["inference"], "requests_per_minute": 1}]}
    config = load_config(None, cli={"starter_models": False, "auth": auth}, environ={})
    keys = KeyRing.from_config(config.auth, environ={"LIMITED_KEY": "sk-limited"})
    app = create_app(config, keys=keys, tracer_provider=provider)
    chat = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            headers = {"Authorization": "Bearer sk-limited"}
            first = await client.post("/v1/chat/completions", json=chat, headers=headers)
            assert first.status_code == 404  # let in: it took the minute's one request
            refused = await client.post("/v1/chat/completions", json=chat, headers=headers)
            assert refused.status_code == 429
    provider.shutdown()
    # cast: the SDK's spans always carry attributes (empty at worst); its type says "or None".
    by_request = {cast(Attrs, s.attributes)["modelpool.request_id"]: s for s in spans.get_finished_spans()}
    server, admitted = by_request[refused.headers["x-request-id"]], by_request[first.headers["x-request-id"]]
    assert server.attributes is not None and admitted.attributes is not None
    assert server.name == "POST /v1/chat/completions"
    assert server.attributes["http.route"] == "/v1/chat/completions"
    assert server.attributes["http.response.status_code"] == 429
    assert server.attributes["modelpool.rate_limited"] == "requests"
    assert "modelpool.rate_limited" not in admitted.attributes
