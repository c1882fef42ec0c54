"""The transformers engine's KV cache with spare columns (`SpareCache`): a decode step
writes in place, the spare is bounded, rows joining and leaving keep every row's K/V
where it belongs; and the batch's shared greedy argmax. The engine tests run a tiny Llama
with random weights in float64 (so a row's numbers do not depend on its neighbours and no
near-tie flips a token): a misplaced row's K/V changes its tokens."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from benchmarks.bench_transformers_engine import Sink
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from modelpool.backends.gpu_estimates import GgufShape
from modelpool.backends.transformers.engine import BatchLimits, ContinuousBatcher, cache_argument
from modelpool.backends.transformers.kv_budget import batch_kv_bytes
from modelpool.backends.transformers.kv_cache import MAX_SPARE, SpareCache, SpareLayer, spare_columns
from modelpool.backends.transformers.sampling import choose_token, make_generator
from modelpool.backends.transformers.sequence import Sequence
from modelpool.inference import SamplingParams

VOCABULARY = 97
ENGINE = "modelpool.backends.transformers.engine"


def layer_of(cache: SpareCache) -> SpareLayer:
    layer = cache.layers[0]
    assert isinstance(layer, SpareLayer)
    return layer


def held(cache: SpareCache) -> tuple[torch.Tensor, torch.Tensor]:
    """The first layer's keys and values."""
    kv = layer_of(cache).held()
    assert kv is not None
    return kv


def states(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, columns, 8, generator=generator), torch.randn(rows, 2, columns, 8, generator=generator)


def test_decode_steps_write_in_place_and_the_keys_equal_concatenation() -> None:
    layer, keys, values = SpareLayer(), *states(3, 40, 0)
    layer.update(keys, values)
    buffer, reallocations = layer._key_buffer, 0
    for step in range(200):
        k, v = states(3, 1, step + 1)
        got_keys, got_values = layer.update(k, v)
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        assert torch.equal(got_keys, keys) and torch.equal(got_values, values)
        if layer._key_buffer is not buffer:
            reallocations, buffer = reallocations + 1, layer._key_buffer
        used = keys.shape[2]
        assert used <= layer.capacity <= used + spare_columns(used)  # the spare is bounded
    assert layer.get_seq_length() == 240
    assert 1 <= reallocations <= 10  # 200 steps: the buffer grew by a quarter a few times, not 200 times


def test_the_spare_never_exceeds_a_quarter_of_the_used_length_or_max_spare() -> None:
    assert spare_columns(8) == 16 and spare_columns(400) == 100 and spare_columns(100_000) == MAX_SPARE
    layer = SpareLayer()
    layer.update(*states(1, 3000, 0))
    layer.update(*states(1, 1, 1))
    assert layer.capacity - layer.get_seq_length() <= MAX_SPARE
    assert layer.held_bytes() == 2 * 1 * 2 * layer.capacity * 8 * 4


def test_stack_rows_pads_each_part_on_the_left_with_zeros() -> None:
    batch, newcomers = SpareCache(), SpareCache()
    old, new = states(2, 5, 0), states(3, 9, 1)
    batch.update(*old, layer_idx=0)
    newcomers.update(*new, layer_idx=0)
    batch.stack_rows(newcomers, 9)
    expected = [torch.cat([F.pad(o, (0, 0, 4, 0)), n]) for o, n in zip(old, new, strict=True)]
    assert torch.equal(held(batch)[0], expected[0]) and torch.equal(held(batch)[1], expected[1])
    k, v = states(5, 1, 2)
    batch.update(k, v, layer_idx=0)  # the next decode step appends after the stacked columns
    assert torch.equal(held(batch)[0], torch.cat([expected[0], k], dim=2))


def test_keep_rows_selects_rows_in_order_and_drops_leading_columns() -> None:
    cache, (keys, values) = SpareCache(), states(4, 12, 0)
    cache.update(keys, values, layer_idx=0)
    index = torch.tensor([3, 1])
    cache.keep_rows(index, 5)
    assert torch.equal(held(cache)[0], keys[index][:, :, 5:])
    assert torch.equal(held(cache)[1], values[index][:, :, 5:])
    k, v = states(2, 1, 1)
    assert torch.equal(cache.update(k, v, layer_idx=0)[1], torch.cat([values[index][:, :, 5:], v], dim=2))


def test_transformers_own_batch_repeat_interleave_still_works() -> None:
    """A shared prompt prefix is run once and repeated with transformers' own method, which
    assigns the layer's tensors: the next update copies them into a fresh buffer."""
    cache, (keys, values) = SpareCache(), states(1, 6, 0)
    cache.update(keys, values, layer_idx=0)
    cache.batch_repeat_interleave(3)
    k, v = states(3, 2, 1)
    got, _ = cache.update(k, v, layer_idx=0)
    assert torch.equal(got, torch.cat([keys.repeat_interleave(3, dim=0), k], dim=2))
    assert layer_of(cache).capacity > 8


