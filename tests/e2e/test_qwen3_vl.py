"""Qwen3-VL in the transformers backend, and `video_url` parts, through the official openai
SDK: a tiny random-weight model (tests/vlm_models.py) whose answers equal plain
transformers' `generate` log-probability for log-probability, alone and decoding in a batch
with others (its interleaved M-RoPE gives an image fewer positions than tokens, and
DeepStack adds the image's features into the first text layer during the prefill). Videos
are made here with PyAV (tests/videos.py); a red and a blue one answer differently."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import yaml
from openai.types.chat import ChatCompletion, ChatCompletionContentPartParam, ChatCompletionMessageParam

from modelpool.inference import VideoInput
from modelpool.media.video import Sampling, VideoPolicy, sample_frames
from tests.conftest import CHAT_MODEL, sdk, serving
from tests.e2e.test_vision import QUESTION, ask, data_uri, direct_logprobs, png, vlm_config
from tests.processes import Server, modelpool_serve
from tests.videos import make_video
from tests.vlm_models import QWEN3_VL_CHAT_TEMPLATE, tiny_llava, tiny_qwen2_vl, tiny_qwen3_vl

QWEN3 = "tiny-qwen3-vl"
QWEN3_IMAGES = "tiny-qwen3-vl-images-only"
QWEN3_PLACED = "tiny-qwen3-vl-device-map-auto"
QWEN2 = "tiny-qwen2-vl-video"
LLAVA_VIDEO = "tiny-llava-video"  # refused at load: LLaVA reads no video here
VIDEO_OPTIONS = {"video": True, "video_fps": 2.0, "video_max_frames": 4}


def video_uri(data: bytes) -> str:
    return f"data:video/mp4;base64,{base64.b64encode(data).decode()}"


def colored(color: str, frames: int = 4) -> bytes:
    return make_video([color] * frames, fps=4)


def ask_video(url: str, text: str = QUESTION) -> list[ChatCompletionMessageParam]:
    # The SDK's types know no video part (vLLM's and llm-pool's); it sends it as it is.
    part = cast("ChatCompletionContentPartParam", {"type": "video_url", "video_url": {"url": url}})
    return [{"role": "user", "content": [{"type": "text", "text": text}, part]}]


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("video-media")
    (where / "green.mp4").write_bytes(colored("green"))
    return where


@pytest.fixture(scope="module")
async def client(media: Path) -> AsyncIterator[httpx.AsyncClient]:
    models = {
        QWEN3: {**vlm_config(tiny_qwen3_vl(), **VIDEO_OPTIONS), "preload": True},
        QWEN3_IMAGES: vlm_config(tiny_qwen3_vl()),
        QWEN3_PLACED: vlm_config(tiny_qwen3_vl(), device_map="auto"),
        # The tiny Qwen2-VL's own template places no video: Qwen3-VL's (the same ChatML) does.
        QWEN2: vlm_config(tiny_qwen2_vl(), **VIDEO_OPTIONS, chat_template=QWEN3_VL_CHAT_TEMPLATE),
        LLAVA_VIDEO: vlm_config(tiny_llava(), video=True),
    }
    server = {"allowed_local_media_dirs": [str(media)], "max_video_seconds": 30, "max_video_pixels": 1_000_000}
    enabled = [QWEN3, QWEN3_IMAGES, QWEN3_PLACED, QWEN2, LLAVA_VIDEO, CHAT_MODEL]
    config = {"enabled_models": enabled, "models": models, "server": server}
    async with serving(config) as (_, http):
        yield http


async def scored(client: httpx.AsyncClient, messages: list[ChatCompletionMessageParam],
                 model: str = QWEN3) -> ChatCompletion:  # fmt: skip
    return await sdk(client).chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True
    )


def logprobs_of(reply: ChatCompletion) -> list[float]:
    assert reply.choices[0].logprobs is not None and reply.choices[0].logprobs.content is not None
    return [entry.logprob for entry in reply.choices[0].logprobs.content]


async def test_qwen3_vl_images_match_plain_transformers_alone_and_in_a_batch(client: httpx.AsyncClient) -> None:
    colors = ("red", "blue")
    text_only: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    alone = [await scored(client, ask(data_uri(png(c)))) for c in colors]
    text_alone = await scored(client, text_only)
    assert alone[0].choices[0].message.content != alone[1].choices[0].message.content
    *batched, text_batched = await asyncio.gather(*(scored(client, ask(data_uri(png(c)))) for c in colors),
                                                  scored(client, text_only))  # fmt: skip
    for color, one, together in zip(colors, alone, batched, strict=True):
        expected = direct_logprobs(tiny_qwen3_vl(), color, 6)
        assert logprobs_of(one) == pytest.approx(expected, abs=1e-4), color
        assert logprobs_of(together) == pytest.approx(expected, abs=1e-4), color
    # The text-only prompt batched beside two image prefills answers as it does alone.
    assert text_batched.choices[0].message.content == text_alone.choices[0].message.content
    assert logprobs_of(text_batched) == pytest.approx(logprobs_of(text_alone), abs=1e-4)


def direct_video_logprobs(data: bytes, steps: int, folder: Path | None = None,
                          template: str | None = None) -> tuple[list[float], int]:  # fmt: skip
    """Plain transformers `generate` on the same video inputs (the frames sampled and
    patched as the server does), so the served prefill, positions and decoding are checked."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from modelpool.backends.transformers.video import video_settings
    from modelpool.backends.transformers.vision import Media, render_with_media
    from modelpool.inference import ChatMessage, ChatRequest
    from modelpool.tools.prompt import plan_chat

    folder = folder or tiny_qwen3_vl()
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    sampled = sample_frames(data, VideoPolicy(), Sampling(2.0, 4), "video")
    video = VideoInput("data:", "video", sampled.frames, sampled.timestamps, sampled.fps)
    message = ChatMessage("user", QUESTION, parts=(*_text(QUESTION), video))
    plan = plan_chat(ChatRequest(messages=(message,)), template_source=template or processor.chat_template,
                     configured_parser=None, constrain_auto=False)  # fmt: skip
    ids, extra = render_with_media(processor, plan, template, {}, Media((), (video,)), model,
                                    video_settings(folder, processor.image_processor))  # fmt: skip
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([ids]), **extra, max_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)  # fmt: skip
    chosen = out.sequences[0, len(ids) :]
    steps_logits = zip(out.logits, chosen, strict=True)
    return [float(torch.log_softmax(logits[0].float(), -1)[token]) for logits, token in steps_logits], len(ids)


