"""Token buckets per caller, driven by a clock moved by hand."""

from __future__ import annotations

import asyncio
import time

import pytest

from modelpool.config.schema import AuthConfig
from modelpool.errors import RateLimited
from modelpool.pool_api.results import Outcome, charge
from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import Limits, LimitState, RequestUsage, UsageMeter
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.ratelimit.limiter import RateLimiter, TokenBucket, duration_text
from modelpool.runtime.ratelimit.usage import UsageLedger
from tests.fakes import ManualClock


def limiter(clock: ManualClock, **keys: Limits) -> RateLimiter:
    return RateLimiter(dict(keys), Limits(), clock)


def refused(limits: RateLimiter, key: str) -> RateLimited:
    with pytest.raises(RateLimited) as caught:
        limits.admit(limits.caller(key, None))
    return caught.value


def test_a_minutes_requests_in_a_burst_then_one_per_refill() -> None:
    clock = ManualClock()
    limits = limiter(clock, app=Limits(requests_per_minute=3))
    app = limits.caller("app", None)
    states = [limits.admit(app) for _ in range(3)]
    assert [s[0].remaining for s in states] == [2, 1, 0]
    error = refused(limits, "app")
    assert error.status_code == 429 and error.code == "rate_limit_exceeded" and error.type == "requests"
    assert error.message == (
        "Rate limit reached for requests per min (RPM) on key 'app': Limit 3, Used 3, Requested 1. "
        "Please try again in 20s."
    )
    assert error.headers == {"Retry-After": "20", "retry-after-ms": "20000"}
    clock.advance(19.5)  # refilled 0.975 of a request: not yet
    assert refused(limits, "app").headers["retry-after-ms"] == "500"
    clock.advance(0.5)
    assert limits.admit(app) == [LimitState("requests", 3, 0, 60.0)]  # empty again: a minute to full


def test_retry_after_is_rounded_up_to_whole_seconds() -> None:
    clock = ManualClock()
    limits = limiter(clock, app=Limits(requests_per_minute=7))  # one request refills in 8.571 s
    app = limits.caller("app", None)
    for _ in range(7):
        limits.admit(app)
    error = refused(limits, "app")
    assert error.headers == {"Retry-After": "9", "retry-after-ms": "8572"}
    assert error.message.endswith("Please try again in 8.572s.")


def test_refill_is_continuous_and_stops_at_the_limit() -> None:
    clock = ManualClock()
    limits = limiter(clock, app=Limits(requests_per_minute=60))
    app = limits.caller("app", None)
    for _ in range(60):
        limits.admit(app)
    clock.advance(10)
    assert limits.states(app) == [LimitState("requests", 60, 10, 50.0)]
    clock.advance(3600)
    assert limits.states(app) == [LimitState("requests", 60, 60, 0.0)]
    for _ in range(60):  # an hour idle still buys one minute's burst, not sixty
        limits.admit(app)
    assert refused(limits, "app").type == "requests"


def test_tokens_are_charged_after_and_may_overdraw_once() -> None:
    clock = ManualClock()
    limits = limiter(clock, app=Limits(tokens_per_minute=100))
    app = limits.caller("app", None)
    assert limits.admit(app) == [LimitState("tokens", 100, 100, 0.0)]  # admission takes no tokens
    limits.charge(app, 90)
    limits.admit(app)  # 10 left: let in, though it may use more
    limits.charge(app, 60)
    assert limits.states(app) == [LimitState("tokens", 100, 0, 90.0)]  # -50: 150 tokens to full
    error = refused(limits, "app")
    assert error.type == "tokens" and error.headers["Retry-After"] == "31"  # back to one token: 30.6 s
    assert error.message == (
        "Rate limit reached for tokens per min (TPM) on key 'app': Limit 100, Used 150. Please try again in 30.6s."
    )
    clock.advance(30.6)
    limits.admit(app)


