"""Uploaded audio → mono float32 samples at the rate a model wants (PyAV decodes and
resamples; wav, mp3, flac, ogg/opus, m4a/aac, webm and the rest of FFmpeg's formats)."""

from __future__ import annotations

import io

import av
import numpy as np
import numpy.typing as npt

from modelpool.errors import InvalidRequest


def decode_audio(data: bytes, sample_rate: int, *, param: str = "file") -> npt.NDArray[np.float32]:
    if not data:
        raise InvalidRequest("the audio file is empty", param=param)
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise InvalidRequest("the file holds no audio stream", param=param)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
            pieces: list[npt.NDArray[np.float32]] = []
            for frame in container.decode(audio=0):
                pieces.extend(_samples(out) for out in resampler.resample(frame))
            pieces.extend(_samples(out) for out in resampler.resample(None))
    except InvalidRequest:
        raise
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise InvalidRequest(
            f"could not decode the audio ({exc}); send wav, mp3, flac, ogg, m4a or webm", param=param
        ) from None
    if not pieces:
        raise InvalidRequest("the audio holds no samples", param=param)
    return np.concatenate(pieces).astype(np.float32, copy=False)


def _samples(frame: av.AudioFrame) -> npt.NDArray[np.float32]:
    # The resampler makes "flt" frames, so this is float32 already and astype copies nothing.
    return frame.to_ndarray().reshape(-1).astype(np.float32, copy=False)
