"""Audio bombs: decoded audio is bounded while it is decoded (`server.max_audio_seconds`).

The attacks (issue 27's table): a 1.5 MB FLAC holding 8 hours of silence, sent to
`/v1/audio/transcriptions`, grew the server to 18 GB until the kernel's OOM killer ended
it; a 59 KB FLAC of 20 minutes of silence grew it by 1.1 GB, and Whisper answered
"you you you …". Replayed here against a real `modelpool serve` process, whose peak RSS
is read from the kernel (VmHWM, reset before each request), and over MCP and a live
session, which decode audio too."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import re
import time
import wave
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import yaml
from mcp.shared.exceptions import MCPError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from modelpool.config import load_config
from modelpool.config.schema import ServerConfig
from modelpool.server.app import create_app
from tests.audio_files import silent_flac, wav_bytes
from tests.conftest import STT_MODEL, TTS_MODEL
from tests.e2e.mcp_helpers import call, mcp_client, mcp_config
from tests.live_server import live_server
from tests.processes import Server, modelpool_serve
from tests.speech_metrics import word_error_rate

MB = 1_000_000
PIPER_RATE = 22050
DEFAULT_LIMIT_S = ServerConfig().max_audio_seconds
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."

pytestmark = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS is read from Linux /proc")


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """8 hours and 20 minutes of silence at 8 kHz, as FLAC (made once; some seconds)."""
    return {"8h": silent_flac(8 * 3600), "20min": silent_flac(20 * 60)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Whisper tiny.en with faster-whisper's VAD filter on, everything else at its default."""
    folder = tmp_path_factory.mktemp("audio-bombs")
    config = {"enabled_models": [STT_MODEL], "models": {STT_MODEL: {"preload": True, "options": {"vad_filter": True}}}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    with modelpool_serve(folder / "server.log", "--config", str(folder / "config.yaml")) as running:
        yield running


class PeakRss:
    """A process's peak resident memory over a stretch of time, from the kernel: writing 5
    to /proc/PID/clear_refs resets VmHWM to the current RSS (psutil gives the RSS itself)."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.start = self._reset()

    def _reset(self) -> int:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
        return int(self.process.memory_info().rss)

    def growth(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"VmHWM:\s+(\d+) kB", status)
        assert match is not None, status
        return int(match.group(1)) * 1024 - self.start


def transcribe(server: Server, name: str, audio: bytes, **fields: str) -> httpx.Response:
    files = {"file": (name, audio)}
    data = {"model": STT_MODEL, **fields}
    return httpx.post(f"{server.url}/v1/audio/transcriptions", data=data, files=files, timeout=300)


def test_an_8_hour_silent_flac_is_a_413_that_costs_no_memory(server: Server, bombs: dict[str, bytes]) -> None:
    assert transcribe(server, "warm.wav", wav_bytes()).status_code == 200  # first-use allocations happen here
    peak = PeakRss(server.process.pid)
    started = time.monotonic()
    response = transcribe(server, "bomb.flac", bombs["8h"])
    took = time.monotonic() - started
    growth = peak.growth()
    print(f"\n8 h of silence ({len(bombs['8h']) / MB:.1f} MB FLAC): {response.status_code} in {took:.2f}s, "
          f"peak RSS growth {growth / MB:.1f} MB")  # fmt: skip
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and error["param"] == "file"
    assert f"{DEFAULT_LIMIT_S:g} s" in error["message"] and "server.max_audio_seconds" in error["message"]
    assert growth < 100 * MB
    assert took < 30  # decoding stops at the limit: 2 h of FLAC frames, counted and dropped
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_20_minutes_of_silence_is_accepted_and_the_vad_filter_keeps_it_empty(
    server: Server, bombs: dict[str, bytes]
) -> None:
    peak = PeakRss(server.process.pid)
    started = time.monotonic()
    response = transcribe(server, "quiet.flac", bombs["20min"], response_format="verbose_json")
    took = time.monotonic() - started
    growth = peak.growth()
    assert response.status_code == 200, response.text
    body = response.json()
    print(f"\n20 min of silence ({len(bombs['20min']) / MB:.2f} MB FLAC): {took:.1f}s, text {body['text']!r}, "
          f"peak RSS growth {growth / MB:.0f} MB")  # fmt: skip
    assert body["duration"] == pytest.approx(1200, abs=0.1)
    assert len(body["text"].split()) <= 2, body["text"]  # not "you you you …"
    # 77 MB of samples, and Whisper's and its VAD's work on one 2-minute window at a time
    # (the whole 20 minutes at once took 417 MB with the VAD, 1.1 GB without it)
    assert growth < 250 * MB


@contextlib.asynccontextmanager
async def served(
    models: dict[str, Any] | None = None, **server: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, openai.AsyncOpenAI]]:
    """Whisper and Piper in this process, over a real loopback socket, with `models` and
    `server` settings."""
    cli = {"enabled_models": [STT_MODEL, TTS_MODEL], "models": models or {}, "server": server}
    app = create_app(load_config(None, cli=cli, environ={}))
    async with live_server(app) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
        yield client, openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", http_client=client, max_retries=0)  # type: ignore[arg-type]  # the SDK takes a legacy httpx client at runtime; it annotates only httpx2


async def spoken(oai: openai.AsyncOpenAI) -> bytes:
    """The sentence as Piper says it: mono pcm16 at 22050 Hz."""
    reply = await oai.audio.speech.create(model=TTS_MODEL, voice="alloy", input=SENTENCE, response_format="pcm",
                                          extra_body={"deterministic": True})  # fmt: skip
    return reply.content


async def test_speech_within_the_limit_is_transcribed_and_speech_past_it_is_refused() -> None:
    async with served(max_audio_seconds=5.0) as (client, oai):
        pcm = await spoken(oai)
        seconds = len(pcm) / 2 / PIPER_RATE
        assert seconds < 5.0 < 2 * seconds  # the sentence fits the limit, twice over it does not
        transcript = await oai.audio.transcriptions.create(model=STT_MODEL, file=("once.wav", wav_of(pcm)))
        assert word_error_rate(SENTENCE, transcript.text) <= 0.10, transcript.text
        twice = await client.post("/v1/audio/transcriptions", data={"model": STT_MODEL},
                                  files={"file": ("twice.wav", wav_of(pcm * 2))})  # fmt: skip
        assert twice.status_code == 413 and twice.json()["error"]["code"] == "request_too_large", twice.text
        assert "5 s" in twice.json()["error"]["message"]


async def test_long_speech_is_transcribed_in_windows_with_its_words_and_times_kept() -> None:
    """Whisper's windows (30 s here) cut in the pauses between sentences: every sentence
    comes back, at its place in the whole audio (not at its place in its window)."""
    async with served({STT_MODEL: {"options": {"window_s": 30}}}) as (client, oai):
        pcm = await spoken(oai)
        stretch = pcm + b"\x00\x00" * int(3 * PIPER_RATE)  # the sentence, then a 3 s pause: ~6.6 s
        response = await client.post("/v1/audio/transcriptions", files={"file": ("long.wav", wav_of(stretch * 10))},
                                     data={"model": STT_MODEL, "response_format": "verbose_json"})  # fmt: skip
    assert response.status_code == 200, response.text
    body, every, said = response.json(), len(stretch) / 2 / PIPER_RATE, len(pcm) / 2 / PIPER_RATE
    segments = [(segment["start"], segment["end"]) for segment in body["segments"]]
    assert body["duration"] == pytest.approx(10 * every, abs=0.1)  # 66 s: three windows
    assert word_error_rate(" ".join([SENTENCE] * 10), body["text"]) <= 0.10, body["text"]
    assert [segment["id"] for segment in body["segments"]] == list(range(len(segments)))
    assert segments == sorted(segments) and segments[-1][1] > 9 * every, segments
    for index in range(10):  # each sentence has a segment where it was said
        start, end = index * every, index * every + said
        assert any(s < end and e > start for s, e in segments), (index, segments)


def wav_of(pcm: bytes, rate: int = PIPER_RATE) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(pcm)
    return buffer.getvalue()


async def test_mcp_transcribe_over_the_limit_is_refused(tmp_path: Path) -> None:
    config = mcp_config(tmp_path / "store", preload=False, max_audio_seconds=2.0)
    async with live_server(create_app(config)) as url, mcp_client(url) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("transcribe", {"model": STT_MODEL, "audio_base64": b64(wav_bytes(seconds=3.0))})
        within = await call(client, "transcribe", model=STT_MODEL, audio_base64=b64(wav_bytes(seconds=1.0)))
    assert refused.value.data["status"] == 413 and refused.value.data["code"] == "request_too_large"
    assert refused.value.data["param"] == "audio_base64"
    assert "2 s" in refused.value.message and "server.max_audio_seconds" in refused.value.message
    assert within["duration_s"] == pytest.approx(1.0)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_a_live_session_is_closed_once_its_audio_passes_the_limit() -> None:
    config = load_config(None, cli={"enabled_models": [STT_MODEL], "server": {"max_audio_seconds": 1.0}}, environ={})
    async with live_server(create_app(config)) as base:
        ws = await connect(base.replace("http", "ws", 1) + "/v1/realtime?intent=transcription")
        assert (await receive(ws))["type"] == "transcription_session.created"
        update = {"input_audio_format": {"type": "audio/pcm", "rate": 16000},
                  "input_audio_transcription": {"model": STT_MODEL, "language": "en"}}  # fmt: skip
        await ws.send(json.dumps({"type": "transcription_session.update", "session": update}))
        assert (await receive(ws))["type"] == "transcription_session.updated"
        chunk = b64(b"\x00\x00" * 1600)  # 100 ms of silence at 16 kHz
        with contextlib.suppress(ConnectionClosed):  # the server may close while chunks are still going out
            for index in range(15):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk,
                                          "event_id": f"chunk-{index}"}))  # fmt: skip
        notice = await receive(ws)
        with pytest.raises(ConnectionClosed):
            await receive(ws)
    assert notice["type"] == "error", notice
    error = notice["error"]
    assert error["code"] == "request_too_large" and error["event_id"] == "chunk-10"  # 1.1 s: the first past 1 s
    assert "1 s" in error["message"] and "server.max_audio_seconds" in error["message"]
    assert ws.close_code == 1008 and "max_audio_seconds" in (ws.close_reason or "")


async def receive(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), 60))
