"""The CTranslate2 batch engine's scheduling, on a fake generator that behaves as CT2's
`generate_batch` does: rows step together, the callback's True stops a row."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from modelpool.backends.ctranslate2.engine import BatchEngine, BatchPolicy, gather_wait
from modelpool.backends.ctranslate2.rows import Row
from modelpool.backends.textgen.channel import Channel, chunk_stream
from modelpool.backends.textgen.detokenize import IncrementalDetokenizer
from modelpool.errors import GenerationFailed, InvalidRequest, ModelUnloaded
from modelpool.inference import BeamSearch, GenerationChunk, SamplingParams
from tests.backends.test_ctranslate2_rows import END, PIECES, Pieces
from tests.polling import until

VOCABULARY = [f"tok{i}" for i in range(len(PIECES))]


@dataclass
class Step:
    batch_id: int
    token_id: int
    log_prob: float | None = None
    logits: Any = None


@dataclass
class FakeGenerator:
    tokens: Callable[[int], int] = lambda step: 2 + step % 6
    """The token every row makes at a step (never the end token)."""
    gate: threading.Event = field(default_factory=threading.Event)
    """Batches start only once this is set."""
    batches: list[tuple[list[list[str]], dict[str, Any]]] = field(default_factory=list)
    stopped: list[tuple[int, int]] = field(default_factory=list)
    """(batch number, row) of rows the callback stopped before max_length."""
    fail: bool = False
    callbacks: list[Callable[[Step], bool]] = field(default_factory=list)
    """Every callback it was given, kept (CT2 drops them later, on its own threads)."""

    def generate_batch(self, prompts: list[list[str]], *, callback: Callable[[Step], bool], **options: Any) -> None:
        self.batches.append((prompts, options))
        self.callbacks.append(callback)
        number = len(self.batches)
        assert self.gate.wait(10), "the test never opened the gate"
        if self.fail:
            raise RuntimeError("CUDA out of memory")
        running = set(range(len(prompts)))
        for step in range(options["max_length"]):
            for row in sorted(running):
                if callback(Step(row, self.tokens(step))):
                    running.discard(row)
                    if step + 1 < options["max_length"]:
                        self.stopped.append((number, row))
            if not running:
                return


def policy(workers: int = 1, *, max_size: int = 8, spread: int = 4, gather_s: float = 0.0) -> BatchPolicy:
    return BatchPolicy(workers, max_size, spread, gather_s)


def submit(
    engine: BatchEngine, prompt_length: int = 3, max_new: int = 4, *, prompt: list[int] | None = None, **sampling: Any
) -> Channel[GenerationChunk]:
    channel: Channel[GenerationChunk] = Channel(asyncio.get_running_loop())
    tokenizer = Pieces()
    params = SamplingParams(**{"temperature": 0, **sampling})
    detok = IncrementalDetokenizer(tokenizer, [1] * prompt_length)  # a bad `prompt` would fail here, not in the engine
    prompt = prompt or [1] * prompt_length
    engine.submit(Row(prompt, params, max_new, channel, detok, tokenizer, frozenset({END})))
    return channel


async def finish_reasons(channel: Channel[GenerationChunk]) -> list[str | None]:
    return [c.finish_reason async for c in chunk_stream(channel) if c.finish_reason]


async def test_a_burst_of_requests_gathered_in_time_runs_as_one_batch() -> None:
    generator = FakeGenerator()
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy(gather_s=0.05))
    channels = [submit(engine, max_new=n) for n in (2, 5, 3)]
    generator.gate.set()
    assert [await finish_reasons(c) for c in channels] == [["length"]] * 3
    [(prompts, options)] = generator.batches
    assert prompts == [["tok1"] * 3] * 3
    # CT2 runs to the longest row's end; the others stop themselves at their own max_tokens.
    assert options["max_length"] == 5 and options["sampling_topk"] == 1 and options["min_length"] == 0
    assert options["end_token"] == [END] and options["include_prompt_in_result"] is False
    assert generator.stopped == [(1, 0), (1, 2)]
    engine.close()


async def test_ignore_eos_holds_the_end_token_back_until_the_longest_row_is_done() -> None:
    generator = FakeGenerator()
    generator.gate.set()
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy(gather_s=0.05))
    channels = [submit(engine, max_new=n, ignore_eos=True, temperature=0.7, top_p=0.9) for n in (3, 6)]
    for channel in channels:
        await finish_reasons(channel)
    [(_, options)] = generator.batches
    assert options["min_length"] == 6 and options["max_length"] == 6
    assert (options["sampling_temperature"], options["sampling_topp"], options["sampling_topk"]) == (0.7, 0.9, 0)
    engine.close()


async def test_requests_that_cannot_share_settings_run_in_separate_batches() -> None:
    generator = FakeGenerator()
    generator.gate.set()
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy(workers=2, gather_s=0.05))
    greedy = submit(engine)
    sampled = submit(engine, temperature=0.8)
    far = submit(engine, prompt_length=30)
    for channel in (greedy, sampled, far):
        assert await finish_reasons(channel) == ["length"]
    assert sorted(len(prompts) for prompts, _ in generator.batches) == [1, 1, 1]
    engine.close()


async def test_a_request_arriving_while_the_workers_are_busy_joins_the_next_batch() -> None:
    generator = FakeGenerator()
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy(workers=1))
    first = submit(engine)
    await until(lambda: len(generator.batches) == 1, "the first batch to start")
    later = [submit(engine) for _ in range(3)]
    generator.gate.set()
    for channel in [first, *later]:
        assert await finish_reasons(channel) == ["length"]
    assert [len(prompts) for prompts, _ in generator.batches] == [1, 3]
    assert engine.largest_batch == 3 and engine.batches_run == 2
    engine.close()


async def test_a_consumer_that_leaves_stops_its_row_and_frees_the_batch() -> None:
    generator = FakeGenerator()
    generator.gate.set()
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy())
    channel = submit(engine, max_new=100_000)
    stream = chunk_stream(channel)
    async for chunk in stream:
        if chunk.text:
            break
    await stream.aclose()
    await until(lambda: engine.in_flight == 0, "the cancelled row to leave", timeout_s=5)
    await until(lambda: generator.stopped == [(1, 0)], "CT2 to be told to stop the row", timeout_s=5)
    engine.close()


async def test_a_failed_batch_fails_each_of_its_requests_and_the_worker_goes_on() -> None:
    generator = FakeGenerator(fail=True)
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy(gather_s=0.05))
    doomed = [submit(engine) for _ in range(2)]
    generator.gate.set()
    for channel in doomed:
        with pytest.raises(GenerationFailed, match=r"generation failed \(request id") as failed:
            await finish_reasons(channel)
        assert "CUDA" not in failed.value.message  # the detail goes to the log, not to the client
    generator.fail = False
    assert await finish_reasons(submit(engine)) == ["length"]
    engine.close()


async def test_a_row_with_a_token_id_outside_the_vocabulary_fails_alone() -> None:
    generator = FakeGenerator()
    generator.gate.set()
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy(gather_s=0.05))
    good = [submit(engine) for _ in range(2)]
    bad = submit(engine, prompt=[1, len(VOCABULARY)])
    with pytest.raises(InvalidRequest, match=f"token id {len(VOCABULARY)} is outside the vocabulary"):
        await finish_reasons(bad)
    assert [await finish_reasons(channel) for channel in good] == [["length"]] * 2
    [(prompts, _)] = generator.batches  # the others ran, in one batch without it
    assert len(prompts) == 2
    engine.close()


async def test_closing_fails_the_requests_still_waiting() -> None:
    generator = FakeGenerator()
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy(workers=1))
    running = submit(engine, max_new=100_000)
    await until(lambda: len(generator.batches) == 1, "the first batch to start")
    waiting = submit(engine)
    generator.gate.set()
    await asyncio.to_thread(engine.close)
    for channel in (running, waiting):
        with pytest.raises(ModelUnloaded):
            await finish_reasons(channel)
    with pytest.raises(ModelUnloaded):
        await finish_reasons(submit(engine))


async def test_a_callback_ct2_still_holds_does_not_keep_the_generator_alive() -> None:
    """CT2 drops a batch's callback on its own worker thread; if that released the generator,
    its destructor would join the very thread it runs on and abort the process."""
    generator = FakeGenerator()
    generator.gate.set()
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy())
    assert await finish_reasons(submit(engine)) == ["length"]
    kept = generator.callbacks[-1]
    engine.close()
    gone = weakref.ref(generator)
    del generator, engine
    gc.collect()
    assert gone() is None and callable(kept)


def test_a_free_worker_gathers_while_requests_keep_coming_up_to_a_cap() -> None:
    every_5_ms = policy(gather_s=0.005)
    assert gather_wait(oldest=1.000, newest=1.000, now=1.000, policy=every_5_ms) == pytest.approx(0.005)
    # Another request came 4 ms later: wait 5 ms from it.
    assert gather_wait(oldest=1.000, newest=1.004, now=1.004, policy=every_5_ms) == pytest.approx(0.005)
    assert gather_wait(oldest=1.000, newest=1.004, now=1.010, policy=every_5_ms) < 0  # quiet for 6 ms: go
    # A steady stream never holds the oldest request longer than ten gaps.
    assert gather_wait(oldest=1.000, newest=1.049, now=1.049, policy=every_5_ms) == pytest.approx(0.001)
    assert gather_wait(oldest=1.000, newest=1.0, now=1.0, policy=policy(gather_s=0.0)) == 0


@dataclass
class Hypothesis:
    sequences_ids: list[list[int]]


@dataclass
class BeamGenerator:
    """CT2's `generate_batch` as it does beam search: no callback, each row's best
    hypothesis returned whole at the end (its end token included: `return_end_token`)."""

    answers: list[list[int]]
    batches: list[dict[str, Any]] = field(default_factory=list)

    def generate_batch(self, prompts: list[list[str]], **options: Any) -> list[Hypothesis]:
        self.batches.append(options)
        assert options.get("callback") is None  # CT2 calls none when beam_size > 1
        return [Hypothesis([answer]) for answer in self.answers[: len(prompts)]]


async def text_and_end(channel: Channel[GenerationChunk]) -> tuple[str, str | None, int]:
    chunks = [c async for c in chunk_stream(channel)]
    usage = chunks[-1].usage
    return "".join(c.text for c in chunks), chunks[-1].finish_reason, usage.completion_tokens if usage else -1


async def test_a_beam_batch_runs_ct2s_search_and_replays_each_answer_through_its_row() -> None:
    # "Hello world!<end>" and "Hello world! How are you?" (cut by a stop string, then by max_tokens)
    generator = BeamGenerator([[1, 2, 3, 4, END], [1, 2, 3, 4, 5, 6, 7, 8]])
    engine = BatchEngine(generator, VOCABULARY, frozenset({END}), policy(gather_s=0.05))
    beam = BeamSearch(4, 0.5)
    ended = submit(engine, max_new=8, beam=beam)
    stopped = submit(engine, max_new=8, beam=beam, stop=(" are",))
    assert await text_and_end(ended) == ("Hello world!", "stop", 4)
    assert await text_and_end(stopped) == ("Hello world! How", "stop", 6)
    [options] = generator.batches
    assert (options["beam_size"], options["length_penalty"], options["max_length"]) == (4, 0.5, 8)
    assert options["num_hypotheses"] == 1 and options["return_end_token"] is True
    capped = submit(engine, max_new=3, beam=beam)  # another max_tokens: a batch of its own
    assert await text_and_end(capped) == ("Hello world", "length", 3)
    assert len(generator.batches) == 2 and generator.batches[1]["max_length"] == 3
    engine.close()
