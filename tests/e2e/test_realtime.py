"""Live transcription over a real WebSocket (`/v1/realtime?intent=transcription`): Piper
speaks a sentence, it is streamed in 100 ms chunks, Whisper tiny.en transcribes it back."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from modelpool.client import make_stt, sync
from modelpool.client.config import parse_models_config
from modelpool.client.errors import AuthenticationError
from modelpool.client.live import LiveDelta, LiveResult, LiveUtterance
from modelpool.config import load_config
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing
from modelpool.wire.openai.realtime import MAX_APPEND_CHARS, MAX_EVENT_CHARS
from tests.conftest import STT_MODEL, TTS_MODEL
from tests.e2e.realtime_audio import CHUNK_S, chunks_of, silence, speech_at
from tests.live_server import live_server
from tests.polling import until, until_answered
from tests.speech_metrics import word_error_rate

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
TRANSCRIPTION = "conversation.item.input_audio_transcription"
RATE = 24000


def served_app(**server: Any) -> FastAPI:
    cli = {"enabled_models": [STT_MODEL, TTS_MODEL], "server": server}
    return create_app(load_config(None, cli=cli, environ={}))


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[tuple[FastAPI, str]]:
    app = served_app()
    async with live_server(app) as url:
        yield app, url.replace("http", "ws", 1) + "/v1/realtime?intent=transcription"


@pytest.fixture(scope="module")
async def sentence(server: tuple[FastAPI, str]) -> bytes:
    """The sentence as 24 kHz pcm16, as OpenAI's realtime clients send it."""
    return await speech_at(server[0], TTS_MODEL, SENTENCE, RATE)


async def receive(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), 60))


async def session(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    assert (await receive(ws))["type"] == "transcription_session.created"
    body = {"input_audio_transcription": {"model": STT_MODEL, "language": "en"}, **fields}
    await ws.send(json.dumps({"type": "transcription_session.update", "session": body}))
    updated = await receive(ws)
    assert updated["type"] == "transcription_session.updated", updated
    return updated["session"]


def append(chunk: bytes) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})


async def stream(ws: ClientConnection, audio: bytes, pace: float, sent: list[float]) -> None:
    """Send 100 ms chunks, `pace` × real time (0: as fast as the socket takes them)."""
    start = time.monotonic()
    for index, chunk in enumerate(chunks_of(audio, RATE)):
        if pace:
            await asyncio.sleep(max(0.0, start + index * CHUNK_S / pace - time.monotonic()))
        await ws.send(append(chunk))
        sent.append(time.monotonic())


async def events_until_completed(ws: ClientConnection, count: int = 1) -> list[tuple[float, dict[str, Any]]]:
    events: list[tuple[float, dict[str, Any]]] = []
    while sum(e["type"] == f"{TRANSCRIPTION}.completed" for _, e in events) < count:
        event = await receive(ws)
        assert event["type"] != "error", event
        events.append((time.monotonic(), event))
    return events


async def test_real_time_stream_gets_deltas_before_the_utterance_ends(
    server: tuple[FastAPI, str], sentence: bytes
) -> None:
    app, url = server
    audio = silence(0.5, RATE) + sentence + silence(1.5, RATE)
    sent: list[float] = []
    async with connect(url) as ws:
        await session(ws, turn_detection={"type": "server_vad", "silence_duration_ms": 500})
        sender = asyncio.create_task(stream(ws, audio, 1.0, sent))
        events = await events_until_completed(ws)
        await sender
    kinds = [e["type"] for _, e in events]
    assert kinds[0] == "input_audio_buffer.speech_started"
    assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed")
    assert kinds[-1] == f"{TRANSCRIPTION}.completed"
    started = events[0][1]
    stopped = next(e for _, e in events if e["type"] == "input_audio_buffer.speech_stopped")
    assert 300 <= started["audio_start_ms"] <= 800  # the speech starts after 0.5 s of silence
    assert stopped["audio_end_ms"] - started["audio_start_ms"] >= len(sentence) / 2 / RATE * 1000 - 500
    completed = events[-1][1]
    wer = word_error_rate(SENTENCE, completed["transcript"])
    assert wer <= 0.10, completed["transcript"]
    deltas = [(at, e) for at, e in events if e["type"] == f"{TRANSCRIPTION}.delta"]
    assert {e["item_id"] for _, e in deltas} == {completed["item_id"]} == {started["item_id"]}
    speech_end = sent[int((0.5 + len(sentence) / 2 / RATE) / CHUNK_S) - 1]  # the last chunk with speech in it
    lead = speech_end - deltas[0][0]
    print(f"\nWER {wer:.3f}; first delta {lead:.2f}s before the last speech chunk was sent: {deltas[0][1]['delta']!r}")
    assert lead > 0, "the first delta came only after the utterance ended"
    assert app.state.pool.status(STT_MODEL).in_flight == 0


