"""The body limit on a chunked body (no Content-Length), at the ASGI level: the app reads it
as it comes (a 100 MiB upload to /v1/files is not held in memory first), and the piece that
passes the limit ends it with a 413, the app told the client left."""

from __future__ import annotations

import asyncio
import json

from starlette.types import Message, Receive, Scope, Send

from modelpool.server.middleware import BodyLimit
from tests.polling import until

SCOPE: Scope = {"type": "http", "method": "POST", "path": "/v1/files", "headers": [], "state": {}}


class ReadingApp:
    """Reads the body to its end (or the client's leaving); answers 200 unless it left."""

    def __init__(self) -> None:
        self.received: list[Message] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            self.received.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"read"})


def chunk(size: int, more: bool = True) -> Message:
    return {"type": "http.request", "body": b"x" * size, "more_body": more}


async def run(limit: int, pieces: asyncio.Queue[Message]) -> tuple[ReadingApp, list[Message], asyncio.Task[None]]:
    app, sent = ReadingApp(), list[Message]()

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = BodyLimit(app, max_bytes=limit, max_upload_bytes=limit, body_timeout_s=30, max_file_bytes=limit)
    return app, sent, asyncio.create_task(middleware(SCOPE, pieces.get, send))


async def test_a_chunked_body_reaches_the_app_as_it_comes() -> None:
    pieces: asyncio.Queue[Message] = asyncio.Queue()
    app, sent, task = await run(1000, pieces)
    pieces.put_nowait(chunk(400))
    await until(lambda: len(app.received) == 1, "the first piece to reach the app before the rest is sent")
    pieces.put_nowait(chunk(400, more=False))
    await asyncio.wait_for(task, timeout=5)
    assert [len(m["body"]) for m in app.received] == [400, 400]
    assert sent[0]["status"] == 200


async def test_the_piece_past_the_limit_is_a_413_and_the_app_is_told_the_client_left() -> None:
    pieces: asyncio.Queue[Message] = asyncio.Queue()
    for message in (chunk(600), chunk(600), chunk(600, more=False)):
        pieces.put_nowait(message)
    app, sent, task = await run(1000, pieces)
    await asyncio.wait_for(task, timeout=5)
    assert [m["type"] for m in app.received] == ["http.request", "http.disconnect"]  # never the third piece
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]  # the app's 200 dropped
    assert sent[0]["status"] == 413
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "request_too_large" and "1000 bytes" in error["message"]
