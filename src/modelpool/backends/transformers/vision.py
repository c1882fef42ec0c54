"""Vision-language models in the transformers backend: any Hugging Face image-text-to-text
folder (`AutoModelForImageTextToText` + `AutoProcessor`: LLaVA, Idefics3/SmolVLM, ...).

The processor renders the chat (its template puts the image tokens where the images go)
and turns the images into the model's inputs by the model's own rules (resizing, tiling).
A prompt with images is prefilled in one forward pass with its pixels; after that it
decodes in the continuous batch like any text sequence, since decoding reads only the KV
cache — with its own position offset where the model's multimodal rotary positions
(Qwen2-VL's and Qwen3-VL's M-RoPE) make an image take fewer positions than tokens.
Videos (the Qwen-VL families) take the same path, their inputs built by `video`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelpool.backends.textgen.hf_text import render_chat_text
from modelpool.backends.transformers.video import (
    VIDEO_FAMILIES,
    PreparedVideos,
    VideoSettings,
    VideoTokens,
    expand_placeholders,
    prepare_videos,
)
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.inference import VideoInput
from modelpool.tools.prompt import ChatPlan


def load_vision_model(
    path: Path, dtype: Any, trust_remote_code: bool, model_id: str, device_map: str | None = None
) -> tuple[Any, Any]:
    """(model, processor) from an image-text-to-text folder (placed by accelerate with `device_map`)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)  # type: ignore[no-untyped-call]
        model = AutoModelForImageTextToText.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code, device_map=device_map
        )
    except (OSError, ValueError) as exc:
        problem = f"transformers could not load {path} as a vision model: {exc}"
        raise ModelLoadFailed(f"model '{model_id}': {problem}") from exc
    return model, processor


def render_with_media(
    processor: Any,
    plan: ChatPlan,
    chat_template: str | None,
    template_kwargs: Mapping[str, Any],
    media: Media,
    model: Any,
    video_settings: VideoSettings | None = None,
) -> tuple[list[int], dict[str, Any]]:
    """(prompt token ids with the image and video tokens, the inputs for the prefill)."""
    text = render_chat_text(processor, plan, chat_template, template_kwargs)
    videos = None
    if media.videos:
        if video_settings is None:  # a model loaded without `video: true` is refused before here
            raise InvalidRequest("this model reads no video", param=media.videos[0].param)
        tokens = _video_tokens(processor)
        videos = prepare_videos(video_settings, model.config.model_type, tokens, media.videos)
        try:
            text = expand_placeholders(text, tokens, videos.placeholders)
        except ValueError as exc:
            raise InvalidRequest(f"this model cannot take the video: {exc}", param=media.videos[0].param) from None
        # The video tokens are in the text already: the processor is not to look for videos
        # (a processor with a torchvision video processor would, and find none passed).
        processor = copy.copy(processor)
        processor.video_token = None
    try:
        inputs = processor(text=[text], images=list(media.images) or None, return_tensors="pt",
                           add_special_tokens=False)  # fmt: skip
    except ValueError as exc:  # the processor's own rules (an aspect ratio it cannot tile, ...)
        raise InvalidRequest(f"the model's processor refused these images: {exc}", param="messages") from None
    ids = [int(t) for t in inputs["input_ids"][0]]
    extra = {}
    for name, value in inputs.items():
        if name in ("input_ids", "attention_mask") or not hasattr(value, "to"):
            continue
        extra[name] = _on_model(value, model)
    if videos is not None:
        extra.update(_video_inputs(videos, ids, model))
    return ids, extra


@dataclass(frozen=True)
class Media:
    images: Sequence[Any] = ()
    """Decoded PIL images, in prompt order."""
    videos: Sequence[VideoInput] = ()
    """Videos sampled into frames, in prompt order."""


def check_video_model(model: Any, model_id: str) -> None:
    """A model configured with `video: true` must be of a family whose video inputs are built here."""
    model_type = model.config.model_type
    if model_type not in VIDEO_FAMILIES:
        raise ModelLoadFailed(f"model '{model_id}': video is read only by Qwen2-VL, Qwen2.5-VL and Qwen3-VL "
                              f"models here, not {model_type}; set video: false")  # fmt: skip


def _video_tokens(processor: Any) -> VideoTokens:
    tokenizer = processor.tokenizer
    return VideoTokens(
        video=getattr(tokenizer, "video_token", None) or "<|video_pad|>",
        vision_start=getattr(tokenizer, "vision_start_token", None) or "<|vision_start|>",
        vision_end=getattr(tokenizer, "vision_end_token", None) or "<|vision_end|>",
    )


def _video_inputs(videos: PreparedVideos, ids: list[int], model: Any) -> dict[str, Any]:
    """The videos' pixels and grids, and each token's modality (text 0, image 1, video 2),
    which the Qwen-VL families' multimodal positions are computed from."""
    import torch

    config = model.config
    token_ids = torch.tensor([ids])
    types = torch.zeros_like(token_ids)
    types[token_ids == config.image_token_id] = 1
    types[token_ids == config.video_token_id] = 2
    return {
        "pixel_values_videos": _on_model(torch.from_numpy(videos.pixel_values_videos), model),
        "video_grid_thw": torch.from_numpy(videos.video_grid_thw).to(model.device),
        "mm_token_type_ids": types.to(model.device),
    }


def _on_model(value: Any, model: Any) -> Any:
    return value.to(model.device, dtype=model.dtype) if value.is_floating_point() else value.to(model.device)
