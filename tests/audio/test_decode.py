"""Decoding uploads: the samples come out as a plain full decode makes them, and the length
bound holds while decoding (a bomb is refused holding next to nothing)."""

from __future__ import annotations

import io
import time
import tracemalloc
import wave

import av
import numpy as np
import numpy.typing as npt
import pytest

from modelpool.audio.decode import decode_audio
from modelpool.errors import AudioTooLong, InvalidRequest
from tests.audio_files import silent_flac, wav_bytes


def stereo_wav(rate: int, seconds: float) -> bytes:
    """A 440 Hz tone in the left channel, 660 Hz in the right: a downmix and a resample."""
    t = np.arange(int(rate * seconds)) / rate
    left, right = np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)
    pcm = (np.stack([left, right], axis=1) * 12000).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(2)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(pcm.tobytes())
    return buffer.getvalue()


def decoded_whole(data: bytes, rate: int) -> npt.NDArray[np.float32]:
    """The plain way: every frame resampled and joined (what the bounded decoder replaces)."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    with av.open(io.BytesIO(data)) as container:
        assert isinstance(container, av.container.InputContainer)
        frames = [*container.decode(audio=0), None]
        pieces = [out.to_ndarray().reshape(-1) for frame in frames for out in resampler.resample(frame)]
    return np.concatenate(pieces)


@pytest.mark.parametrize(("data", "rate"), [(stereo_wav(44100, 3.0), 16000), (stereo_wav(16000, 1.0), 16000),
                                            (silent_flac(5.0), 16000), (stereo_wav(8000, 2.0), 24000)])  # fmt: skip
def test_the_samples_are_those_of_a_whole_decode(data: bytes, rate: int) -> None:
    decoded = decode_audio(data, rate, max_seconds=60)
    assert decoded.dtype == np.float32 and decoded.flags.c_contiguous
    np.testing.assert_array_equal(decoded, decoded_whole(data, rate))


def test_the_limit_is_exact() -> None:
    assert len(decode_audio(wav_bytes(16000, 2.0, b"\x10\x00"), 16000, max_seconds=2.0)) == 32000
    assert len(decode_audio(stereo_wav(44100, 2.0), 16000, max_seconds=2.0)) == 32000  # counted at the model's rate
    one_more = wav_bytes(16000, 2.0 + 1.5 / 16000, b"\x10\x00")  # int(32001.5): one sample more
    with pytest.raises(AudioTooLong) as refused:
        decode_audio(one_more, 16000, max_seconds=2.0)
    assert refused.value.status_code == 413 and refused.value.code == "request_too_large"
    assert "2 s" in refused.value.message and "server.max_audio_seconds" in refused.value.message
    assert refused.value.param == "file"


def test_a_silence_bomb_is_refused_holding_almost_nothing() -> None:
    bomb = silent_flac(3 * 3600)  # 3 hours: 690 MB of float32 samples at 16 kHz, from a ~2 MB upload
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(AudioTooLong):
            decode_audio(bomb, 16000, max_seconds=3600)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\n{len(bomb) / 1e6:.1f} MB FLAC of 3 h refused in {time.monotonic() - started:.2f}s, "
          f"peak Python/numpy allocation {peak / 1e6:.2f} MB")  # fmt: skip
    assert peak < 4_000_000  # one frame's worth, not an hour of samples (230 MB)


def test_audio_within_the_limit_is_held_once() -> None:
    upload = silent_flac(600)  # 10 minutes: 38 MB of samples at 16 kHz
    tracemalloc.start()
    try:
        decoded = decode_audio(upload, 16000, max_seconds=3600)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(decoded) == 600 * 16000
    assert peak < decoded.nbytes * 1.1  # one buffer of the counted length: no pieces joined into a copy


def header_only_webm() -> bytes:
    """A WebM with its Opus track declared and no frame: what a browser's MediaRecorder
    hands over when stopped before the microphone sent sound."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="webm") as container:
        stream = container.add_stream("libopus", rate=48000)
        stream.layout = "mono"
        container.start_encoding()
    return buffer.getvalue()


@pytest.mark.parametrize(("data", "message"), [(b"", "empty"), (b"not audio at all" * 100, "could not decode"),
                                               (header_only_webm(), "ends before its first audio frame")])  # fmt: skip
def test_what_is_not_audio_is_a_400(data: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        decode_audio(data, 16000, max_seconds=60, param="audio_base64")
    assert message in refused.value.message and refused.value.param == "audio_base64"
