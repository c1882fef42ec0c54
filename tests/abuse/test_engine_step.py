"""One bad sequence fails alone: an error inside an engine step that belongs to one
sequence (a token id outside the vocabulary, one row's logprobs) fails that sequence
only; the others in the same batch go on to their end. Its client gets a generic message
with its request id; the log gets the detail. Real models: the starter SmolLM2 GGUF on
the llama.cpp engine, and its float32 conversion on the transformers engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from fastapi import FastAPI

from modelpool.errors import GenerationFailed, InvalidRequest
from modelpool.inference import CompletionRequest, GenerationChunk, SamplingParams
from modelpool.logs import current_request_id
from modelpool.pool_api.generation import Generation, collect
from tests.conftest import CHAT_MODEL, HF_MODEL

GOOD = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
TOO_MANY_LOGPROBS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1_000_000)
"""More top alternatives than the vocabulary has: that row's logprobs fail (the API caps it
at 20; the engine must not trust every caller to)."""


async def as_request(request_id: str, work: Callable[[], AsyncIterator[GenerationChunk]]) -> Generation:
    """`work`'s generation, made inside a request with this id (as the middleware sets it)."""
    current_request_id.set(request_id)  # this task's own context
    return await collect(work())


async def run_together(parts: dict[str, Callable[[], AsyncIterator[GenerationChunk]]]) -> dict[str, object]:
    tasks: dict[str, Awaitable[Generation]] = {rid: as_request(rid, work) for rid, work in parts.items()}
    results = await asyncio.gather(*tasks.values(), return_exceptions=True)
    return dict(zip(tasks, results, strict=True))


def backend_of(app: FastAPI, model: str):
    return app.state.pool.slot(model).replicas.members[0].backend


def assert_good(results: dict[str, object], names: list[str]) -> None:
    for name in names:
        result = results[name]
        assert isinstance(result, Generation), f"{name} failed with its bad neighbour: {result!r}"
        assert result.usage.completion_tokens == GOOD.max_tokens


def assert_failed_alone(result: object, request_id: str, caplog: pytest.LogCaptureFixture, detail: str) -> None:
    assert isinstance(result, GenerationFailed), result
    assert request_id in result.message and detail not in result.message  # generic, with the id
    logged = [r for r in caplog.records if getattr(r, "request_id", None) == request_id and r.exc_info]
    assert logged, "the failure's detail is not in the log under its request id"
    assert logged[0].exc_info is not None
    assert detail in repr(logged[0].exc_info[1])


async def test_llama_cpp_a_row_whose_logprobs_fail_fails_alone(app: FastAPI, caplog: pytest.LogCaptureFixture) -> None:
    backend = backend_of(app, CHAT_MODEL)
    engine = backend._engine
    steps = engine.decode_steps
    caplog.set_level(logging.ERROR, logger="modelpool.backends")
    results = await run_together(
        {
            "good-1": lambda: backend.complete(CompletionRequest("Once upon a time", GOOD)),
            "bad-logprobs": lambda: backend.complete(CompletionRequest("Once upon a time", TOO_MANY_LOGPROBS)),
            "good-2": lambda: backend.complete(CompletionRequest("The weather today", GOOD)),
        }
    )
    assert_good(results, ["good-1", "good-2"])
    assert_failed_alone(results["bad-logprobs"], "bad-logprobs", caplog, "out of bounds")
    assert engine.largest_batch >= 2 and engine.decode_steps > steps
    assert engine.in_flight == 0


async def test_llama_cpp_a_token_id_outside_the_vocabulary_fails_alone(app: FastAPI) -> None:
    backend = backend_of(app, CHAT_MODEL)
    # Past the backend's own check, straight to the engine: llama.cpp would refuse the whole batch.
    results = await run_together(
        {
            "good-1": lambda: backend.complete(CompletionRequest("Once upon a time", GOOD)),
            "bad-token": lambda: backend._generate([1, 2, 10_000_000], GOOD, "prompt"),
            "good-2": lambda: backend.complete(CompletionRequest("The weather today", GOOD)),
        }
    )
    assert_good(results, ["good-1", "good-2"])
    bad = results["bad-token"]
    assert isinstance(bad, InvalidRequest) and "10000000" in bad.message


async def test_transformers_a_row_whose_logprobs_fail_fails_alone(
    app: FastAPI, caplog: pytest.LogCaptureFixture
) -> None:
    slot = app.state.pool.slot(HF_MODEL)
    await slot.ensure_ready(None, explicit=True)
    try:
        backend = backend_of(app, HF_MODEL)
        caplog.set_level(logging.ERROR, logger="modelpool.backends")
        results = await run_together(
            {
                "good-1": lambda: backend.complete(CompletionRequest("Once upon a time", GOOD)),
                "bad-logprobs": lambda: backend.complete(CompletionRequest("Once upon a time", TOO_MANY_LOGPROBS)),
                "good-2": lambda: backend.complete(CompletionRequest("The weather today", GOOD)),
            }
        )
    finally:  # the session's app serves it on demand: leave it as the other tests expect it
        await app.state.pool.unload(HF_MODEL)
    assert_good(results, ["good-1", "good-2"])
    assert_failed_alone(results["bad-logprobs"], "bad-logprobs", caplog, "out of range")


def free_slots_out_of_step(engine: Any) -> list[tuple[int, int, int]]:
    """(seq id, last position its KV cells hold, tokens the engine believes they hold) of every
    free sequence where the two disagree: the batch-invariant spare row is placed after what
    a free sequence is believed to hold, and llama.cpp refuses a whole batch (-1) whose row
    does not follow the sequence's last cell."""
    llama, memory = engine._llama, engine._memory
    rows = [(slot.seq_id, llama.llama_memory_seq_pos_max(memory, slot.seq_id), len(slot.cached))
            for slot in engine._slots if slot.job is None]  # fmt: skip
    return [row for row in rows if row[1] != row[2] - 1]


async def test_llama_cpp_a_sequence_refused_at_its_start_leaves_its_cells_as_believed(app: FastAPI) -> None:
    """A request refused before it starts (a token id outside the vocabulary) in a sequence
    whose cells a finished request left (prompt reuse) must not leave those cells behind
    while the engine believes the sequence empty (found as a rare `llama_decode returned -1`
    in a later, unrelated stream)."""
    backend = backend_of(app, CHAT_MODEL)
    engine = backend._engine
    await collect(backend.complete(CompletionRequest("Once upon a time", GOOD)))
    cached = [list(slot.cached) for slot in engine._slots if slot.cached]
    assert cached, "prompt reuse keeps a finished request's cells (the starter's reuse_prompt_cache)"
    # The same prefix: the refused request is given the sequence that holds those cells.
    with pytest.raises(InvalidRequest, match="10000000"):
        await collect(backend._generate([*cached[0][:4], 10_000_000], GOOD, "prompt"))
    assert await asyncio.wrap_future(engine.call(lambda: free_slots_out_of_step(engine))) == []