@pytest.fixture(scope="module")
def tiny() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCABULARY, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
    return LlamaForCausalLM(config).double().eval()


def test_the_model_gives_the_same_logits_on_spare_and_dynamic_caches(tiny: Any) -> None:
    ids, argument = torch.tensor([[5, 17, 3, 44, 60, 2, 9]]), cache_argument(tiny)
    tokens: dict[str, list[int]] = {}
    for name, cache in (("dynamic", DynamicCache()), ("spare", SpareCache())):
        with torch.inference_mode():
            logits = tiny(input_ids=ids, use_cache=True, **{argument: cache}).logits[:, -1]
            chosen = []
            for _ in range(30):
                chosen.append(int(logits.argmax()))
                step = torch.tensor([[chosen[-1]]])
                logits = tiny(input_ids=step, use_cache=True, **{argument: cache}).logits[:, -1]
        tokens[name] = chosen
    assert tokens["spare"] == tokens["dynamic"]
    assert len(set(tokens["spare"])) > 3  # the tokens depend on the context (random weights)


class _Spelling:
    """Token ids as text: the test reads ids, not text, and the tiny model has no tokenizer."""

    def add(self, token: int) -> str:
        return f"<{token}>"

    def flush(self) -> str:
        return ""


def sequence(prompt: list[int], max_new: int, **sampling: Any) -> Sequence:
    params = SamplingParams(**{"max_tokens": max_new, "temperature": 0, "ignore_eos": True, **sampling})
    generator = make_generator(7, torch.device("cpu"))
    return Sequence(prompt=prompt, params=params, max_new=max_new, out=Sink(), generator=generator,
                    detok=_Spelling(), tokenizer=None, eos_ids={0})  # fmt: skip


def generate(engine: ContinuousBatcher, seqs: list[Sequence]) -> list[list[int]]:
    for seq in seqs:
        engine.submit(seq)
    for seq in seqs:
        assert seq.output.done.wait(60)  # type: ignore[attr-defined]
    return [seq.tokens for seq in seqs]


PROMPTS = [[5, 17, 3, 44], [60, 2, 9, 11, 12, 13, 14, 80, 81], [33], [7, 7, 8, 9, 10, 1, 2]]
LENGTHS = [24, 9, 30, 17]


@pytest.fixture
def engine(tiny: Any) -> Any:
    batcher = ContinuousBatcher(tiny, None, {0}, BatchLimits(8, 4096, 256, 8), "kv-test")
    yield batcher
    batcher.close()


