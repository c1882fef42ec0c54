"""Videos from a request's `video_url` parts: read under the same guard as images (a `data:`
URI always; `http(s)://` only when remote media are allowed, through the SSRF guard; `file://`
only under allowed directories), then checked from the container's headers and decoded with
PyAV into a few sampled frames.

Everything the client picks is bounded before the work it costs: the bytes while they are
read; the container format, the resolution and the declared duration from the headers,
before a frame is decoded; and while decoding, the frames' real timestamps and sizes (a file
that declares one second but runs for an hour, or changes resolution midway, is stopped at
the bound), and the number of frames decoded. Sampled frames are scaled down so that all of
a video's frames together stay within `max_frames_pixels`, whatever its resolution.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modelpool.errors import InvalidRequest, RequestTooLarge
from modelpool.media.images import ImagePolicy, image_bytes

if TYPE_CHECKING:
    from PIL import Image

CONTAINERS = {"mov": "video/mp4", "matroska": "video/webm", "avi": "video/x-msvideo"}
"""Container formats accepted (PyAV's demuxer names, the first of its `format.name`: "mov"
reads MP4 and QuickTime, "matroska" WebM and MKV), and the MIME type each is forwarded as.
Image demuxers PyAV also opens (a PNG, a GIF) are refused: those are images."""
MAX_ASPECT_RATIO = 200
"""Widest long-to-short side ratio a video may have: Qwen's resizing (transformers'
`smart_resize`, for images and videos alike) refuses anything wider, and no model reads a
4200x16 strip usefully."""
DECODED_FRAMES_PER_SECOND = 240
"""Decoded frames allowed per second of `max_seconds`: a stream whose timestamps never move
(all zero) is still stopped."""


@dataclass(frozen=True)
class VideoPolicy:
    """Where videos may come from (`source`: the image guard, with the video byte limit) and
    how big they may be (from the server config)."""

    source: ImagePolicy = field(default_factory=lambda: ImagePolicy(max_bytes=64 * 1024 * 1024, kind="video"))
    max_seconds: float = 600.0
    """Longest video, declared or decoded (413 above it)."""
    max_frame_pixels: int = 8_294_400
    """Most pixels one frame may have (3840x2160; 413 above it, read from the headers)."""
    max_videos: int = 2
    """Most videos one request may carry (`server.max_videos_per_request`)."""
    max_frames_pixels: int = 40_000_000
    """Most pixels a video's sampled frames may have together: frames are scaled down to fit."""
    max_decode_s: float = 60.0
    """Longest one video's decoding may take (every frame up to the last sampled one is
    decoded): a long high-resolution stream within the other bounds still cannot hold a
    decode thread for minutes (413)."""


@dataclass(frozen=True)
class Sampling:
    """How a model wants its frames: `fps` frames a second, at most `max_frames` (fewer,
    spread evenly over the video, when it is longer)."""

    fps: float
    max_frames: int


@dataclass(frozen=True)
class VideoHeader:
    width: int
    height: int
    seconds: float | None
    """As declared (None: the container does not say)."""
    mime: str


@dataclass(frozen=True)
class SampledVideo:
    frames: tuple[Image.Image, ...] = field(repr=False)
    timestamps: tuple[float, ...]
    """Each frame's time in the video, in seconds."""
    fps: float
    """The video's own frame rate (as declared; 0 when unknown)."""


async def video_bytes(url: str, policy: VideoPolicy, param: str) -> bytes:
    """The bytes a `video_url` names, read under the image guard with the video byte limit."""
    return await image_bytes(url, policy.source, param)


def read_header(data: bytes, policy: VideoPolicy, param: str) -> VideoHeader:
    """The container's format, resolution and duration, from its headers (nothing decoded),
    checked against the policy."""
    with _opened(data, param) as container:
        return _checked_header(container, policy, param)


