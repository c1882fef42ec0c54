"""Content parts of messages, as Chat Completions and the Responses API send them: text and
images, and on Chat Completions videos (`video_url`, as vLLM and llm-pool take them; the
Responses API documents no video item); audio parts are named, and refused: no chat model
here reads audio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field

from modelpool.errors import InvalidRequest, ModalityUnsupported
from modelpool.inference import ContentPart, ImageInput, VideoInput
from modelpool.inference import TextPart as TextContent
from modelpool.wire.common import Text, WireModel

Detail = Literal["auto", "low", "high"]


class ChatTextPart(WireModel):
    type: Literal["text"]
    text: Text


class ImageUrl(WireModel):
    url: str = Field(min_length=1)
    detail: Detail | None = None


class ChatImagePart(WireModel):
    type: Literal["image_url"]
    image_url: ImageUrl


class VideoUrl(WireModel):
    url: str = Field(min_length=1)


class ChatVideoPart(WireModel):
    """`{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..." | "https://..."}}`."""

    type: Literal["video_url"]
    video_url: VideoUrl


class ChatAudioPart(WireModel):
    type: Literal["input_audio"]
    input_audio: dict[str, Any]


ChatPart = Annotated[ChatTextPart | ChatImagePart | ChatVideoPart | ChatAudioPart, Field(discriminator="type")]


class ResponsesTextPart(WireModel):
    type: Literal["input_text", "output_text", "text"]
    text: Text
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class ResponsesImagePart(WireModel):
    """`{"type": "input_image", "image_url": "data:..." | "https://...", "detail": ...}`."""

    type: Literal["input_image"]
    image_url: str | None = Field(default=None, min_length=1)
    file_id: str | None = None
    detail: Detail | None = None


ResponsesPart = Annotated[ResponsesTextPart | ResponsesImagePart, Field(discriminator="type")]

AnyPart = ChatTextPart | ChatImagePart | ResponsesTextPart | ResponsesImagePart
"""Either API's parts (llm-pool's `messages` take both); "text" parts are the chat kind."""


def to_content(
    wire: Sequence[Any], where: str, *, images_allowed: bool, separator: str = "\n"
) -> tuple[str, tuple[ContentPart, ...]]:
    """(the text, joined by `separator`; the parts in order when there is an image, else
    ()). `where` is the content's field (`messages[0].content`); a part's errors name
    `where[i]`."""
    texts: list[str] = []
    parts: list[ContentPart] = []
    for index, part in enumerate(wire):
        param = f"{where}[{index}]"
        if isinstance(part, ChatTextPart | ResponsesTextPart):
            texts.append(part.text)
            parts.append(TextContent(part.text))
        elif isinstance(part, ChatAudioPart):
            raise ModalityUnsupported("audio content parts are not read by chat models; transcribe the audio "
                                      "with /v1/audio/transcriptions first", param=param)  # fmt: skip
        elif isinstance(part, ChatVideoPart):
            if not images_allowed:
                raise InvalidRequest("videos go in user messages only", param=param)
            parts.append(VideoInput(part.video_url.url, param))
        else:
            url, detail = _image_source(part, param)
            if not images_allowed:
                raise InvalidRequest("images go in user messages only", param=param)
            parts.append(ImageInput(url, param, detail))
    has_media = any(not isinstance(p, TextContent) for p in parts)
    return separator.join(texts), tuple(parts) if has_media else ()


def _image_source(part: ChatImagePart | ResponsesImagePart, param: str) -> tuple[str, str | None]:
    if isinstance(part, ChatImagePart):
        return part.image_url.url, part.image_url.detail
    if part.image_url is None:
        raise InvalidRequest("an input_image needs image_url (file ids are not supported)", param=param)
    return part.image_url, part.detail
