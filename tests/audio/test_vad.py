"""The streaming VAD's decisions, on scripted speech scores (a fake scorer: no model)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from modelpool.audio.vad import WINDOW, StreamingVad, Turn, TurnEvent, VadSettings


class Scripted:
    """Scores from a script, one per window, in order."""

    def __init__(self, scores: list[float]) -> None:
        self.scores = list(scores)

    def __call__(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        count = len(windows) // WINDOW
        taken, self.scores = self.scores[:count], self.scores[count:]
        return np.array(taken, dtype=np.float32)


def run(scores: list[float], settings: VadSettings, feed: int = 1600) -> list[TurnEvent]:
    vad = StreamingVad(settings, Scripted(scores))
    audio = np.zeros(len(scores) * WINDOW, dtype=np.float32)
    return [event for i in range(0, len(audio), feed) for event in vad.feed(audio[i : i + feed])]


SILENCE_32MS_X16 = VadSettings(threshold=0.5, silence_duration_ms=512)  # 16 windows of silence end a turn


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([0.1] * 40, []),
        ([0.1] * 4 + [0.9] * 10 + [0.1] * 16, [(Turn.STARTED, 4), (Turn.STOPPED, 14)]),
        ([0.1] * 4 + [0.9] * 10 + [0.1] * 15, [(Turn.STARTED, 4)]),  # one window short of the silence
        # between the thresholds (0.35..0.5) neither starts the silence nor resets it
        ([0.9] * 3 + [0.4] * 30, [(Turn.STARTED, 0)]),
        ([0.9] * 3 + [0.1] * 8 + [0.4] * 8, [(Turn.STARTED, 0), (Turn.STOPPED, 3)]),
        # a word after a short pause keeps the turn going
        ([0.9] * 3 + [0.1] * 10 + [0.9] * 2 + [0.1] * 16, [(Turn.STARTED, 0), (Turn.STOPPED, 15)]),
        ([0.9] * 2 + [0.1] * 16 + [0.9] * 2 + [0.1] * 16,
         [(Turn.STARTED, 0), (Turn.STOPPED, 2), (Turn.STARTED, 18), (Turn.STOPPED, 20)]),
    ],
)  # fmt: skip
def test_turns(scores: list[float], expected: list[tuple[Turn, int]]) -> None:
    events = run(scores, SILENCE_32MS_X16)
    assert [(e.turn, e.sample // WINDOW) for e in events] == expected


@pytest.mark.parametrize("feed", [100, 512, 1600, 5000])
def test_chunk_sizes_do_not_change_the_decisions(feed: int) -> None:
    scores = [0.1] * 5 + [0.8] * 20 + [0.05] * 20
    assert run(scores, SILENCE_32MS_X16, feed) == run(scores, SILENCE_32MS_X16, 512)


def test_silero_scores_speech_above_silence() -> None:
    from modelpool.audio.vad import SileroScorer

    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000
    voiced = (0.3 * np.sin(2 * np.pi * 140 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    scorer = SileroScorer()
    quiet = scorer((rng.standard_normal(16000 // WINDOW * WINDOW) * 0.001).astype(np.float32))
    assert len(quiet) == 16000 // WINDOW and float(quiet.max()) < 0.5
    assert len(scorer(voiced[: 16000 // WINDOW * WINDOW])) == 16000 // WINDOW
