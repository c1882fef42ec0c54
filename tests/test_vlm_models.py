"""The tiny test VLMs really see: greedy output depends on the image, is reproducible for
the same image, and an image adds exactly the tokens its processor says it does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from PIL import Image

from tests.vlm_models import (
    COMPLETE_MARKER,
    IDEFICS3_IMAGE_TOKENS,
    LLAVA_IMAGE_TOKENS,
    direct_generate,
    tiny_idefics3,
    tiny_llava,
)


class Built(NamedTuple):
    folder: Path
    build: Callable[[Path | None], Path]
    image_tokens: int  # per image, as the processor expands it


BUILDERS: dict[str, tuple[Callable[[Path | None], Path], int]] = {
    "llava": (tiny_llava, LLAVA_IMAGE_TOKENS),
    "idefics3": (tiny_idefics3, IDEFICS3_IMAGE_TOKENS),
}
QUESTION = "What colour is this?"
WITH_IMAGE = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
TEXT_ONLY = [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]


def solid(colour: tuple[int, int, int], size: tuple[int, int] = (64, 64)) -> Image.Image:
    return Image.new("RGB", size, colour)


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def vlm(request: pytest.FixtureRequest) -> Built:
    build, image_tokens = BUILDERS[request.param]
    return Built(build(None), build, image_tokens)


def test_greedy_output_depends_on_the_image_and_repeats_for_the_same_one(vlm: Built) -> None:
    folder = vlm.folder
    red, red_prompt = direct_generate(folder, WITH_IMAGE, [solid((255, 0, 0))], 12)
    again, _ = direct_generate(folder, WITH_IMAGE, [solid((255, 0, 0))], 12)
    blue, blue_prompt = direct_generate(folder, WITH_IMAGE, [solid((0, 0, 255))], 12)
    assert red == again
    assert red != blue
    assert red_prompt == blue_prompt
    assert len(red) == 12


def test_an_image_adds_the_tokens_its_processor_inserts(vlm: Built) -> None:
    from transformers import AutoProcessor

    folder, _, image_tokens = vlm
    _, text_only = direct_generate(folder, TEXT_ONLY, [], 1)
    _, with_image = direct_generate(folder, WITH_IMAGE, [solid((0, 255, 0))], 1)
    _, with_odd_image = direct_generate(folder, WITH_IMAGE, [solid((0, 255, 0), (200, 37))], 1)
    assert with_image - text_only == image_tokens
    assert with_odd_image == with_image  # any size is resized to the tower's 64x64: a fixed count
    processor: Any = AutoProcessor.from_pretrained(folder)
    assert processor._get_num_multimodal_tokens(image_sizes=[(64, 64)]).num_image_tokens == [image_tokens]


def test_the_chat_template_takes_strings_and_content_parts(vlm: Built) -> None:
    from transformers import AutoProcessor

    processor: Any = AutoProcessor.from_pretrained(vlm.folder)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"}, {"type": "image"}]},
    ]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nCompare <image><image><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert processor.tokenizer.chat_template == processor.chat_template


def test_a_built_folder_is_reused_not_rebuilt(vlm: Built) -> None:
    folder, build, _ = vlm
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build(folder.parent) == folder
    assert weights.stat().st_mtime_ns == before
    assert (folder / COMPLETE_MARKER).is_file()
