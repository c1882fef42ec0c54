from __future__ import annotations

import pytest

from modelpool.backends.textgen.decoding import StopMatcher, Utf8Stream, may_end
from modelpool.inference import SamplingParams


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    matcher, emitted = StopMatcher(stops), []
    for piece in pieces:
        text, hit = matcher.feed(piece)
        emitted.append(text)
        if hit:
            return emitted, True
    emitted.append(matcher.flush())
    return emitted, False


@pytest.mark.parametrize(
    ("stops", "pieces", "emitted", "hit"),
    [
        ((), ["a", "b"], ["a", "b", ""], False),
        (("END",), ["hello ", "world"], ["hello ", "world", ""], False),
        (("END",), ["abc", "E", "N", "D", "zzz"], ["abc", "", "", ""], True),  # split over three tokens
        (("END",), ["abE", "Nx"], ["ab", "ENx", ""], False),  # a false start is released
        (("END",), ["xxEN"], ["xx", "EN"], False),  # held back, then released at the end
        (("\n\n", "###"), ["one\n", "\ntwo"], ["one", ""], True),
        (("ab", "b"), ["xab"], ["x"], True),  # the earliest stop wins
        (("stop",), ["nonstop"], ["non"], True),
    ],
)
def test_stop_matcher(stops: tuple[str, ...], pieces: list[str], emitted: list[str], hit: bool) -> None:
    assert run(stops, pieces) == (emitted, hit)


def test_stop_text_never_leaks_whatever_the_split() -> None:
    text, stop = "The answer is 42. Next question", ". Next"
    for cut in range(1, len(text)):
        emitted, hit = run((stop,), [text[:cut], text[cut:]])
        assert hit and "".join(emitted) == "The answer is 42"


def test_a_stop_before_min_tokens_does_not_count() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.feed("aEND", armed=False) == ("aEND", False)  # before the floor: passes unchecked
    assert matcher.feed("bEN", armed=True) == ("b", False)  # from the floor on: held, then found
    assert matcher.feed("D", armed=True) == ("", True)


@pytest.mark.parametrize(
    ("sampling", "generated", "allowed"),
    [
        (SamplingParams(), 0, True),
        (SamplingParams(ignore_eos=True), 500, False),
        (SamplingParams(min_tokens=3), 2, False),
        (SamplingParams(min_tokens=3), 3, True),
    ],
)
def test_end_of_sequence_may_end_only_past_min_tokens_and_never_with_ignore_eos(
    sampling: SamplingParams, generated: int, allowed: bool
) -> None:
    assert may_end(sampling, generated) is allowed


def test_utf8_characters_split_across_tokens_come_out_whole() -> None:
    data = "né ✓ 🙂".encode()
    stream = Utf8Stream()
    out = [stream.feed(data[i : i + 1]) for i in range(len(data))]
    assert "".join(out) + stream.flush() == "né ✓ 🙂"
    assert all(part in ("", "n", "é", " ", "✓", "🙂") for part in out)
    assert Utf8Stream().feed(b"\xff") == "\ufffd"


@pytest.mark.parametrize(
    ("stops", "pieces", "matched"),
    [
        (("END", "STOP"), ["aSTO", "P b END"], "STOP"),  # the one that came, across pieces
        (("b", "ab"), ["xab"], "ab"),  # the earliest in the text, not the first listed
        (("ab", "a"), ["xab"], "ab"),  # a tie: the first listed
        (("END",), ["no stop here"], None),
    ],
)
def test_the_matcher_tells_which_stop_sequence_it_found(
    stops: tuple[str, ...], pieces: list[str], matched: str | None
) -> None:
    matcher = StopMatcher(stops)
    run_through = [matcher.feed(piece) for piece in pieces]
    assert any(hit for _, hit in run_through) == (matched is not None)
    assert matcher.matched == matched
