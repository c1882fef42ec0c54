"""Which waiting requests share a CTranslate2 batch (pure: no engine)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from modelpool.backends.ctranslate2.batching import BatchKey, batch_key, take_batch
from modelpool.inference import BeamSearch, SamplingParams

GREEDY = batch_key(SamplingParams(temperature=0))
SAMPLED = batch_key(SamplingParams(temperature=0.8, top_p=0.9))


@dataclass
class Req:
    name: str
    key: BatchKey
    prompt_length: int
    live: bool = True


def names(requests: list[Req]) -> list[str]:
    return [r.name for r in requests]


def test_greedy_requests_share_a_key_whatever_their_unused_sampling_fields() -> None:
    assert batch_key(SamplingParams(temperature=0, top_p=0.5, top_k=7)) == GREEDY
    assert batch_key(SamplingParams(temperature=0.5, top_k=1)) == GREEDY  # top-1 sampling is greedy
    assert batch_key(SamplingParams(temperature=0.8, top_p=0.9)) == SAMPLED
    assert batch_key(SamplingParams(temperature=0.7, top_p=0.9)) != SAMPLED


def test_settings_that_ct2_applies_per_batch_split_keys() -> None:
    others = [
        SamplingParams(temperature=0, repetition_penalty=1.2),
        SamplingParams(temperature=0, min_tokens=5),
        SamplingParams(temperature=0, ignore_eos=True),
        SamplingParams(temperature=0, logprobs=0),
        SamplingParams(temperature=0, logprobs=3),
    ]
    keys = {batch_key(params) for params in others}
    assert len(keys) == len(others) and GREEDY not in keys
    # Per-row settings never split a batch: each row applies them itself.
    assert batch_key(SamplingParams(temperature=0, max_tokens=3, stop=("x",))) == GREEDY
    assert batch_key(SamplingParams(temperature=0, logprobs=2)) == batch_key(SamplingParams(temperature=0, logprobs=5))


def test_beam_rows_share_a_batch_only_with_the_same_search_and_cap() -> None:
    beam = SamplingParams(temperature=0, beam=BeamSearch(4))
    assert batch_key(beam, 16) == batch_key(beam, 16) != GREEDY
    others = [batch_key(beam, 8), batch_key(replace(beam, beam=BeamSearch(2)), 16),
              batch_key(replace(beam, beam=BeamSearch(4, 0.5)), 16)]  # fmt: skip
    assert batch_key(beam, 16) not in others and len(set(others)) == 3
    assert batch_key(SamplingParams(temperature=0), 8) == GREEDY  # a streamed row's cap never splits a batch


def test_the_oldest_request_leads_and_only_its_kind_joins_in_arrival_order() -> None:
    waiting = [Req("a", GREEDY, 40), Req("s", SAMPLED, 40), Req("b", GREEDY, 41), Req("c", GREEDY, 40)]
    batch = take_batch(waiting, max_size=8, spread=4, alive=lambda r: r.live)
    assert names(batch) == ["a", "b", "c"]
    assert names(waiting) == ["s"]


def test_prompt_lengths_stay_within_the_spread() -> None:
    waiting = [Req("a", GREEDY, 40), Req("far", GREEDY, 49), Req("b", GREEDY, 36), Req("c", GREEDY, 44)]
    batch = take_batch(waiting, max_size=8, spread=4, alive=lambda r: r.live)
    assert names(batch) == ["a", "b"]  # c would make it 36..44: wider than 4
    assert names(waiting) == ["far", "c"]
    exact = [Req("a", GREEDY, 40), Req("b", GREEDY, 41), Req("c", GREEDY, 40)]
    assert names(take_batch(exact, max_size=8, spread=0, alive=lambda r: r.live)) == ["a", "c"]


def test_a_batch_stops_at_its_size_and_gone_requests_are_dropped() -> None:
    waiting = [Req("gone", GREEDY, 40, live=False)] + [Req(str(i), GREEDY, 40) for i in range(5)]
    batch = take_batch(waiting, max_size=3, spread=0, alive=lambda r: r.live)
    assert names(batch) == ["0", "1", "2"]
    assert names(waiting) == ["3", "4"]
    assert take_batch([Req("gone", GREEDY, 1, live=False)], max_size=3, spread=0, alive=lambda r: r.live) == []
