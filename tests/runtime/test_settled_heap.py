"""The cyclic garbage collector leaves long-lived objects alone (`settle_heap`): what a
load built is frozen, and an unload thaws the heap first so the model's own reference
cycles are still freed."""

from __future__ import annotations

import gc
import weakref

import pytest

from modelpool.runtime.memory import release_freed_memory, settle_heap
from tests.fakes import FakeBackend, fake_slot, pool_of


class _Garbage:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


class CyclicBackend(FakeBackend):
    """A backend whose loaded state holds a reference cycle, as real model objects do."""

    async def start(self) -> None:
        await super().start()
        self.state: _Garbage | None = _Garbage()

    async def stop(self) -> None:
        await super().stop()
        self.state = None  # the cycle is now garbage that only gc.collect() finds


@pytest.fixture(autouse=True)
def thawed() -> object:
    """Each test starts and ends with nothing frozen (it shares its process with others)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_settling_freezes_what_is_alive() -> None:
    kept = [_Garbage() for _ in range(10)]
    settle_heap()
    assert gc.get_freeze_count() >= len(kept)


def test_a_frozen_cycle_survives_a_collection_until_memory_is_released() -> None:
    cycle = _Garbage()
    alive = weakref.ref(cycle)
    settle_heap()
    del cycle
    gc.collect()
    assert alive() is not None  # frozen: the collector no longer looks at it
    release_freed_memory()
    assert alive() is None
    assert gc.get_freeze_count() > 0  # and what is still alive is frozen again


async def test_a_load_freezes_the_model_and_its_unload_frees_its_cycles() -> None:
    backend = CyclicBackend()
    pool = pool_of(fake_slot(backend, "cyclic"))
    frozen_before = gc.get_freeze_count()
    await pool.load("cyclic")
    assert backend.state is not None
    held = weakref.ref(backend.state)
    assert gc.get_freeze_count() > frozen_before
    await pool.unload("cyclic")
    assert held() is None
