"""What a request used, returned with its results, and what each caller used and may still
use (the rate limiter's report, which the admin API renders).

A non-streaming result's `Outcome` carries its usage, a stream's `usage` grows as its items
pass (a prompt at admission, output chunk by chunk, audio when it closes), a failed request's
error carries what it used before failing. The caller charges it from there (the API's rate-limit layer
through a `UsageMeter`); nothing reaches the caller through the context of the call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from modelpool.inference import RequestUsage as RequestUsage  # the interface names it; errors carry it too

USAGE_METER = "usage_meter"
"""Where a server keeps a request's `UsageMeter`: the key in its ASGI scope's `state` (set by
the rate-limit layer, which charges and books what it holds)."""


class Metered(Protocol):
    """A result whose usage may still grow (a stream)."""

    @property
    def usage(self) -> RequestUsage: ...


@dataclass
class UsageMeter:
    """Everything one caller's request got from the pool: whole results' usage added once,
    streams followed (their usage is read again at every `total()`, so a stream is charged
    as it goes and, cut off midway, what it used until then)."""

    settled: RequestUsage = field(default_factory=RequestUsage)
    followed: list[Metered] = field(default_factory=list)

    def add(self, usage: RequestUsage) -> None:
        self.settled.add(usage)

    def follow(self, stream: Metered) -> None:
        self.followed.append(stream)

    def total(self) -> RequestUsage:
        total = RequestUsage()
        total.add(self.settled)
        for stream in self.followed:
            total.add(stream.usage)
        return total


LimitKind = Literal["requests", "tokens"]


@dataclass
class KeyUsage(RequestUsage):
    """One account's totals since the server started: what its requests used, summed."""

    requests: int = 0
    """Requests served on the limited routes, whatever their status (counted as they end)."""
    rate_limited: int = 0
    """Requests refused by a rate limit (not counted in `requests`)."""


@dataclass(frozen=True)
class LimitState:
    """One limit as the x-ratelimit-* headers tell it."""

    kind: LimitKind
    limit: int
    remaining: int
    reset_s: float
    """Until the bucket is full again."""


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def any(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


@dataclass(frozen=True)
class KeyReport:
    key: str
    usage: KeyUsage
    limits: Limits
    remaining: list[LimitState] | None
    """None for anonymous use, whose budgets are kept per client address."""


@dataclass(frozen=True)
class UsageRow:
    """One key's (and model's, when asked per model) use within a window."""

    account: str
    model: str | None
    usage: KeyUsage


class UsageHistory(Protocol):
    """Usage kept on disk (`usage_store`): per key, model and hour."""

    async def query(self, since: int | None, until: int | None, by_model: bool) -> list[UsageRow]:
        """Use per key (and model) in the hours from `since` up to `until` (unix seconds)."""