def _text(text: str) -> tuple[Any, ...]:
    from modelpool.inference import TextPart

    return (TextPart(text),)


async def test_a_video_reaches_qwen3_vl_and_matches_plain_transformers(client: httpx.AsyncClient) -> None:
    red, blue = colored("red"), colored("blue")
    alone = [await scored(client, ask_video(video_uri(v))) for v in (red, blue)]
    assert alone[0].choices[0].message.content != alone[1].choices[0].message.content
    batched = await asyncio.gather(scored(client, ask_video(video_uri(red))), scored(client, ask(data_uri(png("red")))))
    expected, prompt_tokens = direct_video_logprobs(red, 6)
    assert logprobs_of(alone[0]) == pytest.approx(expected, abs=1e-4)
    assert logprobs_of(batched[0]) == pytest.approx(expected, abs=1e-4)
    assert alone[0].usage is not None and alone[0].usage.prompt_tokens == prompt_tokens
    models = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert models[QWEN3]["capabilities"]["modalities"] == ["image", "text", "video"]
    assert models[QWEN3_IMAGES]["capabilities"]["modalities"] == ["image", "text"]


def bad_video(name: str, media: Path) -> tuple[str, int, str, str]:
    """(url, status, error code, words of the message) for each way a video can be bad."""
    broken = colored("red")
    cases = {
        "corrupt": (video_uri(b"\x00\x00\x00\x18ftypmp42" + bytes(200)), 400, "invalid_value", "cannot be"),
        "truncated": (video_uri(broken[: len(broken) // 2]), 400, "invalid_value", "video"),
        "an image": (video_uri(png("red")), 400, "invalid_value", "not supported"),
        "not base64": ("data:video/mp4;base64,@@@", 400, "invalid_value", "not valid base64"),
        "too long": (video_uri(make_video(["red"] * 40, fps=1)), 413, "request_too_large", "server.max_video_seconds"),
        "huge frames": (video_uri(make_video(["red"], size=(2048, 2048))), 413, "request_too_large", "video_pixels"),
        "extreme aspect ratio": (video_uri(make_video(["red"], size=(4200, 16))), 400, "invalid_value", "aspect ratio"),
        "outside the media dir": ("file:///etc/hostname", 400, "invalid_value", "allowed_local_media_dirs"),
        "remote off": ("https://example.com/a.mp4", 400, "invalid_value", "remote video URLs are off"),
    }
    return cases[name]


@pytest.mark.parametrize("name", ["corrupt", "truncated", "an image", "not base64", "too long", "huge frames",
                                  "extreme aspect ratio", "outside the media dir", "remote off"])  # fmt: skip
async def test_bad_videos_get_a_clear_error_naming_the_part(client: httpx.AsyncClient, media: Path,
                                                            name: str) -> None:  # fmt: skip
    url, status, code, words = bad_video(name, media)
    response = await client.post("/v1/chat/completions", json={"model": QWEN3, "messages": ask_video(url)})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == "messages[0].content[1]" and words in error["message"]


async def test_videos_from_a_file_too_many_and_models_without_video(client: httpx.AsyncClient, media: Path) -> None:
    from_file = await scored(client, ask_video((media / "green.mp4").as_uri()))
    green = await scored(client, ask_video(video_uri(colored("green"))))
    assert from_file.choices[0].message.content == green.choices[0].message.content
    image_part: ChatCompletionContentPartParam = {"type": "image_url", "image_url": {"url": data_uri(png("red"))}}
    both = ask_video(video_uri(colored("green")))
    cast("list[ChatCompletionContentPartParam]", both[0]["content"]).append(image_part)
    with_image = await scored(client, both)  # an image and a video in one prompt: both positions and pixels
    assert with_image.usage is not None and green.usage is not None
    assert with_image.usage.prompt_tokens == green.usage.prompt_tokens + 18  # a 64x64 image: 16 pads + 2
    three = [{"type": "video_url", "video_url": {"url": video_uri(colored(c))}} for c in ("red", "green", "blue")]
    body: dict[str, Any] = {"model": QWEN3, "messages": [{"role": "user", "content": three}], "max_tokens": 2}
    too_many = await client.post("/v1/chat/completions", json=body)
    assert too_many.status_code == 400 and "server.max_videos_per_request" in too_many.json()["error"]["message"]
    assert too_many.json()["error"]["param"] == "messages[0].content[2]"
    for model in (QWEN3_IMAGES, CHAT_MODEL):
        refused = await client.post("/v1/chat/completions", json={"model": model, "messages": ask_video(
            video_uri(colored("red")))})  # fmt: skip
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "modality_unsupported"
        assert refused.json()["error"]["param"] == "messages[0].content[1]"
    video = {"type": "video_url", "video_url": {"url": video_uri(colored("red"))}}
    in_system = [{"role": "system", "content": [video]}, {"role": "user", "content": QUESTION}]
    refused = await client.post("/v1/chat/completions", json={"model": QWEN3, "messages": in_system})
    assert refused.status_code == 400 and "user messages only" in refused.json()["error"]["message"]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second, real modelpool serving the tiny Qwen3-VL with video, for the forwarding path."""
    where = tmp_path_factory.mktemp("video-upstream")
    config = {"starter_models": False, "models": {QWEN3: vlm_config(tiny_qwen3_vl(), **VIDEO_OPTIONS)}}
    (where / "config.yaml").write_text(yaml.safe_dump(config))
    with modelpool_serve(where / "server.log", "-c", str(where / "config.yaml")) as server:
        yield server


async def test_a_remote_video_model_gets_the_video_forwarded(client: httpx.AsyncClient, upstream: Server) -> None:
    options = {"base_url": f"{upstream.url}/v1", "upstream_model": QWEN3, "vision": True}
    remote: dict[str, Any] = {"backend": "openai_remote", "allow_remote": True, "options": {**options, "video": True}}
    images_only = {**remote, "options": options}
    direct = await scored(client, ask_video(video_uri(colored("blue"))))
    config = {"starter_models": False, "models": {"front": remote, "front-images": images_only}}
    async with serving(config) as (_, front):
        forwarded = await scored(front, ask_video(video_uri(colored("blue"))), model="front")
        body = {"model": "front-images", "messages": ask_video(video_uri(colored("blue")))}
        refused = await front.post("/v1/chat/completions", json=body)
    assert forwarded.choices[0].message.content == direct.choices[0].message.content
    assert logprobs_of(forwarded) == pytest.approx(logprobs_of(direct), abs=1e-4)
    assert forwarded.usage is not None and direct.usage is not None
    assert forwarded.usage.prompt_tokens == direct.usage.prompt_tokens
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "modality_unsupported"


async def test_device_map_auto_places_the_model_with_accelerate_and_answers_the_same(client: httpx.AsyncClient) -> None:
    """On this machine accelerate has only the CPU to place the weights on: the answer is the
    same as the model loaded on its `device`, and the status says where the weights went."""
    loaded = await client.post(f"/v1/admin/models/{QWEN3_PLACED}/load")
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["replicas"][0]["placement"] == {"": "cpu"}
    placed = await scored(client, ask(data_uri(png("red"))), model=QWEN3_PLACED)
    plain = await scored(client, ask(data_uri(png("red"))), model=QWEN3_IMAGES)
    assert logprobs_of(placed) == pytest.approx(logprobs_of(plain), abs=1e-5)
    assert placed.choices[0].message.content == plain.choices[0].message.content
    status = (await client.post(f"/v1/admin/models/{QWEN3}/load")).json()  # loaded: its status
    assert status["replicas"][0]["placement"] == {"": "cpu"}  # one device, without a device map
    await client.post(f"/v1/admin/models/{QWEN3_PLACED}/unload")


async def test_qwen2_vl_takes_video_without_timestamps_and_other_families_are_refused_at_load(
    client: httpx.AsyncClient,
) -> None:
    red, blue = [await scored(client, ask_video(video_uri(colored(c))), model=QWEN2) for c in ("red", "blue")]
    assert red.choices[0].message.content != blue.choices[0].message.content
    expected, prompt_tokens = direct_video_logprobs(colored("red"), 6, tiny_qwen2_vl(), QWEN3_VL_CHAT_TEMPLATE)
    assert logprobs_of(red) == pytest.approx(expected, abs=1e-4)
    assert red.usage is not None and red.usage.prompt_tokens == prompt_tokens
    refused = await client.post(f"/v1/admin/models/{LLAVA_VIDEO}/load")
    assert refused.status_code >= 400
    assert "video is read only by Qwen2-VL, Qwen2.5-VL and Qwen3-VL models here, not llava" in refused.text
