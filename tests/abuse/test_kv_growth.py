"""A client growing the transformers engine's KV cache: many rows that each ask for long
replies. The batch's cache is left-padded (rows × the longest row) and grows one column a
step; unbounded, 32 such rows of 8,192 tokens would hold 12 GB of float32 KV on SmolLM2-135M.
Replayed on a tiny float64 Llama with a budget of 96 token places: the cache never passes
it, every row still finishes, and each gets exactly the tokens it gets alone."""

from __future__ import annotations

from typing import Any

from modelpool.backends.transformers.engine import BatchLimits, ContinuousBatcher
from tests.backends.test_transformers_kv_cache import generate, sequence, tiny

__all__ = ["tiny"]  # the module-scoped model fixture, used here by name

BUDGET = 96
FLOOD = [[5 + row, 17, 3, 44 + row] for row in range(8)]
"""Eight short prompts, each asking for 40 tokens: 8 × 44 places unbounded."""


def test_long_replies_for_many_rows_keep_the_cache_within_its_budget(tiny: Any) -> None:
    batcher = ContinuousBatcher(tiny, None, {0}, BatchLimits(8, BUDGET, 256, 8), "kv-flood")
    try:
        alone = [generate(batcher, [sequence(prompt, 40)])[0] for prompt in FLOOD[:2]]
        flood = [sequence(prompt, 40) for prompt in FLOOD]
        replies = generate(batcher, flood)
    finally:
        batcher.close()
    assert len(FLOOD) * (4 + 40) > 3 * BUDGET  # what the attack would hold without the bound
    assert batcher.largest_cache <= BUDGET
    assert all(len(reply) == 40 for reply in replies)  # no row was cut short or lost
    assert replies[:2] == alone
    assert batcher.preemptions > 0
