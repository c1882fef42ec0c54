"""The LRU of adapter places both in-process engines use (backends/adapter_places.py), as a
client flooding a model with adapter names meets it: places never grow past `max_adapters`,
an adapter a running request uses is never unloaded for another, and an admin unload of
one in use is refused."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from modelpool.backends.adapter_places import AdapterPlaces
from modelpool.errors import Overloaded


@dataclass(frozen=True)
class Spec:
    name: str
    size: int = 10


class Recording(AdapterPlaces[Spec, Spec]):
    def __init__(self, max_adapters: int) -> None:
        super().__init__(max_adapters=max_adapters, model_id="m")
        self.freed: list[str] = []

    def _load(self, spec: Spec) -> Spec:
        return spec

    def _free(self, held: Spec) -> None:
        self.freed.append(held.name)

    def _spec_of(self, held: Spec) -> Spec:
        return held

    def _bytes_of(self, held: Spec) -> int:
        return held.size


def test_a_flood_of_names_never_holds_more_than_max_adapters() -> None:
    places = Recording(max_adapters=3)
    for i in range(50):
        places.acquire(Spec(f"a{i}"), lambda: ())
        assert len(places.held) <= 3
    assert [h.name for h in places.held] == ["a47", "a48", "a49"]
    assert places.loads == 50 and places.evictions == 47 and places.total_bytes() == 30


def test_an_adapter_in_use_is_never_evicted_and_a_full_house_is_overloaded() -> None:
    places = Recording(max_adapters=2)
    places.acquire(Spec("busy"), lambda: ())
    places.acquire(Spec("idle"), lambda: ())
    places.acquire(Spec("new"), lambda: {"busy"})  # evicts the idle one, not the older busy one
    assert [h.name for h in places.held] == ["busy", "new"] and places.freed == ["idle"]
    with pytest.raises(Overloaded, match="all 2 adapter places are in use"):
        places.acquire(Spec("one-more"), lambda: {"busy", "new"})
    assert [h.name for h in places.held] == ["busy", "new"]


def test_the_least_recently_used_goes_first_and_a_changed_spec_loads_anew() -> None:
    places = Recording(max_adapters=2)
    places.acquire(Spec("a"), lambda: ())
    places.acquire(Spec("b"), lambda: ())
    places.acquire(Spec("a"), lambda: ())  # a is used again: b is now the oldest
    places.acquire(Spec("c"), lambda: ())
    assert places.freed == ["b"]
    places.acquire(Spec("a", size=99), lambda: ())  # same name, another file: reloaded
    assert places.freed == ["b", "a"] and places.total_bytes() == 10 + 99


def test_an_admin_unload_of_an_adapter_in_use_is_refused() -> None:
    places = Recording(max_adapters=2)
    places.acquire(Spec("a"), lambda: ())
    with pytest.raises(Overloaded, match="in use"):
        places.unload("a", lambda: {"a"})
    assert places.unload("a", lambda: ()) is True and places.unload("a", lambda: ()) is False
    assert places.held == [] and places.total_bytes() == 0
