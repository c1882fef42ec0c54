"""Vision-language models in the transformers backend: any Hugging Face image-text-to-text
folder (`AutoModelForImageTextToText` + `AutoProcessor`: LLaVA, Idefics3/SmolVLM, ...).

The processor renders the chat (its template puts the image tokens where the images go)
and turns the images into the model's inputs by the model's own rules (resizing, tiling).
A prompt with images is prefilled in one forward pass with its pixels; after that it
decodes in the continuous batch like any text sequence, since decoding reads only the KV
cache — with its own position offset where the model's multimodal rotary positions
(Qwen2-VL's M-RoPE) make an image take fewer positions than tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from modelpool.backends.textgen.hf_text import render_chat_text
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.tools.prompt import ChatPlan


def load_vision_model(path: Path, dtype: Any, trust_remote_code: bool, model_id: str) -> tuple[Any, Any]:
    """(model, processor) from an image-text-to-text folder."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)  # type: ignore[no-untyped-call]
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        problem = f"transformers could not load {path} as a vision model: {exc}"
        raise ModelLoadFailed(f"model '{model_id}': {problem}") from exc
    return model, processor


def render_with_images(
    processor: Any,
    plan: ChatPlan,
    chat_template: str | None,
    template_kwargs: Mapping[str, Any],
    images: Sequence[Any],
    model: Any,
) -> tuple[list[int], dict[str, Any]]:
    """(prompt token ids with the image tokens, the image inputs for the prefill)."""
    text = render_chat_text(processor, plan, chat_template, template_kwargs)
    try:
        inputs = processor(text=[text], images=list(images), return_tensors="pt", add_special_tokens=False)
    except ValueError as exc:  # the processor's own rules (an aspect ratio it cannot tile, ...)
        raise InvalidRequest(f"the model's processor refused these images: {exc}", param="messages") from None
    ids = [int(t) for t in inputs["input_ids"][0]]
    extra = {}
    for name, value in inputs.items():
        if name in ("input_ids", "attention_mask") or not hasattr(value, "to"):
            continue
        floating = value.is_floating_point()
        extra[name] = value.to(model.device, dtype=model.dtype) if floating else value.to(model.device)
    return ids, extra
