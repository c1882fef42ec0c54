"""Live transcription over WebSocket: `/v1/realtime?intent=transcription`, in the shape of
OpenAI's realtime transcription sessions.

Two tasks per session. The reader takes messages off the socket into a bounded queue; when
the queue is full it stops reading, so the socket's buffers fill and TCP slows the client
(uvicorn reads no further frames until the app receives). The worker runs each event in
order (decode, VAD, transcriptions through the pool). When the client goes away the worker
is cancelled, which closes a running transcription and gives the model back at once. A
session that sends nothing for `server.realtime_idle_timeout_s` gets an `error` event and
is closed with code 1000; one that has sent more than `server.max_audio_seconds` of audio
in all gets a 413 `error` event naming the limit and is closed with code 1008. A client
that goes away with its queue full has none of that audio worked through: the worker's
next take frees the reader, which sees the disconnect and ends the session (the one
transcription being started is cancelled). At most `server.realtime_sessions` sessions are
open at once, and `server.realtime_sessions_per_key` per API key; one more is told so and
closed with code 1013.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketState

from modelpool.audio.pcm import Pcm16Resampler, pcm16_from_base64
from modelpool.audio.vad import VAD_RATE
from modelpool.config.schema import ServerConfig
from modelpool.errors import AudioTooLong, GenerationFailed, InvalidRequest, ModelpoolError, RequestTooLarge
from modelpool.pool_api import PoolApi
from modelpool.pool_api.live import LiveEvent, LiveSessions
from modelpool.pool_api.usage import USAGE_METER
from modelpool.wire.openai.realtime import (
    MAX_EVENT_CHARS,
    SessionState,
    audio_field,
    error_event,
    parse_event,
    render,
    server_event,
)

router = APIRouter()
IDLE_CLOSE_CODE = 1000
POLICY_CLOSE_CODE = 1008
TRY_AGAIN_LATER_CODE = 1013
log = logging.getLogger("modelpool.api")


@dataclass
class RealtimeStats:
    """Live sessions, as tests and operators see them (app.state.realtime)."""

    queue_bound: int
    open_sessions: int = 0
    peak_queued: int = 0
    """The most client events any session's queue has held."""
    by_key: dict[str, int] = field(default_factory=dict)
    """Open sessions per API key (named keys only)."""

    def refusal(self, key: str | None, server: ServerConfig) -> str | None:
        """Why one more session may not open now (None: it may)."""
        if self.open_sessions >= server.realtime_sessions:
            return f"{self.open_sessions} live sessions are open, the most allowed (server.realtime_sessions)"
        if key and self.by_key.get(key, 0) >= server.realtime_sessions_per_key:
            return (f"this key holds {self.by_key[key]} live sessions, the most allowed "
                    "(server.realtime_sessions_per_key)")  # fmt: skip
        return None

    def opened(self, key: str | None) -> None:
        self.open_sessions += 1
        if key:
            self.by_key[key] = self.by_key.get(key, 0) + 1

    def closed(self, key: str | None) -> None:
        self.open_sessions -= 1
        if key:
            left = self.by_key.pop(key) - 1
            if left:
                self.by_key[key] = left


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket, intent: str | None = None) -> None:
    if intent not in (None, "transcription"):
        await websocket.close(code=1008, reason="this server serves only intent=transcription sessions")
        return
    # A foreign web page was refused before this (server/host_guard.py): browsers apply no CORS to WebSockets.
    offered = websocket.scope.get("subprotocols", [])
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
    app = websocket.app
    stats: RealtimeStats = app.state.realtime
    key = websocket.scope.get("state", {}).get("key_name")
    refused = stats.refusal(key, app.state.config.server)
    if refused is not None:
        error = {"message": f"{refused}: try again later", "type": "invalid_request_error", "param": None,
                 "code": "too_many_sessions", "event_id": None}  # fmt: skip
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await websocket.send_text(json.dumps(server_event("error", error=error)))
            await websocket.close(code=TRY_AGAIN_LATER_CODE, reason="too many live sessions")
        return
    stats.opened(key)
    try:
        await Session(websocket, app.state.pool, stats, app.state.config.server, app.state.live_sessions).run()
    finally:
        stats.closed(key)


