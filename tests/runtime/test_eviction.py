"""choose_victims as a table: (need, residents, budget) → victims (or None: cannot fit)."""

from __future__ import annotations

import pytest

from modelpool.runtime.eviction import Budget, Need, Resident, Swap, SwapDecision, choose_victims, decide_swap

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


LOADING_A = Resident("a", 100, last_used=1, busy=True, changing=True)
WAITING_FOR_ROOM_A = Resident("a", 600, last_used=1, busy=True, changing=True, granted=False)
BUSY_B = Resident("b", 200, last_used=2, busy=True)
BUSY_C = Resident("c", 300, last_used=0, busy=True)
TIGHT = Budget(memory_bytes=1000)


@pytest.mark.parametrize(
    ("need", "residents", "waited_s", "decision"),
    [
        (Need(500), [A, B, C], 0.0, SwapDecision(Swap.EVICT, ["a"])),  # idle room: as choose_victims
        (Need(950), [BUSY_A, B], 0.0, SwapDecision(Swap.WAIT)),  # a pending swap: busy a serves first
        (Need(950), [BUSY_A, B], 9.9, SwapDecision(Swap.WAIT)),
        (Need(950), [BUSY_A, B], 10.0, SwapDecision(Swap.EVICT, ["b", "a"])),  # past the bound: idle, then drain
        (Need(700), [BUSY_B, BUSY_C, A], 10.0, SwapDecision(Swap.EVICT, ["a", "c"])),  # busy ones LRU, as few as need
        (Need(750), [BUSY_B, A], 0.0, SwapDecision(Swap.EVICT, ["a"])),  # idle suffices: no wait at all
        (Need(950), [LOADING_A, B], 0.0, SwapDecision(Swap.WAIT)),  # a load in flight: wait for it
        (Need(950), [LOADING_A, B], 60.0, SwapDecision(Swap.WAIT)),  # never drained while it changes state
        (Need(950), [PINNED_A, BUSY_B], 60.0, SwapDecision(Swap.REFUSE)),  # pinned: no wait can help
        (Need(2000), [BUSY_A], 0.0, SwapDecision(Swap.REFUSE)),  # bigger than the budget
        (Need(1), [BUSY_A], 0.0, SwapDecision(Swap.WAIT)),  # max_models below
        # A load still waiting for its room holds nothing: it is no one's obstacle (two such
        # loads once waited for each other forever).
        (Need(600), [WAITING_FOR_ROOM_A], 0.0, SwapDecision(Swap.EVICT, [])),
        (Need(950), [WAITING_FOR_ROOM_A, B], 0.0, SwapDecision(Swap.EVICT, ["b"])),
        (Need(1), [WAITING_FOR_ROOM_A], 0.0, SwapDecision(Swap.EVICT, [])),  # max_models 1: it fits
    ],
)
def test_decide_swap(need: Need, residents: list[Resident], waited_s: float, decision: SwapDecision) -> None:
    budget = Budget(max_models=1) if need.memory_bytes == 1 else TIGHT
    assert decide_swap(need, residents, budget, waited_s, swap_after_s=10.0) == decision
