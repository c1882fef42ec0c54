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
    IMAGE_TOKEN,
    LLAVA_IMAGE_TOKENS,
    QWEN2_VL_IMAGE_PAD,
    QWEN2_VL_IMAGE_PADS,
    QWEN2_VL_IMAGE_TEXT,
    QWEN2_VL_IMAGE_TOKENS,
    QWEN2_VL_ROPE_DELTA,
    QWEN2_VL_SPECIAL_TOKENS,
    QWEN2_VL_VIDEO_PAD,
    QWEN2_VL_VISION_END,
    QWEN2_VL_VISION_START,
    direct_generate,
    qwen2_vl_image_pads,
    tiny_idefics3,
    tiny_llava,
    tiny_qwen2_vl,
)


class Built(NamedTuple):
    folder: Path
    build: Callable[[Path | None], Path]
    image_tokens: int  # per 64x64 image, as the processor expands it
    image_text: str  # what the chat template renders for an image part


class Family(NamedTuple):
    build: Callable[[Path | None], Path]
    image_tokens: int
    image_text: str
    fixed_size: bool  # every image is resized to the tower's 64x64: a fixed token count


BUILDERS: dict[str, Family] = {
    "llava": Family(tiny_llava, LLAVA_IMAGE_TOKENS, IMAGE_TOKEN, fixed_size=True),
    "idefics3": Family(tiny_idefics3, IDEFICS3_IMAGE_TOKENS, IMAGE_TOKEN, fixed_size=True),
    "qwen2_vl": Family(tiny_qwen2_vl, QWEN2_VL_IMAGE_TOKENS, QWEN2_VL_IMAGE_TEXT, fixed_size=False),
}
FIXED_SIZE = sorted(name for name, family in BUILDERS.items() if family.fixed_size)
QUESTION = "What colour is this?"
WITH_IMAGE: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}
]
TEXT_ONLY: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]


def solid(colour: tuple[int, int, int], size: tuple[int, int] = (64, 64)) -> Image.Image:
    return Image.new("RGB", size, colour)


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def vlm(request: pytest.FixtureRequest) -> Built:
    family = BUILDERS[request.param]
    return Built(family.build(None), family.build, family.image_tokens, family.image_text)


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
    folder, _, image_tokens, _ = vlm
    _, text_only = direct_generate(folder, TEXT_ONLY, [], 1)
    _, with_image = direct_generate(folder, WITH_IMAGE, [solid((0, 255, 0))], 1)
    assert with_image - text_only == image_tokens


@pytest.mark.parametrize("name", FIXED_SIZE)
def test_a_fixed_size_tower_gives_any_image_the_same_tokens(name: str) -> None:
    from transformers import AutoProcessor

    folder, image_tokens = BUILDERS[name].build(None), BUILDERS[name].image_tokens
    _, with_image = direct_generate(folder, WITH_IMAGE, [solid((0, 255, 0))], 1)
    _, with_odd_image = direct_generate(folder, WITH_IMAGE, [solid((0, 255, 0), (200, 37))], 1)
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
        f"<|im_start|>user\nCompare {vlm.image_text}{vlm.image_text}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert processor.tokenizer.chat_template == processor.chat_template


def test_a_built_folder_is_reused_not_rebuilt(vlm: Built) -> None:
    folder, build, _, _ = vlm
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build(folder.parent) == folder
    assert weights.stat().st_mtime_ns == before
    assert (folder / COMPLETE_MARKER).is_file()


# ----- Qwen2-VL: dynamic resolution, M-RoPE, and a stand-in for Qwen2VLProcessor --------------


@pytest.fixture(scope="module")
def qwen2_vl() -> Path:
    return tiny_qwen2_vl()


@pytest.fixture(scope="module")
def qwen2_vl_processor(qwen2_vl: Path) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(qwen2_vl)


