"""Qwen3-VL in the transformers backend, and `video_url` parts, through the official openai
SDK: a tiny random-weight model (tests/vlm_models.py) whose answers equal plain
transformers' `generate` log-probability for log-probability, alone and decoding in a batch
with others (its interleaved M-RoPE gives an image fewer positions than tokens, and
DeepStack adds the image's features into the first text layer during the prefill). Videos
are made here with PyAV (tests/videos.py); a red and a blue one answer differently."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionContentPartParam, ChatCompletionMessageParam

from modelpool.inference import VideoInput
from modelpool.media.video import Sampling, VideoPolicy, sample_frames
from tests.conftest import CHAT_MODEL, sdk, serving
from tests.e2e.test_vision import QUESTION, ask, data_uri, direct_logprobs, png, vlm_config
from tests.videos import make_video
from tests.vlm_models import tiny_qwen3_vl

QWEN3 = "tiny-qwen3-vl"
QWEN3_IMAGES = "tiny-qwen3-vl-images-only"
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
    }
    server = {"allowed_local_media_dirs": [str(media)], "max_video_seconds": 30, "max_video_pixels": 1_000_000}
    config = {"enabled_models": [QWEN3, QWEN3_IMAGES, CHAT_MODEL], "models": models, "server": server}
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
    alone = [await scored(client, ask(data_uri(png(c)))) for c in colors]
    assert alone[0].choices[0].message.content != alone[1].choices[0].message.content
    batched = await asyncio.gather(*(scored(client, ask(data_uri(png(c)))) for c in colors),
                                   scored(client, [{"role": "user", "content": QUESTION}]))  # fmt: skip
    for color, one, together in zip(colors, alone, batched, strict=False):
        expected = direct_logprobs(tiny_qwen3_vl(), color, 6)
        assert logprobs_of(one) == pytest.approx(expected, abs=1e-4), color
        assert logprobs_of(together) == pytest.approx(expected, abs=1e-4), color


def direct_video_logprobs(data: bytes, steps: int) -> tuple[list[float], int]:
    """Plain transformers `generate` on the same video inputs (the frames sampled and
    patched as the server does), so the served prefill, positions and decoding are checked."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from modelpool.backends.transformers.vision import Media, render_with_media
    from modelpool.inference import ChatMessage, ChatRequest
    from modelpool.tools.prompt import plan_chat

    folder = tiny_qwen3_vl()
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    sampled = sample_frames(data, VideoPolicy(), Sampling(2.0, 4), "video")
    video = VideoInput("data:", "video", sampled.frames, sampled.timestamps, sampled.fps)
    message = ChatMessage("user", QUESTION, parts=(*_text(QUESTION), video))
    plan = plan_chat(ChatRequest(messages=(message,)), template_source=processor.chat_template,
                     configured_parser=None, constrain_auto=False)  # fmt: skip
    ids, extra = render_with_media(processor, plan, None, {}, Media((), (video,)), model)
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
