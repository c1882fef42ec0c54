"""What each request used, attributed to its caller (an API key's name, or `anonymous`).

The runtime counts tokens and audio where it already feeds its metrics
(`Metrics.count_tokens`, `Metrics.observe_audio`), tokens as soon as they are known (a
prompt at admission, output chunk by chunk); those calls also add to the usage of the
request in progress, found through a context variable. Whoever starts a request (the
API's rate-limit middleware) puts a fresh `RequestUsage` there; tasks created from the
request's task (a streamed body) copy the context, so they add to the same object. Work
with no request around it (preloads, warm-ups) adds to nothing, and the pool's long-lived
tasks (a batcher's worker, a load) start with an empty context (`runtime.detached`), so
they never add to the request that happened to start them.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # metrics imports this module to feed it
    from modelpool.runtime.metrics import Metrics

AudioDirection = Literal["in", "out"]
ANONYMOUS = "anonymous"
"""The account of unauthenticated use (no API keys configured)."""


@dataclass
class RequestUsage:
    """One request's consumption so far; mutable, shared by the tasks serving the request."""

    input_tokens: int = 0
    output_tokens: int = 0
    audio_seconds_in: float = 0.0
    """Audio transcribed."""
    audio_seconds_out: float = 0.0
    """Audio synthesised."""

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: RequestUsage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.audio_seconds_in += other.audio_seconds_in
        self.audio_seconds_out += other.audio_seconds_out


current_usage: ContextVar[RequestUsage | None] = ContextVar("modelpool_request_usage", default=None)


def add_tokens(input_tokens: int, output_tokens: int) -> None:
    usage = current_usage.get()
    if usage is not None:
        usage.input_tokens += input_tokens
        usage.output_tokens += output_tokens


def add_audio(direction: AudioDirection, seconds: float) -> None:
    usage = current_usage.get()
    if usage is None:
        return
    if direction == "in":
        usage.audio_seconds_in += seconds
    else:
        usage.audio_seconds_out += seconds


@dataclass
class KeyUsage(RequestUsage):
    """One account's totals since the server started: what its requests used, summed."""

    requests: int = 0
    """Requests served on the limited routes, whatever their status (counted as they end)."""
    rate_limited: int = 0
    """Requests refused by a rate limit (not counted in `requests`)."""


class UsageLedger:
    """Totals per account, mirrored into the pool's Prometheus counters."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._totals: dict[str, KeyUsage] = {}

    def record(self, account: str, usage: RequestUsage) -> None:
        """A request of `account` ended, having used `usage`."""
        total = self._totals.setdefault(account, KeyUsage())
        total.requests += 1
        total.add(usage)
        self._metrics.count_key_usage(account, usage)

    def refused(self, account: str, limit: str) -> None:
        """A request of `account` was refused by its `limit` (`requests` or `tokens`)."""
        self._totals.setdefault(account, KeyUsage()).rate_limited += 1
        self._metrics.count_rate_limited(account, limit)

    def totals(self) -> dict[str, KeyUsage]:
        """A copy: callers may keep it while requests go on."""
        return {account: replace(usage) for account, usage in self._totals.items()}
