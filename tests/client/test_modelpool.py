"""The SDK against a real `modelpool serve` with the real starter models: every role through
a models.yaml loaded with load_models_config, readiness, typed errors, `service:` lookup."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from modelpool.client import (
    AdminClient,
    AuthenticationError,
    ChatMessage,
    ConfigError,
    ConnectionFailed,
    InvalidRequest,
    ModelLoadError,
    ModelNotFound,
    ModelsConfig,
    PermissionDenied,
    ReadyTimeout,
    load_models_config,
    make_embedder,
    make_llm,
    make_reranker,
    make_stt,
    make_tts,
    make_vlm,
)
from modelpool.services.pids import create_time
from modelpool.services.ports import free_port
from modelpool.services.registry import Registry, ServiceRecord
from tests.client.conftest import (
    ENVIRON,
    KEY,
    KEY_ENV,
    PATTERN,
    RERANKER,
    SLEEPER,
    THINKER,
    VLM,
    keyed,
    write_models_yaml,
)
from tests.client.helpers import cosine, serving_file, solid_png, tiny_png, words
from tests.conftest import CHAT_MODEL
from tests.processes import Server, running

pytestmark = pytest.mark.e2e
HELLO = [ChatMessage.system("You are brief."), ChatMessage.user("Name three colors.")]
SPOKEN = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def config(pool_server: Server, tmp_path_factory: pytest.TempPathFactory) -> ModelsConfig:
    url = pool_server.url
    roles: dict[str, dict[str, object]] = {
        "agent_llm": keyed(url, "preset:smollm2"),
        "thinker": keyed(url, "preset:qwen3", model_name=THINKER),
        "thinker_as_gpt_oss": keyed(url, "preset:gpt-oss", model_name=THINKER),
        "search": keyed(f"{url}/v1", "preset:minilm"),  # a trailing /v1 is accepted
        "reranker": keyed(url, "openai_compat", model_name=RERANKER),
        "ears": keyed(url, "preset:whisper"),
        "polyglot_ears": keyed(url, "preset:whisper-base"),
        "japanese_voice": keyed(url, "preset:kokoro", extra_body={"language": "ja", "voice": "jf_alpha"}),
        "voice": keyed(url, "preset:piper", extra_body={"deterministic": True}),
        "eyes": keyed(url, "preset:smollm2", capabilities={"vision": True}),  # a lie: SmolLM2 reads no images
        "vision": keyed(url, "openai_compat", model_name=VLM, capabilities={"vision": True}),
        "ghost_model": keyed(url, "preset:smollm2", model_name="no-such-model"),
        "sleeper": keyed(url, "openai_compat", model_name=SLEEPER),
        "wrong_key": {"kind": "preset:smollm2", "base_url": url, "api_key_env": "WRONG_KEY"},
    }
    folder = tmp_path_factory.mktemp("sdk")
    return load_models_config(write_models_yaml(folder, roles), environ=ENVIRON)


async def test_llm_waits_ready_then_chats_with_usage(config: ModelsConfig) -> None:
    async with make_llm(config, "agent_llm") as llm:
        await llm.wait_ready(30)
        reply = await llm.chat(HELLO, max_tokens=24, temperature=0)
    assert reply.content.strip() and reply.model == CHAT_MODEL
    assert reply.finish_reason in ("stop", "length") and reply.reasoning == ""
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


async def test_stream_chat_deltas_join_to_the_answer_and_end_with_usage(config: ModelsConfig) -> None:
    async with make_llm(config, "agent_llm") as llm:
        whole = await llm.chat(HELLO, max_tokens=24, temperature=0)
        deltas = [d async for d in llm.stream_chat(HELLO, max_tokens=24, temperature=0)]
    assert "".join(d.content for d in deltas) == whole.content
    assert [d.finish_reason for d in deltas if d.finish_reason] == [whole.finish_reason]
    assert deltas[-1].usage == whole.usage


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=18, le=99)


def get_weather(city: Annotated[str, Field(max_length=30)], unit: Literal["celsius", "fahrenheit"]) -> str:
    """Current weather in a city."""
    return f"21 degrees {unit} in {city}"


async def test_tools_and_typed_structured_output_on_the_real_model(config: ModelsConfig) -> None:
    async with make_llm(config, "agent_llm") as llm:
        person = await llm.chat([ChatMessage.user("Invent a person.")], response_format=Person, temperature=0)
        assert isinstance(person.parsed, Person) and 18 <= person.parsed.age <= 99
        question = [ChatMessage.user("What's the weather in Oslo?")]
        called = await llm.chat(question, tools=[get_weather], tool_choice="get_weather", temperature=0)
        [call] = called.tool_calls
        assert call.name == "get_weather" and called.finish_reason == "tool_calls"
        result = get_weather(**call.args)
        history = [*question, ChatMessage.from_result(called), ChatMessage.tool(call.id, result)]
        answer = await llm.chat(history, tools=[get_weather], tool_choice="none", max_tokens=40, temperature=0)
    assert answer.content.strip() and not answer.tool_calls


async def test_complete_continues_a_prompt(config: ModelsConfig) -> None:
    async with make_llm(config, "agent_llm") as llm:
        # ignore_eos: exactly 4 tokens, even where greedy would end after " Paris."
        result = await llm.complete(
            "The capital of France is", max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )
    assert "Paris" in result.text and result.usage is not None and result.usage.completion_tokens == 4


async def test_embedder_gives_384_dims_and_related_sentences_are_closer(config: ModelsConfig) -> None:
    texts = ["A cat sits on the mat.", "A kitten is resting on a rug.", "The stock market fell sharply today."]
    async with make_embedder(config, "search") as embedder:
        result = await embedder.embed(texts)
        single = await embedder.embed(texts[0])
    cat, kitten, market = result.vectors
    assert len(cat) == 384 and len(result.vectors) == 3
    assert cosine(cat, kitten) > cosine(cat, market) + 0.3
    assert single.vectors[0] == pytest.approx(cat, abs=1e-5)
    assert result.usage is not None and result.usage.prompt_tokens > 0


async def test_reranker_on_an_embedder_and_on_a_cross_encoder(config: ModelsConfig, pool_server: Server) -> None:
    passages = ["Bread is baked from flour.", "Jupiter is the largest planet.", "Rain falls from clouds."]
    async with make_reranker(config, "search") as by_cosine, make_reranker(config, "reranker") as cross:
        ranked = await by_cosine.rerank("Which planet is biggest?", passages, top_n=2, return_documents=True)
        await cross.wait_ready(60)
        scored = await cross.score("Which planet is biggest?", passages)
        reranked = await cross.rerank("Which planet is biggest?", passages)
    assert ranked.order[0] == 1 and len(ranked.results) == 2
    assert ranked.results[0].document == {"text": passages[1]}
    assert ranked.results[0].score > ranked.results[1].score
    assert len(scored) == 3 and reranked.order == sorted(range(3), key=lambda i: -scored[i])
    assert [r.score for r in reranked.results] == pytest.approx(sorted(scored, reverse=True), abs=1e-6)


async def test_speech_round_trip_comes_back_word_for_word(config: ModelsConfig) -> None:
    async with make_tts(config, "voice") as tts, make_stt(config, "ears") as stt:
        await tts.wait_ready(30)
        speech = await tts.speak(SPOKEN)
        transcript = await stt.transcribe(speech.audio)
    assert speech.format == "wav" and speech.audio[:4] == b"RIFF"
    assert words(transcript.text) == words(SPOKEN)
    assert transcript.language == "en" and transcript.duration is not None and transcript.duration > 1
    assert transcript.segments and words(" ".join(s.text for s in transcript.segments)) == words(SPOKEN)


async def test_multilingual_presets_speak_and_hear_japanese(config: ModelsConfig) -> None:
    """The kokoro and whisper-base presets: Japanese speech, heard back with its language."""
    async with make_tts(config, "japanese_voice") as tts, make_stt(config, "polyglot_ears") as stt:
        speech = await tts.speak("この本はとても面白いです。")
        transcript = await stt.transcribe(speech.audio)
    assert speech.audio[:4] == b"RIFF"
    assert transcript.language == "ja"
    assert "本" in transcript.text and "面白い" in transcript.text, transcript.text


async def test_stream_speak_arrives_in_chunks_equal_to_the_whole(config: ModelsConfig, tmp_path: Path) -> None:
    text = "Good morning. The weather is fine today. We will walk to the park."
    async with make_tts(config, "voice") as tts, make_stt(config, "ears") as stt:
        chunks = [chunk async for chunk in tts.stream_speak(text)]
        whole = await tts.speak(text)
        (tmp_path / "speech.wav").write_bytes(whole.audio)
        heard = await stt.transcribe(tmp_path / "speech.wav")  # a path works as well as bytes
        voices = await tts.voices()
    assert len(chunks) > 1 and b"".join(chunks) == whole.audio  # deterministic: the same audio both ways
    assert words(heard.text) == words(text)
    assert any(v.model == "piper-en-us-joe" and v.sample_rate == 22050 for v in voices)


async def test_unknown_model_raises_model_not_found_with_its_code(config: ModelsConfig) -> None:
    async with make_llm(config, "ghost_model") as llm:
        with pytest.raises(ModelNotFound) as caught:
            await llm.chat(HELLO, max_tokens=4)
        with pytest.raises(ModelNotFound):
            await llm.wait_ready(5)  # /readyz?model= knows it does not exist: no waiting
    error = caught.value
    assert (error.status_code, error.code, error.param) == (404, "model_not_found", "model")
    assert "no-such-model" in error.message and CHAT_MODEL in error.message


async def test_bad_request_raises_invalid_request_naming_the_param(config: ModelsConfig) -> None:
    async with make_llm(config, "agent_llm") as llm:
        with pytest.raises(InvalidRequest) as caught:
            await llm.chat(HELLO, temperature=7.5)
    error = caught.value
    assert (error.status_code, error.code, error.param) == (400, "invalid_value", "temperature")
    assert error.error_type == "invalid_request_error"


async def test_a_wrong_key_raises_authentication_error(config: ModelsConfig) -> None:
    async with make_llm(config, "wrong_key") as llm:
        await llm.wait_ready(10)  # /readyz is open
        with pytest.raises(AuthenticationError) as caught:
            await llm.chat(HELLO, max_tokens=4)
    assert (caught.value.status_code, caught.value.code) == (401, "invalid_api_key")


async def test_vlm_sends_the_image_and_a_text_only_model_refuses_it(config: ModelsConfig) -> None:
    """The `eyes` role claims vision for SmolLM2, which reads no images: modelpool's 400 for
    the image part comes back typed, naming the part."""
    async with make_vlm(config, "eyes") as vlm:
        with pytest.raises(InvalidRequest) as caught:
            await vlm.chat([ChatMessage.user("What is in this picture?", images=[tiny_png()])], max_tokens=8)
    error = caught.value
    assert error.param == "messages[0].content[1]" and error.code == "modality_unsupported"


async def test_vlm_reads_images_as_bytes_path_url_and_data_uri(config: ModelsConfig, tmp_path: Path) -> None:
    """The same picture given four ways gets the same answer from a real vision model, and a
    different picture a different one (the tiny VLM's words are nonsense, its sight is not)."""
    red, blue = solid_png("red"), solid_png("blue")
    (tmp_path / "red.png").write_bytes(red)
    with serving_file(red) as url:
        data_uri = "data:image/png;base64," + base64.b64encode(red).decode()
        sources: list[bytes | Path | str] = [red, tmp_path / "red.png", url, data_uri]
        async with make_vlm(config, "vision") as vlm:
            await vlm.wait_ready(60)
            answers = [
                (await vlm.chat([ChatMessage.user("What is this?", images=[source])], max_tokens=6, temperature=0))
                for source in sources
            ]
            other = await vlm.chat([ChatMessage.user("What is this?", images=[blue])], max_tokens=6, temperature=0)
    assert len({a.content for a in answers}) == 1 and answers[0].content
    assert other.content != answers[0].content
    assert answers[0].usage is not None and answers[0].usage.prompt_tokens > 10


async def test_make_vlm_refuses_a_role_without_vision(config: ModelsConfig) -> None:
    with pytest.raises(ConfigError, match="vision"):
        make_vlm(config, "agent_llm")


async def test_reasoning_preset_maps_enable_thinking_and_reads_the_reasoning(config: ModelsConfig) -> None:
    question = [ChatMessage.user(PATTERN)]
    async with make_llm(config, "thinker") as llm, make_llm(config, "thinker_as_gpt_oss") as other:
        await llm.wait_ready(30)  # loads on demand: ready at once
        thinking = await llm.chat(question, max_tokens=12, temperature=0, enable_thinking=True)
        plain = await llm.chat(question, max_tokens=12, temperature=0, enable_thinking=False)
        deltas = [d async for d in llm.stream_chat(question, max_tokens=12, temperature=0, enable_thinking=True)]
        aliased = await other.chat(question, max_tokens=12, temperature=0)  # gpt-oss: no switch, other field first
    assert (thinking.reasoning, thinking.content.strip()) == ("three", "A: 3")
    assert plain.reasoning == "" and plain.content.startswith("A: 3")
    assert "".join(d.reasoning for d in deltas) == "three" and "".join(d.content for d in deltas) == thinking.content
    assert aliased.reasoning == "three"


async def test_wait_ready_times_out_saying_what_it_last_saw(config: ModelsConfig) -> None:
    async with make_llm(config, "sleeper") as sleeper:
        started = time.monotonic()
        with pytest.raises(ReadyTimeout) as caught:
            await sleeper.wait_ready(1.0, poll_s=0.1)
    assert 1.0 <= time.monotonic() - started < 5
    assert (caught.value.last_status, caught.value.last_code) == (503, "model_not_ready")
    assert "autoload off" in caught.value.message


async def test_wait_ready_times_out_when_nothing_listens(tmp_path: Path) -> None:
    roles = {"llm": {"kind": "preset:smollm2", "base_url": f"http://127.0.0.1:{free_port()}", "connect_timeout_s": 1}}
    async with make_llm(load_models_config(write_models_yaml(tmp_path, roles)), "llm") as llm:
        with pytest.raises(ReadyTimeout) as caught:
            await llm.wait_ready(0.5, poll_s=0.1)
    assert caught.value.last_status is None and "cannot reach" in caught.value.message


async def test_health_check_false_skips_the_probe(tmp_path: Path) -> None:
    # A socket that listens but never answers: a probe would connect (seen by accept) and
    # wait for an answer (past wait_ready's own timeout: the 5 s bound turns that into a failure).
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        roles = {"llm": {"kind": "preset:smollm2", "base_url": url, "health_check": False}}
        async with make_llm(load_models_config(write_models_yaml(tmp_path, roles)), "llm") as llm, asyncio.timeout(5):
            await llm.wait_ready(0.5)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected: nothing was asked


@pytest.fixture
def broken_server(tmp_path: Path) -> Iterator[Server]:
    """A second, tiny modelpool whose only (preloaded) model has a source that does not exist."""
    config = tmp_path / "broken.yaml"
    config.write_text(f"starter_models: false\nmodels: {{ghost: {{backend: llama_cpp, source: {tmp_path}/no.gguf}}}}\n")
    port = free_port()
    argv = [sys.executable, "-m", "modelpool", "serve", "--host", "127.0.0.1", "--port", str(port), "-c", str(config)]
    with running(argv, tmp_path / "broken.log", "/healthz", port=port) as server:
        yield server


async def test_wait_ready_raises_model_load_error_at_once(broken_server: Server, tmp_path: Path) -> None:
    roles = {"llm": {"kind": "openai_compat", "base_url": broken_server.url, "model_name": "ghost"}}
    async with make_llm(load_models_config(write_models_yaml(tmp_path, roles)), "llm") as llm:
        started = time.monotonic()
        with pytest.raises(ModelLoadError) as caught:
            await llm.wait_ready(60, poll_s=0.1)  # ghost may still be "loading" for a moment
    assert time.monotonic() - started < 20
    assert caught.value.code in ("model_load_error", "model_source_error") and "does not exist" in caught.value.message


async def test_a_role_found_by_service_name(pool_server: Server, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    pid, port = pool_server.process.pid, int(pool_server.url.rsplit(":", 1)[1])
    record = ServiceRecord(id=f"agents:pool@{port}", name="pool", kind="modelpool", pid=pid, port=port,
                           url=pool_server.url, started_at=create_time(pid) or 0.0, stack="agents")  # fmt: skip
    Registry(state_dir).put(record)
    roles = {"llm": {"kind": "preset:smollm2", "service": "pool", "api_key_env": KEY_ENV},
             "elsewhere": {"kind": "preset:smollm2", "service": "not-running"}}  # fmt: skip
    config = load_models_config(write_models_yaml(tmp_path, roles), environ=ENVIRON, state_dir=state_dir)
    async with make_llm(config, "llm") as llm:
        assert llm.base_url == pool_server.url
        await llm.wait_ready(10)
        assert (await llm.chat(HELLO, max_tokens=4, extra_body={"min_tokens": 1})).content  # sampled: ≥ 1 token
    with pytest.raises(ConfigError, match=r"no running service named 'not-running' \(start it with `modelpool up`\)"):
        make_llm(config, "elsewhere")
    Registry(state_dir).put(dataclasses.replace(record, id=f"agents:pool@{port + 1}"))
    with pytest.raises(ConfigError, match="2 running services are called") as caught:
        make_llm(config, "llm")
    assert f"agents:pool@{port}" in caught.value.message and pool_server.url in caught.value.message


def test_admin_client_raises_the_same_typed_errors(pool_server: Server) -> None:
    with AdminClient(pool_server.url, api_key=KEY) as admin, pytest.raises(PermissionDenied) as caught:
        admin.models()  # the key has the inference scope only
    assert (caught.value.status_code, caught.value.code) == (403, "insufficient_scope")
    with AdminClient(f"http://127.0.0.1:{free_port()}") as admin, pytest.raises(ConnectionFailed, match="cannot reach"):
        admin.memory()
