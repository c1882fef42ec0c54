"""The Files and Batches APIs wired into the app: the stores on `app.state`, their routes,
and how a batch line runs — through the app itself, as an in-process HTTP request of the
key that made the batch, so it meets the same schema, rate limits, usage accounting,
metrics and error envelope as a client's request, and its body is what the route answers."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message

from modelpool.api.routes import batches, files
from modelpool.config.schema import Config
from modelpool.config.sources import HubLocation
from modelpool.owner import INTERNAL_CALLER, InternalCall, Owner, Priority, Schedule
from modelpool.pool_api.batches import LineAnswer
from modelpool.runtime.batches.database import Database
from modelpool.runtime.batches.files import FileLimits, FileStore
from modelpool.runtime.batches.runner import BatchRunner
from modelpool.wire.openai.batches import check_line

log = logging.getLogger("modelpool")
BATCH_CLIENT = ("batch", 0)
"""The client address of a batch line (a keyless server limits callers per address)."""


def add_batch_api(app: FastAPI, config: Config) -> BatchRunner | None:
    """The stores, the routes and the runner (which the lifespan starts and stops); None
    when `batch_api.enabled` is off."""
    settings = config.batch_api
    if not settings.enabled:
        return None
    root = (settings.dir or (config.work_dir or HubLocation.work_dir) / "batches").expanduser()
    try:
        db = Database(root / "batches.sqlite")
        store = FileStore(db, root / "files", FileLimits.of(settings))
    except (OSError, sqlite3.Error) as exc:  # a read-only home in a container: serve the rest, say why
        log.warning("the Batch and Files APIs are off: cannot use %s (%s)", root, exc)
        return None
    runner = BatchRunner(db, store, check_line, settings.concurrency, settings.key_batches, settings.key_batches_kept)
    runner.lock_path = root / "server.lock"  # taken when the server starts: one server per directory
    runner.execute = InProcessCalls(app).call
    app.state.files, app.state.batches = store, runner
    app.include_router(files.router)
    app.include_router(batches.router)
    return runner


def batch_schedule(owner: Owner) -> Schedule:
    """Batch work queues at low priority, as a party of its own beside its key's live
    requests (so a key's batch never takes its live requests' fair share)."""
    return Schedule(party=f"batch {owner.name}", priority=Priority.LOW)


class InProcessCalls:
    """POST a JSON body to one of the app's routes from inside the server, as `owner`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def call(self, owner: Owner, path: str, body: bytes) -> LineAnswer:
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": BATCH_CLIENT, "server": None, "state": {},
            INTERNAL_CALLER: InternalCall(owner, batch_schedule(owner)),
        }  # fmt: skip
        sent = _Reply()
        await self.app(scope, _receive_once(body), sent.send)
        return sent.answer()


def _receive_once(body: bytes) -> Any:
    delivered = False
    never = asyncio.Event()

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the "client" never leaves: a cancelled batch cancels the task instead
        return {"type": "http.disconnect"}

    return receive


class _Reply:
    def __init__(self) -> None:
        self.status = 500
        self.request_id = ""
        self.chunks: list[bytes] = []
        self.retry_after_s: float | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = dict(message.get("headers", []))
            self.request_id = headers.get(b"x-request-id", b"").decode("latin-1")
            retry = headers.get(b"retry-after", b"").decode("latin-1")
            self.retry_after_s = float(retry) if retry.replace(".", "", 1).isdigit() else None
        elif message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))

    def answer(self) -> LineAnswer:
        raw = b"".join(self.chunks)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        return LineAnswer(self.status, self.request_id, body, self.retry_after_s)
