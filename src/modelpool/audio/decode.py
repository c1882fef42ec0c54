"""Uploaded audio → mono float32 samples at the rate a model wants (PyAV decodes and
resamples; wav, mp3, flac, ogg/opus, m4a/aac, webm and the rest of FFmpeg's formats).

A few compressed bytes can hold hours of audio (a FLAC of silence packs 8 hours into a
few MB, which decode to GBs of samples), so the decoded length is bounded while decoding,
never after. Decoding is two passes over the upload:

1. count: every frame is decoded and its samples counted, nothing kept; past
   `max_seconds` the upload is refused at once. A refusal therefore costs one frame of
   memory, whatever the file's header claims (a header can lie; the frames are what
   the decoder makes).
2. fill: the frames are decoded again, resampled into one float32 buffer allocated for
   the counted length, still checked against that length as they come.

Decoding compressed audio runs at hundreds of times real time, so the second pass costs
far less than transcribing what it decodes. PyAV is the [audio] extra: imported when the
first upload is decoded, and without it a decode is a 501 that names the extra.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from modelpool.errors import AudioTooLong, InvalidRequest
from modelpool.extras import AUDIO

if TYPE_CHECKING:
    import av
    import av.container

_SLACK_SAMPLES = 4096
"""Room past the counted length for what a resampler's filter may add at the end."""


def decode_audio(
    data: bytes, sample_rate: int, *, max_seconds: float | None = None, param: str = "file"
) -> npt.NDArray[np.float32]:
    """The upload's first audio stream as mono float32 at `sample_rate`. InvalidRequest for
    what is not audio; AudioTooLong (413) for audio over `max_seconds`, before it is kept."""
    return fill_audio(data, sample_rate, count_audio(data, sample_rate, max_seconds, param), param)


def count_audio(data: bytes, sample_rate: int, max_seconds: float | None = None, param: str = "file") -> int:
    """Pass 1: how many samples at `sample_rate` the upload decodes to, holding one frame at
    a time; AudioTooLong past `max_seconds`, InvalidRequest for no audio at all."""
    if not data:
        raise InvalidRequest("the audio file is empty", param=param)
    limit = None if max_seconds is None else math.floor(max_seconds * sample_rate)
    with _opened(data, param) as container:
        length = _count(container, sample_rate, limit, max_seconds, param)
    if length == 0:
        raise InvalidRequest("the audio holds no samples", param=param)
    return length


def fill_audio(data: bytes, sample_rate: int, length: int, param: str = "file") -> npt.NDArray[np.float32]:
    """Pass 2: the samples, into one buffer for the `length` pass 1 counted."""
    with _opened(data, param) as container:
        return _fill(container, sample_rate, length + _SLACK_SAMPLES, param)


@contextmanager
def _opened(data: bytes, param: str) -> Iterator[av.container.InputContainer]:
    """The container, with FFmpeg's failures (while opening or decoding) as a 400."""
    AUDIO.require()
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise InvalidRequest("the file holds no audio stream", param=param)
            yield container
    except av.error.EOFError:
        # What a browser's MediaRecorder makes when stopped before the microphone sent sound:
        # a container header and no frame.
        raise InvalidRequest(
            "the audio file ends before its first audio frame (an empty recording, or a cut upload)", param=param
        ) from None
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise InvalidRequest(
            f"could not decode the audio ({exc}); send wav, mp3, flac, ogg, m4a or webm", param=param
        ) from None


def _count(
    container: av.container.InputContainer, rate: int, limit: int | None, max_seconds: float | None, param: str
) -> int:
    """Samples the stream makes at `rate` (frames decoded and dropped), stopping past `limit`.
    Counted per input rate in whole samples, so rounding never refuses audio right at it."""
    counts: dict[int, int] = {}
    total = 0.0
    for frame in container.decode(audio=0):
        source_rate = frame.sample_rate or rate
        counts[source_rate] = counts.get(source_rate, 0) + frame.samples
        total = sum(samples * rate / source for source, samples in counts.items())
        if limit is not None and total > limit:
            raise AudioTooLong(
                f"the audio is longer than the {max_seconds:g} s this server transcribes at once "
                "(server.max_audio_seconds); split it, or ask the operator to raise the limit",
                param=param,
            )
    return math.ceil(total)


def _fill(container: av.container.InputContainer, rate: int, capacity: int, param: str) -> npt.NDArray[np.float32]:
    """The stream resampled into one buffer of `capacity` samples, filled in place."""
    buffer = np.empty(capacity, dtype=np.float32)
    filled = 0
    import av  # imported by _opened, which opened the container

    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    for frame in _then_flush(container.decode(audio=0)):
        for out in resampler.resample(frame):
            # The resampler makes "flt" frames: float32 already, so reshape copies nothing.
            samples = out.to_ndarray().reshape(-1)
            if filled + len(samples) > capacity:  # the same bytes decoded longer the second time
                raise InvalidRequest("the audio decoded to a different length twice", param=param)
            buffer[filled : filled + len(samples)] = samples
            filled += len(samples)
    if filled == 0:
        raise InvalidRequest("the audio holds no samples", param=param)
    return buffer[:filled]


def _then_flush(frames: Iterator[av.AudioFrame]) -> Iterator[av.AudioFrame | None]:
    """The frames, then None: what flushes the resampler's last samples."""
    yield from frames
    yield None
