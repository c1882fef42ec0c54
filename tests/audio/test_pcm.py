"""Live pcm16 chunks: checked, decoded, resampled as one stream."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from modelpool.audio.pcm import Pcm16Resampler, pcm16_from_base64
from modelpool.errors import InvalidRequest


def test_decodes_little_endian_samples() -> None:
    samples = np.array([0, 1, -1, 32767, -32768], dtype="<i2")
    assert pcm16_from_base64(base64.b64encode(samples.tobytes()).decode()).tolist() == samples.tolist()


@pytest.mark.parametrize("data", ["not base64!", base64.b64encode(b"\x00\x01\x02").decode()])
def test_bad_chunks_are_invalid_requests(data: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        pcm16_from_base64(data)
    assert raised.value.param == "audio"


def test_resampling_in_chunks_keeps_the_tone_and_the_length() -> None:
    rate, seconds = 24000, 2.0
    t = np.arange(int(rate * seconds)) / rate
    tone = (np.sin(2 * np.pi * 440 * t) * 12000).astype(np.int16)
    resampler = Pcm16Resampler(rate, 16000)
    out = np.concatenate([resampler.convert(tone[i : i + 2400]) for i in range(0, len(tone), 2400)])
    assert abs(len(out) - 32000) < 200  # the resampler holds back a few samples, no more
    spectrum = np.abs(np.fft.rfft(out[1000:17000]))
    assert abs(np.argmax(spectrum) * 16000 / 16000 - 440) <= 2
    assert 0.3 < float(np.abs(out).max()) < 0.4


def test_same_rate_is_a_plain_conversion() -> None:
    pcm = np.array([16384, -16384], dtype=np.int16)
    assert Pcm16Resampler(16000, 16000).convert(pcm).tolist() == [0.5, -0.5]