async def test_a_client_ten_times_faster_than_real_time_is_held_back(
    server: tuple[FastAPI, str], sentence: bytes
) -> None:
    app, url = server
    stats = app.state.realtime
    stats.peak_queued = 0
    utterance = sentence + silence(1.0, RATE)
    sent: list[float] = []
    async with connect(url) as ws:
        await session(ws)
        sender = asyncio.create_task(stream(ws, silence(0.3, RATE) + utterance * 3, 10.0, sent))
        events = await events_until_completed(ws, 3)
        await sender
    transcripts = [e["transcript"] for _, e in events if e["type"] == f"{TRANSCRIPTION}.completed"]
    assert all(word_error_rate(SENTENCE, text) <= 0.10 for text in transcripts), transcripts
    print(f"\nqueue peak {stats.peak_queued} of {stats.queue_bound}; sent in {sent[-1] - sent[0]:.2f}s")
    assert stats.peak_queued == stats.queue_bound  # the queue filled: reading stopped there, and no further


async def test_a_dropped_socket_frees_the_model_at_once(server: tuple[FastAPI, str], sentence: bytes) -> None:
    app, url = server
    pool = app.state.pool
    ws = await connect(url)
    await session(ws)
    sender = asyncio.create_task(stream(ws, sentence, 1.0, []))
    await until(lambda: pool.status(STT_MODEL).in_flight == 1, "a partial transcription to run", timeout_s=30)
    sender.cancel()
    ws.transport.abort()  # no close handshake: the connection is simply gone
    dropped = time.monotonic()
    await until(lambda: pool.status(STT_MODEL).in_flight == 0, "the transcription to give the model back", timeout_s=2)
    print(f"\nmodel free {time.monotonic() - dropped:.3f}s after the drop")
    await until(lambda: app.state.realtime.open_sessions == 0, "the session to end", timeout_s=2)
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("realtime-")]
    assert all(replica.running == 0 for replica in pool.status(STT_MODEL).replicas)
    with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
        await sender


async def test_an_idle_session_is_closed_cleanly() -> None:
    async with live_server(served_app(realtime_idle_timeout_s=0.5)) as base:
        ws = await connect(base.replace("http", "ws", 1) + "/v1/realtime?intent=transcription")
        await session(ws)
        notice = await receive(ws)
        assert notice["type"] == "error" and notice["error"]["code"] == "idle_timeout"
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        assert ws.close_code == 1000 and "no events" in (ws.close_reason or "")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


BAD_INPUT: list[tuple[str | bytes, str, str]] = [
    (append(b"\x00\x01\x02"), "param", "audio"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "not base64 at all!"}), "param", "audio"),
    (json.dumps({"type": "input_audio_buffer.append"}), "param", "audio"),
    (json.dumps({"type": "transcription_session.update", "session": {"input_audio_format": "g711_ulaw"}}),
     "param", "session.input_audio_format"),
    (json.dumps({"type": "transcription_session.update",
                 "session": {"input_audio_format": {"type": "audio/pcm", "rate": 44100}}}),
     "param", "session.input_audio_format.rate"),
    (json.dumps({"type": "transcription_session.update",
                 "session": {"turn_detection": {"type": "server_vad", "threshold": 3}}}),
     "param", "session.turn_detection.threshold"),
    (json.dumps({"type": "transcription_session.update",
                 "session": {"input_audio_transcription": {"model": "no-such-model"}}}), "code", "model_not_found"),
    (json.dumps({"type": "transcription_session.update",
                 "session": {"input_audio_transcription": {"model": TTS_MODEL}}}), "code", "unsupported_task"),
    (json.dumps({"type": "response.create"}), "param", "type"),
    ("{not json", "param", "event"),
    (b"\x00\x01", "param", "event"),
    (json.dumps({"type": "input_audio_buffer.commit"}), "code", "input_audio_buffer_commit_empty"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (MAX_APPEND_CHARS + 4)}), "code",
     "request_too_large"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (MAX_EVENT_CHARS + 4)}), "code",
     "request_too_large"),
]  # fmt: skip


