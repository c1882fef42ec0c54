from __future__ import annotations

import pytest

from modelpool.backends.textgen.reasoning import ReasoningSplitter


def split(pieces: list[str], *, starts_inside: bool) -> tuple[str, str]:
    splitter = ReasoningSplitter(starts_inside=starts_inside)
    reasoning, content = [], []
    for piece in pieces:
        r, c = splitter.feed(piece)
        reasoning.append(r)
        content.append(c)
    r, c = splitter.flush()
    return "".join(reasoning) + r, "".join(content) + c


@pytest.mark.parametrize(
    ("pieces", "starts_inside", "expected"),
    [
        (["<think>plan</think>answer"], False, ("plan", "answer")),
        (["<th", "ink>pl", "an</th", "ink>ans", "wer"], False, ("plan", "answer")),  # tags split across tokens
        (["plan</think>answer"], True, ("plan", "answer")),  # the template opened the tag
        (["no tags at all"], False, ("", "no tags at all")),
        (["still thinking"], True, ("still thinking", "")),
        (["a<think>b</think>c<think>d</think>e"], False, ("bd", "ace")),
        (["ends on a partial <thi"], False, ("", "ends on a partial <thi")),  # released at the end
        (["x < y and </thinking>"], True, ("x < y and </thinking>", "")),  # not the tag
    ],
)
def test_reasoning_splitter(pieces: list[str], starts_inside: bool, expected: tuple[str, str]) -> None:
    assert split(pieces, starts_inside=starts_inside) == expected
