"""Per-request timing: the `metrics` object a response can carry, and the histograms it feeds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestTiming:
    load_wait_s: float = 0.0
    queue_wait_s: float = 0.0
    backend_s: float = 0.0
    time_to_first_token_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    replica: int = 0
    tokenize_s: float | None = None
    """Seconds the engine spent rendering and tokenizing the prompt, inside `backend_s`, where
    the engine reports it (a generation's first chunk); None where it cannot be measured."""
    draft_tokens: int | None = None
    """Speculative decoding: the draft model's guesses the engine checked (None: no draft)."""
    draft_accepted_tokens: int | None = None
    """Of those, the guesses the model agreed with."""
    started: float = field(default=0.0, repr=False)
    counted_prompt_tokens: int = field(default=0, repr=False)
    counted_output_tokens: int = field(default=0, repr=False)
    """Of the tokens above, those the metrics (and the request's usage) have counted: a
    request's tokens are counted as they become known (`Metrics.count_timing`)."""

    def absorb(self, other: RequestTiming) -> None:
        """Fold in the timing of a further part of the same response (multi-prompt completions)."""
        if self.time_to_first_token_s is None and other.time_to_first_token_s is not None:
            self.time_to_first_token_s = other.started - self.started + other.time_to_first_token_s
        self.load_wait_s += other.load_wait_s
        self.queue_wait_s += other.queue_wait_s
        self.backend_s += other.backend_s
        self.prompt_tokens += other.prompt_tokens
        self.output_tokens += other.output_tokens
        if other.tokenize_s is not None:
            self.tokenize_s = (self.tokenize_s or 0.0) + other.tokenize_s
        if other.draft_tokens is not None:
            self.count_drafts(other.draft_tokens, other.draft_accepted_tokens or 0)

    def count_drafts(self, drafted: int, accepted: int) -> None:
        self.draft_tokens = (self.draft_tokens or 0) + drafted
        self.draft_accepted_tokens = (self.draft_accepted_tokens or 0) + accepted

    @property
    def draft_acceptance_rate(self) -> float | None:
        """Accepted guesses per guess (None without a draft, or before its first guess)."""
        if not self.draft_tokens:
            return None
        return round((self.draft_accepted_tokens or 0) / self.draft_tokens, 4)

    @property
    def tokens_per_second(self) -> float | None:
        """Output tokens per second of the turn on the engine (None before any token)."""
        if self.backend_s <= 0 or not self.output_tokens:
            return None
        return round(self.output_tokens / self.backend_s, 2)

    def as_json(self) -> dict[str, Any]:
        """modelpool's names, then the names llm-pool's clients read (`engine_names`)."""
        return {
            "load_wait_ms": _ms(self.load_wait_s),
            "queue_wait_ms": _ms(self.queue_wait_s),
            "backend_ms": _ms(self.backend_s),
            "time_to_first_token_ms": _ms_or_none(self.time_to_first_token_s),
            "tokens_per_second": self.tokens_per_second,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "replica": self.replica,
            **self.engine_names(),
            **self.draft_names(),
        }

    def draft_names(self) -> dict[str, Any]:
        """Speculative decoding's counts, only where a draft model served the request."""
        if self.draft_tokens is None:
            return {}
        return {
            "draft_tokens": self.draft_tokens,
            "draft_accepted_tokens": self.draft_accepted_tokens,
            "draft_acceptance_rate": self.draft_acceptance_rate,
        }

    def engine_names(self) -> dict[str, Any]:
        """The same measurements under llm-pool's names (docs/compatibility.md says what each
        is here). The engine's "gpu_" times are its compute times, on whatever device it runs:
        the turn on the engine less the prompt's tokenization where that is measured. A time
        modelpool cannot measure is null, as llm-pool reports it."""
        tokenize = self.tokenize_s or 0.0
        compute = max(0.0, self.backend_s - tokenize)
        first = self.time_to_first_token_s
        engine_total = self.load_wait_s + self.queue_wait_s + self.backend_s
        return {
            "engine_queue_wait_ms": _ms(self.queue_wait_s),
            "engine_tokenize_ms": _ms_or_none(self.tokenize_s),
            "gpu_time_to_first_token_ms": _ms_or_none(None if first is None else max(0.0, first - tokenize)),
            "gpu_generate_total_ms": _ms(compute),
            "gpu_decode_after_first_token_ms": _ms_or_none(None if first is None else max(0.0, self.backend_s - first)),
            "backend_inference_wall_ms": _ms(self.backend_s),
            "engine_total_wall_ms": _ms(engine_total),
            "engine_outside_backend_wall_ms": _ms(engine_total - self.backend_s),
            "engine_prompt_tokens": self.prompt_tokens,
            "engine_output_tokens": self.output_tokens,
            "engine_tokens_per_second": self.tokens_per_second,
        }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _ms_or_none(seconds: float | None) -> float | None:
    return None if seconds is None else _ms(seconds)