async def test_bad_input_is_an_error_event_and_the_session_goes_on(
    server: tuple[FastAPI, str], sentence: bytes
) -> None:
    _, url = server
    async with connect(url) as ws:
        await session(ws, input_audio_format={"type": "audio/pcm", "rate": 16000})
        for message, field, expected in BAD_INPUT:
            await ws.send(message)
            error = await receive(ws)
            assert error["type"] == "error" and error["error"][field] == expected, (message, error)
        state = await session_update(ws, {"input_audio_format": "pcm16"})
        assert state["input_audio_format"] == "pcm16" and state["input_audio_transcription"]["model"] == STT_MODEL
        sender = asyncio.create_task(stream(ws, sentence + silence(1.0, RATE), 0, []))
        events = await events_until_completed(ws)
        await sender
    assert word_error_rate(SENTENCE, events[-1][1]["transcript"]) <= 0.10


async def session_update(ws: ClientConnection, fields: dict[str, Any]) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "transcription_session.update", "session": fields}))
    updated = await receive(ws)
    assert updated["type"] == "transcription_session.updated", updated
    return updated["session"]


async def test_manual_commit_without_vad(server: tuple[FastAPI, str], sentence: bytes) -> None:
    _, url = server
    async with connect(url) as ws:
        state = await session(ws, turn_detection=None)
        assert state["turn_detection"] is None
        await stream(ws, sentence, 0, [])
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        events = await events_until_completed(ws)
    kinds = {e["type"] for _, e in events}
    assert "input_audio_buffer.speech_started" not in kinds and "input_audio_buffer.committed" in kinds
    assert word_error_rate(SENTENCE, events[-1][1]["transcript"]) <= 0.10


async def test_a_page_of_another_origin_is_refused(server: tuple[FastAPI, str]) -> None:
    """Browsers apply no CORS to WebSockets: a foreign page's Origin is refused before accept,
    a page on this machine is served."""
    _, url = server
    with pytest.raises(InvalidStatus) as refused:
        await connect(url, additional_headers={"Origin": "https://evil.example"})
    assert refused.value.response.status_code == 403
    async with connect(url, additional_headers={"Origin": "http://localhost:5173"}) as ws:
        assert (await receive(ws))["type"] == "transcription_session.created"


async def test_api_keys_guard_the_socket() -> None:
    config = load_config(None, cli={"enabled_models": [STT_MODEL],
                                    "auth": {"keys": [{"name": "app", "key_env": "RT_KEY"}]}}, environ={})  # fmt: skip
    app = create_app(config, keys=KeyRing.from_config(config.auth, environ={"RT_KEY": "secret"}))
    async with live_server(app) as base:
        url = base.replace("http", "ws", 1) + "/v1/realtime?intent=transcription"
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            with pytest.raises(InvalidStatus) as refused:
                await connect(url, additional_headers=headers)
            assert refused.value.response.status_code == 401
            assert json.loads(refused.value.response.body)["error"]["type"] == "authentication_error"
        async with connect(url, additional_headers={"Authorization": "Bearer secret"}) as ws:
            assert (await receive(ws))["type"] == "transcription_session.created"
        protocols = ["realtime", "openai-insecure-api-key.secret"]
        async with connect(url, subprotocols=protocols) as ws:  # type: ignore[arg-type]
            assert ws.subprotocol == "realtime"
            assert (await receive(ws))["type"] == "transcription_session.created"
        for key in ("wrong", "secret"):
            roles = {"stt": {"kind": "preset:whisper", "base_url": base, "api_key_env": "RT_KEY"}}
            async with make_stt(parse_models_config(roles, environ={"RT_KEY": key}), "stt") as stt:
                live = stt.live_transcribe(_chunks(silence(0.3, RATE), 0))
                if key == "wrong":
                    with pytest.raises(AuthenticationError):
                        await anext(live)
                else:
                    assert [result async for result in live] == []  # silence: nothing to transcribe


async def _chunks(audio: bytes, pace: float) -> AsyncIterator[bytes]:
    start = time.monotonic()
    for index, chunk in enumerate(chunks_of(audio, RATE)):
        if pace:
            await asyncio.sleep(max(0.0, start + index * CHUNK_S / pace - time.monotonic()))
        yield chunk


