"""Requests and tokens per minute per caller, as continuous-refill token buckets (OpenAI's
model): a bucket holds up to its per-minute limit and refills evenly at limit/60 a second,
so a minute's budget may be spent in a burst and then comes back steadily.

A request costs one from the requests bucket, taken when it is let in. Its tokens are not
known until it runs, so a request is let in while at least one token is left and the
tokens it used (input + output) are charged as they are counted (the API settles them on
every message it sends). A request may therefore overdraw the bucket below zero, by at
most one minute's budget (the level never goes below -limit, so no caller waits more than
a minute and a bit for its next token); the next request waits until the bucket has
refilled to one token. A refusal names the limit with the longest wait, and that wait.

Callers are API key names. With no keys configured, unauthenticated use is limited per
client address, under the one account `anonymous`; address budgets are kept by last use,
and forgotten once refilled (no different then from a new one) or, past a hard cap, the
oldest first. No HTTP here; the clock is injectable.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from modelpool.config.schema import AuthConfig
from modelpool.errors import RateLimited
from modelpool.pool_api.usage import KeyReport, KeyUsage, LimitKind, Limits, LimitState
from modelpool.runtime.clock import Clock, SystemClock
from modelpool.runtime.ratelimit.usage import ANONYMOUS, UsageLedger

_SHORT = {"requests": "RPM", "tokens": "TPM"}
_NOISE = 1e-9
"""Float error of refills (1030.6 - 1000.0 is 30.59999999999991): not a refusal."""
_PRUNE_EVERY_S = 1.0
"""Refilled address buckets are looked for at most this often (or when their number doubled)."""
_PRUNE_FLOOR = 1024
"""Below this many address buckets, their number doubling is no reason to prune."""
MAX_ADDRESS_BUCKETS = 65_536
"""The most client addresses whose budgets are kept (the least recently seen go first)."""


@dataclass
class TokenBucket:
    per_minute: int
    level: float
    updated: float

    @classmethod
    def full(cls, per_minute: int, now: float) -> TokenBucket:
        return cls(per_minute, float(per_minute), now)

    def refill(self, now: float) -> None:
        """Add what came back since the last refill. A reading earlier than the last one (a
        stale `now`) adds nothing and takes nothing."""
        elapsed = max(0.0, now - self.updated)
        self.level = min(float(self.per_minute), self.level + elapsed * self.per_minute / 60)
        self.updated = max(self.updated, now)

    def take(self, amount: float) -> None:
        """Spend `amount`, overdrawing at most one minute's budget."""
        self.level = max(-float(self.per_minute), self.level - amount)

    def holds(self, amount: float) -> bool:
        return self.level >= amount - _NOISE

    def seconds_until(self, level: float) -> float:
        """From the last refill until the bucket holds `level` (0 if it does)."""
        return max(0.0, (level - self.level) * 60 / self.per_minute)  # `* 60 /`: whole seconds stay whole

    def state(self, kind: LimitKind) -> LimitState:
        left = max(0, math.floor(self.level + _NOISE))
        return LimitState(kind, self.per_minute, left, self.seconds_until(self.per_minute))


@dataclass(frozen=True)
class Caller:
    account: str
    """Whose usage it is: the key's name, or `anonymous`."""
    bucket: str
    """Whose budget it spends: the key's name, or the client's address."""
    limits: Limits
    described: str
    """For error messages: "key 'app'", "client 10.0.0.7"."""
    per_address: bool = False
    """Unauthenticated: the budget is the client address's."""


@dataclass
class _Buckets:
    requests: TokenBucket | None
    tokens: TokenBucket | None

    def each(self) -> list[tuple[LimitKind, TokenBucket]]:
        pairs: list[tuple[LimitKind, TokenBucket | None]] = [("requests", self.requests), ("tokens", self.tokens)]
        return [(kind, bucket) for kind, bucket in pairs if bucket is not None]

    def full_at(self, now: float) -> bool:
        for _, bucket in self.each():
            bucket.refill(now)
        return all(bucket.holds(bucket.per_minute) for _, bucket in self.each())