def test_a_refusal_takes_nothing_from_the_other_limit() -> None:
    clock = ManualClock()
    limits = limiter(clock, app=Limits(requests_per_minute=10, tokens_per_minute=50))
    app = limits.caller("app", None)
    limits.admit(app)
    limits.charge(app, 80)
    for _ in range(3):
        assert refused(limits, "app").type == "tokens"
    assert [s.remaining for s in limits.states(app)] == [9, 0]


def test_each_key_and_each_anonymous_address_has_its_own_budget() -> None:
    clock = ManualClock()
    auth = AuthConfig.model_validate(
        {"keys": [{"name": "a", "key_env": "A", "requests_per_minute": 1}, {"name": "free", "key_env": "F"}]}
    )
    keyed = RateLimiter.from_config(auth, clock)
    keyed.admit(keyed.caller("a", "10.0.0.1"))
    assert refused(keyed, "a").message.startswith("Rate limit reached for requests per min (RPM) on key 'a'")
    assert keyed.caller("free", None).limits == Limits()  # unlimited: the middleware skips the buckets
    anonymous = RateLimiter.from_config(AuthConfig.model_validate({"unauthenticated": {"requests_per_minute": 1}}))
    anonymous.clock = clock
    first, second = anonymous.caller(None, "10.0.0.1"), anonymous.caller(None, "10.0.0.2")
    assert first.account == second.account == "anonymous"
    anonymous.admit(first)
    anonymous.admit(second)
    with pytest.raises(RateLimited, match=r"on client 10\.0\.0\.1"):
        anonymous.admit(first)


def test_keys_sharing_a_name_must_share_their_limits() -> None:
    keys = [{"name": "a", "key_env": "A1", "requests_per_minute": 5}, {"name": "a", "key_env": "A2"}]
    with pytest.raises(ValueError, match="share one budget"):
        AuthConfig.model_validate({"keys": keys})


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0004, "1ms"),
        (0.12, "120ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (8.5714, "8.572s"),
        (20.000000000000004, "20s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (179.56, "2m59.56s"),
        (3600, "1h0m0s"),
    ],
)
def test_durations_read_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


async def test_usage_is_shared_with_the_tasks_a_request_starts() -> None:
    charge(None, outcome(RequestUsage(5, 5)))  # no request around it (a preload): attributed to nobody, and no error
    meter = UsageMeter()

    async def streamed_body() -> None:
        charge(meter, outcome(RequestUsage(3, 4, audio_seconds_out=1.25)))

    await asyncio.create_task(streamed_body())
    charge(meter, outcome(RequestUsage(2, 0, audio_seconds_in=2.0)))
    usage = meter.total()
    assert usage == RequestUsage(input_tokens=5, output_tokens=4, audio_seconds_in=2.0, audio_seconds_out=1.25)
    assert usage.total_tokens == 9


def test_the_ledger_keeps_totals_and_prometheus_counters() -> None:
    metrics = Metrics()
    ledger = UsageLedger(metrics)
    ledger.record("app", RequestUsage(input_tokens=10, output_tokens=3, audio_seconds_in=1.5))
    ledger.record("app", RequestUsage(input_tokens=1, output_tokens=2, audio_seconds_out=0.5))
    ledger.refused("app", "tokens")
    totals = ledger.totals()["app"]
    assert (totals.requests, totals.input_tokens, totals.output_tokens, totals.rate_limited) == (2, 11, 5, 1)
    assert (totals.audio_seconds_in, totals.audio_seconds_out) == (1.5, 0.5)
    text = metrics.render().decode()
    assert 'modelpool_key_requests_total{key="app"} 2.0' in text
    assert 'modelpool_key_input_tokens_total{key="app"} 11.0' in text
    assert 'modelpool_key_output_tokens_total{key="app"} 5.0' in text
    assert 'modelpool_key_audio_seconds_total{direction="in",key="app"} 1.5' in text
    assert 'modelpool_rate_limited_total{key="app",limit="tokens"} 1.0' in text


