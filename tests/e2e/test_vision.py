"""Images in chat, through the official openai SDK, on a tiny random-weight LLaVA-style model
(tests/vlm_models.py: no real VLM installs here) in the transformers backend, and forwarded
to it by a front modelpool (`openai_remote`, `vision: true`). Random weights talk nonsense,
so what is asserted is real: the image reaches the model (red and blue answer differently,
the same image the same), the answer equals plain transformers `generate` token for token,
and the prompt's token count includes the image tokens."""

from __future__ import annotations

import asyncio
import base64
import io
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
import yaml
from openai.types.chat import ChatCompletion, ChatCompletionContentPartParam, ChatCompletionMessageParam
from openai.types.responses import ResponseInputImageParam, ResponseInputMessageContentListParam
from PIL import Image

from tests.conftest import CHAT_MODEL, sdk, serving
from tests.processes import Server, modelpool_serve
from tests.vlm_models import direct_generate, tiny_idefics3, tiny_llava, tiny_qwen2_vl
from tests.web_servers import web_server

VLM = "tiny-llava"
IDEFICS = "tiny-idefics3"
QWEN = "tiny-qwen2-vl"
QUESTION = "What is in the picture?"


def png(color: str, size: tuple[int, int] = (64, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def ask(url: str, text: str = QUESTION) -> list[ChatCompletionMessageParam]:
    parts: list[ChatCompletionContentPartParam] = [
        {"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}
    ]
    return [{"role": "user", "content": parts}]


def vlm_config(folder: Path, **options: object) -> dict[str, object]:
    return {"backend": "transformers", "source": str(folder), "options": {"vision": True, **options}}


@pytest.fixture(scope="module")
def folder() -> Path:
    return tiny_llava()


@pytest.fixture(scope="module")
async def client(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    media = tmp_path_factory.mktemp("media")
    (media / "green.png").write_bytes(png("green"))
    models = {
        VLM: {**vlm_config(folder, max_images=2), "preload": True},
        IDEFICS: vlm_config(tiny_idefics3()),
        QWEN: vlm_config(tiny_qwen2_vl()),
    }
    server = {"allowed_local_media_dirs": [str(media)], "max_image_pixels": 1_000_000, "max_image_bytes": 200_000}
    enabled = [VLM, IDEFICS, QWEN, CHAT_MODEL]
    async with serving({"enabled_models": enabled, "models": models, "server": server}) as (app, http):
        await app.state.pool.slot(VLM).ensure_ready(None)
        http.headers["x-media-dir"] = str(media)  # where the tests find it (not read by the server)
        yield http


async def answer(
    oai: openai.AsyncOpenAI, messages: list[ChatCompletionMessageParam], model: str = VLM
) -> ChatCompletion:
    return await oai.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)


async def test_the_image_reaches_the_model_and_matches_plain_transformers(client: httpx.AsyncClient,
                                                                          folder: Path) -> None:  # fmt: skip
    oai = sdk(client)
    red, blue, red_again = [await answer(oai, ask(data_uri(png(c)))) for c in ("red", "blue", "red")]
    assert red.choices[0].message.content != blue.choices[0].message.content
    assert red.choices[0].message.content == red_again.choices[0].message.content
    template = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image"}]}]
    ids, prompt_tokens = direct_generate(folder, template, [Image.new("RGB", (64, 64), "red")], 8)
    from transformers import AutoTokenizer

    assert red.choices[0].message.content == AutoTokenizer.from_pretrained(folder).decode(ids, skip_special_tokens=True)
    assert red.usage is not None
    assert red.usage.prompt_tokens == prompt_tokens  # the image's tokens counted as the engine counts them
    text_only = await oai.chat.completions.create(
        model=VLM, messages=[{"role": "user", "content": QUESTION}], max_tokens=8, temperature=0
    )
    assert text_only.usage is not None
    assert text_only.usage.prompt_tokens < prompt_tokens


async def test_a_smolvlm_family_model_matches_plain_transformers_too(client: httpx.AsyncClient) -> None:
    """Idefics3 (SmolVLM's family): its processor wraps each image in its own tokens."""
    oai = sdk(client)
    red, blue = [await answer(oai, ask(data_uri(png(c))), model=IDEFICS) for c in ("red", "blue")]
    assert red.choices[0].message.content != blue.choices[0].message.content
    template = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image"}]}]
    ids, prompt_tokens = direct_generate(tiny_idefics3(), template, [Image.new("RGB", (64, 64), "blue")], 8)
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(tiny_idefics3()).decode(ids, skip_special_tokens=True)
    assert blue.usage is not None
    assert blue.choices[0].message.content == expected and blue.usage.prompt_tokens == prompt_tokens


def direct_logprobs(folder: Path, color: str, steps: int) -> list[float]:
    """Plain transformers `generate` (greedy): the log-probability of each chosen token."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    template = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image"}]}]
    text = processor.apply_chat_template(template, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.new("RGB", (64, 64), color)], return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)  # fmt: skip
    chosen = out.sequences[0, inputs["input_ids"].shape[1] :]
    steps_logits = zip(out.logits, chosen, strict=True)
    return [float(torch.log_softmax(logits[0].float(), -1)[token]) for logits, token in steps_logits]


async def test_qwen2_vl_decodes_in_the_batch_from_its_rotary_offset(client: httpx.AsyncClient) -> None:
    """Qwen2-VL's M-RoPE gives an image fewer positions than tokens (16 tokens, 4 positions
    for a 64x64 picture): each sequence decodes from its own offset, alone or in a batch with
    others. The log-probabilities, which move with any position error even where the tiny
    model's greedy words do not, equal plain transformers'."""
    oai = sdk(client)

    async def scored(messages: list[ChatCompletionMessageParam]) -> ChatCompletion:
        return await oai.chat.completions.create(model=QWEN, messages=messages, max_tokens=6, temperature=0,
                                                 logprobs=True)  # fmt: skip

    colors = ("red", "blue", "green")
    alone = [await scored(ask(data_uri(png(c)))) for c in colors]
    batched = await asyncio.gather(*(scored(ask(data_uri(png(c)))) for c in colors),
                                   scored([{"role": "user", "content": "Say hi."}]))  # fmt: skip
    for color, one, together in zip(colors, alone, batched, strict=False):
        expected = direct_logprobs(tiny_qwen2_vl(), color, 6)
        for reply in (one, together):
            assert reply.choices[0].logprobs is not None and reply.choices[0].logprobs.content is not None
            got = [entry.logprob for entry in reply.choices[0].logprobs.content]
            assert got == pytest.approx(expected, abs=1e-4), color


async def test_images_and_text_requests_share_the_batch_and_answer_as_alone(client: httpx.AsyncClient) -> None:
    oai = sdk(client)
    requests = [ask(data_uri(png(c))) for c in ("red", "blue", "yellow")] + [[{"role": "user", "content": "Hi!"}]]
    alone = [(await answer(oai, r)).choices[0].message.content for r in requests]
    together = await asyncio.gather(*(answer(oai, r) for r in requests))
    assert [t.choices[0].message.content for t in together] == alone


async def test_streaming_a_multi_turn_chat_with_images_in_two_user_messages(client: httpx.AsyncClient) -> None:
    oai = sdk(client)
    messages: list[ChatCompletionMessageParam] = [
        *ask(data_uri(png("red"))), {"role": "assistant", "content": "A red square."},
        *ask(data_uri(png("blue")), "And this one?"),
    ]  # fmt: skip
    whole = await answer(oai, messages)
    pieces = []
    stream = await oai.chat.completions.create(model=VLM, messages=messages, max_tokens=8, temperature=0, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == whole.choices[0].message.content
    one_image = await answer(oai, ask(data_uri(png("blue")), "And this one?"))
    assert whole.usage is not None
    assert one_image.usage is not None
    assert whole.usage.prompt_tokens > one_image.usage.prompt_tokens


async def test_formats_and_a_local_file_all_reach_the_model(client: httpx.AsyncClient) -> None:
    oai = sdk(client)
    media = Path(client.headers["x-media-dir"])
    from_file = await answer(oai, ask(f"file://{media}/green.png"))
    from_uri = await answer(oai, ask(data_uri(png("green"))))
    assert from_file.choices[0].message.content == from_uri.choices[0].message.content
    for fmt, mime in [("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")]:
        buffer = io.BytesIO()
        Image.new("RGB", (64, 64), "green").save(buffer, format=fmt)
        reply = await answer(oai, ask(data_uri(buffer.getvalue(), mime)))
        assert reply.usage is not None
        assert from_uri.usage is not None
        assert reply.choices[0].message.content and reply.usage.prompt_tokens == from_uri.usage.prompt_tokens


async def test_responses_take_input_image_items(client: httpx.AsyncClient) -> None:
    oai = sdk(client)
    chat = await answer(oai, ask(data_uri(png("red"))))
    # cast: the SDK's image part requires `detail`; the server, as OpenAI's API, defaults it.
    image = cast(ResponseInputImageParam, {"type": "input_image", "image_url": data_uri(png("red"))})
    content: ResponseInputMessageContentListParam = [{"type": "input_text", "text": QUESTION}, image]
    reply = await oai.responses.create(model=VLM, input=[{"role": "user", "content": content}],
                                       max_output_tokens=8, temperature=0, store=False)  # fmt: skip
    assert reply.output_text == chat.choices[0].message.content


async def test_responses_take_llm_pools_flat_content_array(client: httpx.AsyncClient) -> None:
    """llm-pool's image input (github.com/Bobcat/llm-pool tests/test_multimodal.py,
    test_image_url_parses_from_json_payload): a flat content array as `input`, one user
    message, answered as the same parts in a chat completion are."""
    oai = sdk(client)
    for color in ("red", "blue"):
        body = {
            "model": VLM,
            "input": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": data_uri(png(color))}},
            ],
            "decoding": {"temperature": 0, "max_tokens": 8},
        }
        chat = await answer(oai, ask(data_uri(png(color)), "What is in this image?"))
        reply = (await client.post("/v1/responses", json=body)).json()
        assert chat.usage is not None
        assert reply["output_text"] == chat.choices[0].message.content
        assert reply["usage"]["input_tokens"] == chat.usage.prompt_tokens  # the image's tokens counted


BAD_IMAGES = [
    ("undecodable", {"url": data_uri(b"not an image at all")}, 400, "invalid_value", "cannot be decoded"),
    ("bmp", {"url": "BMP"}, 400, "invalid_value", "not supported"),
    ("not-base64", {"url": "data:image/png,rawbytes"}, 400, "invalid_value", "base64"),
    ("too-many-pixels", {"url": "BIG"}, 413, "request_too_large", "pixels"),
    ("too-many-bytes", {"url": "HEAVY"}, 413, "request_too_large", "max_image_bytes"),
    ("remote-off", {"url": "https://example.com/cat.png"}, 400, "invalid_value", "allow_remote_images"),
    ("file-outside", {"url": "file:///etc/hostname"}, 400, "invalid_value", "allowed_local_media_dirs"),
]


def bad_url(name: str) -> str:
    if name == "BMP":
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buffer, format="BMP")
        return data_uri(buffer.getvalue(), "image/bmp")
    if name == "BIG":
        return data_uri(png("red", (1200, 1000)))
    if name == "HEAVY":
        noise = Image.frombytes("RGB", (300, 300), random.Random(0).randbytes(300 * 300 * 3))  # incompressible
        buffer = io.BytesIO()
        noise.save(buffer, format="PNG")
        return data_uri(buffer.getvalue())
    return name


@pytest.mark.parametrize(("case", "image_url", "status", "code", "words"), BAD_IMAGES, ids=[c[0] for c in BAD_IMAGES])
async def test_bad_images_get_a_clear_error_naming_the_part(
    client: httpx.AsyncClient, case: str, image_url: dict[str, str], status: int, code: str, words: str
) -> None:
    url = bad_url(image_url["url"])
    body = {"model": VLM, "messages": ask(url), "max_tokens": 4}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == "messages[0].content[1]" and words in error["message"]


async def test_too_many_images_and_a_text_only_model(client: httpx.AsyncClient) -> None:
    three = [{"type": "image_url", "image_url": {"url": data_uri(png(c))}} for c in ("red", "green", "blue")]
    body = {"model": VLM, "messages": [{"role": "user", "content": three}], "max_tokens": 4}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages[0].content[2]"
    assert "at most 2 images" in response.json()["error"]["message"]
    text_only = await client.post("/v1/chat/completions", json={**body, "model": CHAT_MODEL})
    assert text_only.status_code == 400 and text_only.json()["error"]["code"] == "modality_unsupported"
    models = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert models[VLM]["capabilities"]["modalities"] == ["image", "text"]
    assert models[VLM]["capabilities"]["max_images"] == 2
    assert models[CHAT_MODEL]["capabilities"]["modalities"] == ["text"]
    assert (await answer(sdk(client), ask(data_uri(png("red"))))).choices[0].message.content  # still serving


@pytest.fixture(scope="module")
def upstream(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second, real modelpool serving the tiny VLM, for the forwarding path."""
    where = tmp_path_factory.mktemp("vision-upstream")
    config = {"starter_models": False, "models": {VLM: vlm_config(folder)}}
    (where / "config.yaml").write_text(yaml.safe_dump(config))
    with modelpool_serve(where / "server.log", "-c", str(where / "config.yaml")) as server:
        yield server


async def test_a_remote_vision_model_gets_the_image_forwarded(client: httpx.AsyncClient, upstream: Server) -> None:
    remote: dict[str, Any] = {"backend": "openai_remote", "allow_remote": True,
              "options": {"base_url": f"{upstream.url}/v1", "upstream_model": VLM, "vision": True}}  # fmt: skip
    text_only = {**remote, "options": {**remote["options"], "vision": False}}
    direct = await answer(sdk(client), ask(data_uri(png("blue"))))
    async with serving({"starter_models": False, "models": {"front": remote, "front-text": text_only}}) as (_, front):
        forwarded = await answer(sdk(front), ask(data_uri(png("blue"))), model="front")
        body = {"model": "front-text", "messages": ask(data_uri(png("blue")))}
        refused = await front.post("/v1/chat/completions", json=body)
    assert forwarded.choices[0].message.content == direct.choices[0].message.content
    assert direct.usage is not None
    assert forwarded.usage is not None
    assert forwarded.usage.prompt_tokens == direct.usage.prompt_tokens
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "modality_unsupported"


async def test_remote_images_on_loopback_are_refused_and_slow_ones_time_out(folder: Path) -> None:
    """With remote images on, a URL on this machine is refused by the guard (its address is
    loopback), and a host allowed by name but too slow answers 400 at the deadline."""
    from aiohttp import web

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.Response(body=png("red"), content_type="image/png")

    app = web.Application()
    app.router.add_get("/slow.png", slow)
    server = {"allow_remote_images": True, "image_fetch_allowed_hosts": ["localhost"], "image_fetch_timeout_s": 0.5}
    config = {"starter_models": False, "models": {VLM: vlm_config(folder)}, "server": server}
    async with web_server(app) as port, serving(config) as (_, http):
        by_address = {"model": VLM, "messages": ask(f"http://127.0.0.1:{port}/slow.png")}
        refused = await http.post("/v1/chat/completions", json=by_address)
        by_allowed_name = {"model": VLM, "messages": ask(f"http://localhost:{port}/slow.png")}
        slow_reply = await http.post("/v1/chat/completions", json=by_allowed_name)
    assert refused.status_code == 400 and "not a public address" in refused.json()["error"]["message"]
    assert slow_reply.status_code == 400 and "longer than 0.5 s" in slow_reply.json()["error"]["message"]
    assert refused.json()["error"]["param"] == slow_reply.json()["error"]["param"] == "messages[0].content[1]"
