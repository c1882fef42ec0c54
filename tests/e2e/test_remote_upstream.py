"""`openai_remote` models: a second, real modelpool server on loopback (with an API key) is
the upstream; the front modelpool forwards to it behind the `allow_remote` gate."""

from __future__ import annotations

import io
import logging
import wave
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam

from modelpool.services.ports import free_port
from tests.conftest import CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL, sdk, serving
from tests.processes import Server, modelpool_serve

SECRET = "sk-upstream-8c1f0e2d-never-log-me"
ALLOW = {"allow_remote": True}
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("upstream")
    config = {
        "enabled_models": [CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL],
        "auth": {"keys": [{"name": "front", "scopes": ["inference"], "key_env": "UPSTREAM_KEY"}]},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    argv = ("-c", str(folder / "config.yaml"), "--log-format", "json")
    with modelpool_serve(folder / "server.log", *argv, env={"UPSTREAM_KEY": SECRET}) as server:
        yield server


def remote(upstream_url: str, model: str, **settings: Any) -> dict[str, Any]:
    options = {"base_url": f"{upstream_url}/v1", "upstream_model": model, "api_key_env": "FRONT_KEY"}
    return {"backend": "openai_remote", "options": {**options, **settings.pop("options", {})}, **settings}


@pytest.fixture
async def front(upstream: Server, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("FRONT_KEY", SECRET)
    monkeypatch.setenv("WRONG_KEY", "sk-wrong")
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    unchecked = {"health_check": False}
    models = {
        "remote-chat": remote(upstream.url, CHAT_MODEL, tasks=["chat", "completion"]),
        "remote-embed": remote(upstream.url, EMBED_MODEL, tasks=["embedding"], allow_remote=True),
        "remote-wrong-key": remote(upstream.url, CHAT_MODEL, options={"api_key_env": "WRONG_KEY", **unchecked}),
        "remote-down": remote(closed, CHAT_MODEL, options={**unchecked, "retries": 2, "retry_backoff_s": 0.05}),
        "remote-down-checked": remote(closed, CHAT_MODEL, preload=False, options={"retries": 0}),
        "remote-stt": remote(upstream.url, STT_MODEL, tasks=["transcription"], allow_remote=True),
        "remote-tts": remote(upstream.url, TTS_MODEL, tasks=["speech"], allow_remote=True,
                             options={"speech_sample_rate": 22050}),  # Piper's rate
    }
    async with serving({"starter_models": False, "models": models}) as (_, client):
        yield client


def direct(upstream: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{upstream.url}/v1", api_key=SECRET, max_retries=0)


async def test_remote_models_need_allow_remote(front: httpx.AsyncClient) -> None:
    oai = sdk(front)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        await oai.chat.completions.create(model="remote-chat", messages=HI, max_tokens=4)
    assert refused.value.code == "remote_not_allowed" and "allow_remote" in refused.value.message
    # min_tokens goes through to the upstream (a modelpool): sampled, an end-of-sequence first
    # would otherwise leave no text.
    allowed = await oai.chat.completions.create(
        model="remote-chat", messages=HI, max_tokens=4, extra_body={**ALLOW, "min_tokens": 4}
    )
    assert allowed.usage is not None
    assert allowed.choices[0].message.content and allowed.usage.completion_tokens == 4
    # A model marked `allow_remote: true` in the config needs no flag.
    assert (await oai.embeddings.create(model="remote-embed", input="hello")).data


async def test_chat_and_streams_are_forwarded_faithfully(front: httpx.AsyncClient, upstream: Server) -> None:
    want = await direct(upstream).chat.completions.create(model=CHAT_MODEL, messages=HI, max_tokens=12, temperature=0)
    oai = sdk(front)
    got = await oai.chat.completions.create(
        model="remote-chat", messages=HI, max_tokens=12, temperature=0, extra_body=ALLOW
    )
    assert got.model == "remote-chat"
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage == want.usage and got.choices[0].finish_reason == want.choices[0].finish_reason
    stream = await oai.chat.completions.create(
        model="remote-chat", messages=HI, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=ALLOW,
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.choices[0].message.content
    assert chunks[-1].usage == want.usage


async def test_completion_logprobs_and_embeddings_match_the_upstream(
    front: httpx.AsyncClient, upstream: Server
) -> None:
    ask: dict[str, Any] = {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "logprobs": 2}
    want = await direct(upstream).completions.create(model=CHAT_MODEL, **ask)
    got = await sdk(front).completions.create(model="remote-chat", extra_body=ALLOW, **ask)
    assert got.choices[0].text == want.choices[0].text
    assert got.choices[0].logprobs is not None and want.choices[0].logprobs is not None
    assert got.choices[0].logprobs.tokens == want.choices[0].logprobs.tokens
    assert got.choices[0].logprobs.token_logprobs == pytest.approx(want.choices[0].logprobs.token_logprobs, abs=1e-6)

    texts = ["a red apple", "the blue sea"]
    want_vectors = await direct(upstream).embeddings.create(model=EMBED_MODEL, input=texts)
    got_vectors = await sdk(front).embeddings.create(model="remote-embed", input=texts)
    for mine, theirs in zip(got_vectors.data, want_vectors.data, strict=True):
        assert mine.embedding == pytest.approx(theirs.embedding, abs=1e-6)
    assert got_vectors.usage.prompt_tokens == want_vectors.usage.prompt_tokens


async def test_upstream_errors_keep_their_status_and_message(front: httpx.AsyncClient) -> None:
    oai = sdk(front)
    with pytest.raises(openai.AuthenticationError) as wrong_key:
        await oai.chat.completions.create(model="remote-wrong-key", messages=HI, max_tokens=4, extra_body=ALLOW)
    assert "upstream 'remote-wrong-key' answered 401" in wrong_key.value.message
    with pytest.raises(openai.BadRequestError) as too_long:
        await oai.chat.completions.create(model="remote-chat", messages=HI, max_tokens=10**6, extra_body=ALLOW)
    assert "upstream 'remote-chat' answered 400" in too_long.value.message
    assert too_long.value.code == "context_length_exceeded"  # the upstream's own code


async def test_unreachable_upstreams_are_retried_then_reported(
    front: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="modelpool.upstream")
    body = {"model": "remote-down", "messages": HI, "max_tokens": 4, **ALLOW}
    response = await front.post("/v1/chat/completions", json=body)
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_unavailable"
    assert "is unreachable" in response.json()["error"]["message"]
    assert len([r for r in caplog.records if r.getMessage() == "upstream unreachable; retrying"]) == 2
    checked = await front.post("/v1/admin/models/remote-down-checked/load")
    assert checked.status_code == 503 and "health check failed" in checked.json()["error"]["message"]


async def test_the_api_key_never_shows(front: httpx.AsyncClient, upstream: Server, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    await sdk(front).chat.completions.create(model="remote-chat", messages=HI, max_tokens=2, extra_body=ALLOW)
    await front.post("/v1/chat/completions", json={"model": "remote-down", "messages": HI, **ALLOW})
    admin = (await front.get("/v1/admin/models")).text
    assert "FRONT_KEY" in admin and SECRET not in admin  # the variable's name, never its value
    assert SECRET not in caplog.text and SECRET not in upstream.log_text()
    assert "sk-wrong" not in caplog.text


async def test_speech_and_transcription_are_forwarded(front: httpx.AsyncClient, upstream: Server) -> None:
    oai = sdk(front)
    # Deterministic (Piper's noise off, forwarded to the upstream): a noisy take was once heard as "kuiit".
    spoken = await oai.audio.speech.create(model="remote-tts", voice="alloy", input="The quick brown fox.",
                                           response_format="wav", extra_body={"deterministic": True})  # fmt: skip
    wav = spoken.content
    with wave.open(io.BytesIO(wav)) as audio:
        assert audio.getframerate() == 22050 and audio.getnframes() / 22050 > 0.8
    heard = await oai.audio.transcriptions.create(model="remote-stt", file=("fox.wav", wav, "audio/wav"),
                                                  response_format="verbose_json")  # fmt: skip
    assert "quick brown fox" in heard.text.lower() and heard.segments
    upload = ("fox.wav", wav, "audio/wav")
    direct_heard = await direct(upstream).audio.transcriptions.create(model=STT_MODEL, file=upload)
    assert heard.text.strip() == direct_heard.text.strip()