class RateLimiter:
    def __init__(
        self,
        keys: dict[str, Limits],
        unauthenticated: Limits,
        clock: Clock | None = None,
        *,
        max_buckets: int = MAX_ADDRESS_BUCKETS,
    ) -> None:
        """`keys`: every configured key name → its limits (empty: no keys, so callers are
        anonymous and limited per address by `unauthenticated`). `max_buckets`: the most
        client addresses whose budgets are kept."""
        self.clock = clock or SystemClock()
        self._keys = keys
        self._unauthenticated = unauthenticated
        self._max_buckets = max_buckets
        self._key_buckets: dict[str, _Buckets] = {}
        """Per key name: as many as there are keys, kept for good."""
        self._address_buckets: OrderedDict[str, _Buckets] = OrderedDict()
        """Per client address, the least recently used first."""
        self._pruned_at = -math.inf
        self._size_after_prune = 0

    @property
    def address_buckets(self) -> int:
        """How many client addresses' budgets are kept."""
        return len(self._address_buckets)

    @classmethod
    def from_config(cls, auth: AuthConfig, clock: Clock | None = None) -> RateLimiter:
        keys = {key.name: Limits(key.requests_per_minute, key.tokens_per_minute) for key in auth.keys}
        anonymous = Limits(auth.unauthenticated.requests_per_minute, auth.unauthenticated.tokens_per_minute)
        return cls(keys, anonymous, clock)

    def reconfigure(self, auth: AuthConfig) -> None:
        """A config reload's keys and limits, at once: a key whose limits changed (or that
        went) starts again from full budgets; the others keep what they have left."""
        fresh = RateLimiter.from_config(auth, self.clock)
        for name in self._keys.keys() | fresh._keys.keys():
            if self._keys.get(name) != fresh._keys.get(name):
                self._key_buckets.pop(name, None)
        if fresh._unauthenticated != self._unauthenticated:
            self._address_buckets.clear()
        self._keys, self._unauthenticated = fresh._keys, fresh._unauthenticated

    def caller(self, key: str | None, address: str | None) -> Caller:
        """Who is asking: the key's name when the request had one, else the client address."""
        if key is not None:
            return Caller(key, key, self._keys.get(key, Limits()), f"key '{key}'")
        where = address or "unknown"
        return Caller(ANONYMOUS, f"address {where}", self._unauthenticated, f"client {where}", per_address=True)

    def admit(self, caller: Caller) -> list[LimitState]:
        """Take one request from the caller's budget, or raise RateLimited (taking nothing).
        Returns the limits' states after it, for the response headers."""
        buckets = self._refilled(caller)
        short = [(kind, bucket) for kind, bucket in buckets.each() if not bucket.holds(1)]
        if short:  # the limit that keeps the caller waiting longest is the one to tell
            kind, bucket = max(short, key=lambda pair: pair[1].seconds_until(1))
            raise _refusal(caller, kind, bucket)
        if buckets.requests is not None:
            buckets.requests.take(1)
        return [bucket.state(kind) for kind, bucket in buckets.each()]

    def charge(self, caller: Caller, tokens: int) -> None:
        """Tokens the caller used (may overdraw the bucket, by one minute's budget at most)."""
        if tokens <= 0 or caller.limits.tokens_per_minute is None:
            return  # nothing to charge, and no buckets made for a caller without limits
        bucket = self._refilled(caller).tokens
        if bucket is not None:
            bucket.take(tokens)

    def states(self, caller: Caller) -> list[LimitState]:
        return [bucket.state(kind) for kind, bucket in self._refilled(caller).each()]

    def levels(self) -> list[tuple[str, LimitKind, float]]:
        """Every key's bucket levels now, (key, kind, level), for the durable store."""
        now = self.clock.monotonic()
        found = []
        for key, buckets in self._key_buckets.items():
            for kind, bucket in buckets.each():
                bucket.refill(now)
                found.append((key, kind, bucket.level))
        return found

    def restore(self, levels: list[tuple[str, LimitKind, float]], elapsed_s: float) -> None:
        """Key buckets as an earlier run left them `elapsed_s` ago, refilled for that time
        (a limit lowered since is a bucket no fuller than the new limit)."""
        now = self.clock.monotonic()
        for key, kind, level in levels:
            if key not in self._keys:
                continue  # a key no longer configured
            buckets = self._refilled(self.caller(key, None))
            bucket = buckets.requests if kind == "requests" else buckets.tokens
            if bucket is not None:
                bucket.level = max(-float(bucket.per_minute), min(float(bucket.per_minute), level))
                bucket.updated = now - max(0.0, elapsed_s)
                bucket.refill(now)

    def report(self, ledger: UsageLedger) -> list[KeyReport]:
        """Every configured key (or `anonymous` when there are none) and whoever else has
        used the pool, with their totals, limits and what is left."""
        totals = ledger.totals()
        accounts = list(self._keys) or [ANONYMOUS]
        accounts += sorted(set(totals) - set(accounts))
        return [self._report(account, totals.get(account, KeyUsage())) for account in accounts]

    def _report(self, account: str, usage: KeyUsage) -> KeyReport:
        if account == ANONYMOUS and not self._keys:
            # Budgets are per address: no one "remaining" to show.
            return KeyReport(account, usage, self._unauthenticated, None)
        caller = self.caller(account, None)
        return KeyReport(account, usage, caller.limits, self.states(caller) if caller.limits.any else [])

    def _refilled(self, caller: Caller) -> _Buckets:
        now = self.clock.monotonic()
        buckets = self._buckets_of(caller, now)
        for _, bucket in buckets.each():
            bucket.refill(now)
        return buckets

    def _buckets_of(self, caller: Caller, now: float) -> _Buckets:
        if not caller.per_address:
            buckets = self._key_buckets.get(caller.bucket)
            if buckets is None:
                buckets = self._key_buckets[caller.bucket] = _new_buckets(caller.limits, now)
            return buckets
        kept = self._address_buckets
        buckets = kept.get(caller.bucket)
        if buckets is not None:
            kept.move_to_end(caller.bucket)  # the most recently used last
            return buckets
        self._prune(now)
        buckets = kept[caller.bucket] = _new_buckets(caller.limits, now)
        return buckets

    def _prune(self, now: float) -> None:
        """Before an address is added: forget the least recently used addresses whose
        budgets have refilled (no different from a new one), at most once a second or when
        their number doubled, stopping at the first that has not (amortised: each bucket is
        dropped once, and a look stops at one kept). Past the cap, the oldest go anyway."""
        kept = self._address_buckets
        while len(kept) >= self._max_buckets:
            kept.popitem(last=False)
        due = now - self._pruned_at >= _PRUNE_EVERY_S
        if not due and len(kept) < 2 * max(self._size_after_prune, _PRUNE_FLOOR):
            return
        self._pruned_at = now
        while kept and next(iter(kept.values())).full_at(now):
            kept.popitem(last=False)
        self._size_after_prune = len(kept)


