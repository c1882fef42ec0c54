"""Images in a chat request, made ready for its model: refused when the model reads no
images (400 `modality_unsupported` naming the part) or gets too many, else loaded —
decoded from data URIs, fetched under the guard, read from allowed directories — all
before the request waits for its turn on the model.

Bounded before the work, in this order: the image count (the model's `max_images` and the
server's), each image's bytes while it is read, each image's pixels and all of the
request's pixels together from the headers, and only then the pixels are decoded, on the
server-wide image-decode threads. The images of a request load together; the first that
fails cancels the others (fetches stop, queued decodes never start).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import replace

from modelpool.capabilities import Capabilities, Modality
from modelpool.errors import InvalidRequest, ModalityUnsupported, RequestTooLarge
from modelpool.inference import ChatMessage, ChatRequest, ContentPart, ImageInput
from modelpool.media.images import ImagePolicy, decode, image_bytes, pixels
from modelpool.offload import IMAGE_DECODES, all_or_none


async def with_loaded_images(
    request: ChatRequest, model_id: str, declared: Capabilities, policy: ImagePolicy
) -> ChatRequest:
    images = [image for message in request.messages for image in message.images]
    if not images:
        return request
    if Modality.IMAGE not in declared.modalities:
        raise ModalityUnsupported(f"model '{model_id}' does not read images", param=images[0].param)
    _check_count(images, model_id, declared, policy)
    local = [image for image in images if not _forwarded_as_url(image, declared)]
    loaded = await _load_all(local, policy)
    by_part = {id(image): done for image, done in zip(local, loaded, strict=True)}
    return replace(request, messages=tuple(_with_parts(m, by_part) for m in request.messages))


def _check_count(images: Sequence[ImageInput], model_id: str, declared: Capabilities, policy: ImagePolicy) -> None:
    model_most = declared.max_images
    if model_most is not None and model_most <= policy.max_images and len(images) > model_most:
        raise InvalidRequest(f"model '{model_id}' reads at most {model_most} images a request, "
                             f"this one has {len(images)}", param=images[model_most].param)  # fmt: skip
    if len(images) > policy.max_images:
        raise InvalidRequest(f"a request may carry at most {policy.max_images} images "
                             f"(server.max_images_per_request), this one has {len(images)}",
                             param=images[policy.max_images].param)  # fmt: skip


def _forwarded_as_url(image: ImageInput, declared: Capabilities) -> bool:
    """The upstream fetches it, by its URL: nothing to load here."""
    return declared.image_urls_upstream and image.url.lower().startswith(("http://", "https://"))


async def _load_all(images: Sequence[ImageInput], policy: ImagePolicy) -> list[ImageInput]:
    """Read every image's bytes, check the pixels of all from their headers, then decode."""
    datas = await all_or_none(images, lambda image: image_bytes(image.url, policy, image.param))
    counts = await all_or_none(
        list(zip(images, datas, strict=True)),
        lambda item: IMAGE_DECODES.run(pixels, item[1], policy.max_pixels, item[0].param),
    )
    total = 0
    for image, count in zip(images, counts, strict=True):
        total += count
        if total > policy.max_request_pixels:
            raise RequestTooLarge(f"the request's images have over {policy.max_request_pixels} pixels together "
                                  "(server.max_request_image_pixels)", param=image.param)  # fmt: skip
    return await all_or_none(list(zip(images, datas, strict=True)), lambda item: _decoded(*item, policy))


async def _decoded(image: ImageInput, data: bytes, policy: ImagePolicy) -> ImageInput:
    def work() -> ImageInput:
        decoded, mime = decode(data, policy.max_pixels, image.param)
        uri = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
        return replace(image, image=decoded, data_uri=uri)

    return await IMAGE_DECODES.run(work)


def _with_parts(message: ChatMessage, loaded: dict[int, ImageInput]) -> ChatMessage:
    if not message.parts:
        return message
    parts: tuple[ContentPart, ...] = tuple(loaded.get(id(part), part) for part in message.parts)
    return replace(message, parts=parts)
