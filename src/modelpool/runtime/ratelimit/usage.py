"""What each caller (an API key's name, or `anonymous`) used since the server started.

A request's usage comes back from the pool with its results (`Outcome.usage`, a stream's
`usage`); the API's rate-limit layer adds what a request got into its `UsageMeter` and,
when the request ends, records the total here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from modelpool.pool_api.usage import KeyUsage, RequestUsage

if TYPE_CHECKING:
    from modelpool.runtime.metrics.prometheus import Metrics

ANONYMOUS = "anonymous"
"""The account of unauthenticated use (no API keys configured)."""


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
