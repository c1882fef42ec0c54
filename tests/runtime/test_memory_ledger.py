"""The ledger shares a meter's growth among the windows open while it grew: what it
attributes adds up to no more than the growth, however the windows overlap."""

from __future__ import annotations

import asyncio
import sys

import pytest

from modelpool.backends.base import MemoryEstimate
from modelpool.runtime.memory_accounts import MemoryAccounts
from modelpool.runtime.memory_ledger import Ledger
from modelpool.status import GpuMemory
from tests.fakes import FakeProcessBackend, fake_slot, pool_of


class Meter:
    """A meter set by hand."""

    def __init__(self, value: int = 1000) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


def test_one_window_alone_gets_all_its_growth() -> None:
    meter = Meter()
    ledger = Ledger(meter)
    window = ledger.open(1)
    meter.value += 300
    assert ledger.close(window) == 300 and ledger.unattributed == 0


def test_overlapping_loads_share_the_growth_instead_of_each_counting_it_all() -> None:
    # The case: four loads at once each measured "after - before" = everybody's growth.
    meter = Meter()
    ledger = Ledger(meter)
    a = ledger.open(100)
    meter.value += 100  # only a is open: a's
    b = ledger.open(300)
    meter.value += 400  # a and b: shared 1:3
    assert ledger.close(a) == 100 + 100
    meter.value += 50  # b alone
    assert ledger.close(b) == 300 + 50
    assert meter.value - ledger.start == 550 == 200 + 350  # each byte counted once


def test_growth_with_no_window_open_is_unattributed() -> None:
    meter = Meter()
    ledger = Ledger(meter)
    meter.value += 70
    window = ledger.open(1)
    meter.value += 30
    assert ledger.close(window) == 30 and ledger.unattributed == 70


def test_an_absorbing_window_takes_every_change_while_open() -> None:
    # An unload frees memory while a load runs: the load is not charged negative growth.
    meter = Meter()
    ledger = Ledger(meter)
    load = ledger.open(500)
    meter.value += 200
    release = ledger.open(1, absorbs=True)
    meter.value -= 150
    ledger.close(release)
    meter.value += 100
    assert ledger.close(load) == 300


def test_a_window_that_saw_only_shrinking_measures_zero_and_closing_twice_gives_zero() -> None:
    meter = Meter()
    ledger = Ledger(meter)
    window = ledger.open(1)
    meter.value -= 10
    assert ledger.close(window) == 0
    assert ledger.close(window) == 0


@pytest.mark.parametrize("weights", [(1, 1, 1, 1), (100, 1, 1, 50), (7, 13, 29, 1)])
def test_the_sum_never_exceeds_the_growth_whatever_the_interleaving(weights: tuple[int, ...]) -> None:
    meter = Meter()
    ledger = Ledger(meter)
    windows = [ledger.open(w) for w in weights]
    measured = []
    for step, window in enumerate(windows):
        meter.value += 1000 * (step + 1) + 7
        measured.append(ledger.close(window))
    assert sum(measured) <= meter.value - ledger.start
    assert sum(measured) >= meter.value - ledger.start - len(weights)  # whole bytes, floored


async def test_runtimes_are_imported_once_each_and_counted_apart() -> None:
    meter = Meter()
    accounts = MemoryAccounts(rss=Ledger(meter), gpus=list)
    module = "modelpool_test_fake_runtime"
    sys.modules.pop(module, None)

    class Finder:
        """Imports the fake runtime, growing the meter by 500 as a first import would."""

        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> object:
            import importlib.machinery

            if name != module:
                return None

            class Loader(importlib.machinery.BuiltinImporter):
                @staticmethod
                def exec_module(mod: object) -> None:
                    meter.value += 500

                @staticmethod
                def create_module(spec: object) -> None:
                    return None

            return importlib.machinery.ModuleSpec(name, Loader())

    sys.meta_path.insert(0, Finder())  # type: ignore[arg-type]
    try:
        load = accounts.open_load(MemoryEstimate(100), in_process=True)
        await asyncio.gather(accounts.import_runtimes((module, "json")), accounts.import_runtimes((module,)))
        meter.value += 100
        measured = accounts.close_load(load)
    finally:
        sys.meta_path.pop(0)
        sys.modules.pop(module, None)
    assert list(accounts.runtimes) == [module]  # once, and json (imported before) is nobody's
    # While the import ran beside the load, its growth was shared by weight (256 MiB : 100 B).
    assert accounts.runtimes[module] + measured.ram_bytes <= 600
    assert accounts.runtimes[module] >= 499 and measured.ram_bytes >= 100
    assert accounts.overhead().ram_bytes == 1000 + accounts.runtimes[module]


def test_an_engine_process_gets_no_share_of_this_process() -> None:
    meter = Meter()
    accounts = MemoryAccounts(rss=Ledger(meter), gpus=list)
    windows = accounts.open_load(MemoryEstimate(100), in_process=False)
    meter.value += 50
    assert accounts.close_load(windows).ram_bytes == 0


def test_gpu_loads_share_the_gpus_growth_by_their_gpu_estimates() -> None:
    free = [80_000]

    def gpus() -> list[GpuMemory]:
        return [GpuMemory("cuda:0", 100_000, free[0])]

    accounts = MemoryAccounts(rss=Ledger(Meter()), gpus=gpus)
    assert accounts.overhead().gpu_bytes == 20_000  # in use at start, by anyone
    a = accounts.open_load(MemoryEstimate(10, gpu_bytes=3000), in_process=True)
    b = accounts.open_load(MemoryEstimate(10, gpu_bytes=1000), in_process=True)
    free[0] -= 4000
    assert (accounts.close_load(a).gpu_bytes, accounts.close_load(b).gpu_bytes) == (3000, 1000)


class GrowingEngine(FakeProcessBackend):
    """An engine process whose RSS grows as it serves (its KV cache filling)."""

    rss = 1000

    def resident_bytes(self) -> int:
        return self.rss


async def test_an_engine_process_is_counted_by_its_rss_now_not_at_load() -> None:
    backend = GrowingEngine()
    slot = fake_slot(backend)
    pool = pool_of(slot)
    await pool.load("fake")
    backend.rss = 5000
    assert slot.memory_bytes() == 5000
    memory = pool.memory()
    assert memory.models["fake"].locality == "engine_process" and memory.models["fake"].measured_bytes == 5000
    assert memory.process is not None and memory.process.engine_processes_bytes == 5000
    assert memory.process.models_bytes == 0  # not this process's memory
