"""llm-pool's timing names, derived from `RequestTiming` as docs/compatibility.md defines
them: the arithmetic, and `null` where a measurement is missing (as llm-pool reports it)."""

from __future__ import annotations

import pytest

from modelpool.pool_api.timing import RequestTiming


def test_each_name_is_the_documented_measurement() -> None:
    timing = RequestTiming(load_wait_s=0.5, queue_wait_s=0.25, backend_s=2.0, time_to_first_token_s=0.5,
                           prompt_tokens=47, output_tokens=23, tokenize_s=0.125)  # fmt: skip
    names = timing.as_json()
    assert names["engine_queue_wait_ms"] == names["queue_wait_ms"] == 250.0
    assert names["engine_tokenize_ms"] == 125.0
    assert names["gpu_time_to_first_token_ms"] == 375.0  # the first token's wait, less tokenizing
    assert names["gpu_generate_total_ms"] == 1875.0  # the turn, less tokenizing
    assert names["gpu_decode_after_first_token_ms"] == 1500.0
    assert names["backend_inference_wall_ms"] == names["backend_ms"] == 2000.0
    assert names["engine_total_wall_ms"] == 2750.0 and names["engine_outside_backend_wall_ms"] == 750.0
    assert (names["engine_prompt_tokens"], names["engine_output_tokens"]) == (47, 23)
    assert names["engine_tokens_per_second"] == names["tokens_per_second"] == pytest.approx(11.5)


def test_what_is_not_measured_is_null() -> None:
    names = RequestTiming(queue_wait_s=0.01, backend_s=0.2, prompt_tokens=5).as_json()
    assert names["engine_tokenize_ms"] is None  # an engine process or an upstream: tokenized out of sight
    assert names["gpu_time_to_first_token_ms"] is None and names["gpu_decode_after_first_token_ms"] is None
    assert names["engine_tokens_per_second"] is None  # no output token
    assert names["gpu_generate_total_ms"] == names["backend_inference_wall_ms"] == 200.0


def test_a_multi_prompt_request_sums_its_tokenizing() -> None:
    first, second = RequestTiming(tokenize_s=0.1), RequestTiming(tokenize_s=0.2)
    first.absorb(second)
    assert first.tokenize_s == pytest.approx(0.3)
    untimed = RequestTiming()
    untimed.absorb(RequestTiming())
    assert untimed.tokenize_s is None


def test_draft_counts_appear_only_with_a_draft_and_sum_over_prompts() -> None:
    assert "draft_tokens" not in RequestTiming(backend_s=0.1).as_json()
    first = RequestTiming()
    first.count_drafts(10, 7)
    second = RequestTiming()
    second.count_drafts(6, 1)
    first.absorb(second)
    names = first.as_json()
    assert (names["draft_tokens"], names["draft_accepted_tokens"]) == (16, 8)
    assert names["draft_acceptance_rate"] == 0.5
    none_guessed = RequestTiming()
    none_guessed.count_drafts(0, 0)
    assert none_guessed.as_json()["draft_acceptance_rate"] is None  # a draft that never guessed: no rate
