"""Videos in a chat request, made ready for its model: refused when the model reads no video
(400 `modality_unsupported` naming the part) or when the request carries too many, else read
from where images may come from (data URIs, the guarded fetch, allowed directories) and
checked from their headers — all before the request waits for its turn on the model.

A model that reads frames in process (it declares `video_fps` and `max_video_frames`) gets
each video decoded into its sampled frames here, on the video-decode threads; an engine or
upstream that takes the video itself (vLLM, an OpenAI-compatible server) gets the checked
bytes unchanged, as a data URI, or the URL itself when the upstream fetches URLs.
"""

from __future__ import annotations

import base64
from dataclasses import replace

from modelpool.capabilities import Capabilities, Modality
from modelpool.errors import InvalidRequest, ModalityUnsupported, RequestTooLarge
from modelpool.extras import VIDEO
from modelpool.inference import ChatMessage, ChatRequest, ContentPart, VideoInput
from modelpool.media.video import Sampling, VideoPolicy, read_header, sample_frames, video_bytes
from modelpool.offload import VIDEO_DECODES, all_or_none


async def with_loaded_videos(
    request: ChatRequest, model_id: str, declared: Capabilities, policy: VideoPolicy
) -> ChatRequest:
    videos = [video for message in request.messages for video in message.videos]
    if not videos:
        return request
    if Modality.VIDEO not in declared.modalities:
        raise ModalityUnsupported(f"model '{model_id}' does not read video", param=videos[0].param)
    if len(videos) > policy.max_videos:
        raise InvalidRequest(f"a request may carry at most {policy.max_videos} videos "
                             f"(server.max_videos_per_request), this one has {len(videos)}",
                             param=videos[policy.max_videos].param)  # fmt: skip
    VIDEO.require()
    local = [video for video in videos if not _forwarded_as_url(video, declared)]
    if local and declared.max_video_frames is not None:
        policy = _sharing_the_pixel_budget(request, local, declared.max_video_frames, policy)
    loaded = await all_or_none(local, lambda video: _loaded(video, declared, policy))
    by_part = {id(video): done for video, done in zip(local, loaded, strict=True)}
    return replace(request, messages=tuple(_with_parts(m, by_part) for m in request.messages))


MIN_FRAME_PIXELS = 32 * 32
"""Fewest pixels a sampled frame may be scaled down to, before the request is refused."""


def _sharing_the_pixel_budget(request: ChatRequest, videos: list[VideoInput], max_frames: int,
                              policy: VideoPolicy) -> VideoPolicy:  # fmt: skip
    """One request-wide pixel budget (`server.max_request_image_pixels`) for its images and
    its videos' sampled frames together: what the (already loaded) images leave is shared
    evenly among the videos decoded here."""
    images = sum(image.image.width * image.image.height for message in request.messages
                 for image in message.images if image.image is not None)  # fmt: skip
    each = (policy.max_frames_pixels - images) // len(videos)
    if each < max_frames * MIN_FRAME_PIXELS:
        raise RequestTooLarge(f"the request's images leave too few of its {policy.max_frames_pixels} pixels "
                              "for its videos' frames (server.max_request_image_pixels)",
                              param=videos[0].param)  # fmt: skip
    return replace(policy, max_frames_pixels=each)


def _forwarded_as_url(video: VideoInput, declared: Capabilities) -> bool:
    """The upstream fetches it, by its URL: nothing to read here."""
    return declared.image_urls_upstream and video.url.lower().startswith(("http://", "https://"))


async def _loaded(video: VideoInput, declared: Capabilities, policy: VideoPolicy) -> VideoInput:
    data = await video_bytes(video.url, policy, video.param)
    if declared.video_fps is None or declared.max_video_frames is None:
        return await VIDEO_DECODES.run(_as_data_uri, video, data, policy)
    sampling = Sampling(declared.video_fps, declared.max_video_frames)
    sampled = await VIDEO_DECODES.run(sample_frames, data, policy, sampling, video.param)
    return replace(video, frames=sampled.frames, timestamps=sampled.timestamps, fps=sampled.fps)


def _as_data_uri(video: VideoInput, data: bytes, policy: VideoPolicy) -> VideoInput:
    """Checked from its headers (format, resolution, length), then forwarded as it came."""
    header = read_header(data, policy, video.param)
    return replace(video, data_uri=f"data:{header.mime};base64,{base64.b64encode(data).decode('ascii')}")


def _with_parts(message: ChatMessage, loaded: dict[int, VideoInput]) -> ChatMessage:
    if not message.parts:
        return message
    parts: tuple[ContentPart, ...] = tuple(loaded.get(id(part), part) for part in message.parts)
    return replace(message, parts=parts)
