"""choose_victims as a table: (need, residents, budget) → victims (or None: cannot fit)."""

from __future__ import annotations

import pytest

from modelpool.runtime.eviction import Budget, Need, Resident, choose_victims

A = Resident("a", 100, last_used=1)
B = Resident("b", 200, last_used=2)
C = Resident("c", 300, last_used=3)
BUSY_A = Resident("a", 100, last_used=1, busy=True)
PINNED_A = Resident("a", 100, last_used=1, pinned=True)
GPU_A = Resident("a", 10, last_used=1, gpu_bytes=800)


@pytest.mark.parametrize(
    ("need", "residents", "budget", "victims"),
    [
        (Need(100), [], Budget(), []),  # no limits
        (Need(100), [A, B], Budget(memory_bytes=1000), []),  # fits already
        (Need(800), [A, B, C], Budget(memory_bytes=1000), ["a", "b", "c"]),  # LRU order until it fits
        (Need(500), [C, B, A], Budget(memory_bytes=1000), ["a"]),  # order of the list does not matter
        (Need(600), [A, B, C], Budget(memory_bytes=1000), ["a", "b"]),
        (Need(700), [BUSY_A, B, C], Budget(memory_bytes=1000), ["b", "c"]),  # busy is skipped
        (Need(950), [BUSY_A, B, C], Budget(memory_bytes=1000), None),  # busy model blocks: impossible
        (Need(950), [PINNED_A, B], Budget(memory_bytes=1000), None),  # pinned model blocks
        (Need(2000), [], Budget(memory_bytes=1000), None),  # bigger than the whole budget
        (Need(1), [A, B], Budget(max_models=2), ["a"]),  # count limit
        (Need(1), [A, B, C], Budget(max_models=2), ["a", "b"]),
        (Need(1, new_model=False), [A, B], Budget(max_models=2), []),  # a new replica adds no model
        (Need(1), [BUSY_A], Budget(max_models=1), None),
        (Need(10, gpu_bytes=300), [GPU_A, B], Budget(gpu_bytes=1000), ["a"]),  # GPU budget
        (Need(10, gpu_bytes=100), [GPU_A, B], Budget(gpu_bytes=1000), []),
    ],
)
def test_choose_victims(need: Need, residents: list[Resident], budget: Budget, victims: list[str] | None) -> None:
    assert choose_victims(need, residents, budget) == victims
