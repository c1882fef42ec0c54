"""The MCP server at /mcp, driven by the official MCP Python client over a real socket:
every pool tool against the real starter models, the transcript store (and its restart),
`transcript_source` on the HTTP transcription route, and API keys."""

from __future__ import annotations

import base64
import io
import json
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import AudioContent

from modelpool.config.schema import AuthConfig
from modelpool.mcp_server.source_index import SourceIndex
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing
from tests.conftest import CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL
from tests.e2e.mcp_helpers import POOL_MODELS, call, mcp_client, mcp_config
from tests.e2e.test_audio import SENTENCES
from tests.e2e.test_vision import QUESTION, VLM, ask, data_uri, png, vlm_config
from tests.live_server import live_server
from tests.speech_metrics import word_error_rate
from tests.vlm_models import tiny_llava

TOOLS = {"list_models", "chat", "embed", "rerank", "transcribe", "speak",
         "add_transcript", "query_transcripts", "list_sources", "get_transcript_stats"}  # fmt: skip


@dataclass(frozen=True)
class Served:
    url: str
    store: Path
    media: Path


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    store, media = tmp_path_factory.mktemp("transcripts"), tmp_path_factory.mktemp("media")
    vision = {VLM: {**vlm_config(tiny_llava()), "preload": False}}  # the chat tool's image
    async with live_server(create_app(mcp_config(store, media, more=vision))) as url:
        yield Served(url, store, media)


async def spoken_wav(url: str, text: str = SENTENCES) -> bytes:
    async with mcp_client(url) as client:
        result = await client.call_tool("speak", {"model": TTS_MODEL, "text": text, "deterministic": True})
    assert not result.is_error
    (audio,) = result.content
    assert isinstance(audio, AudioContent) and audio.mime_type == "audio/wav"
    return base64.b64decode(audio.data)


async def test_both_protocol_eras_list_every_tool(served: Served) -> None:
    for mode in ("auto", "legacy"):  # 2026-07-28 discovery, and the initialize handshake
        async with mcp_client(served.url, mode=mode) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == TOOLS, mode
        assert set(tools["chat"].input_schema["required"]) == {"model", "messages"}
        assert set(tools["add_transcript"].input_schema["required"]) == {"source_id", "text", "start", "end"}


async def test_list_models(served: Served) -> None:
    async with mcp_client(served.url) as client:
        listed = (await call(client, "list_models"))["models"]
    tasks = {model["id"]: model["tasks"] for model in listed}
    assert set(tasks) == {*POOL_MODELS, VLM}
    assert "chat" in tasks[CHAT_MODEL] and "embedding" in tasks[EMBED_MODEL]
    assert "transcription" in tasks[STT_MODEL] and "speech" in tasks[TTS_MODEL]


async def test_chat_answers_as_the_http_route_does(served: Served) -> None:
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Count from 1 to 5, separated by commas."}]  # fmt: skip
    async with mcp_client(served.url) as client:
        reply = await call(client, "chat", model=CHAT_MODEL, messages=messages, max_tokens=24, temperature=0)
    assert reply["model"] == CHAT_MODEL and all(str(n) in reply["text"] for n in range(1, 6)), reply["text"]
    assert 0 < reply["usage"]["completion_tokens"] <= 24 and reply["finish_reason"] in ("stop", "length")
    async with httpx.AsyncClient(base_url=served.url, timeout=120) as http:
        body = {"model": CHAT_MODEL, "messages": messages, "max_tokens": 24, "temperature": 0}
        over_http = (await http.post("/v1/chat/completions", json=body)).json()
    assert reply["text"] == over_http["choices"][0]["message"]["content"]  # greedy: the same words


async def test_chat_takes_an_image_as_the_http_route_does(served: Served) -> None:
    """The agent sample's VLM MCP server answers questions about an image; so does `chat`
    with `image_url`, on a (tiny, random-weight) vision model: the same answer as the HTTP
    route's for the same image, and a different one for another image."""
    (served.media / "blue.png").write_bytes(png("blue"))
    answers = {}
    async with mcp_client(served.url) as client, httpx.AsyncClient(base_url=served.url, timeout=120) as http:
        for name, url in (("red", data_uri(png("red"))), ("blue", (served.media / "blue.png").as_uri())):
            turn = [{"role": "user", "content": QUESTION}]
            reply = await call(client, "chat", model=VLM, messages=turn, image_url=url, max_tokens=8, temperature=0)
            body = {"model": VLM, "messages": ask(url), "max_tokens": 8, "temperature": 0}
            over_http = (await http.post("/v1/chat/completions", json=body)).json()
            assert reply["text"] == over_http["choices"][0]["message"]["content"]
            assert reply["usage"]["prompt_tokens"] == over_http["usage"]["prompt_tokens"]  # the image's tokens
            answers[name] = reply["text"]
    assert answers["red"] != answers["blue"]


