"""Long audio cut into windows at quiet points, so an engine that works on all it is given
at once (faster-whisper computes the features of the whole audio in one go, ~0.8 MB a
second) holds one window's worth, not the upload's."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

FRAME_S = 0.1
"""The cut lands in the middle of the quietest frame this long."""
MAX_SEARCH_S = 10.0
"""How far before a window's nominal end the quietest frame is looked for."""


def quiet_windows(audio: npt.NDArray[np.float32], rate: int, window_s: float) -> Iterator[tuple[int, int]]:
    """(start, end) sample ranges that cover `audio` in order, each at most `window_s` long,
    each but the last ending in the quietest `FRAME_S` of its last stretch (so a cut rarely
    splits a word). Audio no longer than `window_s` (or `window_s` 0) is one window."""
    window = int(window_s * rate)
    if window <= 0 or len(audio) <= window:
        yield 0, len(audio)
        return
    search = int(min(MAX_SEARCH_S, window_s / 4) * rate)
    start = 0
    while len(audio) - start > window:
        end = _quietest_point(audio, start + window - search, start + window, int(FRAME_S * rate))
        yield start, end
        start = end
    yield start, len(audio)


def _quietest_point(audio: npt.NDArray[np.float32], low: int, high: int, frame: int) -> int:
    """The middle of the frame of least energy in audio[low:high]."""
    count = max(1, (high - low) // frame)
    stretch = audio[low : low + count * frame].reshape(count, -1)
    energy = np.einsum("ij,ij->i", stretch, stretch)  # per frame, without squaring a copy
    return low + int(np.argmin(energy)) * frame + frame // 2
