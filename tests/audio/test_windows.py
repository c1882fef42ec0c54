"""Long audio cut into windows at its quiet points."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from modelpool.audio.windows import quiet_windows

RATE = 16000


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, int(seconds * RATE)).astype(np.float32)


def test_audio_within_a_window_is_one_window() -> None:
    assert list(quiet_windows(noise(30), RATE, 30)) == [(0, 30 * RATE)]
    assert list(quiet_windows(noise(90), RATE, 0)) == [(0, 90 * RATE)]  # 0: no windows


def test_windows_cover_the_audio_in_order_and_cut_in_the_quiet() -> None:
    audio = noise(300)
    gaps = [(27.0, 27.4), (55.0, 55.3)]  # quiet stretches just before where windows would end
    for start, end in gaps:
        audio[int(start * RATE) : int(end * RATE)] = 0.0
    windows = list(quiet_windows(audio, RATE, 30))
    assert windows[0][0] == 0 and windows[-1][1] == len(audio)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(windows))  # contiguous: nothing lost
    assert all(0 < end - start <= 30 * RATE for start, end in windows)
    first_cut, second_cut = windows[0][1] / RATE, windows[1][1] / RATE
    assert gaps[0][0] <= first_cut <= gaps[0][1] and gaps[1][0] <= second_cut <= gaps[1][1]


@pytest.mark.parametrize("seconds", [30.01, 61, 119.99, 3600])
def test_every_length_is_covered(seconds: float) -> None:
    audio = noise(seconds, seed=1)
    windows = list(quiet_windows(audio, RATE, 30))
    assert sum(end - start for start, end in windows) == len(audio)
    assert len(windows) <= int(seconds / (30 * 0.75)) + 1  # each window is at least 3/4 of the nominal length
