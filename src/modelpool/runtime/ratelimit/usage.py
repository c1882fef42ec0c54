"""What each caller (an API key's name, or `anonymous`) used since the server started.

A request's usage comes back from the pool with its results (`Outcome.usage`, a stream's
`usage`); the API's rate-limit layer adds what a request got into its `UsageMeter` and,
when the request ends, records the total here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from modelpool.pool_api.usage import KeyUsage, RequestUsage

if TYPE_CHECKING:
    from modelpool.runtime.metrics.prometheus import Metrics

ANONYMOUS = "anonymous"
"""The account of unauthenticated use (no API keys configured)."""
Journal = Callable[[str, str, RequestUsage, int, int], None]
"""(account, model, usage, requests, refused): what `UsageLedger` passes on to be kept."""


class UsageLedger:
    """Totals per account, mirrored into the pool's Prometheus counters."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._totals: dict[str, KeyUsage] = {}
        self.journal: Journal | None = None
        """Where each record also goes (the durable store), when usage is kept on disk."""

    def restore(self, totals: dict[str, KeyUsage]) -> None:
        """Start from totals kept by an earlier run (the durable store's)."""
        self._totals = {account: replace(usage) for account, usage in totals.items()}

    def record(self, account: str, usage: RequestUsage, model: str = "") -> None:
        """A request of `account` (for `model`, when it named one) ended, having used `usage`."""
        total = self._totals.setdefault(account, KeyUsage())
        total.requests += 1
        total.add(usage)
        self._metrics.count_key_usage(account, usage)
        if self.journal is not None:
            self.journal(account, model, usage, 1, 0)

    def refused(self, account: str, limit: str) -> None:
        """A request of `account` was refused by its `limit` (`requests` or `tokens`)."""
        self._totals.setdefault(account, KeyUsage()).rate_limited += 1
        self._metrics.count_rate_limited(account, limit)
        if self.journal is not None:
            self.journal(account, "", RequestUsage(), 0, 1)

    def totals(self) -> dict[str, KeyUsage]:
        """A copy: callers may keep it while requests go on."""
        return {account: replace(usage) for account, usage in self._totals.items()}
