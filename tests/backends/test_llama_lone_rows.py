"""Where llama.cpp's equal split (a KV stream per sequence) would leave one row alone in a
micro-batch: the engine drops a guess or defers a prompt token rather than let a row take the split-KV
attention kernel that rounds differently (engine.py `_no_lone_row`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from modelpool.backends.llama_cpp.engine import _lone_tail, _Row


def rows(**per_sequence: int) -> list[_Row]:
    """`a=3, b=1`: three rows of sequence 0, one of sequence 1 (in that order)."""
    made = []
    for seq_id, count in enumerate(per_sequence.values()):
        job: Any = SimpleNamespace(seq_id=seq_id)
        made += [_Row(0, position, job, True, position == 0) for position in range(count)]
    return made


@pytest.mark.parametrize(
    ("counts", "alone"),
    [
        ({"a": 1}, 0),  # a lone decode: the spare row's case
        ({"a": 2}, None),  # one micro-batch of two rows
        ({"a": 2, "b": 1}, 0),  # {a0, b0}, then a1 alone
        ({"a": 3, "b": 1}, None),  # {a0, b0}, {a1, a2}
        ({"a": 4, "b": 4}, None),  # as many rows each: never alone
        ({"a": 5, "b": 4, "c": 1}, 0),  # a's surplus over b is one row
        ({"a": 1, "b": 65}, 1),  # b's surplus of 64 goes 63 then 1
        ({"a": 1, "b": 64}, None),
    ],
)
def test_the_sequence_left_with_one_row_alone(counts: dict[str, int], alone: int | None) -> None:
    assert _lone_tail(rows(**counts), 63) == alone