def test_rows_joining_and_leaving_mid_generation_get_their_own_tokens(engine: ContinuousBatcher) -> None:
    """Each prompt alone, then all of them arriving while others decode (joins pad the
    cache on the left) and leaving after different lengths (removals drop rows and
    leading columns): every sequence gets exactly its lone tokens."""
    alone = [generate(engine, [sequence(p, n)])[0] for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    first = sequence(PROMPTS[0], LENGTHS[0])
    engine.submit(first)
    late = [sequence(p, n) for p, n in zip(PROMPTS[1:], LENGTHS[1:], strict=True)]
    while len(first.tokens) < 3:  # the others join a batch that is already decoding
        assert not first.output.done.is_set()  # type: ignore[attr-defined]
        threading.Event().wait(0.001)
    together = generate(engine, late)
    assert first.output.done.wait(60)  # type: ignore[attr-defined]
    assert [first.tokens, *together] == alone
    assert engine.largest_batch >= 3
    assert len({tuple(t) for t in alone}) == len(alone)  # distinct: a row with another's K/V would show


def test_plain_greedy_rows_share_one_argmax_and_other_rows_choose_their_own(
    engine: ContinuousBatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of plain greedy rows and penalised ones: the same tokens as each alone, and
    `choose_token` runs only for the rows that need it."""
    mixed = [{}, {"repetition_penalty": 1.5}, {}, {"presence_penalty": 1.0}]
    alone = [generate(engine, [sequence(p, 12, **s)])[0] for p, s in zip(PROMPTS, mixed, strict=True)]
    calls: list[int] = []

    def counting(logits: torch.Tensor, *args: Any, **kwargs: Any) -> int:
        calls.append(1)
        return choose_token(logits, *args, **kwargs)

    monkeypatch.setattr(f"{ENGINE}.choose_token", counting)
    together = generate(engine, [sequence(p, 12, **s) for p, s in zip(PROMPTS, mixed, strict=True)])
    assert together == alone
    assert len(calls) == 2 * 12  # the two penalised rows, every token; the plain rows never


def test_a_row_that_may_not_end_never_gets_an_end_id_from_the_shared_argmax(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end id is a token the plain argmax picks; under ignore_eos the row must get the
    next best instead, exactly as the per-row path (`choose_token` with the id banned) gives."""
    free = ContinuousBatcher(tiny, None, {VOCABULARY - 1}, BatchLimits(8, 4096, 256, 8), "kv-free")
    try:
        picked = generate(free, [sequence(PROMPTS[0], 12)])[0]
    finally:
        free.close()
    end = picked[1]
    runs = []
    for shared in (True, False):
        if not shared:  # the reference: every row through `choose_token`
            monkeypatch.setattr(f"{ENGINE}._plain_greedy", lambda seq: False)
        batcher = ContinuousBatcher(tiny, None, {end}, BatchLimits(8, 4096, 256, 8), "kv-eos")
        try:
            runs.append(generate(batcher, [sequence(p, 12) for p in PROMPTS]))
        finally:
            batcher.close()
    assert runs[0] == runs[1]
    assert end not in runs[0][0] and runs[0][0][0] == picked[0]


def test_a_batch_that_outgrows_its_token_budget_steps_rows_out_and_each_gets_its_lone_tokens(tiny: Any) -> None:
    """Four rows that would grow to 4 × 31 places of cache under a budget of 64: before a
    step would pass it the latest joined rows step out and come back later, prefilling what
    they had. The cache never holds more than the budget, and every sequence (a seeded
    sampled one too) gets exactly the tokens it gets alone."""
    budget = 64
    batcher = ContinuousBatcher(tiny, None, {0}, BatchLimits(8, budget, 256, 8), "kv-budget")
    try:
        settings: list[dict[str, Any]] = [{}, {"temperature": 0.9}, {}, {"repetition_penalty": 1.3}]
        runs = zip(PROMPTS, LENGTHS, settings, strict=True)
        alone = [generate(batcher, [sequence(p, n, **s)])[0] for p, n, s in runs]
        assert batcher.preemptions == 0  # a lone row never steps out
        together = [sequence(p, n, **s) for p, n, s in zip(PROMPTS, LENGTHS, settings, strict=True)]
        assert generate(batcher, together) == alone
    finally:
        batcher.close()
    assert batcher.preemptions >= 2
    assert sum(seq.preemptions for seq in together) == batcher.preemptions
    assert batcher.largest_batch >= 2
    assert batcher.largest_cache <= budget
    unbounded = max(len(p) + n for p, n in zip(PROMPTS, LENGTHS, strict=True)) * len(PROMPTS)
    assert unbounded > budget


def test_a_prompt_waits_while_the_widest_row_would_pass_the_budget(tiny: Any) -> None:
    """Rows are counted at the batch's padded width: a short prompt beside a long-running
    row joins only while (rows × width) stays within the budget, and the results match
    each alone."""
    batcher = ContinuousBatcher(tiny, None, {0}, BatchLimits(8, 48, 256, 8), "kv-width")
    try:
        long, short = sequence([5, 17, 3, 44, 60, 2, 9, 11, 12, 13], 30), sequence([33], 5)
        alone = [generate(batcher, [sequence(s.prompt, s.max_new)])[0] for s in (long, short)]
        batcher.submit(long)
        while len(long.tokens) < 20:  # width 30 now: two rows would need 2 × 31 places
            assert not long.output.done.is_set()  # type: ignore[attr-defined]
            threading.Event().wait(0.001)
        assert generate(batcher, [short]) == [alone[1]]
        assert long.output.done.wait(60)  # type: ignore[attr-defined]
        assert long.tokens == alone[0]
    finally:
        batcher.close()
    assert batcher.largest_cache <= 48


def test_the_kv_bound_holds_what_the_batch_cache_allocates(tiny: Any) -> None:
    """`batch_kv_bytes` (what the pool counts for the batch's KV cache) against the bytes the
    cache's buffers take after every decode step of a batch that fills its budget: never
    more, and not far below (the bound is worth counting)."""
    limits = BatchLimits(8, 96, 256, 8)
    config = tiny.config
    head = config.hidden_size // config.num_attention_heads
    shape = GgufShape(config.num_hidden_layers, config.num_key_value_heads, head, head)
    bound = batch_kv_bytes(shape, 8, limits, longest_context=64)  # the tiny model is float64
    batcher = ContinuousBatcher(tiny, None, {0}, limits, "kv-bound")
    peak = 0
    decode = batcher._decode

    def measured_decode() -> None:
        nonlocal peak
        decode()
        cache = batcher._cache
        if cache is not None:
            layers = [layer for layer in cache.layers if isinstance(layer, SpareLayer)]
            buffers = [b for layer in layers for b in (layer._key_buffer, layer._value_buffer) if b is not None]
            peak = max(peak, sum(b.numel() * b.element_size() for b in buffers))

    batcher._decode = measured_decode  # type: ignore[method-assign]
    try:
        generate(batcher, [sequence(p, n) for p, n in zip(PROMPTS * 2, LENGTHS * 2, strict=True)])
    finally:
        batcher.close()
    assert batcher.largest_cache <= limits.max_batch_tokens and batcher.preemptions > 0
    assert bound / 4 < peak <= bound