def test_the_report_lists_every_key_with_what_is_left() -> None:
    clock = ManualClock()
    limits = limiter(clock, app=Limits(requests_per_minute=2), free=Limits())
    limits.admit(limits.caller("app", None))
    ledger = UsageLedger(Metrics())
    ledger.record("app", RequestUsage(input_tokens=4))
    reports = {report.key: report for report in limits.report(ledger)}
    assert list(reports) == ["app", "free"]
    assert reports["app"].usage.input_tokens == 4 and reports["app"].remaining == [LimitState("requests", 2, 1, 30.0)]
    assert reports["free"].usage.requests == 0 and reports["free"].remaining == []


def test_an_overdraw_is_capped_at_one_minutes_budget() -> None:
    clock = ManualClock()
    limits = limiter(clock, app=Limits(tokens_per_minute=100))
    app = limits.caller("app", None)
    limits.admit(app)
    limits.charge(app, 10_000)  # one huge reply: the debt stops at -100 (a minute's budget)
    assert limits.states(app) == [LimitState("tokens", 100, 0, 120.0)]
    error = refused(limits, "app")
    assert error.headers["Retry-After"] == "61"  # back to one token: 101 tokens at 100/min
    assert "Used 200." in error.message
    clock.advance(60.6)
    limits.admit(app)


def test_retry_after_is_the_longest_wait_of_the_limits_refused() -> None:
    clock = ManualClock()
    limits = limiter(clock, app=Limits(requests_per_minute=1, tokens_per_minute=10))
    app = limits.caller("app", None)
    limits.admit(app)
    limits.charge(app, 500)  # both spent: a request back in 60 s, a token in 66 s
    error = refused(limits, "app")
    assert error.type == "tokens"
    assert error.headers == {"Retry-After": "66", "retry-after-ms": "66000"}
    assert error.message.startswith("Rate limit reached for tokens per min (TPM) on key 'app'")
    clock.advance(60)
    assert refused(limits, "app").type == "tokens"  # the request is back, the tokens are not
    clock.advance(6)
    limits.admit(app)


def test_a_bucket_never_drains_when_the_clock_reads_earlier() -> None:
    bucket = TokenBucket(per_minute=60, level=5.0, updated=100.0)
    bucket.refill(90.0)  # an earlier reading (a clock stepped back, or a stale `now`)
    assert bucket.level == 5.0
    bucket.refill(101.0)
    assert bucket.level == pytest.approx(6.0)


def test_twenty_thousand_addresses_are_admitted_in_well_under_a_second() -> None:
    clock = ManualClock()  # frozen: no budget refills, so no bucket may be forgotten
    limits = RateLimiter({}, Limits(requests_per_minute=1), clock)
    # CPU time, not wall time: ~0.1 s of CPU here, and a busy machine (CI beside other work)
    # stretched the wall time past the bound. A quadratic bucket scan would still blow it.
    started = time.process_time()
    for i in range(20_000):
        limits.admit(limits.caller(None, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"))
        assert time.process_time() - started < 1.0, f"too slow: {i} addresses admitted in a CPU second"
    assert limits.address_buckets == 20_000


def test_address_buckets_that_refilled_are_dropped() -> None:
    clock = ManualClock()
    limits = RateLimiter({}, Limits(requests_per_minute=60), clock)  # a request refills in 1 s
    for i in range(20_000):
        limits.admit(limits.caller(None, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"))
        clock.advance(0.01)  # 100 new addresses a second
    assert limits.address_buckets <= 512, "the buckets of addresses gone a second are dropped"


def test_the_address_buckets_have_a_hard_cap_dropping_the_oldest() -> None:
    clock = ManualClock()
    limits = RateLimiter({}, Limits(requests_per_minute=1), clock, max_buckets=1000)
    for i in range(20_000):  # nothing refills on a frozen clock: only the cap bounds them
        limits.admit(limits.caller(None, f"addr-{i}"))
    assert limits.address_buckets == 1000
    with pytest.raises(RateLimited):
        limits.admit(limits.caller(None, "addr-19999"))  # a recent address keeps its spent budget
    limits.admit(limits.caller(None, "addr-0"))  # the oldest was dropped: a fresh budget


def outcome(usage: RequestUsage) -> Outcome[None]:
    """A whole result of the pool that used `usage`."""
    return Outcome(None, RequestTiming(), usage)
