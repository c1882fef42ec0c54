"""Live transcription over WebSocket (`/v1/realtime?intent=transcription`, OpenAI's realtime
transcription events): raw pcm16 chunks go up as they come, partial text and finished
utterances come back while the audio still flows."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from modelpool.client.errors import ClientError, connection_failed, error_class, error_from_payload

_TRANSCRIPTION = "conversation.item.input_audio_transcription"


@dataclass(frozen=True)
class LiveDelta:
    """New settled text of the utterance `item_id` while it is still spoken."""

    item_id: str
    text: str


@dataclass(frozen=True)
class LiveUtterance:
    """One utterance, finished: its whole transcript (the deltas may have differed)."""

    item_id: str
    text: str


LiveResult = LiveDelta | LiveUtterance


@dataclass(frozen=True)
class LiveRequest:
    url: str
    api_key: str | None
    model: str
    sample_rate: int
    language: str | None
    turn_detection: dict[str, Any] | None


async def live_transcription(request: LiveRequest, chunks: AsyncIterable[bytes]) -> AsyncIterator[LiveResult]:
    """Deltas and finished utterances until the audio has ended and its last utterance is
    transcribed. An `error` event from the server raises the SDK's typed error."""
    headers = {"Authorization": f"Bearer {request.api_key}"} if request.api_key else {}
    try:
        socket = await connect(request.url, additional_headers=headers, max_size=None)
    except InvalidStatus as exc:
        status = exc.response.status_code
        raise error_class(status, None)(f"the server refused the live session (HTTP {status})", status) from None
    except OSError as exc:
        raise connection_failed(request.url, exc) from None
    async with socket:
        await socket.send(json.dumps({"type": "transcription_session.update", "session": _session(request)}))
        sender = asyncio.create_task(_send_audio(socket, chunks))
        try:
            async for result in _results(socket, sender):
                yield result
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await sender


def _session(request: LiveRequest) -> dict[str, Any]:
    audio_format: Any = "pcm16" if request.sample_rate == 24000 else {"type": "audio/pcm", "rate": request.sample_rate}
    session: dict[str, Any] = {
        "input_audio_format": audio_format,
        "input_audio_transcription": {"model": request.model, "language": request.language},
    }
    if request.turn_detection is not None:
        session["turn_detection"] = {"type": "server_vad", **request.turn_detection}
    return session


async def _send_audio(socket: ClientConnection, chunks: AsyncIterable[bytes]) -> None:
    """Every chunk (each send waits while the server is not reading: TCP pushes back),
    then a commit that ends the last utterance."""
    async for chunk in chunks:
        if chunk:
            await socket.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(chunk).decode("ascii")}))  # fmt: skip
    await socket.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "end_of_audio"}))


async def _results(socket: ClientConnection, sender: asyncio.Task[None]) -> AsyncIterator[LiveResult]:
    """The session ends with the utterance that the final commit closed: the one committed
    without a `speech_stopped` before it (a VAD turn always has one)."""
    stopped: set[str] = set()
    last: str | None = None
    try:
        async for message in socket:
            event = json.loads(message)
            kind = event.get("type")
            if kind == "input_audio_buffer.speech_stopped":
                stopped.add(event["item_id"])
            elif kind == "input_audio_buffer.committed" and event["item_id"] not in stopped and sender.done():
                last = event["item_id"]
            elif kind == f"{_TRANSCRIPTION}.delta":
                yield LiveDelta(event["item_id"], event["delta"])
            elif kind == f"{_TRANSCRIPTION}.completed":
                yield LiveUtterance(event["item_id"], event["transcript"])
                if event["item_id"] == last:
                    return
            elif kind in ("error", f"{_TRANSCRIPTION}.failed"):
                if _ends_audio(event):
                    return  # the final commit found no utterance left to transcribe
                raise error_from_payload(event)
    except ConnectionClosed as exc:
        raise ClientError(f"the live session closed: {exc}") from None


def _ends_audio(event: dict[str, Any]) -> bool:
    error = event.get("error") or {}
    return error.get("code") == "input_audio_buffer_commit_empty" and error.get("event_id") == "end_of_audio"


async def pulled(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """A blocking iterable (a microphone) as an async one, each item read on a worker thread."""
    iterator = iter(chunks)
    while (chunk := await asyncio.to_thread(next, iterator, None)) is not None:
        yield chunk
