"""Prometheus metrics of one pool. Each pool owns its registry: no process-wide globals,
so several apps (tests) never share counters."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import RequestUsage

Series = TypeVar("Series", Counter, Histogram)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Counter | Histogram] = {}
        self._add_request_series()
        self._add_token_series()
        self._add_latency_series()
        self._add_audio_series()
        self._add_key_series()
        self._add_cache_series()

    def _add_request_series(self) -> None:
        """HTTP requests, and each model's state."""
        self.requests = Counter(
            "modelpool_requests",
            "HTTP requests by model, route and status.",
            ["model", "route", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "modelpool_request_duration_seconds",
            "Time from request received to response finished.",
            ["model", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.model_state = Gauge(
            "modelpool_model_state",
            "1 for the state each model is in, 0 for the others.",
            ["model", "state"],
            registry=self.registry,
        )
        self.queued = Gauge(
            "modelpool_queued_requests",
            "Requests waiting for a turn, by model and priority class (read from the queue at scrape time).",
            ["model", "priority"],
            registry=self.registry,
        )

    def _add_token_series(self) -> None:
        self.input_tokens = Counter(
            "modelpool_input_tokens", "Prompt/input tokens processed.", ["model"], registry=self.registry
        )
        self.output_tokens = Counter("modelpool_output_tokens", "Tokens generated.", ["model"], registry=self.registry)
        self.draft_tokens = Counter(
            "modelpool_draft_tokens", "Speculative decoding: draft guesses checked.", ["model"], registry=self.registry
        )
        self.draft_accepted_tokens = Counter(
            "modelpool_draft_accepted_tokens",
            "Speculative decoding: draft guesses the model agreed with.",
            ["model"],
            registry=self.registry,
        )

    def _add_latency_series(self) -> None:
        """Where a request's time goes (queue, first token, backend), and model loads."""
        self.queue_seconds = Histogram(
            "modelpool_queue_wait_seconds",
            "Time a request waited for its turn on a loaded model.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_token_seconds = Histogram(
            "modelpool_time_to_first_token_seconds",
            "Time from a request's turn to its first generated text.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.backend_seconds = Histogram(
            "modelpool_backend_seconds",
            "Time a request spent in its backend.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.load_seconds = Histogram(
            "modelpool_model_load_seconds",
            "Time to load a model.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def _add_audio_series(self) -> None:
        self.audio_seconds = Counter(
            "modelpool_audio_seconds",
            "Seconds of audio transcribed (in) or synthesised (out).",
            ["model", "direction"],
            registry=self.registry,
        )
        self.real_time_factor = Histogram(
            "modelpool_real_time_factor",
            "Processing time divided by audio duration (lower is faster).",
            ["model", "task"],
            buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
            registry=self.registry,
        )

    def _add_key_series(self) -> None:
        # Per caller (API key name, or `anonymous`): a label set as small as the key list.
        self.key_requests = Counter(
            "modelpool_key_requests", "Requests served per API key.", ["key"], registry=self.registry
        )
        self.key_input_tokens = Counter(
            "modelpool_key_input_tokens", "Prompt/input tokens per API key.", ["key"], registry=self.registry
        )
        self.key_output_tokens = Counter(
            "modelpool_key_output_tokens", "Generated tokens per API key.", ["key"], registry=self.registry
        )
        self.key_audio_seconds = Counter(
            "modelpool_key_audio_seconds",
            "Seconds of audio transcribed (in) or synthesised (out) per API key.",
            ["key", "direction"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "modelpool_rate_limited",
            "Requests refused by a rate limit, per API key and limit (requests or tokens).",
            ["key", "limit"],
            registry=self.registry,
        )

    def _add_cache_series(self) -> None:
        self.embedding_cache_hits = Counter(
            "modelpool_embedding_cache_hits",
            "Embedding inputs answered from the model's cache (one per input text looked up).",
            ["model"],
            registry=self.registry,
        )
        self.embedding_cache_misses = Counter(
            "modelpool_embedding_cache_misses",
            "Embedding inputs not in the model's cache, so computed by the engine.",
            ["model"],
            registry=self.registry,
        )

    def _one(self, series: Series, *values: str) -> Series:
        """`series.labels(*values)`, looked up once: prometheus_client checks and locks on every
        call (~4 µs), and a request updates a dozen series. Counters and histograms only: they
        are never removed, so a kept child is never stale (the gauges of a removed model are)."""
        key = (id(series), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = series.labels(*values)
        return child  # type: ignore[return-value]

    def set_model_state(self, model: str, state: str, all_states: list[str]) -> None:
        for name in all_states:
            self.model_state.labels(model=model, state=name).set(1 if name == state else 0)

    def forget_model(self, model: str, all_states: list[str], priorities: list[str]) -> None:
        """A removed model's gauges go from /metrics (its counters stay: totals so far)."""
        for name in all_states:
            with contextlib.suppress(KeyError):  # never published
                self.model_state.remove(model, name)
        for priority in priorities:
            with contextlib.suppress(KeyError):
                self.queued.remove(model, priority)

    def count_tokens(self, model: str, *, input_tokens: int, output_tokens: int) -> None:
        self._one(self.input_tokens, model).inc(input_tokens)
        self._one(self.output_tokens, model).inc(output_tokens)

    def count_timing(self, model: str, timing: RequestTiming) -> None:
        """Count the tokens `timing` has gained since it was last counted: called as a
        request's tokens become known (a prompt at admission, output chunk by chunk), so a
        request cut off midway is charged what it used. Counts only grow: when a last
        report says fewer than were counted as they passed, the difference stays counted."""
        new_input = timing.prompt_tokens - timing.counted_prompt_tokens
        new_output = timing.output_tokens - timing.counted_output_tokens
        if new_input <= 0 and new_output <= 0:
            return
        timing.counted_prompt_tokens = max(timing.counted_prompt_tokens, timing.prompt_tokens)
        timing.counted_output_tokens = max(timing.counted_output_tokens, timing.output_tokens)
        self.count_tokens(model, input_tokens=max(0, new_input), output_tokens=max(0, new_output))

    def observe_queue_wait(self, model: str, seconds: float) -> None:
        self._one(self.queue_seconds, model).observe(seconds)

    def observe_timing(self, model: str, timing: RequestTiming) -> None:
        """A request's turn ended: its times, and whatever of its tokens is not counted yet."""
        self._one(self.backend_seconds, model).observe(timing.backend_s)
        if timing.time_to_first_token_s is not None:
            self._one(self.first_token_seconds, model).observe(timing.time_to_first_token_s)
        if timing.draft_tokens is not None:
            self._one(self.draft_tokens, model).inc(timing.draft_tokens)
            self._one(self.draft_accepted_tokens, model).inc(timing.draft_accepted_tokens or 0)
        self.count_timing(model, timing)

    def observe_audio(self, model: str, task: str, audio_seconds: float, busy_seconds: float) -> None:
        direction = "in" if task == "transcription" else "out"
        self.audio_seconds.labels(model=model, direction=direction).inc(audio_seconds)
        if audio_seconds > 0:
            self.real_time_factor.labels(model=model, task=task).observe(busy_seconds / audio_seconds)

    def cache_lookup_counter(self, model: str) -> Callable[[bool], None]:
        """Counts `model`'s embedding-cache lookups, `count(hit)` each. Both series start at 0
        here (only models with a cache ask), so a hit ratio exists from the first lookup."""
        hits = self.embedding_cache_hits.labels(model=model)
        misses = self.embedding_cache_misses.labels(model=model)

        def count(hit: bool) -> None:
            (hits if hit else misses).inc()

        return count

    def observe_request(self, model: str, route: str, status: int, seconds: float) -> None:
        self._one(self.requests, model, route, str(status)).inc()
        self._one(self.request_seconds, model, route).observe(seconds)

    def count_key_usage(self, key: str, usage: RequestUsage) -> None:
        self._one(self.key_requests, key).inc()
        self._one(self.key_input_tokens, key).inc(usage.input_tokens)
        self._one(self.key_output_tokens, key).inc(usage.output_tokens)
        self._one(self.key_audio_seconds, key, "in").inc(usage.audio_seconds_in)
        self._one(self.key_audio_seconds, key, "out").inc(usage.audio_seconds_out)

    def count_rate_limited(self, key: str, limit: str) -> None:
        self.rate_limited.labels(key=key, limit=limit).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