async def test_the_sdk_transcribes_live(server: tuple[FastAPI, str], sentence: bytes) -> None:
    _, url = server
    base = url.split("/v1/")[0].replace("ws", "http", 1)
    roles = {"stt": {"kind": "preset:whisper", "base_url": base, "language": "en"}}
    audio = silence(0.3, RATE) + sentence + silence(1.0, RATE) + sentence  # the last one ends with the audio
    async with make_stt(parse_models_config(roles, environ={}), "stt") as stt:
        live = stt.live_transcribe(_chunks(audio, 4.0), turn_detection={"silence_duration_ms": 400})
        results = [result async for result in live]
    utterances = [r.text for r in results if isinstance(r, LiveUtterance)]
    assert len(utterances) == 2 and all(word_error_rate(SENTENCE, u) <= 0.10 for u in utterances), utterances
    assert any(isinstance(r, LiveDelta) for r in results)
    assert np.count_nonzero([isinstance(r, LiveUtterance) for r in results]) == 2


async def test_the_sync_facade_transcribes_live(server: tuple[FastAPI, str], sentence: bytes) -> None:
    _, url = server
    roles = {"stt": {"kind": "preset:whisper", "base_url": url.split("/v1/")[0].replace("ws", "http", 1)}}
    config = parse_models_config(roles, environ={})

    def transcribe() -> list[LiveResult]:  # a script's thread: the server runs in this test's loop
        with sync.make_stt(config, "stt") as stt:
            return list(stt.live_transcribe(chunks_of(silence(0.3, RATE) + sentence, RATE)))

    results = await asyncio.to_thread(transcribe)
    assert [type(r) for r in results][-1] is LiveUtterance
    assert word_error_rate(SENTENCE, results[-1].text) <= 0.10


async def test_a_client_gone_with_a_full_queue_has_none_of_it_worked_through(
    server: tuple[FastAPI, str], sentence: bytes, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each append here holds 31 s of audio, past the 30 s an utterance may last, so each
    is a whole transcription. The client sends them faster than they are worked through,
    never reads, and goes away: its queued audio is not worked through (at most the
    transcription the worker was starting runs), and the session ends as a disconnect,
    not as an error (the test above drops a client that keeps pace, with nothing queued)."""
    app, url = server
    pool, stats = app.state.pool, app.state.realtime
    calls: list[float] = []
    transcribe = pool.transcribe_samples

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        return await transcribe(*args, **kwargs)

    monkeypatch.setattr(pool, "transcribe_samples", counted)
    stats.peak_queued = 0
    long_audio = (sentence * 20)[: 31 * RATE * 2]
    assert len(append(long_audio)) < MAX_APPEND_CHARS
    ws = await connect(url, max_size=None)
    await session(ws, turn_detection=None)

    async def flood() -> None:
        for _ in range(stats.queue_bound + 6):
            await ws.send(append(long_audio))

    sender = asyncio.create_task(flood())
    await until(lambda: stats.peak_queued == stats.queue_bound, "the session's queue to fill", timeout_s=60)
    ws.transport.abort()
    sender.cancel()
    gone = len(calls)
    await until(lambda: stats.open_sessions == 0, "the session to end", timeout_s=60)
    assert len(calls) - gone <= 1, f"{len(calls) - gone} transcriptions ran after the client left"
    assert pool.status(STT_MODEL).in_flight == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
        await sender


async def test_live_sessions_are_capped_and_a_closed_one_frees_its_place() -> None:
    app = served_app(realtime_sessions=1)
    async with live_server(app) as base:
        url = base.replace("http", "ws", 1) + "/v1/realtime?intent=transcription"
        async with connect(url) as first:
            assert (await receive(first))["type"] == "transcription_session.created"
            async with connect(url) as second:
                refused = await receive(second)
                assert refused["type"] == "error" and refused["error"]["code"] == "too_many_sessions"
                assert "server.realtime_sessions" in refused["error"]["message"]
                with pytest.raises(ConnectionClosed):
                    await second.recv()
                assert second.close_code == 1013
        await until(lambda: app.state.realtime.open_sessions == 0, "the first session to end")
        async with connect(url) as third:
            assert (await receive(third))["type"] == "transcription_session.created"


async def test_a_sessions_usage_is_kept_under_its_model(server: tuple[FastAPI, str], sentence: bytes) -> None:
    _, url = server
    async with connect(url) as ws:
        await session(ws)
        await stream(ws, sentence + silence(1.0, RATE), 0, [])
        await events_until_completed(ws)
    async with httpx.AsyncClient(base_url=url.replace("ws", "http", 1).split("/v1/")[0]) as http:

        async def kept_under_its_model() -> bool:
            reply = await http.get("/v1/admin/usage", params={"start_time": 0, "group_by": "model"})
            return STT_MODEL in {row["model"] for row in reply.json()["windowed"]}

        await until_answered(kept_under_its_model, "the session's usage under its model")
