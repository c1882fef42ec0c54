"""Images on llama.cpp, in process (`llama_cpp` with `mmproj`) and as an engine process
(`llama_server` with `mmproj`: llama-cpp-python's server), on a tiny random-weight Idefics3
converted to GGUF + projector by llama.cpp's own converter (tests/vlm_gguf.py). Asserted:
the image reaches the model (red and blue answer differently, the same image the same), the
answer and the prompt's token count equal llama-cpp-python's own multimodal chat handler's,
and the engine process counts the image tokens the same."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionContentPartParam, ChatCompletionMessageParam
from PIL import Image

from tests.conftest import sdk, serving
from tests.vlm_gguf import tiny_vlm_gguf

QUESTION = "What is in the picture?"


def data_uri(color: str) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def ask(color: str) -> list[ChatCompletionMessageParam]:
    parts: list[ChatCompletionContentPartParam] = [
        {"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": data_uri(color)}}
    ]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def gguf() -> tuple[Path, Path]:
    return tiny_vlm_gguf()


@pytest.fixture(scope="module")
def reference(gguf: tuple[Path, Path]) -> Iterator[dict[str, tuple[str, int]]]:
    """llama-cpp-python's own multimodal chat handler on the same files: (answer, prompt tokens)."""
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import MTMDChatHandler

    model, mmproj = gguf
    llm = Llama(str(model), n_ctx=2048, verbose=False, chat_handler=MTMDChatHandler(str(mmproj), verbose=False))
    answers = {}
    for color in ("red", "blue"):
        # llama-cpp-python types messages as its own TypedDicts: the same OpenAI shape, another class.
        reply: Any = llm.create_chat_completion(messages=ask(color), max_tokens=8, temperature=0)  # type: ignore[arg-type]
        answers[color] = (reply["choices"][0]["message"]["content"], reply["usage"]["prompt_tokens"])
    llm.close()
    yield answers


async def answer(oai: openai.AsyncOpenAI, model: str, color: str) -> tuple[str, int]:
    reply = await oai.chat.completions.create(model=model, messages=ask(color), max_tokens=8, temperature=0)
    assert reply.usage is not None
    return reply.choices[0].message.content or "", reply.usage.prompt_tokens


async def test_in_process_and_engine_process_read_images_as_llama_cpp_does(
    gguf: tuple[Path, Path], reference: dict[str, tuple[str, int]], tmp_path: Path
) -> None:
    model, mmproj = gguf
    models = {
        "vlm-inproc": {"backend": "llama_cpp", "source": str(model), "options": {"mmproj": str(mmproj), "n_ctx": 2048}},
        "vlm-engine": {"backend": "llama_server", "source": str(model),
                       "options": {"mmproj": str(mmproj), "context_length": 2048, "stop_grace_s": 5}},
    }  # fmt: skip
    config = {"starter_models": False, "state_dir": str(tmp_path), "models": models}
    async with serving(config) as (_, client):
        oai = sdk(client)
        for model_id in models:
            red, blue, red_again = [await answer(oai, model_id, c) for c in ("red", "blue", "red")]
            assert red != blue and red == red_again, model_id
            if model_id == "vlm-inproc":
                assert {"red": red, "blue": blue} == reference
            else:  # that server samples with its own default repeat_penalty (1.1): the image tokens agree
                assert (red[1], blue[1]) == (reference["red"][1], reference["blue"][1])
            text_only = await oai.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": QUESTION}], max_tokens=4, temperature=0
            )
            assert text_only.usage is not None and text_only.usage.prompt_tokens < red[1]
        listed = {m["id"]: m["capabilities"] for m in (await client.get("/v1/models")).json()["data"]}
        assert all(listed[m]["modalities"] == ["image", "text"] for m in models)
