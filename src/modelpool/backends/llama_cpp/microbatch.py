"""How llama.cpp cuts a batch into micro-batches when each sequence has a KV stream of its
own, and which row of a step would end up alone in one (the batch-invariance rule of the
in-process engine, engine.py).

llama.cpp (0.3.36's vendored `llama_batch_allocr::split_equal(n_ubatch, sequential=true)`,
used by `llama_kv_cache::init_batch` whenever there is more than one stream) builds each
micro-batch from the first unused row in batch order: its sequence, then the sequence with
the next id, and the next, as long as each still has unused rows — a missing id ends the
run. It then takes as many rows of each sequence of the run, round by round, until one of
them has none left or another round would pass `n_ubatch` rows. So sequences 0, 2 and 3
decoding together (1 finished) are cut into {0} and {2, 3}: sequence 0's row is alone.

A micro-batch of one row of one sequence whose stream spans 512 cells takes ggml-cpu's
split-KV flash attention (`neq1 == 1 && neq3 == 1 && nek1 >= 512`), which sums in another
order than the kernel every other row takes: that row's logits would differ from alone.
The engine writes its rows sorted by sequence id, so batch order is id order, and the model
below works on (sequence id, rows) groups in that order.
"""

from __future__ import annotations

from collections.abc import Sequence

SPLIT_KV_FROM = 224
"""A lone row from this position on may span 512 KV cells (its stream holds positions
0..pos, padded to 256 cells); a margin below 256 in case cells are not perfectly packed."""


def micro_batches(groups: Sequence[tuple[int, int]], n_ubatch: int) -> list[list[tuple[int, int]]]:
    """llama.cpp's micro-batches of a batch whose rows are sorted by sequence id, given as
    (sequence id, rows) in that order: each micro-batch as (sequence id, rows in it)."""
    order = [seq_id for seq_id, _ in groups]
    left = {seq_id: count for seq_id, count in groups}
    made: list[list[tuple[int, int]]] = []
    while True:
        start = next((i for i, seq_id in enumerate(order) if left[seq_id] > 0), None)
        if start is None:
            return made
        run = [order[start]]
        for seq_id in order[start + 1 :]:
            if seq_id != run[-1] + 1 or left[seq_id] == 0 or len(run) > n_ubatch:
                break
            run.append(seq_id)
        # Rounds of one row each while every sequence has one, until another would not fit.
        each = min(min(left[seq_id] for seq_id in run), max(1, n_ubatch // len(run)))
        for seq_id in run:
            left[seq_id] -= each
        made.append([(seq_id, each) for seq_id in run])


def lone_sequences(groups: Sequence[tuple[int, int]], n_ubatch: int) -> list[int]:
    """The sequences whose last row would be alone in a micro-batch (a micro-batch of one
    row of one sequence is always that sequence's last row: a sequence alone takes up to
    `n_ubatch` of its rows at once)."""
    return [batch[0][0] for batch in micro_batches(groups, n_ubatch) if batch == [(batch[0][0], 1)]]