def test_qwen2_vl_config_names_its_vision_tokens_and_mrope(qwen2_vl: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    config: Any = AutoConfig.from_pretrained(qwen2_vl)
    tokenizer: Any = AutoTokenizer.from_pretrained(qwen2_vl)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN2_VL_SPECIAL_TOKENS}
    assert config.model_type == "qwen2_vl"
    assert config.image_token_id == ids[QWEN2_VL_IMAGE_PAD] == tokenizer.image_token_id
    assert config.video_token_id == ids[QWEN2_VL_VIDEO_PAD]
    assert config.vision_start_token_id == ids[QWEN2_VL_VISION_START]
    assert config.vision_end_token_id == ids[QWEN2_VL_VISION_END]
    assert config.text_config.vocab_size == len(tokenizer)
    head_dim = config.text_config.hidden_size // config.text_config.num_attention_heads
    assert sum(config.text_config.rope_parameters["mrope_section"]) == head_dim // 2
    assert config.vision_config.hidden_size == config.text_config.hidden_size


@pytest.mark.parametrize("size", [(64, 64), (200, 37), (37, 200), (300, 300), (10, 10)])
def test_qwen2_vl_token_count_follows_the_image_size(qwen2_vl_processor: Any, size: tuple[int, int]) -> None:
    processor = qwen2_vl_processor
    text = processor.apply_chat_template(WITH_IMAGE, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=text, images=[solid((0, 255, 0), size)], return_tensors="pt")
    pads = int((inputs["input_ids"] == processor.image_token_id).sum())
    assert pads == qwen2_vl_image_pads(*size)
    assert pads == int(inputs["image_grid_thw"].prod()) // 4  # 2x2 patches a token
    assert inputs["mm_token_type_ids"].tolist() == (inputs["input_ids"] == processor.image_token_id).long().tolist()
    assert qwen2_vl_image_pads(64, 64) == QWEN2_VL_IMAGE_PADS


def test_qwen2_vl_processor_gives_what_qwen2vlprocessor_gives(qwen2_vl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder's PaddleOCRVLProcessor stands in for Qwen2VLProcessor, which transformers
    cannot build without a torchvision video processor: built here in memory with that check
    skipped, the real one turns text and images into the same inputs, token counts included."""
    import torch
    from transformers import AutoProcessor, ProcessorMixin, Qwen2VLProcessor

    processor: Any = AutoProcessor.from_pretrained(qwen2_vl)
    check = ProcessorMixin.check_argument_for_proper_class

    def no_video_processor(self: Any, name: str, argument: Any) -> Any:
        return None if name == "video_processor" and argument is None else check(self, name, argument)

    monkeypatch.setattr(Qwen2VLProcessor, "check_argument_for_proper_class", no_video_processor)
    real: Any = Qwen2VLProcessor(
        image_processor=processor.image_processor, tokenizer=processor.tokenizer, chat_template=processor.chat_template
    )
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == real.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    images = [solid((255, 0, 0), (200, 37)), solid((0, 0, 255))]
    ours, theirs = (
        processor(text=text, images=images, return_tensors="pt"),
        real(text=text, images=images, return_tensors="pt"),
    )
    assert (
        sorted(ours)
        == sorted(theirs)
        == sorted(["input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw"])
    )
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    counted = real._get_num_multimodal_tokens(image_sizes=[(37, 200), (64, 64)]).num_image_tokens
    assert counted == [qwen2_vl_image_pads(200, 37), QWEN2_VL_IMAGE_PADS]


def test_qwen2_vl_gives_an_image_fewer_rotary_positions_than_tokens(qwen2_vl: Path) -> None:
    import torch

    from tests.vlm_models import _load

    processor, model = _load(qwen2_vl)
    text = processor.apply_chat_template(WITH_IMAGE, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=text, images=[solid((255, 0, 0))], return_tensors="pt")
    with torch.inference_mode():
        model(**inputs)
    assert int(model.model.rope_deltas.flatten()[0]) == QWEN2_VL_ROPE_DELTA