def _new_buckets(limits: Limits, now: float) -> _Buckets:
    rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
    return _Buckets(
        TokenBucket.full(rpm, now) if rpm is not None else None,
        TokenBucket.full(tpm, now) if tpm is not None else None,
    )


def _refusal(caller: Caller, kind: LimitKind, bucket: TokenBucket) -> RateLimited:
    wait_s = bucket.seconds_until(1)
    used = math.ceil(bucket.per_minute - bucket.level)
    asked = ", Requested 1" if kind == "requests" else ""  # a request's tokens are unknown until it ends
    message = (
        f"Rate limit reached for {kind} per min ({_SHORT[kind]}) on {caller.described}: "
        f"Limit {bucket.per_minute}, Used {used}{asked}. Please try again in {duration_text(wait_s)}."
    )
    return RateLimited(message, limit=kind, retry_after_s=wait_s)


def duration_text(seconds: float) -> str:
    """A duration as OpenAI's rate-limit headers write it (Go's format, to the ms): `120ms`,
    `1s`, `1.5s`, `6m0s`, `1h0m0s`. Rounded up, so a client that waits that long is let in
    (but float noise, 20.000000000000004 s, is not a millisecond more)."""
    ms = max(0, math.ceil(round(seconds * 1000, 6)))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    hours, minutes = divmod(minutes, 60)
    text = f"{rest // 1000}.{rest % 1000:03d}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    return f"{hours}h{text}" if hours else text
