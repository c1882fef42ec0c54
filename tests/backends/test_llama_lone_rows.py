"""Where llama.cpp's equal split (a KV stream per sequence, sequential ids) would leave one row
alone in a micro-batch, whose split-KV attention kernel rounds differently: the model of the
split (microbatch.py) and the engine's answer (a guess dropped, a prompt token deferred, or a
spare row in a neighbouring sequence id; engine.py `_no_lone_row`)."""

from __future__ import annotations

from itertools import groupby
from types import SimpleNamespace
from typing import Any

import pytest

from modelpool.backends.llama_cpp.engine import LlamaEngine, _Row, _Slot
from modelpool.backends.llama_cpp.microbatch import SPLIT_KV_FROM, lone_sequences, micro_batches

LONG = SPLIT_KV_FROM + 168  # a position whose stream spans 512 cells


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ([(0, 1)], [[(0, 1)]]),
        ([(0, 1), (1, 1)], [[(0, 1), (1, 1)]]),  # the spare row's pair
        ([(0, 1), (2, 1), (3, 1)], [[(0, 1)], [(2, 1), (3, 1)]]),  # a missing id ends the run: 0 alone
        ([(0, 2), (1, 1)], [[(0, 1), (1, 1)], [(0, 1)]]),
        ([(0, 65)], [[(0, 63)], [(0, 2)]]),
        # Seen in a step of the e2e test: a long prompt beside three short ones.
        ([(0, 388), (1, 34), (2, 37), (3, 38)],
         [[(0, 15), (1, 15), (2, 15), (3, 15)]] * 2 + [[(0, 4), (1, 4), (2, 4), (3, 4)]]
         + [[(0, 63)]] * 5 + [[(0, 39)], [(2, 3), (3, 3)], [(3, 1)]]),
    ],
)  # fmt: skip
def test_micro_batches_follow_llamas_sequential_equal_split(groups: list[tuple[int, int]], expected: Any) -> None:
    assert micro_batches(groups, 63) == expected


def test_lone_sequences() -> None:
    assert lone_sequences([(0, 1), (2, 1), (3, 1)], 63) == [0]
    assert lone_sequences([(0, 1), (1, 1), (2, 1)], 63) == []
    assert lone_sequences([(0, 1), (1, 65)], 63) == [1]


def engine(parallel: int = 4) -> Any:
    """The engine's batch-composition state without a llama.cpp context."""
    made: Any = object.__new__(LlamaEngine)
    made.parallel, made.n_ctx, made._n_ubatch, made._spares = parallel, 512, 63, []
    made.model = SimpleNamespace(bos=1)
    made._slots = [_Slot(i) for i in range(parallel)]
    return made


def job(seq_id: int, position: int, **more: Any) -> Any:
    state = {"history": [0] * position, "drafted": [], "evaluated": 0, **more}
    return SimpleNamespace(seq_id=seq_id, position=position, **state)


def decode(made: Any, seq_id: int, position: int) -> _Row:
    running = job(seq_id, position + 1)
    made._slots[seq_id].job = running
    return _Row(7, position, seq_id, running, True, True)


def alone_past_split_kv(rows: list[_Row]) -> list[int]:
    groups = [(seq_id, len(list(same))) for seq_id, same in groupby(row.seq_id for row in rows)]
    last = {row.seq_id: row for row in rows}
    return [s for s in lone_sequences(groups, 63) if last[s].job is not None and last[s].position >= SPLIT_KV_FROM]


def test_a_long_decode_whose_neighbour_left_gets_a_spare_row_beside_it() -> None:
    """Sequences 0 (a long conversation), 2 and 3 decode; 1 finished a step earlier. Cut as
    {0} and {2, 3}, 0's row took the split-KV kernel and its answer changed (the e2e test
    `test_a_long_conversation_equals_alone_in_a_batch_that_thins_out`, 4 of 10 runs)."""
    made = engine()
    rows = [decode(made, 0, LONG), decode(made, 2, 40), decode(made, 3, 41)]
    assert alone_past_split_kv(rows) == [0]
    made._no_lone_row(rows)
    assert [row.seq_id for row in rows] == [0, 1, 2, 3] and rows[1].job is None
    assert alone_past_split_kv(rows) == []
    assert [(spare.seq_id, spare.position) for spare in made._spares] == [(1, 0)]


def test_the_highest_sequence_borrows_the_one_below() -> None:
    made = engine(parallel=2)
    rows = [decode(made, 1, LONG)]
    made._no_lone_row(rows)
    assert [(row.seq_id, row.job is None) for row in rows] == [(0, True), (1, False)]


def test_rows_are_put_in_sequence_order_and_a_lone_last_prompt_row_waits() -> None:
    """Batch order decides llama.cpp's runs: sorted by id, a decode of 2 written before the
    prompt of 1 no longer lands alone; a prompt whose last row would be alone is cut by one."""
    made = engine()
    prompt = job(1, LONG + 2, evaluated=LONG + 2)
    made._slots[1].job = prompt
    rows = [decode(made, 0, LONG), decode(made, 2, LONG)]
    rows += [_Row(5, LONG, 1, prompt, False, False), _Row(5, LONG + 1, 1, prompt, True, True)]
    made._no_lone_row(rows)
    assert [row.seq_id for row in rows] == [0, 1, 2]
    assert prompt.evaluated == prompt.position == LONG + 1  # its last token goes in the next step
    assert alone_past_split_kv(rows) == [] and made._spares == []


def test_with_one_sequence_nothing_can_be_borrowed() -> None:
    made = engine(parallel=1)
    rows = [decode(made, 0, LONG)]
    made._no_lone_row(rows)
    assert len(rows) == 1
