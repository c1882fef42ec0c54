"""UpstreamClient against a scripted HTTP server on loopback: what it retries (connection
errors, 5xx) and what it never retries (4xx, a stream that has begun), and how upstream
errors of every shape become ours."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from modelpool.backends.remote.client import RetryPolicy, UpstreamClient
from modelpool.errors import UpstreamError, UpstreamUnavailable
from modelpool.services.ports import free_port

FAST = RetryPolicy(retries=2, backoff_s=0.01)


Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Script:
    """Answers to give, in order; the last one repeats."""

    answers: list[Answer] = field(default_factory=list)
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path, request.headers.get("Authorization")))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return await answer(request)


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Script, str]]:
    script = Script()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", script.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield script, f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


async def client_for(url: str, **kwargs: object) -> UpstreamClient:
    client = UpstreamClient("up", url, **{"retry": FAST, **kwargs})  # type: ignore[arg-type]
    await client.open()
    return client


def error(status: int, body: object) -> Answer:
    text = body if isinstance(body, str) else json.dumps(body)

    async def answer(_: web.Request) -> web.StreamResponse:
        return web.Response(status=status, text=text)

    return answer


def ok(payload: object) -> Answer:
    async def answer(_: web.Request) -> web.StreamResponse:
        return web.json_response(payload)

    return answer


def stream_of(events: list[bytes], *, then_break: bool = False) -> Answer:
    return lambda request: sse(request, events, then_break)


async def test_5xx_is_retried_and_the_key_goes_as_a_bearer_token(upstream: tuple[Script, str]) -> None:
    script, url = upstream
    script.answers = [error(503, {"error": {"message": "busy"}}), error(502, "bad gateway"), ok({"ok": 1})]
    client = await client_for(url, api_key="sk-secret")
    assert await client.post_json("chat/completions", {"a": 1}) == {"ok": 1}
    assert [s[:2] for s in script.seen] == [("POST", "/v1/chat/completions")] * 3
    assert {s[2] for s in script.seen} == {"Bearer sk-secret"}
    assert "sk-secret" not in repr(client)
    await client.close()


async def test_5xx_after_the_last_retry_is_a_502_with_the_upstream_message(upstream: tuple[Script, str]) -> None:
    script, url = upstream
    script.answers = [error(500, {"error": {"message": "engine exploded", "type": "server_error", "code": "boom"}})]
    client = await client_for(url)
    with pytest.raises(UpstreamError) as failed:
        await client.post_json("completions", {})
    assert failed.value.status_code == 502 and failed.value.upstream_status == 500
    assert failed.value.code == "boom" and "engine exploded" in failed.value.message
    assert len(script.seen) == 3
    await client.close()


@pytest.mark.parametrize(
    ("body", "message", "code"),
    [
        ({"error": {"message": "bad temperature", "type": "invalid_request_error", "code": "invalid_value"}},
         "bad temperature", "invalid_value"),
        ({"detail": [{"loc": ["body", "model"], "msg": "field required"}]}, "field required", "upstream_error"),
        ("plain text trouble", "plain text trouble", "upstream_error"),
    ],
)  # fmt: skip
async def test_4xx_is_never_retried_and_keeps_its_status(
    upstream: tuple[Script, str], body: object, message: str, code: str
) -> None:
    script, url = upstream
    script.answers = [error(422, body)]
    client = await client_for(url)
    with pytest.raises(UpstreamError) as refused:
        await client.post_json("chat/completions", {})
    assert refused.value.status_code == 422 and refused.value.code == code
    assert message in refused.value.message and refused.value.message.startswith("upstream 'up' answered 422")
    assert len(script.seen) == 1
    await client.close()


async def test_connection_refused_is_retried_then_unavailable() -> None:
    client = await client_for(f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(UpstreamUnavailable, match="is unreachable"):
        await client.post_json("chat/completions", {})
    await client.close()


async def sse(request: web.Request, events: list[bytes], then_break: bool = False) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
    if then_break:
        assert request.transport is not None
        request.transport.close()  # the engine died mid-stream
        return response
    await response.write_eof()
    return response


async def test_streams_yield_events_until_done(upstream: tuple[Script, str]) -> None:
    script, url = upstream
    events = [b": keep-alive\n\n", b'data: {"n": 1}\n\n', b"event: x\ndata: {\"n\": 2}\n\n", b"data: [DONE]\n\n"]
    script.answers = [stream_of(events)]
    client = await client_for(url)
    assert [e async for e in await client.stream_events("chat/completions", {})] == [{"n": 1}, {"n": 2}]
    await client.close()


async def test_a_stream_cut_mid_way_is_unavailable_and_not_retried(upstream: tuple[Script, str]) -> None:
    script, url = upstream
    script.answers = [stream_of([b'data: {"n": 1}\n\n'], then_break=True)]
    client = await client_for(url)
    received = []
    with pytest.raises(UpstreamUnavailable, match="went away mid-response"):
        async for event in await client.stream_events("chat/completions", {}):
            received.append(event)
    assert received == [{"n": 1}] and len(script.seen) == 1
    await client.close()


async def test_an_error_event_in_a_stream_is_raised(upstream: tuple[Script, str]) -> None:
    script, url = upstream
    events = [b'data: {"n": 1}\n\n', b'data: {"error": {"message": "out of memory", "code": "oom"}}\n\n']
    script.answers = [stream_of(events)]
    client = await client_for(url)
    received = []
    with pytest.raises(UpstreamError, match="out of memory"):
        async for event in await client.stream_events("chat/completions", {}):
            received.append(event)
    assert received == [{"n": 1}]  # what came before the error was passed on
    await client.close()
