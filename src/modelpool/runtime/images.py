"""Images in a chat request, made ready for its model: refused when the model reads no
images (400 `modality_unsupported` naming the part) or gets too many, else loaded —
decoded from data URIs, fetched under the guard, read from allowed directories — all
before the request waits for its turn on the model."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from modelpool.capabilities import Capabilities, Modality
from modelpool.errors import InvalidRequest, ModalityUnsupported
from modelpool.inference import ChatMessage, ChatRequest, ContentPart, ImageInput
from modelpool.media.images import ImagePolicy, load_image


async def with_loaded_images(
    request: ChatRequest, model_id: str, declared: Capabilities, policy: ImagePolicy
) -> ChatRequest:
    images = [image for message in request.messages for image in message.images]
    if not images:
        return request
    if Modality.IMAGE not in declared.modalities:
        raise ModalityUnsupported(f"model '{model_id}' does not read images", param=images[0].param)
    if declared.max_images is not None and len(images) > declared.max_images:
        raise InvalidRequest(f"model '{model_id}' reads at most {declared.max_images} images a request, "
                             f"this one has {len(images)}", param=images[declared.max_images].param)  # fmt: skip
    loaded = await asyncio.gather(*(_load(image, declared, policy) for image in images))
    by_part = {id(image): done for image, done in zip(images, loaded, strict=True)}
    return replace(request, messages=tuple(_with_parts(m, by_part) for m in request.messages))


async def _load(image: ImageInput, declared: Capabilities, policy: ImagePolicy) -> ImageInput:
    if declared.image_urls_upstream and image.url.lower().startswith(("http://", "https://")):
        return image  # the upstream fetches it, by its URL
    loaded = await load_image(image.url, policy, image.param)
    return replace(image, image=loaded.image, data_uri=loaded.data_uri())


def _with_parts(message: ChatMessage, loaded: dict[int, ImageInput]) -> ChatMessage:
    if not message.parts:
        return message
    parts: tuple[ContentPart, ...] = tuple(loaded.get(id(part), part) for part in message.parts)
    return replace(message, parts=parts)