class Session:
    def __init__(
        self, websocket: WebSocket, pool: PoolApi, stats: RealtimeStats, server: ServerConfig, sessions: LiveSessions
    ) -> None:
        self.websocket = websocket
        self.stats = stats
        self.idle_timeout_s = server.realtime_idle_timeout_s
        self.state = SessionState()
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=stats.queue_bound)
        meter = websocket.scope.get("state", {}).get(USAGE_METER)
        self.transcriber = sessions(pool, self._emit, max_seconds=server.max_audio_seconds, meter=meter)
        self.resampler = Pcm16Resampler(self.state.rate, VAD_RATE)
        self._sending = asyncio.Lock()
        self._busy = False
        """The worker is handling an event (the session is not idle while it waits for results)."""

    async def run(self) -> None:
        reader = asyncio.create_task(self._read(), name="realtime-reader")
        worker = asyncio.create_task(self._work(), name="realtime-worker")
        try:
            await self._send(server_event("transcription_session.created", session=self.state.render()))
            await asyncio.wait({reader, worker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, worker):
                task.cancel()
            results = await asyncio.gather(reader, worker, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(
                result, (asyncio.CancelledError, WebSocketDisconnect)
            ):
                raise result

    async def _read(self) -> None:
        while True:
            try:
                message = await asyncio.wait_for(self.websocket.receive(), self.idle_timeout_s)
            except asyncio.TimeoutError:
                if self._busy or not self.queue.empty():  # quiet, but waiting for its results
                    continue
                await self._close_idle()
                return
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                await self._send(error_event(InvalidRequest("send events as JSON text frames", param="event")))
                continue
            await self.queue.put(text)  # full: wait here, reading no further (TCP pushes back)
            self.stats.peak_queued = max(self.stats.peak_queued, self.queue.qsize())

    async def _close_idle(self) -> None:
        reason = f"no events for {self.idle_timeout_s:g}s"
        error = {"message": f"session closed: {reason}", "type": "invalid_request_error", "param": None,
                 "code": "idle_timeout", "event_id": None}  # fmt: skip
        await self._send(server_event("error", error=error))
        await self.websocket.close(code=IDLE_CLOSE_CODE, reason=reason)

    async def _work(self) -> None:
        while True:
            text = await self.queue.get()
            event: dict[str, Any] = {}
            self._busy = True
            try:
                if len(text) > MAX_EVENT_CHARS:  # not parsed: decoding it would stall the event loop
                    raise RequestTooLarge(f"an event may hold at most {MAX_EVENT_CHARS} characters; send audio "
                                          "in smaller appends (100 ms each is usual)", param="audio")  # fmt: skip
                event = parse_event(text)
                await self._handle(event)
            except AudioTooLong as exc:  # the session's audio is spent: say so, and end it
                await self._send(error_event(exc, _client_id(event)))
                await self.websocket.close(code=POLICY_CLOSE_CODE, reason="over server.max_audio_seconds")
                return
            except ModelpoolError as exc:
                await self._send(error_event(exc, _client_id(event)))
            except Exception:  # an engine's own failure: say so and keep the session
                log.exception("live transcription failed on an event")
                await self._send(error_event(GenerationFailed("the server failed on this event (see its log)")))
            finally:
                self._busy = False

    async def _handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            audio, resampler = audio_field(event), self.resampler
            samples = await asyncio.to_thread(lambda: resampler.convert(pcm16_from_base64(audio)))  # off the loop
            await self.transcriber.append(samples)
        elif kind == "transcription_session.update":
            rate, live = self.state.updated(event.get("session"))
            self.transcriber.configure(live)
            if rate != self.resampler.input_rate:
                self.resampler = Pcm16Resampler(rate, VAD_RATE)
            self.state.apply(rate, live)
            if live.model is not None:  # the session's usage is kept under it (the model last chosen)
                self.websocket.scope.setdefault("state", {})["model_id"] = live.model
            await self._send(server_event("transcription_session.updated", session=self.state.render()))
        elif kind == "input_audio_buffer.commit":
            await self.transcriber.commit()
        else:
            await self.transcriber.clear()

    async def _emit(self, event: LiveEvent) -> None:
        await self._send(render(event))

    async def _send(self, event: dict[str, Any]) -> None:
        async with self._sending:
            if self.websocket.application_state is WebSocketState.CONNECTED:
                with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # closed meanwhile: the reader ends it
                    await self.websocket.send_text(json.dumps(event))


def _client_id(event: dict[str, Any]) -> str | None:
    client_id = event.get("event_id")
    return client_id if isinstance(client_id, str) else None

