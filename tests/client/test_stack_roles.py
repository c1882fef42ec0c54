"""Every SDK role against a stack started with `modelpool up`: the agent stack's `llm`
service (chat, embeddings) and `speech` service (Whisper, Piper), found by service name in
the registry — the models.yaml names no host or port at all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from modelpool.client import (
    ChatMessage,
    InvalidRequest,
    ModelsConfig,
    load_models_config,
    make_embedder,
    make_llm,
    make_stt,
    make_tts,
    make_vlm,
    sync,
)
from modelpool.services.ports import free_port
from tests.client.conftest import write_models_yaml
from tests.client.helpers import cosine, tiny_png, words
from tests.conftest import CHAT_MODEL, EMBED_MODEL
from tests.stacks import by_name, cli, write_agent_stack

pytestmark = pytest.mark.e2e
ROLES: dict[str, dict[str, object]] = {
    "agent_llm": {"kind": "preset:smollm2", "service": "llm"},
    "search": {"kind": "preset:minilm", "service": "llm"},
    "eyes": {"kind": "preset:smollm2", "service": "llm", "capabilities": {"vision": True}},
    "ears": {"kind": "preset:whisper", "service": "speech"},
    "voice": {"kind": "preset:piper", "service": "speech", "extra_body": {"deterministic": True}},
}


@pytest.fixture(scope="module")
def stack_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("stack")
    state_dir = folder / "state"
    up = cli(state_dir, "up", str(write_agent_stack(folder / "agent", port_base=free_port())), "--detach")
    assert up.returncode == 0, up.stdout + up.stderr
    yield state_dir
    cli(state_dir, "down", "--all", "--grace", "10")


@pytest.fixture(scope="module")
def config(stack_state: Path, tmp_path_factory: pytest.TempPathFactory) -> ModelsConfig:
    return load_models_config(write_models_yaml(tmp_path_factory.mktemp("roles"), ROLES), state_dir=stack_state)


async def test_llm_role_chats_and_streams_on_the_llm_service(config: ModelsConfig, stack_state: Path) -> None:
    question = [ChatMessage.user("Name a fruit.")]
    async with make_llm(config, "agent_llm") as llm:
        assert llm.base_url == by_name(stack_state)["llm"].url
        await llm.wait_ready(60)
        reply = await llm.chat(question, max_tokens=16, temperature=0)
        deltas = [d async for d in llm.stream_chat(question, max_tokens=16, temperature=0)]
    assert reply.model == CHAT_MODEL and reply.content.strip() and reply.usage is not None
    assert "".join(d.content for d in deltas) == reply.content


async def test_embedder_role_on_the_llm_service(config: ModelsConfig) -> None:
    async with make_embedder(config, "search") as embedder:
        await embedder.wait_ready(60)
        result = await embedder.embed(["A dog runs in the park.", "A puppy plays outside.", "Tax rates rose."])
    dog, puppy, tax = result.vectors
    assert result.model == EMBED_MODEL and len(dog) == 384
    assert cosine(dog, puppy) > cosine(dog, tax)


async def test_tts_and_stt_roles_round_trip_on_the_speech_service(config: ModelsConfig, stack_state: Path) -> None:
    text = "Please open the window."
    async with make_tts(config, "voice") as tts, make_stt(config, "ears") as stt:
        assert tts.base_url == stt.base_url == by_name(stack_state)["speech"].url
        await tts.wait_ready(60)
        await stt.wait_ready(60)
        speech = await tts.speak(text)
        streamed = b"".join([chunk async for chunk in tts.stream_speak(text, response_format="pcm")])
        transcript = await stt.transcribe(speech.audio)
    assert speech.audio[:4] == b"RIFF" and len(streamed) > 1000
    assert words(transcript.text) == words(text)


async def test_vlm_role_sends_the_image_and_the_text_model_refuses_it(config: ModelsConfig) -> None:
    """No vision-language model exists on this machine (../shared/MODELS.md), so the VLM
    role meets a text-only model: the image reaches the server, which names the part it
    cannot take, and the SDK raises that as InvalidRequest."""
    async with make_vlm(config, "eyes") as vlm:
        with pytest.raises(InvalidRequest) as caught:
            await vlm.chat([ChatMessage.user("What is in the picture?", images=[tiny_png()])], max_tokens=8)
    assert caught.value.param == "messages[0].content[1]" and caught.value.status_code == 400


def test_sync_facade_on_the_stack(config: ModelsConfig) -> None:
    with sync.make_llm(config, "agent_llm") as llm, sync.make_embedder(config, "search") as embedder:
        llm.wait_ready(60)
        text = "".join(d.content for d in llm.stream_chat([ChatMessage.user("Say hi.")], max_tokens=8, temperature=0))
        assert text == llm.chat([ChatMessage.user("Say hi.")], max_tokens=8, temperature=0).content
        assert len(embedder.embed("hello").vectors[0]) == 384