def sample_frames(data: bytes, policy: VideoPolicy, sampling: Sampling, param: str) -> SampledVideo:
    """Decode `data` into the frames `sampling` asks for, as RGB images."""
    with _opened(data, param) as container:
        header = _checked_header(container, policy, param)
        stream = container.streams.video[0]
        step = 1.0 / sampling.fps
        if header.seconds:  # known length: spread the frames over all of it
            step = max(step, header.seconds / sampling.max_frames)
        size = _frame_size(header, policy.max_frames_pixels // sampling.max_frames)
        frames, times = _decode_sampled(container, stream, policy, sampling.max_frames, step, size, param)
        rate = float(stream.average_rate or 0)
    if not frames:
        raise InvalidRequest("the video has no frame that could be decoded", param=param)
    return SampledVideo(tuple(frames), tuple(times), rate)


def _decode_sampled(
    container: Any, stream: Any, policy: VideoPolicy, most: int, step: float, size: tuple[int, int], param: str
) -> tuple[list[Image.Image], list[float]]:
    """Frames at `step` seconds apart; when more than `most` come (the length was not known),
    every other one is dropped and the step doubled, so the kept ones stay evenly spread."""
    import av

    frames: list[Image.Image] = []
    times: list[float] = []
    next_time, decoded = 0.0, 0
    most_decoded = int(policy.max_seconds * DECODED_FRAMES_PER_SECOND) + 1
    deadline = time.monotonic() + policy.max_decode_s
    try:
        for frame in container.decode(stream):
            decoded += 1
            when = float(frame.time) if frame.time is not None else 0.0
            _check_frame(frame, when, decoded, most_decoded, policy, param)
            if time.monotonic() > deadline:
                raise RequestTooLarge(f"decoding the video took longer than {policy.max_decode_s:g} s; "
                                      "send a shorter or smaller one", param=param)  # fmt: skip
            if when + 1e-6 < next_time:
                continue
            frames.append(frame.to_image(width=size[0], height=size[1]))
            times.append(when)
            next_time = when + step
            if len(frames) > most:
                frames, times, step = frames[::2], times[::2], step * 2
                next_time = times[-1] + step
    except av.FFmpegError as exc:
        if not frames:
            raise InvalidRequest(f"the video cannot be decoded: {exc}", param=param) from None
        # A damaged tail: the frames decoded before it are the video.
    return frames, times


def _check_frame(frame: Any, when: float, decoded: int, most: int, policy: VideoPolicy, param: str) -> None:
    if when > policy.max_seconds:
        raise RequestTooLarge(f"the video runs past {policy.max_seconds:g} s (server.max_video_seconds)",
                              param=param)  # fmt: skip
    if decoded > most:
        raise RequestTooLarge(f"the video has more than {most} frames (server.max_video_seconds)", param=param)
    if frame.width * frame.height > policy.max_frame_pixels:
        raise RequestTooLarge(f"a video frame is {frame.width}x{frame.height}, over {policy.max_frame_pixels} "
                              "pixels (server.max_video_pixels)", param=param)  # fmt: skip


def _frame_size(header: VideoHeader, most_pixels: int) -> tuple[int, int]:
    """The size frames are kept at: theirs, or scaled down (aspect kept) to `most_pixels`."""
    pixels = header.width * header.height
    if pixels <= most_pixels:
        return header.width, header.height
    scale = math.sqrt(most_pixels / pixels)
    return max(2, int(header.width * scale)), max(2, int(header.height * scale))


class _opened:
    """A PyAV container over the bytes (a context manager), its errors the request's."""

    def __init__(self, data: bytes, param: str) -> None:
        self.data, self.param = data, param
        self.container: Any = None

    def __enter__(self) -> Any:
        import av

        try:
            self.container = av.open(io.BytesIO(self.data), mode="r")
        except (av.FFmpegError, ValueError, OSError) as exc:
            raise InvalidRequest(f"the video cannot be read: {exc}", param=self.param) from None
        return self.container

    def __exit__(self, *_: object) -> None:
        if self.container is not None:
            self.container.close()


def _checked_header(container: Any, policy: VideoPolicy, param: str) -> VideoHeader:
    demuxer = str(container.format.name).split(",")[0]
    if demuxer not in CONTAINERS:
        raise InvalidRequest(f"video format {demuxer} is not supported (MP4, MOV, WebM, Matroska, AVI)", param=param)
    if not container.streams.video:
        raise InvalidRequest("the file has no video stream", param=param)
    stream = container.streams.video[0]
    codec = stream.codec_context
    if codec is None:  # a codec FFmpeg does not know, or a header cut short
        raise InvalidRequest("the video's codec cannot be read from its headers", param=param)
    width, height = int(codec.width or 0), int(codec.height or 0)
    if width <= 0 or height <= 0:
        raise InvalidRequest("the video's resolution cannot be read from its headers", param=param)
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise InvalidRequest(f"the video is {width}x{height}: its aspect ratio is over {MAX_ASPECT_RATIO}:1",
                             param=param)  # fmt: skip
    if width * height > policy.max_frame_pixels:
        raise RequestTooLarge(f"the video is {width}x{height}, over {policy.max_frame_pixels} pixels a frame "
                              "(server.max_video_pixels)", param=param)  # fmt: skip
    seconds = _declared_seconds(container, stream)
    if seconds is not None and seconds > policy.max_seconds:
        raise RequestTooLarge(f"the video is {seconds:.0f} s long, over {policy.max_seconds:g} s "
                              "(server.max_video_seconds)", param=param)  # fmt: skip
    return VideoHeader(width, height, seconds, CONTAINERS[demuxer])


def _declared_seconds(container: Any, stream: Any) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration) / 1_000_000  # av.time_base: microseconds
    return None
