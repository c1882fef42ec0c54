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

    def as_json(self) -> dict[str, Any]:
        tokens_per_s = self.output_tokens / self.backend_s if self.backend_s > 0 and self.output_tokens else None
        return {
            "load_wait_ms": _ms(self.load_wait_s),
            "queue_wait_ms": _ms(self.queue_wait_s),
            "backend_ms": _ms(self.backend_s),
            "time_to_first_token_ms": None if self.time_to_first_token_s is None else _ms(self.time_to_first_token_s),
            "tokens_per_second": round(tokens_per_s, 2) if tokens_per_s is not None else None,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "replica": self.replica,
        }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