async def test_embed_matches_the_http_route(served: Served) -> None:
    texts = ["a cat sat on the mat", "stock markets fell"]
    async with mcp_client(served.url) as client:
        reply = await call(client, "embed", model=EMBED_MODEL, input=texts)
    async with httpx.AsyncClient(base_url=served.url, timeout=120) as http:
        over_http = (await http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": texts})).json()
    assert reply["dimensions"] == 384 and len(reply["embeddings"]) == 2
    expected = np.array([item["embedding"] for item in over_http["data"]])
    np.testing.assert_allclose(np.array(reply["embeddings"]), expected, atol=1e-6)


RERANK_CASES = [
    ("How do I bake bread?", ["The stock market closed higher.", "Knead the dough, let it rise, then bake it.",
                              "Cats sleep most of the day."], 1),
    ("What do cats do all day?", ["Knead the dough and bake.", "Interest rates rose again.",
                                  "Cats sleep for most of the day."], 2),
    ("Why did shares go up?", ["Investors bought shares after strong earnings.", "Bread needs yeast.",
                               "The cat sat on the mat."], 0),
]  # fmt: skip


@pytest.mark.parametrize(("query", "documents", "relevant"), RERANK_CASES)
async def test_rerank_puts_the_relevant_passage_first(
    served: Served, query: str, documents: list[str], relevant: int
) -> None:
    async with mcp_client(served.url) as client:
        ranked = (await call(client, "rerank", model=EMBED_MODEL, query=query, documents=documents))["results"]
        best_two = await call(client, "rerank", model=EMBED_MODEL, query=query, documents=documents, top_n=2)
    assert ranked[0]["index"] == relevant and ranked[0]["document"] == documents[relevant]
    scores = [item["relevance_score"] for item in ranked]
    assert scores == sorted(scores, reverse=True) and sorted(item["index"] for item in ranked) == [0, 1, 2]
    assert best_two["results"] == ranked[:2]


async def test_speak_then_transcribe_from_base64_and_from_a_file(served: Served) -> None:
    audio = await spoken_wav(served.url)
    with wave.open(io.BytesIO(audio)) as reader:  # real sizes in the header: the whole file is there
        assert reader.getframerate() == 22050 and reader.getnframes() * 2 == len(audio) - 44
    (served.media / "speech.wav").write_bytes(audio)
    async with mcp_client(served.url) as client:
        encoded = base64.b64encode(audio).decode()
        from_base64 = await call(client, "transcribe", model=STT_MODEL, audio_base64=encoded)
        from_uri = await call(client, "transcribe", model=STT_MODEL, audio_base64=f"data:audio/wav;base64,{encoded}")
        from_file = await call(client, "transcribe", model=STT_MODEL, path=str(served.media / "speech.wav"))
    assert word_error_rate(SENTENCES, from_base64["text"]) <= 0.10, from_base64["text"]
    assert from_file["text"] == from_uri["text"] == from_base64["text"]
    assert from_base64["duration_s"] > 3 and from_base64["segments"][0]["start"] == 0
    assert from_base64["stored_under"] is None


async def test_transcribe_can_store_its_segments(served: Served) -> None:
    audio = base64.b64encode(await spoken_wav(served.url)).decode()
    async with mcp_client(served.url) as client:
        heard = await call(client, "transcribe", model=STT_MODEL, audio_base64=audio,
                           transcript_source="agent/mic", transcript_start=1000)  # fmt: skip
        stored = (await call(client, "query_transcripts", source_id="agent/mic"))["entries"]
    assert heard["stored_under"] == "agent/mic"
    assert [(e["start"], e["end"], e["text"]) for e in stored] == [
        (s["start"] + 1000, s["end"] + 1000, s["text"].strip()) for s in heard["segments"]
    ]


async def test_transcript_tools_keep_raw_ids_apart(served: Served) -> None:
    async with mcp_client(served.url) as client:
        for source, text, start in [("room/1", "hello from slash", 1), ("room:1", "hello from colon", 2),
                                    ("room/1", "bye from slash", 5)]:  # fmt: skip
            added = await call(client, "add_transcript", source_id=source, text=text, start=start, end=start + 1,
                               speaker="ann")  # fmt: skip
            assert added["source_id"] == source and added["text"] == text
        slash = (await call(client, "query_transcripts", source_id="room/1"))["entries"]
        colon = (await call(client, "query_transcripts", source_id="room:1", text="HELLO"))["entries"]
        windowed = (await call(client, "query_transcripts", text="hello", since=1.5, until=4))["entries"]
        sources = {s["source_id"]: s for s in (await call(client, "list_sources"))["sources"]}
        stats = await call(client, "get_transcript_stats")
    assert [(e["source_id"], e["text"]) for e in slash] == [("room/1", "hello from slash"),
                                                            ("room/1", "bye from slash")]  # fmt: skip
    assert [(e["source_id"], e["text"]) for e in colon] == [("room:1", "hello from colon")]
    assert [(e["source_id"], e["text"]) for e in windowed] == [("room/1", "hello from slash"),
                                                               ("room:1", "hello from colon")]  # fmt: skip
    assert (sources["room/1"]["entries"], sources["room:1"]["entries"]) == (2, 1)
    assert sources["room/1"]["speakers"] == ["ann"]
    assert stats["entries"] == sum(s["entries"] for s in sources.values()) and stats["sources"] == len(sources)
    files = {name: source for name, (_, source) in SourceIndex(served.store).files().items()}  # sidecar and journal
    assert files[next(n for n, s in files.items() if s == "room/1")] != files[next(n for n, s in files.items()
                                                                                   if s == "room:1")]  # fmt: skip


async def test_the_store_survives_a_restart(tmp_path: Path) -> None:
    config = mcp_config(tmp_path, preload=False)
    async with live_server(create_app(config)) as url, mcp_client(url) as client:
        await call(client, "add_transcript", source_id="cam/7", text="before the restart", start=3, end=4)
        await call(client, "add_transcript", source_id="cam:7", text="the other camera", start=5, end=6)
    async with live_server(create_app(config)) as url, mcp_client(url) as client:  # a new app, the same directory
        found = (await call(client, "query_transcripts"))["entries"]
        stats = await call(client, "get_transcript_stats")
    assert [(e["source_id"], e["text"], e["start"]) for e in found] == [
        ("cam/7", "before the restart", 3),
        ("cam:7", "the other camera", 5),
    ]
    assert (stats["sources"], stats["entries"], stats["skipped_lines"]) == (2, 2, 0)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_transcription_route_appends_to_the_store(served: Served, stream: bool) -> None:
    source = f"http:{'streamed' if stream else 'whole'}"
    form = {"model": STT_MODEL, "response_format": "verbose_json", "transcript_source": source,
            "transcript_start": "50", "stream": str(stream).lower()}  # fmt: skip
    files = {"file": ("speech.wav", await spoken_wav(served.url, "Good morning. The meeting starts at nine."))}
    async with httpx.AsyncClient(base_url=served.url, timeout=120) as http:
        response = await http.post("/v1/audio/transcriptions", data=form, files=files)
    assert response.status_code == 200, response.text
    async with mcp_client(served.url) as client:
        stored = (await call(client, "query_transcripts", source_id=source))["entries"]
    assert stored and all(e["start"] >= 50 for e in stored)
    if stream:  # the last event carries the whole text
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        done = next(event for event in events if event["type"] == "transcript.text.done")
        assert " ".join(e["text"] for e in stored) == done["text"]
    else:
        segments = response.json()["segments"]
        assert [(e["text"], round(e["start"] - 50, 3)) for e in stored] == [
            (s["text"].strip(), s["start"]) for s in segments
        ]
    assert "meeting" in " ".join(e["text"] for e in stored).lower()


async def test_api_keys_and_scopes(tmp_path: Path) -> None:
    holders = [{"name": "app", "scopes": ["inference"], "key_env": "APP_KEY"},
               {"name": "ops", "scopes": ["admin"], "key_env": "OPS_KEY"}]  # fmt: skip
    auth = AuthConfig.model_validate({"keys": holders})
    keys = KeyRing.from_config(auth, {"APP_KEY": "sk-app", "OPS_KEY": "sk-ops"})
    app = create_app(mcp_config(tmp_path, preload=False), keys=keys)
    async with live_server(app) as url:
        for key, message in [(None, "Missing API key"), ("sk-wrong", "Incorrect API key"), ("sk-ops", "lacks")]:
            with pytest.raises(Exception) as refused:  # an exception group: checked below
                async with mcp_client(url, key) as client:
                    await client.list_tools()
            assert refused.group_contains(MCPError, match=message)  # raised out of the client's task group
        async with mcp_client(url, "sk-app") as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            added = await call(client, "add_transcript", source_id="s", text="with a key", start=0, end=1)
        assert added["text"] == "with a key"
        async with httpx.AsyncClient(base_url=url) as http:
            denied = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert denied.status_code == 401
        assert denied.json()["error"]["data"] == {"status": 401, "type": "authentication_error",
                                                   "code": "invalid_api_key", "param": None}  # fmt: skip


async def test_it_can_be_turned_off_and_lets_in_the_cors_origins(tmp_path: Path) -> None:
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    off = create_app(mcp_config(tmp_path / "off", preload=False, mcp=False))
    async with live_server(off) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.post("/mcp", json=listing, headers=headers)).status_code == 404
    config = mcp_config(tmp_path / "on", preload=False, cors_origins=["https://app.example"])
    async with live_server(create_app(config)) as url, httpx.AsyncClient(base_url=url) as http:
        listed = await http.post("/mcp", json=listing, headers={**headers, "Origin": "https://app.example"})
        other = await http.post("/mcp", json=listing, headers={**headers, "Origin": "https://other.example"})
    assert listed.status_code == 200 and {t["name"] for t in listed.json()["result"]["tools"]} == TOOLS
    assert other.status_code == 403
